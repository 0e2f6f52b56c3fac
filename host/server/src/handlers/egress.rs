//! `/v1/sandboxes/{name}/egress`: a sandbox's egress policy and its
//! connection log; a `PUT` replaces the policy while it runs.

use std::sync::Arc;

use futures::FutureExt;

use super::sandboxes::{resumed, saved, Answer};
use crate::api_egress::{EgressConnection, EgressReport, EgressRules, EgressSecret};
use crate::http::{json_reply, read_json, ApiError};
use crate::route::Call;
use crate::Inner;

fn no_policy(name: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{name} has no egress policy: its network is its backend's. A policy is given at create (`egress` in POST /v1/sandboxes)"
    ))
}

async fn report(sandbox: &berth::Sandbox) -> EgressReport {
    let settings = sandbox
        .state()
        .egress
        .map(|e| e.settings)
        .unwrap_or_default();
    let status = sandbox.egress_status().await.ok().flatten();
    EgressReport {
        policy: EgressRules::of(&settings.policy),
        secrets: settings.secrets.iter().map(EgressSecret::of).collect(),
        running: status.is_some(),
        connections: status
            .as_ref()
            .map(|s| s.connections.iter().map(EgressConnection::of).collect())
            .unwrap_or_default(),
        dropped: status.as_ref().map_or(0, |s| s.dropped),
        open: status.as_ref().map_or(0, |s| s.open),
        rss_bytes: status.as_ref().map_or(0, |s| s.rss_bytes),
    }
}

/// `GET`: the policy and the log.
pub(crate) fn get(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let (_lock, r, sandbox) = resumed(&inner, &name).await?;
        if r.state.egress.is_none() {
            return Err(no_policy(&name));
        }
        Ok(json_reply(&report(&sandbox).await))
    }
    .boxed()
}

/// `PUT`: a new policy, from the next connection.
pub(crate) fn put(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let body: EgressRules = read_json(call.body, inner.limits.json_body).await?;
        let policy = body.policy().map_err(ApiError::bad_request)?;
        let (_lock, mut r, mut sandbox) = resumed(&inner, &name).await?;
        if r.state.egress.is_none() {
            return Err(no_policy(&name));
        }
        let result = sandbox.set_egress_policy(policy).await;
        saved(&inner, &mut r, &sandbox, result)?;
        Ok(json_reply(&report(&sandbox).await))
    }
    .boxed()
}
