//! `berth ls` and `berth fork`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::snapshot::DedupRecord;

use super::*;

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
        "ISOLATION",
        "SNAPSHOT",
        "READY",
        "SNAPSHOT ID",
        "WHERE",
        "NODE",
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
            summary(&r.state.backend)
                .isolation
                .unwrap_or_else(|| "-".into()),
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
            summary(&r.state.backend).node.unwrap_or_else(|| "-".into()),
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
    let mut opts = named(&home).options(new, false, source.freeze, false);
    opts.progress = progress_bar();
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
        checkpoint_each_exec: false,
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
