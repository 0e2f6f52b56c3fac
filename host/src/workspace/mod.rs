//! Workspaces: the manifest ([`spec`]), its entries as an archive
//! ([`entries`]), and workspace archives with the hydrate policy
//! ([`archive`]).

pub mod archive;
pub mod entries;
mod entry_path;
mod limits;
pub mod spec;
pub mod tree;

pub use archive::{ArchiveError, ArchiveStats};
pub use limits::ArchiveLimits;
pub use spec::{Entry, WorkspaceSpec};
