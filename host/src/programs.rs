//! Where Berth's own programs are on this host (the helper, the egress
//! daemon), for the modules that start them.

use std::path::PathBuf;

/// A program of Berth's: `$VARIABLE` when set, else `name` beside the
/// running program or in its parent directory (the tests run from
/// `target/debug/deps`, beside which cargo puts the binaries).
pub fn find(variable: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}
