//! The in-container agent: a static (musl) `berth-agent` for the host's
//! architecture, put beside the `berth` binary where the library finds it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::process::{output, run};

/// The file name the library looks for beside the program.
const STATIC_NAME: &str = "berth-agent-static";

fn musl_target() -> String {
    format!("{}-unknown-linux-musl", std::env::consts::ARCH)
}

fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Builds the agent statically and copies it to
/// `target/debug/berth-agent-static` (and `target/release/…`), beside the
/// `berth` binaries. (Not `berth-agent`: `cargo build --workspace` writes
/// the host-linked build of the same crate there.)
pub(crate) fn build_agent(root: &Path) -> Result<()> {
    let target = musl_target();
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if !installed.lines().any(|l| l.trim() == target) {
        run(Command::new("rustup").args(["target", "add", &target]))?;
    }
    run(Command::new("cargo").current_dir(root).args([
        "build",
        "--release",
        "--package",
        "berth-agent",
        "--bin",
        "berth-agent",
        "--target",
        &target,
    ]))?;
    let dir = target_dir(root);
    let built = dir.join(&target).join("release").join("berth-agent");
    for profile in ["debug", "release"] {
        let to = dir.join(profile);
        std::fs::create_dir_all(&to)?;
        std::fs::copy(&built, to.join(STATIC_NAME))
            .with_context(|| format!("copying {} into {}", built.display(), to.display()))?;
    }
    let size = std::fs::metadata(&built)?.len();
    eprintln!("xtask: built berth-agent for {target} ({size} bytes)");
    Ok(())
}
