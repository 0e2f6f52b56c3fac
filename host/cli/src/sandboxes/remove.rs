//! `berth rm` and `berth gc [--orphans]`: removing sandboxes and what they stored.

use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::snapshot::{DedupRecord, DeleteReport};

use super::*;

/// `berth rm NAME`: destroy what the sandbox owns — its container or
/// directory and, unless `keep_snapshot`, the snapshots Berth made for it —
/// and forget it (`NamedSandboxes::remove_locked`, which the server uses
/// too). With `keep_snapshot` the workspace is stopped (persisted) first
/// and the snapshot stays.
pub async fn rm(name: &str, force: bool, keep_snapshot: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let lock = lock(&home, name).await?;
    let path = state_path(&home, name)?;
    let options = berth::sandbox::RemoveOptions {
        force,
        keep_snapshot,
    };
    let removal = match named(&home).remove_locked(&lock, name, options).await {
        Ok(removal) => removal,
        Err(e) => {
            use berth::sandbox::RemoveError as E;
            let next = match &e {
                E::OrphansRemain { .. } => format!(
                    "these orphans are still there; `berth rm {name}` again once their engine answers, or `berth rm --force {name}` forgets them"
                ),
                E::Shutdown { .. } => format!(
                    "the state file {} was kept; fix the problem or use `berth rm --force {name}`",
                    path.display()
                ),
                E::DeleteSnapshot { .. } => format!(
                    "`berth rm {name}` again deletes it, `berth rm --force {name}` forgets it"
                ),
                _ => String::new(),
            };
            let e = anyhow::Error::new(e);
            bail!("{e:#}\n{next}");
        }
    };
    for removed in &removal.orphans_removed {
        println!("removed orphan {removed}");
    }
    for forced in &removal.forced {
        eprintln!("berth: {forced} (removing anyway: --force)");
    }
    if let Some(report) = &removal.deleted {
        print_deleted(&removal.snapshot, report);
    }
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
/// more — the snapshot files each kind names (the local kind's archives in
/// `$BERTH_HOME/snapshots`) and generations that
/// `berth rm` kept for forks that are gone since — listed, and deleted
/// with `yes`.
pub async fn gc_orphans(yes: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let dry_run = !yes;
    let known = saved_sandboxes(&home);
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut found = 0usize;
    let mut failed = false;
    // Snapshot files no sandbox uses: each kind's provider says which.
    for orphan in named(&home).orphan_files(&known) {
        found += 1;
        if !dry_run {
            std::fs::remove_file(&orphan.path)
                .with_context(|| format!("deleting {}", orphan.path.display()))?;
        }
        println!("{verb} {} ({})", orphan.path.display(), orphan.reason);
    }
    // Generations kept for forks: collected once no known fork starts
    // from them.
    let bases: std::collections::BTreeSet<String> = known
        .iter()
        .filter_map(|s| DedupRecord::from_fields(&s.state.snapshot.fields)?.base)
        .map(|g| g.index.clone())
        .collect();
    let client = client(&home);
    let (leftovers, unreadable) = named(&home).leftovers();
    for p in unreadable {
        eprintln!("berth: skipping unreadable leftover record {}", p.display());
    }
    for leftover in leftovers {
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
                        named(&home).forget_leftover(&leftover)?;
                    } else {
                        named(&home).record_leftover(&remaining)?;
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
