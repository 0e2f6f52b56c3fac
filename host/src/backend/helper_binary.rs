//! Where the `berth-agent` binary is on this host: the in-container agent
//! the Docker backend copies into containers, and the helper the local
//! backend runs for files and background processes.

use std::path::PathBuf;

/// `$BERTH_AGENT`, else `berth-agent-static` (a static build, which runs
/// in any image) beside the running program or in its parent directory
/// (where `cargo xtask build-agent` puts it for the CLI and the tests).
pub fn path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_AGENT").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join("berth-agent-static"),
        dir.parent()?.join("berth-agent-static"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}
