//! `berth start|exec|stop|persist|hydrate|inspect`: driving a sandbox.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::snapshot::DedupRecord;
use berth_docker::EngineChoice;
use clap::Args;

use super::*;

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
    if args.engine.is_none() && args.snapshot_generation.is_none() {
        if let Some(remote) = crate::server::Remote::for_home(&home).await {
            let started = through_server::start(&remote, name).await?;
            println!("started {name}: {}", started.branch);
            for lost in &started.lost_background {
                print_lost(&lost.id, &lost.command);
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let mut sandbox = match &args.engine {
        Some(engine) => {
            let client = client(&home);
            let options = options(&home, &saved);
            let state = saved.state.clone();
            let moved = match EngineChoice::new(engine.clone()).moved_state(&state.backend)? {
                Some(target) => client.move_to(state, target, None, options).await,
                None => client.resume(state, None, options).await,
            }
            .map_err(|e| {
                    let portable = matches!(e, berth::SandboxError::NotPortable { .. });
                    let e = anyhow::Error::new(e);
                    if portable {
                        e.context(format!(
                            "{name} stays where it is; a sandbox that moves is created with `berth create {name} --snapshot remote:MANIFEST` (e.g. the s3-store plugin)"
                        ))
                    } else {
                        e
                    }
                })?;
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
    for lost in sandbox.background_not_restored() {
        print_lost(&lost.id, &lost.command);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_lost(id: &str, command: &str) {
    eprintln!(
        "berth: background process {id} ({command}) did not come back: the sandbox's instance was re-created"
    );
}

fn refused_stop(name: &str, e: anyhow::Error) -> anyhow::Error {
    e.context(format!(
        "stopping {name} was refused to protect its snapshot; `berth start {name}` restores the snapshot into the sandbox"
    ))
}

/// `berth stop NAME`.
pub async fn stop(name: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    if let Some(remote) = crate::server::Remote::for_home(&home).await {
        let saved = through_server::stop(&remote, name).await.map_err(|e| {
            if through_server::is_code(&e, "lineage_mismatch") {
                refused_stop(name, e)
            } else {
                e
            }
        })?;
        print_stopped(name, &saved);
        return Ok(ExitCode::SUCCESS);
    }
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let mut sandbox = resume(&home, &saved).await?;
    let result = match sandbox.attach().await {
        Ok(_) => sandbox.stop().await,
        Err(e) => Err(e),
    };
    saved.state = sandbox.state();
    save(&home, &saved)?;
    if let Err(e) = result {
        let refused = matches!(e, berth::SandboxError::LineageMismatch { .. });
        let e = anyhow::Error::new(e);
        return Err(if refused { refused_stop(name, e) } else { e });
    }
    print_stopped(name, &saved);
    Ok(ExitCode::SUCCESS)
}

/// `berth shutdown NAME [--discard]`: save the workspace (unless
/// `discard`), then end the sandbox's instance. The sandbox stays.
pub async fn shutdown(name: &str, discard: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    if let Some(remote) = crate::server::Remote::for_home(&home).await {
        let ready = load(&home, name)?.state.workspace_root_ready;
        if ready && !discard {
            let saved = through_server::stop(&remote, name)
                .await
                .map_err(|e| refused_shutdown(name, e))?;
            print_stopped(name, &saved);
        }
        through_server::shutdown(&remote, name).await?;
        println!("shut down {name}; `berth start {name}` brings it back from its snapshot");
        return Ok(ExitCode::SUCCESS);
    }
    let _lock = lock(&home, name).await?;
    let mut saved = load(&home, name)?;
    let mut sandbox = resume(&home, &saved).await?;
    let save_first = saved.state.workspace_root_ready && !discard;
    // A stop that fails leaves the instance up: nothing is lost.
    let stopped = if save_first {
        match sandbox.attach().await {
            Ok(_) => sandbox.stop().await,
            Err(e) => Err(e),
        }
    } else {
        Ok(())
    };
    let result = match stopped {
        Ok(()) => sandbox.shutdown().await,
        Err(e) => Err(e),
    };
    saved.state = sandbox.state();
    save(&home, &saved)?;
    result.map_err(|e| refused_shutdown(name, anyhow::Error::new(e)))?;
    if save_first {
        print_stopped(name, &saved);
    }
    println!("shut down {name}; `berth start {name}` brings it back from its snapshot");
    Ok(ExitCode::SUCCESS)
}

fn refused_shutdown(name: &str, e: anyhow::Error) -> anyhow::Error {
    e.context(format!(
        "{name} was not shut down; `berth shutdown --discard {name}` ends it without saving its workspace"
    ))
}

/// What a stop saved, in a line or two.
fn print_stopped(name: &str, saved: &Saved) {
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
            "generation {}: read {} ({} unchanged, not read), uploaded {} in {} ({} of {} new; {}% already stored)",
            stats.generation,
            human_bytes(stats.read_bytes),
            count(stats.files_unchanged as usize, "file"),
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
}

/// `berth inspect NAME`.
pub async fn inspect(name: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let saved = load(&home, name)?;
    println!("{}", saved.state.to_json()?);
    Ok(ExitCode::SUCCESS)
}

/// `berth persist NAME --out FILE`: the workspace as a tar file. It is
/// written beside FILE under a hidden name and renamed into place once
/// complete, so FILE is never half-written; a failed or interrupted
/// persist removes the hidden file.
pub async fn persist(name: &str, out: &Path) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let file_name = out
        .file_name()
        .with_context(|| format!("--out {} does not name a file", out.display()))?;
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        bail!(
            "cannot write {}: the directory {} does not exist (create it first)",
            out.display(),
            dir.display()
        );
    }
    let (_lock, sandbox) = attach_locked(&home, name).await?;
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(file_name);
    hidden.push(".berth-partial");
    let temp = RemovedOnDrop(dir.join(hidden));
    let mut file = tokio::fs::File::create(&temp.0)
        .await
        .with_context(|| format!("cannot write {}", out.display()))?;
    let n = sandbox
        .persist_workspace_to(&mut file)
        .await
        .context("reading the workspace archive")?;
    file.sync_all()
        .await
        .with_context(|| format!("writing {}", out.display()))?;
    tokio::fs::rename(&temp.0, out)
        .await
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {} ({n} bytes)", out.display());
    Ok(ExitCode::SUCCESS)
}

/// A file removed when this is dropped, unless it was renamed away.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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
