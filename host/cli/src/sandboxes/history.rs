//! `berth history|diff|rewind|checkpoint`, and the checkpoint
//! `--checkpoint each-exec` takes after every command: a deduplicated
//! snapshot's generations for people. Each goes through the server when
//! one runs (it holds sandboxes open: a checkpoint there costs what
//! changed, not a resume); else it runs in this process under the
//! sandbox's lock.

use std::process::ExitCode;

use anyhow::Context;
use berth::snapshot::GenerationNote;
use berth_server::{Checkpointed, Diff, History, Note, Rewound};
use http::Method;

use super::*;
use crate::server::Remote;

/// What a sandbox's state file holds (its record and options).
type Saved = berth::sandbox::NamedSandbox;

/// A resumed sandbox (not attached: nothing is started) and its record.
async fn resumed(home: &Path, name: &str) -> anyhow::Result<(StateLock, Saved, berth::Sandbox)> {
    let lock = lock(home, name).await?;
    let saved = load(home, name)?;
    let sandbox = resume(home, &saved).await?;
    Ok((lock, saved, sandbox))
}

fn when(secs: Option<u64>) -> String {
    let Some(secs) = secs else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(secs);
    let ago = now.saturating_sub(secs);
    match ago {
        0..=59 => format!("{ago}s ago"),
        60..=3599 => format!("{}m ago", ago / 60),
        3600..=86399 => format!("{}h ago", ago / 3600),
        _ => format!("{}d ago", ago / 86400),
    }
}

