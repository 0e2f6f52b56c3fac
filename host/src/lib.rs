//! Berth: a sandbox runtime for AI-agent workspaces whose snapshot storage
//! backends are WebAssembly component plugins.
//!
//! The crate is organised by concept (see `docs/ARCHITECTURE.md`):
//!
//! - [`snapshot_id`]: the id grammar every store shares.
//! - [`store_error`]: what a snapshot store can say went wrong.
//! - [`remote_client`]: the [`RemoteSnapshotClient`] trait (a byte store keyed
//!   by snapshot id) and its native directory implementation.
//! - [`snapshot`]: the [`SandboxSnapshot`] trait (where one sandbox's archive
//!   lives) and the native `noop`, `local` and `remote` snapshots.
//! - [`plugin`]: the wasmtime host that loads store plugins, grants them
//!   capabilities and adapts them to the two traits.
//! - [`conformance`]: the contract's clauses as executable checks, run
//!   against native and Wasm stores alike.

mod archive_dir;
pub mod backend;
mod byte_pipe;
pub mod conformance;
pub mod plugin;
mod plugin_error;
mod random_id;
pub mod remote_client;
pub mod sandbox;
pub mod snapshot;
pub mod snapshot_id;
pub mod store_error;
pub mod workspace;

pub use remote_client::RemoteSnapshotClient;
pub use snapshot::SandboxSnapshot;
pub use snapshot_id::{SnapshotId, SnapshotIdError};
pub use store_error::{StorageError, StoreError};
