//! The plugin contract's identity: the WIT package, its version and its
//! worlds. Both the plugin host and the OCI registry client (which checks
//! that an artifact is a component of a world) name them; neither owns
//! the other.

use serde::Deserialize;

/// The contract version this host implements.
pub const CONTRACT_VERSION: &str = "0.1.0";
/// The contract package.
pub const CONTRACT_PACKAGE: &str = "berth:snapshot";

/// Which contract world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum World {
    /// Exports `berth:snapshot/remote-client`.
    #[serde(rename = "remote-client-plugin")]
    RemoteClient,
    /// Exports `berth:snapshot/snapshot`.
    #[serde(rename = "snapshot-plugin")]
    Snapshot,
}

impl World {
    /// The WIT world name.
    pub fn name(self) -> &'static str {
        match self {
            World::RemoteClient => "remote-client-plugin",
            World::Snapshot => "snapshot-plugin",
        }
    }

    /// The contract interface the world exports, without version.
    pub fn export_interface(self) -> &'static str {
        match self {
            World::RemoteClient => "berth:snapshot/remote-client",
            World::Snapshot => "berth:snapshot/snapshot",
        }
    }
}
