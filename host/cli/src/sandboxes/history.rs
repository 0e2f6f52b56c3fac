//! `berth history|diff|rewind`, and the checkpoint `--checkpoint each-exec`
//! takes after every command: a deduplicated snapshot's generations for
//! people. Each runs in this process under the sandbox's lock (a server,
//! if one runs, resumes sandboxes from the same state under the same lock).

use std::process::ExitCode;

use anyhow::Context;
use berth::snapshot::{ChangeKind, GenerationNote};

use super::*;

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

/// `berth history NAME`.
pub async fn history(name: &str, json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let saved = load(&home, name)?;
    let sandbox = resume(&home, &saved).await?;
    let history = sandbox.history().with_context(|| {
        format!("{name} keeps no history: create it with --dedup (and --keep N)")
    })?;
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
            Some(GenerationNote::Exec {
                command,
                exit_code,
                duration_ms,
                ..
            }) => format!("exec {command:?} → {exit_code} ({duration_ms} ms)"),
            Some(GenerationNote::BeforeRewind { to }) => format!("saved before rewind to {to}"),
            Some(_) => "-".into(),
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
    let saved = load(&home, name)?;
    let sandbox = resume(&home, &saved).await?;
    let diff = sandbox.diff(older, newer).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&diff)?);
        return Ok(ExitCode::SUCCESS);
    }
    for p in &diff.paths {
        let sign = match p.change {
            ChangeKind::Added => "+",
            ChangeKind::Removed => "-",
            ChangeKind::Modified => "M",
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

/// `berth rewind NAME K`.
pub async fn rewind(name: &str, number: u64) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (_lock, mut saved, mut sandbox) = resumed(&home, name).await?;
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
    save(&home, &saved)?;
    let before = result.with_context(|| format!("rewinding {name} to generation {number}"))?;
    println!(
        "rewound {name} to generation {number}; the workspace as it was is generation {before} (`berth rewind {name} {before}` undoes this)"
    );
    Ok(ExitCode::SUCCESS)
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
