//! Listing, creating, inspecting, starting, stopping and removing
//! sandboxes.

use std::sync::Arc;

use berth::backend::docker::swarm::SwarmOptions;
use berth::backend::docker::DockerOptions;
use berth::backend::local::LocalOptions;
use berth::sandbox::{
    BackendSpec, NamedSandbox, Sandbox, SandboxSpec, SnapshotSpec, StartBranch, StateLock,
};
use berth::WorkspaceSpec;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;

use super::record;
use crate::api;
use crate::http::{bytes_reply, json_reply, read_json, ApiError, Reply};
use crate::routes::Call;
use crate::Inner;

type Answer = BoxFuture<'static, Result<Reply, ApiError>>;

pub(crate) fn version(_: Arc<Inner>, _: Call) -> Answer {
    async move {
        Ok(json_reply(&api::Version {
            api: api::API_VERSION,
            berth: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            environment: crate::environment_fingerprint(),
            build: crate::build_identity(),
        }))
    }
    .boxed()
}

pub(crate) fn openapi(_: Arc<Inner>, _: Call) -> Answer {
    async move {
        let doc = crate::openapi();
        Ok(bytes_reply(
            Bytes::from(serde_json::to_vec_pretty(&doc).unwrap_or_default()),
            "application/json",
        ))
    }
    .boxed()
}

pub(crate) fn list(inner: Arc<Inner>, _: Call) -> Answer {
    async move {
        let named = inner.open.named();
        let (rows, _) = named.list();
        let summary = |b: &berth::sandbox::BackendState| {
            named.client().backend_summary(b).unwrap_or_default()
        };
        let rows: Vec<api::SandboxSummary> = rows
            .iter()
            .map(|r| api::SandboxSummary {
                name: r.name.clone(),
                backend: r.state.backend.kind.clone(),
                snapshot: r.state.snapshot.kind.clone(),
                snapshot_id: r.state.snapshot.id.to_string(),
                ready: r.state.workspace_root_ready,
                location: summary(&r.state.backend).location,
            })
            .collect();
        Ok(json_reply(&rows))
    }
    .boxed()
}

pub(crate) fn inspect(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let r = inner.open.named().load(call.param(0))?;
        Ok(json_reply(&record(&r)))
    }
    .boxed()
}

pub(crate) fn create(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let body: api::CreateSandbox = read_json(call.body, inner.limits.json_body).await?;
        let named = inner.open.named();
        let name = body.name.clone();
        let _lock = named.lock(&name).await?;
        if named.read_text(&name)?.is_some() {
            return Err(berth::sandbox::NamedSandboxError::Exists { name }.into());
        }
        let spec = spec_of(
            &body,
            named.home(),
            named.options(&name, body.compress, true),
        )?;
        let mut sandbox = named.client().create(spec).await.map_err(ApiError::from)?;
        let started = if body.start.unwrap_or(true) {
            sandbox.start().await.map(|_| ())
        } else {
            Ok(())
        };
        let mut r = NamedSandbox {
            checkpoint_each_exec: false,
            name: name.clone(),
            compression: body.compress,
            freeze: true,
            state: sandbox.state(),
        };
        if let Err(e) = started {
            // Not registered: what the start made is removed, so the same
            // request can be sent again; kept only if that removal fails.
            let kept = named.settle_failed_create(&mut r, &mut sandbox, &e).await;
            let mut error = ApiError::from(e);
            error.message = match kept {
                Ok(()) => format!(
                    "{name} was not created: it did not start ({}), and what it had made was removed",
                    error.message
                ),
                Err(cleanup) => format!(
                    "{name} did not start ({}), and removing what it had made failed too ({}); it is kept: remove it (DELETE /v1/sandboxes/{name})",
                    error.message,
                    crate::http::chain(&cleanup)
                ),
            };
            return Err(error);
        }
        named.save(&r)?;
        Ok(json_reply(&record(&r)))
    }
    .boxed()
}

