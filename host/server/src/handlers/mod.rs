//! The endpoints, by what they touch.

pub(crate) mod egress;
pub(crate) mod exec;
pub(crate) mod files;
pub(crate) mod history;
pub(crate) mod processes;
pub(crate) mod sandboxes;

use crate::api::SandboxRecord;
use berth::sandbox::NamedSandbox;

/// A record on the wire.
pub(crate) fn record(r: &NamedSandbox) -> SandboxRecord {
    SandboxRecord {
        name: r.name.clone(),
        compression: r.compression,
        freeze: r.freeze,
        checkpoint_each_exec: r.checkpoint_each_exec,
        state: serde_json::to_value(&r.state).unwrap_or(serde_json::Value::Null),
    }
}
