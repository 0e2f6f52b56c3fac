//! `berth create|start|exec|stop|rm|ls|inspect|persist|hydrate|gc|fork`: sandboxes
//! kept by name as state files under `$BERTH_HOME`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use berth::backend::docker::{
    DockerOptions, DockerProvider, EngineChoice, PullPolicy, PullProgress,
};
use berth::backend::local::LocalOptions;
use berth::backend::ExecRequest;
use berth::sandbox::{
    BackendSpec, Progress, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SandboxState,
    SnapshotSpec, StateFile, StateLock, StateSink,
};
use berth::snapshot::{DedupRecord, DeleteReport};
use berth::workspace::WorkspaceSpec;
use berth::SnapshotId;
use clap::Args;

use crate::{leftovers, table};
use serde::{Deserialize, Serialize};

/// `$BERTH_HOME`, else `$XDG_DATA_HOME/berth`, else `~/.local/share/berth`.
pub fn berth_home() -> anyhow::Result<PathBuf> {
    if let Some(h) = std::env::var_os("BERTH_HOME") {
        return Ok(PathBuf::from(h));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return Ok(PathBuf::from(x).join("berth"));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".local/share/berth")),
        None => bail!("cannot find a home for berth's state: set BERTH_HOME"),
    }
}

/// What the CLI keeps per sandbox.
#[derive(Serialize, Deserialize)]
struct Saved {
    name: String,
    #[serde(default)]
    compression: bool,
    /// Pause the container while `stop` reads the workspace.
    #[serde(default = "yes")]
    freeze: bool,
    state: SandboxState,
}

fn yes() -> bool {
    true
}

fn state_path(home: &Path, name: &str) -> anyhow::Result<PathBuf> {
    SnapshotId::parse(name).with_context(|| format!("{name:?} is not a valid sandbox name"))?;
    Ok(home.join("sandboxes").join(format!("{name}.json")))
}

/// Takes sandbox `name`'s lock: lifecycle commands hold it from before they
/// read the state until after they wrote it, so parallel commands on one
/// sandbox see each other's work instead of racing.
async fn lock(home: &Path, name: &str) -> anyhow::Result<StateLock> {
    Ok(StateFile::new(state_path(home, name)?).lock().await?)
}

