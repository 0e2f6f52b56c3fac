//! Listing, creating, inspecting, starting, stopping and removing
//! sandboxes.

use std::sync::Arc;

use berth::backend::BackendSettings;
use berth::sandbox::{CreateRequest, NamedSandbox, Sandbox, StartBranch, StateLock};
use bytes::Bytes;
use futures::FutureExt;

use super::record;
use crate::api;
use crate::http::{bytes_reply, json_reply, read_json, ApiError};
use crate::route::Call;
use crate::Inner;

pub(crate) use super::Answer;

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

pub(crate) fn openapi(inner: Arc<Inner>, _: Call) -> Answer {
    async move {
        let doc = crate::openapi::document(&inner.routes);
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
        let mut body: api::CreateSandbox = read_json(call.body, inner.limits.json_body).await?;
        if let Some(pool) = body.from_pool.take() {
            return super::pools::claim(&inner, body, pool).await;
        }
        let named = inner.open.named();
        let request = request_of(body, named.home())?;
        let (record_saved, sandbox) = named.create(request, |_| {}).await?;
        if sandbox.is_running() {
            // Kept open: the first command needs no resume and attach.
            inner.open.insert(&record_saved, sandbox)?;
        }
        Ok(json_reply(&record(&record_saved)))
    }
    .boxed()
}

/// `GET /v1/defaults`: the bounds new sandboxes get, read from the home's
/// `config.toml` now (an edit counts from the next create).
pub(crate) fn defaults(inner: Arc<Inner>, _: Call) -> Answer {
    async move {
        let client = inner.open.named().client();
        let home = client.home().to_path_buf();
        let defaults = client.host_defaults()?;
        let file = berth::backend::limits::HostDefaults::path(&home);
        Ok(json_reply(&api::HostDefaults {
            file_exists: file.exists(),
            file: file.display().to_string(),
            defaults: defaults
                .entries()
                .into_iter()
                .map(|e| api::HostDefault {
                    key: e.key.into(),
                    value: e.value,
                    from_file: e.from_file,
                    help: e.help.into(),
                })
                .collect(),
        }))
    }
    .boxed()
}

/// `GET /v1/backends`: the kinds this server creates, with their settings.
pub(crate) fn backends(inner: Arc<Inner>, _: Call) -> Answer {
    async move {
        let kinds: Vec<api::BackendKind> = inner
            .open
            .named()
            .client()
            .backend_settings_docs()
            .into_iter()
            .map(|(kind, docs)| api::BackendKind {
                kind,
                settings: docs
                    .into_iter()
                    .map(|d| api::BackendSetting {
                        key: d.key.into(),
                        value: d.value.into(),
                        required: d.required,
                        help: d.help.into(),
                        aliases: d.aliases.iter().map(|a| a.to_string()).collect(),
                    })
                    .collect(),
            })
            .collect();
        Ok(json_reply(&kinds))
    }
    .boxed()
}

/// The library's create request for `body`: the backend's settings from
/// `backend` and the fields beside it, the workspace's host paths
/// resolved from `home`.
fn request_of(body: api::CreateSandbox, home: &std::path::Path) -> Result<CreateRequest, ApiError> {
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
    let mut request = CreateRequest::new(body.name, settings);
    if let Some(v) = body.workspace {
        request.workspace = super::workspace_of(v, home)?;
    }
    if let Some(snapshot) = body.snapshot {
        request.snapshot = snapshot;
    }
    request.compression = body.compress;
    request.checkpoint_each_exec = body.checkpoint_each_exec;
    request.dedup_keep = body.dedup_keep.or(body
        .checkpoint_each_exec
        .then(|| berth::sandbox::default_keep(true)));
    request.start = body.start.unwrap_or(true);
    if let Some(egress) = &body.egress {
        request.egress = Some(egress.settings().map_err(ApiError::bad_request)?);
    }
    Ok(request)
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
pub(crate) async fn resumed(
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
pub(crate) fn saved<T>(
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
        let options = named.options(&body.name, false, source.freeze, false);
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