fn spec_of(
    body: &api::CreateSandbox,
    home: &std::path::Path,
    options: berth::sandbox::SandboxOptions,
) -> Result<SandboxSpec, ApiError> {
    let workspace = match &body.workspace {
        Some(v) => {
            let mut w: WorkspaceSpec = serde_json::from_value(v.clone()).map_err(|e| {
                ApiError::bad_request(format!(
                    "`workspace` is not a valid workspace manifest: {e}"
                ))
            })?;
            w.resolve_host_paths(home);
            w
        }
        None => WorkspaceSpec::default(),
    };
    let mut snapshot =
        SnapshotSpec::parse_choice(body.snapshot.as_deref().unwrap_or("local"), home)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(keep) = body.dedup_keep {
        if !matches!(snapshot, SnapshotSpec::Remote { .. }) {
            return Err(ApiError::bad_request(format!(
                "`dedup_keep` needs a remote store (`snapshot`: remote:MANIFEST), not {:?}",
                body.snapshot.as_deref().unwrap_or("local")
            )));
        }
        snapshot = snapshot.deduplicated(keep.max(1));
    }
    let kind = body
        .backend
        .as_deref()
        .unwrap_or(berth::backend::local::KIND);
    let docker_only = body.image.is_some()
        || body.pull.is_some()
        || body.engine.is_some()
        || body.network.is_some()
        || !body.expose.is_empty()
        || body.memory.is_some()
        || body.cpus.is_some()
        || !body.constraints.is_empty()
        || body.reserve_memory.is_some()
        || body.reserve_cpus.is_some()
        || body.pids_limit.is_some()
        || body.placement_timeout_secs.is_some();
    let backend = match kind {
        berth::backend::docker::KIND => {
            let image = body
                .image
                .clone()
                .ok_or_else(|| ApiError::bad_request("backend docker needs `image`"))?;
            if !body.expose.is_empty() && body.network.as_deref().unwrap_or("none") == "none" {
                return Err(ApiError::bad_request(format!(
                    "`expose` {} needs a network the engine can publish on, and the sandbox has none (the default, network none): make one (`docker network create NET`) and pass `network`",
                    body.expose.join(",")
                )));
            }
            let mut o = DockerOptions::new(image).agent(body.agent.unwrap_or(true));
            if let Some(p) = &body.pull {
                o = o.pull(p.parse().map_err(|e: String| {
                    ApiError::bad_request(format!("`pull`: {e}"))
                })?);
            }
            if let Some(e) = &body.engine {
                o = o.engine(e.clone());
            }
            if let Some(m) = body.memory {
                o = o.memory(m as i64);
            }
            if let Some(c) = body.cpus {
                o = o.cpus(c);
            }
            if let Some(n) = &body.network {
                o = o.network(n.clone());
            }
            for p in &body.expose {
                o = o.expose(p.clone());
            }
            BackendSpec::new(o)
        }
        berth::backend::docker::swarm::KIND => {
            let image = body
                .image
                .clone()
                .ok_or_else(|| ApiError::bad_request("backend swarm needs `image`"))?;
            let manager = body.engine.clone().ok_or_else(|| {
                ApiError::bad_request(
                    "backend swarm needs `engine`: a swarm manager's endpoint or Docker context",
                )
            })?;
            if !body.expose.is_empty() {
                return Err(ApiError::bad_request(
                    "`expose` is a docker-backend option; a swarm sandbox publishes no port",
                ));
            }
            let mut o = SwarmOptions::new(manager, image).agent(body.agent.unwrap_or(true));
            if let Some(m) = body.memory {
                o = o.memory(m as i64);
            }
            if let Some(c) = body.cpus {
                o = o.cpus(c);
            }
            if let Some(p) = body.pids_limit {
                o = o.pids_limit(p);
            }
            if let Some(m) = body.reserve_memory {
                o = o.reserve_memory(m as i64);
            }
            if let Some(c) = body.reserve_cpus {
                o = o.reserve_cpus(c);
            }
            for c in &body.constraints {
                o = o.constraint(c.clone());
            }
            if let Some(n) = body.network.as_deref().filter(|n| *n != "none") {
                o = o.network(n);
            }
            if let Some(t) = body.placement_timeout_secs {
                o = o.placement_timeout(std::time::Duration::from_secs(t));
            }
            BackendSpec::new(o)
        }
        berth::backend::local::KIND if !docker_only => BackendSpec::new(LocalOptions::default()),
        berth::backend::local::KIND => {
            return Err(ApiError::bad_request(
                "`image`, `engine`, `network`, `expose`, `memory` and `cpus` need backend docker (or swarm); \
                 `constraints`, `reserve_memory`, `reserve_cpus`, `pids_limit` and `placement_timeout_secs` need backend swarm",
            ))
        }
        other => {
            return Err(ApiError::bad_request(format!(
                "backend {other:?} is not one this server knows (local, docker, swarm)"
            )))
        }
    };
    Ok(SandboxSpec::new(workspace)
        .snapshot(snapshot)
        .backend(backend)
        .options(options))
}

