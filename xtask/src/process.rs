//! Running commands and finding tools.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub(crate) fn is_root() -> bool {
    output(Command::new("id").arg("-u"))
        .map(|o| o.trim() == "0")
        .unwrap_or(false)
}

/// A tool `cargo install` put in `~/.cargo/bin`, found even when that
/// directory is not on PATH.
pub(crate) fn cargo_installed(tool: &str) -> PathBuf {
    if have(tool) {
        return PathBuf::from(tool);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cargo/bin").join(tool)
}