fn load(home: &Path, name: &str) -> anyhow::Result<Saved> {
    let path = state_path(home, name)?;
    let text = StateFile::new(&path).read()?.with_context(|| {
        format!(
            "no sandbox named {name:?} (looked for {}); see `berth ls`",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("state file {} is corrupt", path.display()))
}

/// Writes the state file atomically: temp file, fsync, rename.
fn save(home: &Path, saved: &Saved) -> anyhow::Result<()> {
    let path = state_path(home, &saved.name)?;
    StateFile::new(path).write(&serde_json::to_string_pretty(saved)?)?;
    Ok(())
}

/// Options for a CLI sandbox: the state file is rewritten (atomically)
/// whenever the lifecycle says a crash must not lose the moment.
fn options(home: &Path, name: &str, compression: bool, freeze: bool) -> SandboxOptions {
    let home = home.to_path_buf();
    let name = name.to_string();
    let sink = move |state: &SandboxState| {
        let saved = Saved {
            name: name.clone(),
            compression,
            freeze,
            state: state.clone(),
        };
        save(&home, &saved)
            .map_err(|e| Box::<dyn std::error::Error + Send + Sync>::from(format!("{e:#}")))
    };
    SandboxOptions {
        compression,
        freeze_during_stop: freeze,
        state_sink: Some(StateSink(std::sync::Arc::new(sink))),
        progress: progress_bar(),
        ..SandboxOptions::default()
    }
}

/// The client every command uses: sandboxes under `home`, image pulls
/// drawn on stderr.
fn client(home: &Path) -> SandboxClient {
    SandboxClient::builder(home)
        .backend_provider(DockerProvider::default().pull_progress(pull_progress()))
        .build()
}

/// How an image pull goes, on stderr: a bar of layers and bytes on a
/// terminal, as `docker run` draws it; elsewhere, one line when it ends.
fn pull_progress() -> PullProgress {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let bar = std::sync::OnceLock::<indicatif::ProgressBar>::new();
    let started = std::time::Instant::now();
    PullProgress(std::sync::Arc::new(move |status| {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        if status.finished {
            if let Some(bar) = bar.get() {
                bar.finish_and_clear();
            }
            eprintln!(
                "pulled {}: {} layer{}, {:.1} MiB in {:.1} s",
                status.image,
                status.layers,
                if status.layers == 1 { "" } else { "s" },
                mib(status.bytes_done),
                started.elapsed().as_secs_f64()
            );
            return;
        }
        if !terminal {
            return;
        }
        let bar = bar.get_or_init(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "pulling {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        });
        bar.set_message(format!(
            "{} ({}/{} layers)",
            status.image, status.layers_done, status.layers
        ));
        bar.set_length(status.bytes_total.max(status.bytes_done));
        bar.set_position(status.bytes_done);
    }))
}

/// A bytes-and-rate progress bar on stderr, when it is a terminal.
fn progress_bar() -> Option<Progress> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let bar = std::sync::Arc::new(bar);
    Some(Progress(std::sync::Arc::new(move |operation, bytes| {
        bar.set_message(operation);
        bar.set_position(bytes);
        bar.tick();
    })))
}

/// Takes the sandbox's lock, resumes it and attaches (restoring the
/// workspace if it is gone), saving what that changed even when it failed.
/// Returns the lock (still held) and the running sandbox.
async fn attach_locked(home: &Path, name: &str) -> anyhow::Result<(StateLock, Sandbox)> {
    let lock = lock(home, name).await?;
    let mut saved = load(home, name)?;
    let mut sandbox = resume(home, &saved).await?;
    let attached = sandbox.attach().await;
    saved.state = sandbox.state();
    save(home, &saved)?;
    attached?;
    Ok((lock, sandbox))
}

async fn resume(home: &Path, saved: &Saved) -> anyhow::Result<Sandbox> {
    let client = client(home);
    Ok(client
        .resume(
            saved.state.clone(),
            None,
            options(home, &saved.name, saved.compression, saved.freeze),
        )
        .await?)
}

/// Parses `noop`, `local`, `local:DIR`, `plugin:MANIFEST`, `remote:MANIFEST`.
fn parse_snapshot(s: &str, home: &Path) -> anyhow::Result<SnapshotSpec> {
    let abs = |p: &str| -> anyhow::Result<PathBuf> {
        std::path::absolute(p).with_context(|| format!("resolving {p}"))
    };
    Ok(match s.split_once(':') {
        None if s == "noop" => SnapshotSpec::Noop,
        None if s == "local" => SnapshotSpec::Local {
            base_dir: home.join("snapshots"),
        },
        Some(("local", dir)) => SnapshotSpec::Local {
            base_dir: abs(dir)?,
        },
        Some(("plugin", m)) => SnapshotSpec::Plugin { plugin: abs(m)? },
        Some(("remote", m)) => SnapshotSpec::Remote { plugin: abs(m)? },
        _ => bail!(
            "--snapshot {s:?}: use noop, local, local:DIR, plugin:MANIFEST or remote:MANIFEST"
        ),
    })
}

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
    /// Backend: local (not isolated) or docker.
    #[arg(long, default_value = "local", value_parser = ["local", "docker"])]
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
            for p in &args.expose {
                o = o.expose(p.clone());
            }
            if let Some(c) = &args.container {
                o = o.existing_container(c.clone());
            }
            BackendSpec::new(o.pull_progress(pull_progress()))
        }
        berth::backend::local::KIND => {
            if args.image.is_some()
                || args.container.is_some()
                || !args.run_args.is_empty()
                || args.engine.is_some()
            {
                bail!("--image, --engine, --container and --run-arg need --backend docker");
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
    let started = if args.no_start {
        Ok(())
    } else {
        sandbox.start().await.map(|_| ())
    };
    let saved = Saved {
        name: args.name.clone(),
        compression: args.compress,
        freeze: !args.no_freeze,
        state: sandbox.state(),
    };
    // Saved even when start failed: what start made (a container) stays
    // known, so `berth start` can retry and `berth rm` can clean it up.
    save(&home, &saved)?;
    if let Err(e) = started {
        return Err(anyhow::Error::new(e).context(format!(
            "{} was created but did not start; `berth start {}` retries, `berth rm {}` removes it",
            args.name, args.name, args.name
        )));
    }
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

/// `berth start`.
#[derive(Args)]
pub struct StartArgs {
    /// Sandbox name.
    name: String,
    /// Restore this generation of a deduplicated snapshot instead of the
    /// newest (see `berth inspect NAME` for the kept ones).
    #[arg(long)]
    snapshot_generation: Option<u64>,
    /// With --snapshot-generation: discard the live workspace (and its
    /// changes since the last stop) to restore the older generation.
    #[arg(long, requires = "snapshot_generation")]
    discard_workspace: bool,
    /// Move the sandbox to this Docker engine (an endpoint or a context)
    /// and restore its workspace there from its snapshot, which must be a
    /// shared (remote) store. If its old engine answers, the workspace is
    /// saved there first and the old container removed; if not, the old
    /// container is kept as an orphan (`berth ls`) that `berth rm` removes
    /// once that engine is back.
    #[arg(long, conflicts_with = "snapshot_generation")]
    engine: Option<String>,
}

pub async fn start(args: StartArgs) -> anyhow::Result<ExitCode> {
    let name = args.name.as_str();
    let home = berth_home()?;
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let mut sandbox = match &args.engine {
        Some(engine) => {
            let moved = client(&home)
                .resume_on_engine(
                    saved.state.clone(),
                    &EngineChoice::new(engine.clone()),
                    None,
                    options(&home, name, saved.compression, saved.freeze),
                )
                .await?;
            saved.state = moved.state();
            save(&home, &saved)?;
            for orphan in &saved.state.orphans {
                eprintln!(
                    "berth: the old engine did not answer ({}); its container stays as an orphan that `berth rm {name}` removes once that engine is back",
                    orphan.reason
                );
            }
            moved
        }
        None => resume(&home, &saved).await?,
    };
    if let Some(generation) = args.snapshot_generation {
        // Refuse before discarding anything.
        let record = DedupRecord::from_fields(&saved.state.snapshot.fields).with_context(|| {
            format!("{name}'s snapshot keeps one archive, not generations (create it with --dedup)")
        })?;
        if record.find(generation).is_none() {
            bail!(
                "generation {generation} of {name} is not kept (kept: {}); `berth create --keep N` keeps more",
                record.kept_numbers()
            );
        }
        if sandbox.state().workspace_root_ready {
            if !args.discard_workspace {
                bail!(
                    "{name}'s workspace is live; `berth stop {name}` saves it first, and `--discard-workspace` drops it to restore generation {generation}"
                );
            }
            let shut = sandbox.shutdown().await;
            saved.state = sandbox.state();
            save(&home, &saved)?;
            shut?;
        }
        sandbox.select_generation(generation)?;
    }
    let result = sandbox.start().await;
    saved.state = sandbox.state();
    save(&home, &saved)?;
    let branch = result?;
    println!("started {name}: {branch}");
    Ok(ExitCode::SUCCESS)
}

/// `berth exec`.
#[derive(Args)]
pub struct ExecArgs {
    /// Sandbox name.
    name: String,
    /// Timeout in seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Extra environment (KEY=VALUE, repeatable).
    #[arg(long = "env")]
    env: Vec<String>,
    /// Print the result as JSON instead of passing output through.
    #[arg(long)]
    json: bool,
    /// The command (joined with spaces and run by `sh -c`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (lock, sandbox) = attach_locked(&home, &args.name).await?;
    // The sandbox is up: commands on it may run in parallel.
    drop(lock);
    let mut request = ExecRequest::new(
        args.command.join(" "),
        Duration::from_secs_f64(args.timeout),
    );
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
        request.env.insert(k.to_string(), v.to_string());
    }
    let result = sandbox.exec(request).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        print!("{}", result.stdout);
        eprint!("{}", result.stderr);
        // The library's own notes (a timeout, the OOM killer) end stderr
        // without a newline.
        if !result.stderr.is_empty() && !result.stderr.ends_with('\n') {
            eprintln!();
        }
        if result.truncated {
            eprintln!(
                "berth: output truncated ({} stdout and {} stderr bytes dropped)",
                result.stdout_dropped, result.stderr_dropped
            );
        }
    }
    Ok(ExitCode::from(result.exit_code.clamp(0, 255) as u8))
}

/// `berth stop NAME`.
pub async fn stop(name: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let mut sandbox = resume(&home, &saved).await?;
    let result = match sandbox.attach().await {
        Ok(_) => sandbox.stop().await,
        Err(e) => Err(e),
    };
    saved.state = sandbox.state();
    save(&home, &saved)?;
    result?;
    let s = &saved.state.snapshot;
    match (&s.digest, s.size) {
        (Some(digest), Some(size)) => println!(
            "stopped {name}: workspace saved to snapshot {} ({}, {digest})",
            s.id,
            human_bytes(size)
        ),
        _ => println!(
            "stopped {name}: nothing saved (snapshot {} is {})",
            s.id, s.kind
        ),
    }
    if let Some(stats) = DedupRecord::from_fields(&s.fields).and_then(|d| d.last_stop) {
        println!(
            "generation {}: uploaded {} in {} ({} of {} new; {}% already stored)",
            stats.generation,
            human_bytes(stats.uploaded_bytes),
            count(stats.upload_calls as usize, "call"),
            stats.new_chunks,
            count(stats.chunks as usize, "chunk"),
            stats
                .dedup_ratio
                .parse::<f64>()
                .map(|r| format!("{:.1}", r * 100.0))
                .unwrap_or_else(|_| stats.dedup_ratio.clone())
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `1015 bytes`, `3.2 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return count(n as usize, "byte");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `berth rm NAME`: destroy what the sandbox owns — its container or
/// directory and, unless `keep_snapshot`, the snapshots Berth made for it —
/// and forget it. With `keep_snapshot` the workspace is stopped (persisted)
/// first and the snapshot stays.
pub async fn rm(name: &str, force: bool, keep_snapshot: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let path = state_path(&home, name)?;
    if !saved.state.orphans.is_empty() {
        let cleanup = client(&home).remove_orphans(&saved.state).await;
        saved.state = cleanup.state;
        save(&home, &saved)?;
        for removed in &cleanup.removed {
            println!("removed orphan {removed}");
        }
        if !cleanup.remaining.is_empty() {
            let why: Vec<String> = cleanup
                .remaining
                .iter()
                .map(|(what, e)| format!("{what}: {e}"))
                .collect();
            if !force {
                bail!(
                    "{}
these orphans are still there; `berth rm {name}` again once their engine answers, or `berth rm --force {name}` forgets them",
                    why.join("\n")
                );
            }
            eprintln!("berth: forgetting orphans (--force): {}", why.join("; "));
        }
    }
    let mut sandbox = resume(&home, &saved).await?;
    let closed = if keep_snapshot && sandbox.state().workspace_root_ready {
        sandbox.close().await
    } else {
        sandbox.shutdown().await
    };
    saved.state = sandbox.state();
    if let Err(e) = closed {
        let e = anyhow::Error::new(e);
        if !force {
            save(&home, &saved)?;
            bail!(
                "{e:#}\nthe state file {} was kept; fix the problem or use `berth rm --force {name}`",
                path.display()
            );
        }
        eprintln!("berth: {e:#} (removing anyway: --force)");
    }
    if !keep_snapshot {
        let snapshot = saved.state.snapshot.clone();
        match sandbox.delete_snapshot().await {
            Ok(report) => {
                print_deleted(&snapshot, &report);
                if !report.kept.is_empty() {
                    leftovers::record(&home, &sandbox.state().snapshot)?;
                }
            }
            Err(e) if force => {
                eprintln!(
                    "berth: deleting the snapshot failed: {:#} (removing anyway: --force; its objects stay in the store)",
                    anyhow::Error::new(e)
                )
            }
            Err(e) => {
                save(&home, &saved)?;
                bail!(
                    "deleting the snapshot failed: {:#}\nthe sandbox is shut down but its snapshot {} is still stored; `berth rm {name}` again deletes it, `berth rm --force {name}` forgets it",
                    anyhow::Error::new(e),
                    snapshot.id
                );
            }
        }
    }
    StateFile::new(&path).remove()?;
    println!("removed {name}");
    Ok(ExitCode::SUCCESS)
}

/// What deleting a snapshot did, in one line (and a line per kept object).
fn print_deleted(snapshot: &berth::sandbox::SnapshotState, report: &DeleteReport) {
    if let Some(why) = &report.unsupported {
        println!("kept snapshot {}: {why}", snapshot.id);
        return;
    }
    if report.deleted.is_empty() {
        if report.kept.is_empty() {
            println!("snapshot {}: nothing was stored", snapshot.id);
        }
    } else if snapshot.kind == "local" {
        println!(
            "deleted snapshot {} ({})",
            snapshot.id,
            report.deleted.join(", ")
        );
    } else {
        println!(
            "deleted snapshot {} from its store: {}",
            snapshot.id,
            count(report.deleted.len(), "object")
        );
    }
    for kept in &report.kept {
        println!(
            "kept {} ({}); `berth gc --orphans` deletes it once no fork needs it",
            kept.object, kept.why
        );
    }
}

/// `3 objects`, `1 object`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Every sandbox's saved state, by name.
fn saved_sandboxes(home: &Path) -> Vec<Saved> {
    let mut rows = Vec::new();
    if let Ok(rd) = std::fs::read_dir(home.join("sandboxes")) {
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "json") {
                match std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|t| serde_json::from_str::<Saved>(&t).ok())
                {
                    Some(s) => rows.push(s),
                    None => eprintln!("berth: skipping unreadable state file {}", p.display()),
                }
            }
        }
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// `berth ls`.
pub async fn ls(json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let rows = saved_sandboxes(&home);
    if json {
        let states: Vec<_> = rows
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "state": r.state}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&states)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = table::Table::new(&[
        "NAME",
        "BACKEND",
        "SNAPSHOT",
        "READY",
        "SNAPSHOT ID",
        "WHERE",
        "ORPHANS",
    ]);
    let client = client(&home);
    // Every backend's columns come from its provider's summary; a kind
    // this berth has no provider for shows `-`.
    let summary = |b: &berth::sandbox::BackendState| client.backend_summary(b).unwrap_or_default();
    for r in rows {
        let orphans: Vec<String> = r
            .state
            .orphans
            .iter()
            .map(|o| {
                let s = summary(&o.backend);
                format!(
                    "{} on {}",
                    s.instance.as_deref().unwrap_or("?"),
                    s.location.as_deref().unwrap_or("?")
                )
            })
            .collect();
        table.row(vec![
            r.name.clone(),
            r.state.backend.kind.clone(),
            r.state.snapshot.kind.clone(),
            if r.state.workspace_root_ready {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            r.state.snapshot.id.to_string(),
            summary(&r.state.backend)
                .location
                .unwrap_or_else(|| "-".into()),
            if orphans.is_empty() {
                "-".to_string()
            } else {
                orphans.join(", ")
            },
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

/// `berth inspect NAME`.
pub async fn inspect(name: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let saved = load(&home, name)?;
    println!("{}", saved.state.to_json()?);
    Ok(ExitCode::SUCCESS)
}

/// `berth persist NAME --out FILE`: the workspace as a tar file.
pub async fn persist(name: &str, out: &Path) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (_lock, sandbox) = attach_locked(&home, name).await?;
    let tmp = out.with_extension("partial");
    let mut file = tokio::fs::File::create(&tmp)
        .await
        .with_context(|| format!("creating {}", tmp.display()))?;
    let n = match sandbox.persist_workspace_to(&mut file).await {
        Ok(n) => n,
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(e).context("reading the workspace archive");
        }
    };
    file.sync_all().await?;
    tokio::fs::rename(&tmp, out).await?;
    println!("wrote {} ({n} bytes)", out.display());
    Ok(ExitCode::SUCCESS)
}

/// `berth hydrate NAME FILE`: extract a tar into the workspace, after the
/// whole archive passed the hydrate policy.
pub async fn hydrate(name: &str, file: &Path) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (_lock, sandbox) = attach_locked(&home, name).await?;
    let mut f = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let stats = sandbox
        .hydrate_workspace(&mut f)
        .await
        .with_context(|| format!("{} was not extracted into {name}", file.display()))?;
    println!(
        "extracted {} entries ({} bytes) into {name}",
        stats.entries, stats.bytes
    );
    Ok(ExitCode::SUCCESS)
}

/// `berth gc [NAME...] [--dry-run]`: collect the garbage of deduplicated
/// snapshots (all sandboxes with one when no name is given).
pub async fn gc(names: Vec<String>, dry_run: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let names = if names.is_empty() {
        saved_sandboxes(&home)
            .into_iter()
            .filter(|s| DedupRecord::from_fields(&s.state.snapshot.fields).is_some())
            .map(|s| s.name)
            .collect()
    } else {
        names
    };
    if names.is_empty() {
        println!(
            "no sandbox has a deduplicated snapshot: nothing to collect (`berth gc --orphans` looks for what removed sandboxes left)"
        );
    }
    let client = client(&home);
    let mut failed = false;
    for name in names {
        let _lock = lock(&home, &name).await?;
        let mut saved = load(&home, &name)?;
        match client.collect_garbage(&saved.state, None, dry_run).await {
            Ok((report, state)) => {
                let verb = if dry_run { "would delete" } else { "deleted" };
                println!(
                    "{name}: {verb} {} packs and {} indexes{}{}",
                    report.packs.len(),
                    report.indexes.len(),
                    if report.journal {
                        ", and an interrupted stop's journal"
                    } else {
                        ""
                    },
                    if report.pinned.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; kept generations {:?} (forks start from them)",
                            report.pinned
                        )
                    }
                );
                for object in report.packs.iter().chain(&report.indexes) {
                    println!("  {object}");
                }
                if !dry_run {
                    saved.state = state;
                    save(&home, &saved)?;
                }
            }
            Err(e) => {
                eprintln!("berth: gc {name}: {:#}", anyhow::Error::new(e));
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `berth gc --orphans [--yes]`: what no known sandbox references any
/// more — local archives in `$BERTH_HOME/snapshots` and generations that
/// `berth rm` kept for forks that are gone since — listed, and deleted
/// with `yes`.
pub async fn gc_orphans(yes: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let dry_run = !yes;
    let known = saved_sandboxes(&home);
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut found = 0usize;
    let mut failed = false;
    // Local archives: every file here is Berth's; those no sandbox's
    // snapshot names are orphans.
    let snapshots = home.join("snapshots");
    let owned: std::collections::BTreeSet<PathBuf> = known
        .iter()
        .filter(|s| s.state.snapshot.kind == "local")
        .filter_map(|s| {
            let base = s.state.snapshot.base_dir.as_ref()?;
            Some(base.join(format!("{}.tar", s.state.snapshot.id)))
        })
        .collect();
    if let Ok(rd) = std::fs::read_dir(&snapshots) {
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "tar") && p.is_file())
            .collect();
        files.sort();
        for file in files {
            if owned.contains(&file) {
                continue;
            }
            found += 1;
            if !dry_run {
                std::fs::remove_file(&file)
                    .with_context(|| format!("deleting {}", file.display()))?;
            }
            println!("{verb} {} (no sandbox uses it)", file.display());
        }
    }
    // Generations kept for forks: collected once no known fork starts
    // from them.
    let bases: std::collections::BTreeSet<String> = known
        .iter()
        .filter_map(|s| DedupRecord::from_fields(&s.state.snapshot.fields)?.base)
        .map(|g| g.index.clone())
        .collect();
    let client = client(&home);
    for leftover in leftovers::all(&home) {
        match client.collect_leftovers(&leftover, &bases, dry_run).await {
            Ok((report, remaining)) => {
                found += report.deleted.len();
                if !report.deleted.is_empty() {
                    println!(
                        "{verb} what removed snapshot {} left: {}",
                        leftover.id,
                        count(report.deleted.len(), "object")
                    );
                    for object in &report.deleted {
                        println!("  {object}");
                    }
                }
                for kept in &report.kept {
                    println!("kept {} ({})", kept.object, kept.why);
                }
                if !dry_run {
                    if report.kept.is_empty() {
                        leftovers::forget(&home, &leftover)?;
                    } else {
                        leftovers::record(&home, &remaining)?;
                    }
                }
            }
            Err(e) => {
                eprintln!(
                    "berth: gc --orphans: snapshot {}: {:#}",
                    leftover.id,
                    anyhow::Error::new(e)
                );
                failed = true;
            }
        }
    }
    if found == 0 {
        println!("no orphans: every stored snapshot belongs to a sandbox");
    } else if dry_run {
        println!("nothing was deleted; `berth gc --orphans --yes` deletes these");
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `berth fork NAME NEW [--generation K]`: a new sandbox starting from
/// NAME's newest generation (or generation K), sharing its chunks.
pub async fn fork(
    name: &str,
    new: &str,
    generation: Option<u64>,
    no_start: bool,
) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let _source_lock = lock(&home, name).await?;
    let _lock = lock(&home, new).await?;
    if state_path(&home, new)?.exists() {
        bail!("a sandbox named {new:?} exists already; pick another name");
    }
    let source = load(&home, name)?;
    let client = client(&home);
    let backend = client.backend_like(&source.state.backend)?;
    let opts = options(&home, new, false, source.freeze);
    let mut sandbox = client
        .fork(&source.state, generation, None, backend, opts)
        .await
        .with_context(|| format!("forking {name}"))?;
    let started = if no_start {
        Ok(())
    } else {
        sandbox.start().await.map(|_| ())
    };
    let saved = Saved {
        name: new.to_string(),
        compression: false,
        freeze: source.freeze,
        state: sandbox.state(),
    };
    save(&home, &saved)?;
    if let Err(e) = started {
        return Err(anyhow::Error::new(e).context(format!(
            "{new} was forked but did not start; `berth start {new}` retries, `berth rm {new}` removes it"
        )));
    }
    let base = DedupRecord::from_fields(&saved.state.snapshot.fields)
        .and_then(|d| d.base)
        .map(|g| {
            format!(
                "{name} generation {}{}",
                g.number,
                if generation.is_none() {
                    " (its newest)"
                } else {
                    ""
                }
            )
        })
        .unwrap_or_default();
    println!(
        "forked {new} from {base} (snapshot {}){}",
        saved.state.snapshot.id,
        if no_start { "" } else { ", started" }
    );
    Ok(ExitCode::SUCCESS)
}
