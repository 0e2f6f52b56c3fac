//! Berth: a sandbox runtime for AI-agent workspaces whose snapshot storage
//! backends are WebAssembly component plugins.
//!
//! An agent works in a *sandbox*: a workspace where it runs shell commands.
//! A [`SandboxClient`] creates sandboxes from a [`SandboxSpec`] and resumes
//! them from their saved [`SandboxState`] (JSON); a [`Sandbox`] runs the
//! lifecycle — [`start`](Sandbox::start) (fresh, or restored from its
//! snapshot), [`exec`](Sandbox::exec), [`stop`](Sandbox::stop) (persist the
//! workspace, destroying nothing), [`shutdown`](Sandbox::shutdown). Where
//! the workspace lives is a [`Backend`]: the local one (a host directory, not
//! isolated), Docker (feature `docker`, on by default), or the embedder's
//! own. Where snapshots go is a [`SnapshotSpec`]: a host directory, a Wasm
//! plugin loaded by a [`PluginHost`] and granted only what its manifest
//! lists (outbound HTTP needs the feature `http`, on by default), any [`RemoteSnapshotClient`], or the embedder's own
//! [`SandboxSnapshot`].
//!
//! ```
//! use std::time::Duration;
//! use berth::{ExecRequest, SandboxClient, SandboxSpec, WorkspaceSpec};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?; let home = dir.path();
//! let client = SandboxClient::new(home); // workspaces, snapshots and state under `home`
//! let workspace: WorkspaceSpec =
//!     serde_json::from_str(r#"{"entries": {"task.md": {"type": "file", "content": "hi\n"}}}"#)?;
//! let mut sandbox = client.create(SandboxSpec::new(workspace)).await?;
//! sandbox.start().await?;
//! let result = sandbox
//!     .exec(ExecRequest::new("cat task.md", Duration::from_secs(10)))
//!     .await?;
//! assert_eq!(result.stdout, "hi\n");
//! sandbox.stop().await?; // the workspace is now in its snapshot
//! # Ok(()) }
//! ```
//!
//! The library needs a multi-threaded tokio runtime (the default of
//! `#[tokio::main]`). `examples/embed.rs` loads a plugin and resumes a
//! sandbox from its JSON; `docs/ARCHITECTURE.md` maps the modules and the
//! data paths of stop and resume.
//!
//! Modules, by concept:
//!
//! - [`sandbox`]: the lifecycle engine, its state and options.
//! - [`backend`]: the [`Backend`] trait, the local and Docker backends.
//! - [`workspace`]: workspace manifests and archives (the hydrate policy).
//! - [`snapshot`] and [`remote_client`]: where archives are kept.
//! - [`plugin`]: the wasmtime host that loads store plugins.
//! - [`conformance`]: the plugin contract's clauses as executable checks.
//! - [`snapshot_id`] and [`store_error`]: the id grammar and store errors.
//! - [`cleanup`]: what undoes a cancelled operation after its caller left.
//! - [`egress`]: what a sandbox may reach, enforced on the host by its
//!   egress daemon; [`programs`]: where Berth's own programs are.
#![deny(missing_docs)]
#![warn(unreachable_pub)]

pub mod allocator;
mod archive_dir;
pub mod backend;
pub mod byte_pipe;
mod capped_writer;
pub mod cleanup;
pub mod conformance;
pub mod egress;
/// The plugin contract's identity (re-exported by [`plugin`]).
use berth_base::contract;
pub mod error_text;
pub mod plugin;
mod plugin_error;
pub mod programs;
pub mod random_id;
pub use berth_registry as registry;
pub mod remote_client;
pub mod sandbox;
pub mod snapshot;
pub mod snapshot_id;
pub mod store_error;
pub use berth_base::units;
use berth_base::user_cache;
#[cfg(test)]
mod test_rng;
pub mod workspace;

pub use backend::{Backend, BackendError, BackendState, ExecRequest, ExecResult};
pub use plugin::{Plugin, PluginError, PluginHost, PluginManifest};
pub use remote_client::RemoteSnapshotClient;
pub use sandbox::{
    BackendSpec, DetachRequest, Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxSpec,
    SandboxState, SnapshotSpec, StartBranch,
};
pub use snapshot::SandboxSnapshot;
pub use snapshot_id::{SnapshotId, SnapshotIdError};
pub use store_error::{StorageError, StoreError};
pub use workspace::WorkspaceSpec;
