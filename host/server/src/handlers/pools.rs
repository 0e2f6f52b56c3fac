//! Warm pools: making, listing and removing them, and claims (a create
//! that names `from_pool`).

use std::sync::Arc;

use berth::backend::BackendSettings;
use berth::sandbox::{Claim, ClaimRequest, ClaimSource, PoolError, PoolSpec};
use futures::FutureExt;

use super::record;
use super::Answer;
use crate::api;
use crate::api_pools;
use crate::http::{json_reply, read_json, ApiError, Reply};
use crate::pool_keeper::pool_view;
use crate::route::Call;
use crate::Inner;

/// How many members a claim tries before it creates cold (each one that
/// fails its hand-over is removed and replaced).
const MEMBERS_TRIED: usize = 3;

pub(crate) fn list(inner: Arc<Inner>, _: Call) -> Answer {
    async move {
        inner.pools.start();
        let pools: Vec<api_pools::Pool> = inner
            .pools
            .pools()
            .list()
            .iter()
            .map(|p| pool_view(&inner.pools, &p.spec, p.members.len()))
            .collect();
        Ok(json_reply(&pools))
    }
    .boxed()
}

pub(crate) fn get(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        inner.pools.start();
        let pools = inner.pools.pools();
        let spec = pools.load(call.param(0))?;
        let members = pools.member_names(&spec.name).len();
        Ok(json_reply(&pool_view(&inner.pools, &spec, members)))
    }
    .boxed()
}

pub(crate) fn create(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let body: api_pools::CreatePool = read_json(call.body, inner.limits.json_body).await?;
        let spec = spec_of(body)?;
        inner.pools.pools().create(&spec).await?;
        inner.pools.start();
        inner.pools.wake();
        Ok(json_reply(&pool_view(&inner.pools, &spec, 0)))
    }
    .boxed()
}

pub(crate) fn remove(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let pool = call.param(0).to_string();
        inner.pools.release(&pool);
        let removed = inner.pools.pools().remove(&pool).await?;
        Ok(json_reply(&api_pools::PoolRemoved {
            members_removed: removed as u32,
        }))
    }
    .boxed()
}

/// The library's pool template for `body`.
fn spec_of(body: api_pools::CreatePool) -> Result<PoolSpec, ApiError> {
    let backend = match body.backend {
        None => serde_json::Value::Null,
        Some(api::BackendChoice::Kind(kind)) => serde_json::Value::String(kind),
        Some(api::BackendChoice::Settings(settings)) => serde_json::Value::Object(settings),
    };
    let mut settings = BackendSettings::from_json(backend, berth::backend::local::KIND)
        .map_err(|e| ApiError::bad_request(format!("`backend`: {e}")))?;
    for (key, value) in body.settings {
        settings.add(key, value);
    }
    let mut spec = PoolSpec::new(body.name, body.size, &settings);
    if let Some(snapshot) = body.snapshot {
        spec.snapshot = snapshot;
    }
    spec.compression = body.compress;
    spec.checkpoint_each_exec = body.checkpoint_each_exec;
    spec.dedup_keep = body.dedup_keep.or(body
        .checkpoint_each_exec
        .then(|| berth::sandbox::default_keep(true)));
    if let Some(egress) = &body.egress {
        spec.egress = Some(egress.settings().map_err(ApiError::bad_request)?);
    }
    Ok(spec)
}

/// A create that named `from_pool`: a warm member handed over, else a cold
/// create from the template. Only `name` and `workspace` may be given.
pub(crate) async fn claim(
    inner: &Arc<Inner>,
    body: api::CreateSandbox,
    pool: String,
) -> Result<Reply, ApiError> {
    let others = [
        ("backend", body.backend.is_some()),
        ("snapshot", body.snapshot.is_some()),
        ("compress", body.compress),
        ("dedup_keep", body.dedup_keep.is_some()),
        ("checkpoint_each_exec", body.checkpoint_each_exec),
        ("start", body.start == Some(false)),
        ("egress", body.egress.is_some()),
    ];
    let given: Vec<&str> = others
        .iter()
        .filter(|(_, given)| *given)
        .map(|(name, _)| *name)
        .chain(body.settings.keys().map(String::as_str))
        .collect();
    if !given.is_empty() {
        return Err(ApiError::bad_request(format!(
            "a claim from pool {pool:?} takes the pool's template: give only `name` and `workspace` (given: {})",
            given.join(", ")
        )));
    }
    let named = inner.open.named();
    let mut request = ClaimRequest::new(body.name);
    if let Some(v) = body.workspace {
        request.workspace = super::workspace_of(v, named.home())?;
    }
    let pools = inner.pools.pools();
    let spec = pools.load(&pool)?;
    inner.pools.start();
    let claim = take(inner, &spec, &request).await?;
    inner.pools.wake();
    let mut reply = record(&claim.record);
    reply.claimed = Some(match &claim.source {
        ClaimSource::Member(member) => {
            tracing::info!(pool, member, sandbox = %claim.record.name, "claimed a warm pool member");
            api::Claimed {
                pool,
                warm: true,
                reason: None,
            }
        }
        ClaimSource::Cold(reason) => {
            tracing::info!(pool, sandbox = %claim.record.name, reason, "claim created cold");
            api::Claimed {
                pool,
                warm: false,
                reason: Some(reason.clone()),
            }
        }
    });
    inner.open.insert(&claim.record, claim.sandbox)?;
    Ok(json_reply(&reply))
}

/// The claim itself: ready members in turn, then a cold create.
async fn take(
    inner: &Arc<Inner>,
    spec: &PoolSpec,
    request: &ClaimRequest,
) -> Result<Claim, PoolError> {
    let pools = inner.pools.pools();
    let pool = spec.name.as_str();
    if let Some(reason) = request.needs_cold_create()? {
        return pools.claim_cold(spec, request, &reason).await;
    }
    let mut tried = 0;
    while tried < MEMBERS_TRIED {
        let Some(ready) = inner.pools.take(pool) else {
            break;
        };
        let member = ready.member.clone();
        match pools.hand_over(pool, &member, ready.sandbox, request).await {
            Ok((record, sandbox)) => {
                return Ok(Claim {
                    record,
                    sandbox,
                    source: ClaimSource::Member(member),
                })
            }
            Err(e) if e.member_gone => {}
            Err(e) if e.member_spoiled => {
                tracing::warn!(pool, member, error = %e.error, "a pool member failed its hand-over; removing it");
                let pools = pools.clone();
                let pool = pool.to_string();
                tokio::spawn(async move { pools.remove_member(&pool, &member).await });
                tried += 1;
            }
            Err(e) => return Err(e.error),
        }
    }
    let (_, making) = inner.pools.counts(pool);
    let reason = if tried > 0 {
        format!("{tried} warm sandboxes failed their hand-over")
    } else if making > 0 {
        format!("the pool had no warm sandbox ready ({making} being made)")
    } else {
        "the pool had no warm sandbox ready".to_string()
    };
    pools.claim_cold(spec, request, &reason).await
}
