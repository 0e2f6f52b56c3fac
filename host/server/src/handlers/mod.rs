//! The endpoints, by what they touch.

pub(crate) mod egress;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod forks;
pub(crate) mod history;
pub(crate) mod pools;
pub(crate) mod processes;
pub(crate) mod sandboxes;

use crate::api::SandboxRecord;
use crate::http::{ApiError, Reply};
use berth::sandbox::NamedSandbox;
use berth::WorkspaceSpec;

/// What a handler returns.
pub(crate) type Answer = futures::future::BoxFuture<'static, Result<Reply, ApiError>>;

/// A create's `workspace`: a manifest, its host paths resolved from
/// `home`.
pub(crate) fn workspace_of(
    value: serde_json::Value,
    home: &std::path::Path,
) -> Result<WorkspaceSpec, ApiError> {
    let mut w: WorkspaceSpec = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!(
            "`workspace` is not a valid workspace manifest: {e}"
        ))
    })?;
    w.resolve_host_paths(home);
    Ok(w)
}

/// A record on the wire.
pub(crate) fn record(r: &NamedSandbox) -> SandboxRecord {
    SandboxRecord {
        name: r.name.clone(),
        compression: r.compression,
        freeze: r.freeze,
        checkpoint_each_exec: r.checkpoint_each_exec,
        state: serde_json::to_value(&r.state).unwrap_or(serde_json::Value::Null),
        claimed: None,
    }
}
