//! Directories: only the granted host paths, each at its guest path with its
//! own read-only or read-write mode.

use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use crate::plugin::manifest::{DirGrant, DirMode};
use crate::plugin_error::PluginError;

pub(super) fn preopen(
    builder: &mut WasiCtxBuilder,
    plugin: &str,
    dirs: &[DirGrant],
) -> Result<(), PluginError> {
    for d in dirs {
        let perms = match d.mode {
            DirMode::ReadOnly => FsPerms::ReadOnly,
            DirMode::ReadWrite => FsPerms::ReadWrite,
        };
        builder
            .preopened_dir(&d.host, &d.guest, perms)
            .map_err(|e| PluginError::Host {
                plugin: plugin.to_string(),
                operation: "grant",
                message: format!(
                    "cannot open granted directory {} (for guest path {}): {e}; create it or fix grants.dirs",
                    d.host.display(),
                    d.guest
                ),
            })?;
    }
    Ok(())
}
