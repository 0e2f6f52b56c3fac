//! What `berth rm` had to leave in a store because a fork still starts
//! from it: one file per removed snapshot under `$BERTH_HOME/leftovers`,
//! holding the snapshot's state (its store and the kept generations), so
//! `berth gc --orphans` can delete those once no known fork needs them.

use std::path::{Path, PathBuf};

use anyhow::Context;
use berth::sandbox::{SnapshotState, StateFile};

fn dir(home: &Path) -> PathBuf {
    home.join("leftovers")
}

fn path(home: &Path, snapshot: &SnapshotState) -> PathBuf {
    dir(home).join(format!("{}.json", snapshot.id))
}

/// Records (or replaces) what is left of `snapshot`.
pub fn record(home: &Path, snapshot: &SnapshotState) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(snapshot)?;
    StateFile::new(path(home, snapshot))
        .write(&text)
        .context("recording what the removal left for forks")?;
    Ok(())
}

/// Forgets `snapshot`: nothing of it is left.
pub fn forget(home: &Path, snapshot: &SnapshotState) -> anyhow::Result<()> {
    StateFile::new(path(home, snapshot)).remove()?;
    Ok(())
}

/// Every recorded leftover. An unreadable file is reported and skipped.
pub fn all(home: &Path) -> Vec<SnapshotState> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir(home)) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        match std::fs::read_to_string(&p)
            .ok()
            .and_then(|t| serde_json::from_str::<SnapshotState>(&t).ok())
        {
            Some(s) => out.push(s),
            None => eprintln!("berth: skipping unreadable leftover record {}", p.display()),
        }
    }
    out.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    out
}
