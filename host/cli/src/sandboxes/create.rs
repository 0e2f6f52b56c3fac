//! `berth create`: a sandbox from a manifest, on a backend, with a snapshot store.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use berth::sandbox::CreateRequest;
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
    /// Snapshot store, KIND[:ARGUMENT]: noop, local, local:DIR,
    /// plugin:MANIFEST, remote:MANIFEST, or a kind this command was built
    /// with.
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
    /// --snapshot-generation K` restores an older one. By default 1, or
    /// 50 with `--checkpoint each-exec` (its last 50 steps).
    #[arg(long, requires = "dedup")]
    keep: Option<u32>,
    /// With --dedup: also keep every generation written within this long
    /// of the newest (e.g. `1h`, `30m`), whatever --keep says.
    #[arg(long, requires = "dedup", value_parser = crate::server::parse_duration_arg)]
    keep_within: Option<std::time::Duration>,
    /// With --dedup: `each-exec` writes a generation after every command
    /// (`berth history NAME` lists them with their command lines; `berth
    /// rewind NAME K` goes back). By default, off: only stops write one.
    #[arg(long, requires = "dedup", value_parser = ["each-exec", "off"])]
    checkpoint: Option<String>,
    /// The backend and its settings.
    #[command(flatten)]
    backend: super::backend_args::BackendArgs,
    /// Claim it from this warm pool (`berth pool create`): a started
    /// sandbox of the pool's template is handed over at once, with
    /// --workspace applied; an empty pool creates it cold from the
    /// template instead (and says so). The template decides the backend,
    /// the snapshot store and the rest.
    #[arg(long, value_name = "POOL", conflicts_with_all = ["snapshot_id", "compress", "dedup", "no_freeze", "no_start"])]
    from_pool: Option<String>,
    /// Do not pause the container while `stop` reads the workspace (by
    /// default it is paused, so the snapshot is one moment of it).
    #[arg(long)]
    no_freeze: bool,
    /// Create without starting.
    #[arg(long)]
    no_start: bool,
    /// What the sandbox may reach beyond itself.
    #[command(
        flatten,
        next_help_heading = "Egress (default deny, enforced on the host)"
    )]
    egress: super::egress::CreateEgressArgs,
    /// Print the state as JSON.
    #[arg(long)]
    json: bool,
}

/// The workspace manifest of `--workspace`, host paths resolved from its
/// directory, and whether it names a root.
fn workspace(path: Option<&Path>) -> anyhow::Result<(WorkspaceSpec, bool)> {
    let Some(p) = path else {
        return Ok((WorkspaceSpec::default(), false));
    };
    let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
    let names_root = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .is_some_and(|v| v.get("root").is_some());
    let mut spec = serde_json::from_str::<WorkspaceSpec>(&text)
        .with_context(|| format!("{} is not a valid workspace manifest", p.display()))?;
    let dir = std::path::absolute(p)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    spec.resolve_host_paths(&dir);
    Ok((spec, names_root))
}

pub async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (workspace, names_root) = workspace(args.workspace.as_deref())?;
    if let Some(pool) = &args.from_pool {
        if args.backend.given()
            || args.snapshot != "local"
            || args.checkpoint.is_some()
            || args.egress.settings()?.is_some()
        {
            anyhow::bail!("--from-pool takes the pool's template: give only the name and --workspace (`berth pool ls --json` shows the template)");
        }
        return super::pools::claim(&home, pool, &args.name, workspace, args.json).await;
    }
    let mut request = CreateRequest::new(
        args.name.clone(),
        super::backend_args::backend_settings(&args.backend)?,
    );
    request.workspace = workspace;
    request.snapshot = args.snapshot.clone();
    request.snapshot_id = args.snapshot_id.clone();
    request.compression = args.compress;
    request.freeze = !args.no_freeze;
    let checkpointing = args.checkpoint.as_deref() == Some("each-exec");
    let keep = args
        .keep
        .unwrap_or_else(|| berth::sandbox::default_keep(checkpointing));
    request.dedup_keep = args.dedup.then_some(keep);
    request.keep_within = args.keep_within;
    request.checkpoint_each_exec = checkpointing;
    request.start = !args.no_start;
    request.egress = args.egress.settings()?;
    let named = named(&home);
    let (saved, _sandbox) = named
        .create(request, |options| options.progress = progress_bar())
        .await?;
    if names_root {
        let summary = named
            .client()
            .backend_summary(&saved.state.backend)
            .unwrap_or_default();
        if let Some(dir) = summary.workspace_dir {
            eprintln!(
                "berth: note: the {} backend keeps the workspace in {}, not at the manifest's root {} (commands run there; -o root_dir=DIR chooses the directory, the Docker backend honours the root)",
                saved.state.backend.kind,
                dir.display(),
                saved.state.manifest.root
            );
        }
    }
    if checkpointing {
        eprintln!(
            "berth: {} checkpoints after every command and keeps its newest {keep} generations{} \
             (`berth history {}`; --keep N and --keep-within D choose)",
            args.name,
            args.keep_within
                .map(|d| format!(
                    " and every one written within {} of the newest",
                    humantime_secs(d)
                ))
                .unwrap_or_default(),
            args.name
        );
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

/// `d` as a person writes it (`90s`, `30m`, `2h`, `1d`).
fn humantime_secs(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    match secs {
        s if s > 0 && s % 86400 == 0 => format!("{}d", s / 86400),
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}
