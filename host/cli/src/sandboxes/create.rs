//! `berth create`: a sandbox from a manifest, on a backend, with a snapshot store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::backend::docker::swarm::SwarmOptions;
use berth::backend::docker::{DockerOptions, PullPolicy};
use berth::backend::local::LocalOptions;
use berth::sandbox::{BackendSpec, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use clap::Args;

use super::*;

/// `berth create`.
#[derive(Args)]
pub struct CreateArgs {
    /// Sandbox name ([A-Za-z0-9._-], up to 128 characters).
    name: String,
    /// Workspace manifest (JSON: root, environment, entries).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Snapshot store: noop, local, local:DIR, plugin:MANIFEST, remote:MANIFEST.
    #[arg(long, default_value = "local")]
    snapshot: String,
    /// Snapshot id (default: derived from the session id, stable).
    #[arg(long)]
    snapshot_id: Option<String>,
    /// Compress snapshots with zstd (a deduplicated snapshot compresses
    /// its chunks itself).
    #[arg(long)]
    compress: bool,
    /// Store incremental, deduplicated generations (remote:MANIFEST only):
    /// a stop uploads what changed, not the whole workspace.
    #[arg(long)]
    dedup: bool,
    /// Generations to keep (with --dedup); `berth start NAME
    /// --snapshot-generation K` restores an older one.
    #[arg(long, default_value_t = 1, requires = "dedup")]
    keep: u32,
    /// With --dedup: also keep every generation written within this long
    /// of the newest (e.g. `1h`, `30m`), whatever --keep says.
    #[arg(long, requires = "dedup", value_parser = crate::server::parse_duration_arg)]
    keep_within: Option<std::time::Duration>,
    /// With --dedup: `each-exec` writes a generation after every command
    /// (`berth history NAME` lists them with their command lines; `berth
    /// rewind NAME K` goes back). By default, off: only stops write one.
    #[arg(long, requires = "dedup", value_parser = ["each-exec", "off"])]
    checkpoint: Option<String>,
    /// Backend: local (not isolated), docker, or swarm (placed by a
    /// Docker swarm across its nodes; --engine names a manager, and the
    /// snapshot must be a shared store).
    #[arg(long, default_value = "local", value_parser = ["local", "docker", "swarm"])]
    backend: String,
    /// Host directory for the workspace (local backend).
    #[arg(long)]
    root_dir: Option<PathBuf>,
    /// Image (docker backend); pulled from its registry as --pull says.
    #[arg(long)]
    image: Option<String>,
    /// The Docker engine (docker backend): an endpoint (unix:///PATH,
    /// tcp://HOST:PORT with DOCKER_TLS_VERIFY and DOCKER_CERT_PATH) or a
    /// Docker context's name. By default, what the docker CLI would use
    /// (DOCKER_HOST, DOCKER_CONTEXT, the current context, the local
    /// socket); the sandbox remembers it.
    #[arg(long)]
    engine: Option<String>,
    /// Run every command as its own docker exec instead of through
    /// Berth's in-container agent (docker backend; no persistent sessions).
    #[arg(long)]
    no_agent: bool,
    /// When to pull the image (docker backend): missing, always or never.
    #[arg(long, default_value = "missing")]
    pull: PullPolicy,
    /// Memory limit, e.g. 512MiB (docker backend).
    #[arg(long, value_parser = crate::plugin::parse_size_arg)]
    memory: Option<u64>,
    /// CPU limit, e.g. 1.5 (docker backend).
    #[arg(long)]
    cpus: Option<f64>,
    /// A placement constraint (swarm backend; repeatable), as `docker
    /// service create --constraint` takes it: node.labels.pool==gpu.
    #[arg(long = "constraint")]
    constraints: Vec<String>,
    /// Memory the swarm reserves on the node, e.g. 2GiB (swarm backend).
    #[arg(long, value_parser = crate::plugin::parse_size_arg)]
    reserve_memory: Option<u64>,
    /// CPUs the swarm reserves on the node, e.g. 0.5 (swarm backend).
    #[arg(long)]
    reserve_cpus: Option<f64>,
    /// Pids limit (swarm backend; default 1024).
    #[arg(long)]
    pids_limit: Option<i64>,
    /// How long a start waits for the swarm to run the sandbox, e.g. 60s
    /// or 2m (swarm backend; default 60s).
    #[arg(long, value_parser = crate::server::parse_duration_arg)]
    placement_timeout: Option<std::time::Duration>,
    /// Network mode (docker backend; default none).
    #[arg(long)]
    network: Option<String>,
    /// Container port to publish on 127.0.0.1 (docker backend; repeatable).
    #[arg(long = "expose")]
    expose: Vec<String>,
    /// Use this existing container; Berth will not remove it (docker backend).
    #[arg(long)]
    container: Option<String>,
    /// A `docker run` argument from the supported subset (repeatable; use
    /// --run-arg=--cap-add --run-arg=NET_ADMIN).
    #[arg(long = "run-arg", allow_hyphen_values = true)]
    run_args: Vec<String>,
    /// Do not pause the container while `stop` reads the workspace (by
    /// default it is paused, so the snapshot is one moment of it).
    #[arg(long)]
    no_freeze: bool,
    /// Create without starting.
    #[arg(long)]
    no_start: bool,
    /// Print the state as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let path = state_path(&home, &args.name)?;
    let _lock = lock(&home, &args.name).await?;
    if path.exists() {
        bail!(
            "a sandbox named {:?} exists already; `berth rm {}` first or pick another name",
            args.name,
            args.name
        );
    }
    let mut names_root = false;
    let workspace = match &args.workspace {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            names_root = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .is_some_and(|v| v.get("root").is_some());
            let mut spec = serde_json::from_str::<WorkspaceSpec>(&text)
                .with_context(|| format!("{} is not a valid workspace manifest", p.display()))?;
            let dir = std::path::absolute(p)?
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default();
            spec.resolve_host_paths(&dir);
            spec
        }
        None => WorkspaceSpec::default(),
    };
    let mut snapshot = parse_snapshot(&args.snapshot, &home)?;
    if args.dedup {
        if !matches!(snapshot, SnapshotSpec::Remote { .. }) {
            bail!(
                "--dedup needs a remote store (--snapshot remote:MANIFEST), not {:?}",
                args.snapshot
            );
        }
        snapshot = snapshot.deduplicated(args.keep);
    }
    let client = client(&home);
    let opts = options(&home, &args.name, args.compress, !args.no_freeze);
    let backend = match args.backend.as_str() {
        berth::backend::docker::KIND => {
            let image = args
                .image
                .clone()
                .context("--backend docker needs --image")?;
            let mut o = DockerOptions::new(image)
                .run_args(args.run_args.clone())
                .pull(args.pull)
                .agent(!args.no_agent);
            if let Some(e) = &args.engine {
                o = o.engine(e.clone());
            }
            if let Some(m) = args.memory {
                o = o.memory(m as i64);
            }
            if let Some(c) = args.cpus {
                o = o.cpus(c);
            }
            if let Some(n) = &args.network {
                o = o.network(n.clone());
            }
            if !args.expose.is_empty() && args.network.as_deref().unwrap_or("none") == "none" {
                bail!(
                    "--expose {} needs a network the engine can publish on, and the sandbox has none (the default, --network none): \
                     make one (`docker network create NET`) and add --network NET, or leave --expose out",
                    args.expose.join(",")
                );
            }
            for p in &args.expose {
                o = o.expose(p.clone());
            }
            if let Some(c) = &args.container {
                o = o.existing_container(c.clone());
            }
            BackendSpec::new(o.pull_progress(pull_progress()))
        }
        berth::backend::docker::swarm::KIND => {
            let manager = args.engine.clone().context(
                "--backend swarm needs --engine MANAGER: a swarm manager's endpoint or Docker context",
            )?;
            let image = args
                .image
                .clone()
                .context("--backend swarm needs --image")?;
            if args.container.is_some() || !args.run_args.is_empty() || !args.expose.is_empty() {
                bail!("--container, --run-arg and --expose are docker-backend options; a swarm sandbox takes --memory, --cpus, --pids-limit, --reserve-memory, --reserve-cpus, --constraint and --network");
            }
            let mut o = SwarmOptions::new(manager, image).agent(!args.no_agent);
            if let Some(m) = args.memory {
                o = o.memory(m as i64);
            }
            if let Some(c) = args.cpus {
                o = o.cpus(c);
            }
            if let Some(p) = args.pids_limit {
                o = o.pids_limit(p);
            }
            if let Some(m) = args.reserve_memory {
                o = o.reserve_memory(m as i64);
            }
            if let Some(c) = args.reserve_cpus {
                o = o.reserve_cpus(c);
            }
            for c in &args.constraints {
                o = o.constraint(c.clone());
            }
            if let Some(n) = args.network.as_deref().filter(|n| *n != "none") {
                o = o.network(n);
            }
            if let Some(t) = args.placement_timeout {
                o = o.placement_timeout(t);
            }
            BackendSpec::new(o.placement_progress(placement_progress()))
        }
        berth::backend::local::KIND => {
            if args.image.is_some()
                || args.container.is_some()
                || !args.run_args.is_empty()
                || args.engine.is_some()
            {
                bail!(
                    "--image, --engine, --container and --run-arg need --backend docker (or swarm)"
                );
            }
            let mut local = LocalOptions::default();
            if let Some(d) = &args.root_dir {
                local = local.root_dir(std::path::absolute(d)?);
            }
            BackendSpec::new(local)
        }
        other => bail!(
            "--backend {other:?} is not a backend this berth knows; it knows {}",
            client.backend_kinds().join(", ")
        ),
    };
    let mut spec = SandboxSpec::new(workspace)
        .snapshot(snapshot)
        .backend(backend)
        .options(opts);
    if let Some(id) = &args.snapshot_id {
        spec = spec.snapshot_id(id.clone());
    }
    let mut sandbox = client.create(spec).await?;
    if let Some(window) = args.keep_within {
        sandbox.keep_generations_within(Some(window))?;
    }
    let started = if args.no_start {
        Ok(())
    } else {
        sandbox.start().await.map(|_| ())
    };
    let mut saved = Saved {
        name: args.name.clone(),
        compression: args.compress,
        freeze: !args.no_freeze,
        checkpoint_each_exec: args.checkpoint.as_deref() == Some("each-exec"),
        state: sandbox.state(),
    };
    if let Err(e) = started {
        // Not registered: what the start made is removed, so the same
        // create can be run again. Kept only if that removal fails.
        let name = &args.name;
        return Err(
            match named(&home)
                .settle_failed_create(&mut saved, &mut sandbox, &e)
                .await
            {
                Ok(()) => anyhow::Error::new(e).context(format!(
                    "{name} was not created: it did not start, and what it had made was removed"
                )),
                Err(cleanup) => anyhow::Error::new(e).context(format!(
                    "{name} did not start, and removing what it had made failed too ({:#}); it is kept: `berth rm {name}` removes it",
                    anyhow::Error::new(cleanup)
                )),
            },
        );
    }
    save(&home, &saved)?;
    if names_root && saved.state.backend.kind == berth::backend::local::KIND {
        if let Ok(local) = saved
            .state
            .backend
            .decode::<berth::backend::local::LocalState>()
        {
            eprintln!(
                "berth: note: the local backend keeps the workspace in {}, not at the manifest's root {} (commands run there; --root-dir chooses the directory, the Docker backend honours the root)",
                local.root_dir.display(),
                saved.state.manifest.root
            );
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&saved.state)?);
    } else {
        println!(
            "created {} (session {}, snapshot {} {}){}",
            args.name,
            saved.state.session_id,
            saved.state.snapshot.kind,
            saved.state.snapshot.id,
            if args.no_start { "" } else { ", started" }
        );
    }
    Ok(ExitCode::SUCCESS)
}
