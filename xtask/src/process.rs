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

/// Starts a daemon with `setsid -f`, its output appended to a fresh `log`:
/// the daemon is forked away and re-parented, so it outlives xtask and is
/// never left a zombie of a living parent.
pub(crate) fn start_daemon(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&std::ffi::OsStr],
    log: &std::path::Path,
) -> Result<()> {
    let log = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let program = program.as_ref();
    let status = Command::new("setsid")
        .arg("-f")
        .arg(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("starting {}", program.to_string_lossy()))?;
    if !status.success() {
        bail!("setsid -f {} failed: {status}", program.to_string_lossy());
    }
    Ok(())
}

/// Installs Debian's `package` with apt unless `tool` is on the PATH.
pub(crate) fn apt_install(tool: &str, package: &str) -> Result<()> {
    if have(tool) {
        return Ok(());
    }
    run(Command::new("apt-get").arg("update").arg("-qq"))?;
    run(Command::new("apt-get")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["install", "-y", "-qq", package]))
}