/// `berth history NAME`: through the server when one runs (it may hold the
/// sandbox open), else read from the state here.
pub async fn history(name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let history: History = match Remote::for_home(&home).await {
        Some(remote) => {
            let path = format!("{}/history", through_server::sandbox_path(name));
            remote.json(Method::GET, &path, None).await?
        }
        None => {
            let saved = load(&home, name)?;
            let sandbox = resume(&home, &saved).await?;
            History::from(sandbox.history()?)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&history)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = crate::table::Table::new(&[
        "GEN", "WHEN", "WHAT", "ADDED", "CHANGED", "REMOVED", "STORED",
    ]);
    for g in &history.generations {
        let mark = if history.current == Some(g.number) {
            "*"
        } else {
            ""
        };
        let what = match &g.note {
            Some(Note::Exec {
                command,
                exit_code,
                duration_ms,
                ..
            }) => format!("exec {command:?} → {exit_code} ({duration_ms} ms)"),
            Some(Note::Checkpoint { message: Some(m) }) => format!("checkpoint {m:?}"),
            Some(Note::Checkpoint { message: None }) => "checkpoint".into(),
            Some(Note::BeforeRewind { to }) => format!("saved before rewind to {to}"),
            Some(Note::Other) => "-".into(),
            None => "stop".into(),
        };
        let (a, c, r) = match &g.changes {
            Some(ch) => (
                ch.added.to_string(),
                ch.changed.to_string(),
                ch.removed.to_string(),
            ),
            None => ("?".into(), "?".into(), "?".into()),
        };
        table.row(vec![
            format!("{}{mark}", g.number),
            when(g.created),
            what,
            a,
            c,
            r,
            g.stored_bytes
                .map(human_bytes)
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

/// `berth diff NAME A B`.
pub async fn diff(name: &str, older: u64, newer: u64, json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let diff: Diff = match Remote::for_home(&home).await {
        Some(remote) => {
            let path = format!(
                "{}/diff?from={older}&to={newer}",
                through_server::sandbox_path(name)
            );
            remote.json(Method::GET, &path, None).await?
        }
        None => {
            let saved = load(&home, name)?;
            let sandbox = resume(&home, &saved).await?;
            Diff::from(sandbox.diff(older, newer).await?)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
        return Ok(ExitCode::SUCCESS);
    }
    for p in &diff.paths {
        let sign = match p.change.as_str() {
            "added" => "+",
            "removed" => "-",
            _ => "M",
        };
        if p.what.is_empty() {
            println!("{sign} {} ({})", p.path, p.kind);
        } else {
            println!("{sign} {} ({}: {})", p.path, p.kind, p.what.join(", "));
        }
    }
    let c = diff.counts();
    eprintln!(
        "{older} → {newer}: {} added, {} modified, {} removed",
        c.added, c.changed, c.removed
    );
    Ok(ExitCode::SUCCESS)
}

/// `berth rewind NAME K`: through the server when one runs (which then
/// opens the rewound sandbox afresh), else here under the sandbox's lock.
pub async fn rewind(name: &str, number: u64) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let before = match Remote::for_home(&home).await {
        Some(remote) => {
            let path = format!("{}/rewind", through_server::sandbox_path(name));
            let rewound: Rewound = remote
                .json(
                    Method::POST,
                    &path,
                    Some(serde_json::json!({ "generation": number })),
                )
                .await
                .with_context(|| format!("rewinding {name} to generation {number}"))?;
            rewound.saved_as
        }
        None => rewind_here(&home, name, number).await?,
    };
    println!(
        "rewound {name} to generation {number}; the workspace as it was is generation {before} (`berth rewind {name} {before}` undoes this)"
    );
    Ok(ExitCode::SUCCESS)
}

async fn rewind_here(home: &Path, name: &str, number: u64) -> anyhow::Result<u64> {
    let (_lock, mut saved, mut sandbox) = resumed(home, name).await?;
    let attached = if saved.state.workspace_root_ready {
        sandbox.attach().await.map(|_| ())
    } else {
        Ok(())
    };
    let result = match attached {
        Ok(()) => sandbox.rewind(number).await,
        Err(e) => Err(e),
    };
    saved.state = sandbox.state();
    save(home, &saved)?;
    result.with_context(|| format!("rewinding {name} to generation {number}"))
}

/// `berth checkpoint NAME [-m MESSAGE]`: a generation of the running
/// workspace now, through the server when one runs.
pub async fn checkpoint(name: &str, message: Option<String>) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let generation = take_checkpoint(&home, name, message).await?;
    println!("{name}: generation {generation}");
    Ok(ExitCode::SUCCESS)
}

/// A checkpoint of `name` now, through the server when one runs; its
/// generation.
pub(super) async fn take_checkpoint(
    home: &Path,
    name: &str,
    message: Option<String>,
) -> anyhow::Result<u64> {
    Ok(match Remote::for_home(home).await {
        Some(remote) => {
            let path = format!("{}/checkpoint", through_server::sandbox_path(name));
            let taken: Checkpointed = remote
                .json(
                    Method::POST,
                    &path,
                    Some(serde_json::json!({ "message": message })),
                )
                .await?;
            taken.generation.unwrap_or_default()
        }
        None => {
            let (_lock, mut saved, mut sandbox) = resumed(home, name).await?;
            sandbox.history()?;
            sandbox.attach().await?;
            let result = sandbox
                .checkpoint(GenerationNote::Checkpoint { message })
                .await;
            saved.state = sandbox.state();
            save(home, &saved)?;
            result?;
            sandbox.history()?.current.unwrap_or_default()
        }
    })
}

/// After a command of a sandbox created with `--checkpoint each-exec`:
/// a generation recording it. A failure is reported, not fatal to the
/// command's own exit code.
pub async fn checkpoint_after(
    name: &str,
    command: &str,
    exit_code: i32,
    started: std::time::SystemTime,
    duration: std::time::Duration,
) {
    let run = async {
        let home = berth_home()?;
        let (_lock, mut saved, mut sandbox) = resumed(&home, name).await?;
        if !saved.checkpoint_each_exec {
            return Ok(());
        }
        sandbox.attach().await?;
        let note = GenerationNote::Exec {
            command: command.to_string(),
            exit_code,
            started_ms: started
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            duration_ms: duration.as_millis() as u64,
        };
        let result = sandbox.checkpoint(note).await;
        saved.state = sandbox.state();
        save(&home, &saved)?;
        result?;
        Ok::<(), anyhow::Error>(())
    };
    if let Err(e) = run.await {
        eprintln!("berth: the checkpoint after this command failed: {e:#}");
    }
}
