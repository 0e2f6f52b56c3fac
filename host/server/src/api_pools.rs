//! The wire types of warm pools (`/v1/pools`) and of a claim (`from_pool`
//! in a create).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{name}/forks`: children of a sandbox, made at
/// once.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForksBody {
    /// How many (1 to 64); they are named `prefix1` … `prefixN`.
    pub count: u32,
    /// The children's names' beginning.
    pub prefix: String,
    /// Fork this kept generation. By default none: a live fork, from a
    /// checkpoint of the running workspace written now (the parent keeps
    /// running).
    #[serde(default)]
    pub generation: Option<u64>,
    /// Start the children. By default, yes.
    #[serde(default)]
    pub start: Option<bool>,
}

/// The reply of a fork into many.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Forked {
    /// The generation every child started from (the new checkpoint's, for
    /// a live fork).
    pub generation: u64,
    /// The children, in order.
    pub sandboxes: Vec<crate::api::SandboxRecord>,
    /// How long the checkpoint took (0 when a kept generation was named).
    pub checkpoint_ms: u64,
    /// How long making and starting the children took.
    pub forks_ms: u64,
}

/// `POST /v1/pools`: a pool's template and size.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CreatePool {
    /// Its name (the sandbox name grammar).
    pub name: String,
    /// How many started sandboxes to keep (1 to 256).
    pub size: u32,
    /// The backend, as in a sandbox's create. By default, `local`.
    #[serde(default)]
    pub backend: Option<crate::api::BackendChoice>,
    /// The snapshot store, as in a sandbox's create. By default, `local`.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Compress snapshots with zstd. By default, no.
    #[serde(default)]
    pub compress: bool,
    /// Keep this many deduplicated generations (a `remote:` store only).
    #[serde(default)]
    pub dedup_keep: Option<u32>,
    /// Write a generation after every command (50 kept unless
    /// `dedup_keep` says).
    #[serde(default)]
    pub checkpoint_each_exec: bool,
    /// The egress policy every member is held to (no secrets).
    #[serde(default)]
    pub egress: Option<crate::api_egress::CreateEgress>,
    /// The backend kind's settings, beside the fields above (`image`,
    /// `memory`, ...; see `GET /v1/backends`).
    #[serde(flatten)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

/// A pool as listed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Pool {
    /// Its name.
    pub name: String,
    /// How many started sandboxes it keeps.
    pub size: u32,
    /// Members started and open in this server, ready for a claim at
    /// once.
    pub ready: u32,
    /// Members on record (ready, being opened, or being made).
    pub members: u32,
    /// Members being made now.
    pub making: u32,
    /// The template, as stored (`backend`, `snapshot`, ...).
    pub template: serde_json::Value,
}

/// `DELETE /v1/pools/{pool}`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PoolRemoved {
    /// How many members were shut down and forgotten.
    pub members_removed: u32,
}
