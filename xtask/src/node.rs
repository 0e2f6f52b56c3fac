//! The TypeScript client's side of the tests: Node.js 18 or newer with
//! npm, and the npm cache holding the package's pinned build tools
//! (`host/typescript/package-lock.json`), so the tests' fresh projects
//! install from the cache.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::process::{have, output, run};

/// Checks Node and npm, and puts the lock file's packages in npm's cache.
pub(crate) fn node_setup(root: &Path) -> Result<()> {
    if !have("node") || !have("npm") {
        anyhow::bail!("Node.js (18 or newer) and npm are needed for the TypeScript client");
    }
    let version = output(Command::new("node").arg("--version"))?;
    let major: u32 = version
        .trim()
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("reading node --version ({version:?})"))?;
    if major < 18 {
        anyhow::bail!("Node.js {version} is too old for the TypeScript client: 18 or newer");
    }
    let lock_path = root.join("host/typescript/package-lock.json");
    let lock: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&lock_path).with_context(|| format!("reading {}", lock_path.display()))?,
    )
    .with_context(|| format!("parsing {}", lock_path.display()))?;
    let specs: Vec<String> = lock["packages"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(path, entry)| {
            let name = path
                .rsplit("node_modules/")
                .next()
                .filter(|_| !path.is_empty())?;
            Some(format!("{name}@{}", entry["version"].as_str()?))
        })
        .collect();
    eprintln!(
        "xtask: Node {} ready; caching the TypeScript client's {} build packages",
        version.trim(),
        specs.len()
    );
    run(Command::new("npm")
        .args(["cache", "add", "--no-audit", "--no-fund"])
        .args(&specs))
}
