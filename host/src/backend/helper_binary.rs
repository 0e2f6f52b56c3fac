//! Where the `berth-agent` binary is on this host: the in-container agent
//! the Docker backend copies into containers, and the helper the local
//! backend runs for files and background processes.

use std::path::PathBuf;

/// `$BERTH_AGENT`, else `berth-agent-static` (a static build, which runs
/// in any image) beside the running program or in its parent directory
/// (where `cargo xtask build-agent` puts it for the CLI and the tests).
pub fn path() -> Option<PathBuf> {
    crate::programs::find("BERTH_AGENT", "berth-agent-static")
}