pub(crate) fn remove(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let options = berth::sandbox::RemoveOptions {
            force: call.flag("force"),
            keep_snapshot: call.flag("keep_snapshot"),
        };
        let named = inner.open.named();
        let lock = named.lock(&name).await?;
        inner.open.forget(&name);
        match named.remove_locked(&lock, &name, options).await {
            Ok(removal) => {
                for forced in &removal.forced {
                    tracing::warn!("removing {name}: {forced} (removed anyway: force)");
                }
                Ok(json_reply(&api::Done { ok: true }))
            }
            Err(e) => Err(e.into()),
        }
    }
    .boxed()
}

/// `name` resumed afresh for a lifecycle change, as the in-process CLI
/// does: its lock held (returned), the server's open copy forgotten.
async fn resumed(
    inner: &Inner,
    name: &str,
) -> Result<(StateLock, NamedSandbox, Sandbox), ApiError> {
    let named = inner.open.named();
    let lock = named.lock(name).await?;
    inner.open.forget(name);
    let r = named.load(name)?;
    let sandbox = named.resume(&r, |_| {}).await?;
    Ok((lock, r, sandbox))
}

/// Saves what `sandbox` now is into its record, whether `result` is a
/// success or not (what a failed change made stays reachable), then
/// returns `result`.
fn saved<T>(
    inner: &Inner,
    r: &mut NamedSandbox,
    sandbox: &Sandbox,
    result: Result<T, berth::SandboxError>,
) -> Result<T, ApiError> {
    r.state = sandbox.state();
    inner.open.named().save(r)?;
    Ok(result?)
}

pub(crate) fn start(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let (_lock, mut r, mut sandbox) = resumed(&inner, call.param(0)).await?;
        let result = sandbox.start().await;
        let branch = saved(&inner, &mut r, &sandbox, result)?;
        let lost = sandbox
            .background_not_restored()
            .iter()
            .map(|b| api::LostProcess {
                id: b.id.clone(),
                command: b.command.clone(),
            })
            .collect();
        let kind = match branch {
            StartBranch::Reuse => "reused",
            StartBranch::Attached => "attached",
            StartBranch::Restore | StartBranch::Rebuild { restored: true } => "restored",
            _ => "fresh",
        };
        Ok(json_reply(&api::Started {
            branch: branch.to_string(),
            kind: kind.to_string(),
            lost_background: lost,
            sandbox: record(&r),
        }))
    }
    .boxed()
}

pub(crate) fn stop(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let (_lock, mut r, mut sandbox) = resumed(&inner, call.param(0)).await?;
        let result = match sandbox.attach().await {
            Ok(_) => sandbox.stop().await,
            Err(e) => Err(e),
        };
        saved(&inner, &mut r, &sandbox, result)?;
        Ok(json_reply(&record(&r)))
    }
    .boxed()
}

pub(crate) fn fork(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let source_name = call.param(0).to_string();
        let body: api::ForkBody = read_json(call.body, inner.limits.json_body).await?;
        let named = inner.open.named();
        let _source_lock = named.lock(&source_name).await?;
        let _lock = named.lock(&body.name).await?;
        if named.read_text(&body.name)?.is_some() {
            return Err(berth::sandbox::NamedSandboxError::Exists { name: body.name }.into());
        }
        let source = named.load(&source_name)?;
        let client = named.client();
        let backend = client.backend_like(&source.state.backend)?;
        let options = named.options(&body.name, false, source.freeze);
        let mut sandbox = client
            .fork(&source.state, body.generation, None, backend, options)
            .await?;
        let started = if body.start.unwrap_or(true) {
            sandbox.start().await.map(|_| ())
        } else {
            Ok(())
        };
        let r = NamedSandbox {
            checkpoint_each_exec: false,
            name: body.name.clone(),
            compression: false,
            freeze: source.freeze,
            state: sandbox.state(),
        };
        // Saved even when start failed: what start made stays reachable.
        named.save(&r)?;
        started?;
        Ok(json_reply(&record(&r)))
    }
    .boxed()
}

pub(crate) fn shutdown(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let (_lock, mut r, mut sandbox) = resumed(&inner, call.param(0)).await?;
        let result = sandbox.shutdown().await;
        saved(&inner, &mut r, &sandbox, result)?;
        Ok(json_reply(&record(&r)))
    }
    .boxed()
}

pub(crate) fn ports(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let ports = open.sandbox.read().await.published_ports().await?;
        let ports: Vec<api::Port> = ports
            .into_iter()
            .map(|p| api::Port {
                port: p.port,
                address: p.address,
            })
            .collect();
        Ok(json_reply(&ports))
    }
    .boxed()
}
