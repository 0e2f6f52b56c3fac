//! Background processes.

use std::sync::Arc;

use berth::sandbox::{BackgroundProcess, DetachRequest};
use futures::future::BoxFuture;
use futures::FutureExt;

use super::exec::{ndjson, signal_of};
use crate::api;
use crate::http::{json_reply, read_json, ApiError, Reply};
use crate::route::Call;
use crate::Inner;

type Answer = BoxFuture<'static, Result<Reply, ApiError>>;

fn wire(p: BackgroundProcess) -> api::Process {
    api::Process {
        id: p.id,
        command: p.command,
        state: serde_json::to_value(p.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        started_ms: p.started_ms,
        exit_code: p.exit_code,
        pid: p.pid,
    }
}

pub(crate) fn list(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let list = open.sandbox.read().await.processes().list().await?;
        Ok(json_reply(&list.into_iter().map(wire).collect::<Vec<_>>()))
    }
    .boxed()
}

pub(crate) fn get(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let p = open
            .sandbox
            .read()
            .await
            .processes()
            .get(call.param(1))
            .await?;
        Ok(json_reply(&wire(p)))
    }
    .boxed()
}

pub(crate) fn detach(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let body: api::DetachBody = read_json(call.body, inner.limits.json_body).await?;
        let mut request = DetachRequest::new(body.command);
        if let Some(id) = body.name {
            request = request.name(id);
        }
        if let Some(ring) = body.log_ring {
            request = request.log_ring(ring);
        }
        // The record of it is part of the state: written under the lock.
        let (_lock, open) = inner.open.get_locked(&name).await?;
        let mut sandbox = open.sandbox.write().await;
        let started = sandbox.detach(request).await;
        inner.open.saved(&name, &open, &sandbox)?;
        Ok(json_reply(&wire(started?)))
    }
    .boxed()
}

pub(crate) fn logs(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let tail = call.number("tail")?;
        let framing = match call.query("framing").ok() {
            None | Some("json-lines") => api::Framing::JsonLines,
            Some("binary") => api::Framing::Binary,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "`framing` is `json-lines` or `binary`, not {other:?}"
                )))
            }
        };
        let process = open
            .sandbox
            .read()
            .await
            .processes()
            .logs(call.param(1), call.flag("follow"), tail)
            .await?;
        Ok(ndjson(framing, None, process, None, None, None))
    }
    .boxed()
}

pub(crate) fn kill(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let (name, id) = (call.param(0).to_string(), call.param(1).to_string());
        let body: api::SignalBody = read_json(call.body, inner.limits.json_body).await?;
        let signal = signal_of(&body)?;
        let open = inner.open.get(&name).await?;
        open.sandbox
            .read()
            .await
            .processes()
            .kill(&id, signal)
            .await?;
        Ok(json_reply(&api::Done { ok: true }))
    }
    .boxed()
}

pub(crate) fn wait(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        // Not holding the sandbox while waiting: a stop may come meanwhile.
        let waiter = {
            let sandbox = open.sandbox.read().await;
            sandbox.processes().wait(call.param(1)).await
        };
        Ok(json_reply(&api::Waited { exit_code: waiter? }))
    }
    .boxed()
}
