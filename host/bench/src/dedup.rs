//! Deduplicated generations against whole archives: stops, restores, moves.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use berth::backend::local::LocalState;
use berth::sandbox::{
    BackendSpec, BackendState, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SnapshotSpec,
};
use berth::workspace::WorkspaceSpec;

/// Berth side by side with GNU tar, the docker CLI and boto3.
use super::*;

/// The state of a sandbox whose workspace is `src`, moved to a fresh root
/// (where a restore goes).
pub(super) fn moved_to(
    state: &berth::sandbox::SandboxState,
    root: &Path,
) -> anyhow::Result<berth::sandbox::SandboxState> {
    let mut moved = state.clone();
    let mut local: LocalState = moved.backend.decode()?;
    local.root_dir = root.to_path_buf();
    local.owned = true;
    moved.backend = BackendState::encode(berth::backend::local::KIND, &local)?;
    Ok(moved)
}

/// Writes dirty pages out, so one measurement does not pay for the
/// previous one's writeback (on this VM's disk that swings a 1 GiB
/// restore between 4 and 15 s).
pub(super) fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Times a restore of `state`'s snapshot into a fresh root.
pub(super) async fn timed_restore(
    client: &SandboxClient,
    state: &berth::sandbox::SandboxState,
    root: &Path,
) -> anyhow::Result<f64> {
    drop_dir(root);
    let mut sb = client
        .resume(moved_to(state, root)?, None, SandboxOptions::default())
        .await?;
    settle();
    let t = Instant::now();
    sb.start().await?;
    let secs = t.elapsed().as_secs_f64();
    sb.shutdown().await?;
    Ok(secs)
}

/// A local sandbox over the workspace `src` (never shut down: `src` stays).
pub(super) async fn sandbox_over(
    client: &SandboxClient,
    src: &Path,
    snapshot: SnapshotSpec,
) -> anyhow::Result<Sandbox> {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(snapshot)
                .backend(BackendSpec::new(
                    // Over a directory that holds the workspace already:
                    // no disk image can be mounted there.
                    berth::backend::local::LocalOptions::default()
                        .root_dir(src.to_path_buf())
                        .disk(berth::backend::limits::Bound::Unlimited),
                )),
        )
        .await?;
    sb.start().await?;
    Ok(sb)
}

/// A seed no earlier mutation of this bench used, so a change is never
/// content the workspace already held (which would deduplicate).
pub(super) fn fresh_seed() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(2, std::sync::atomic::Ordering::Relaxed) * 1_000_003
}

/// Rewrites `n` small files with new content (`total` bytes in all).
pub(super) fn touch_small_files(src: &Path, n: u64, total: u64, seed: u64) -> anyhow::Result<()> {
    let each = (total / n) as usize;
    let mut buf = vec![0u8; each];
    for i in 0..n {
        fill(&mut buf, seed + i);
        std::fs::write(src.join(format!("src/d{:03}/f{i}.txt", i % 200)), &buf)?;
    }
    Ok(())
}

/// Deduplicated stops against whole-tar stops through the same store, on
/// the bench workspace: the first (full) stop, then (a) no change, (b)
/// 1 MiB appended to a large file, (c) 1 MiB over 50 small files, (d) a
/// new 100 MiB file; and restores, without and with the host's pack cache.
pub(super) async fn dedup_rows(
    base: &Path,
    src: &Path,
    label: &str,
    store: SnapshotSpec,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let new_file_mib = if quick { 4 } else { 100 };
    let home = base.join(format!("dedup-home-{label}"));
    let uncached = crate::client_builder(&home).pack_cache(None).build();
    let cached = crate::client_builder(&home)
        .pack_cache(Some(berth::snapshot::PackCache::new(
            base.join(format!("pack-cache-{label}")),
            8 << 30,
        )))
        .build();
    let restore_root = base.join("dedup-restored");
    let scenarios = [
        "first full stop",
        "(a) no change",
        "(b) 1 MiB appended to a large file",
        "(c) 1 MiB over 50 small files",
        if quick {
            "(d) a new 4 MiB file"
        } else {
            "(d) a new 100 MiB file"
        },
    ];
    let mut whole_stop = vec![];
    let mut whole_restore = vec![];
    let mut stops: Vec<Vec<(f64, u64, u64)>> = vec![vec![]; scenarios.len()];
    let mut restores = vec![];
    let mut cached_restores = vec![];
    let mut checkpoints = vec![];
    for run in 0..runs {
        // A: today's whole-tar snapshot through the same store.
        let mut whole = sandbox_over(&uncached, src, store.clone()).await?;
        settle();
        let t = Instant::now();
        whole.stop().await?;
        whole_stop.push(t.elapsed().as_secs_f64());
        whole_restore.push(timed_restore(&uncached, &whole.state(), &restore_root).await?);

        // B: the deduplicated one, new each run (so its first stop is full).
        let client = if run == 0 { &cached } else { &uncached };
        let mut dedup = sandbox_over(client, src, store.clone().deduplicated(1)).await?;
        for (i, _) in scenarios.iter().enumerate() {
            match i {
                2 => {
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .open(src.join("large0.bin"))?;
                    let mut chunk = vec![0u8; 1 << 20];
                    fill(&mut chunk, fresh_seed());
                    std::io::Write::write_all(&mut f, &chunk)?;
                }
                3 => touch_small_files(src, 50, 1 << 20, fresh_seed())?,
                4 => {
                    let mut f = std::fs::File::create(src.join("new100.bin"))?;
                    let mut chunk = vec![0u8; 1 << 20];
                    for n in 0..new_file_mib {
                        fill(&mut chunk, fresh_seed() + n);
                        std::io::Write::write_all(&mut f, &chunk)?;
                    }
                }
                _ => {}
            }
            settle();
            let t = Instant::now();
            dedup.stop().await?;
            let secs = t.elapsed().as_secs_f64();
            let stats = berth::snapshot::DedupRecord::from_fields(&dedup.state().snapshot.fields)
                .and_then(|d| d.last_stop)
                .context("a deduplicated stop records its stats")?;
            stops[i].push((secs, stats.uploaded_bytes, stats.upload_calls));
        }
        if run == 0 {
            // --checkpoint each-exec: what a checkpoint after a command
            // that changed 1 MiB (over 50 files) adds to the command.
            for _ in 0..3 {
                touch_small_files(src, 50, 1 << 20, fresh_seed())?;
                settle();
                let t = Instant::now();
                dedup
                    .checkpoint(berth::snapshot::GenerationNote::Exec {
                        command: "bench".into(),
                        exit_code: 0,
                        started_ms: 0,
                        duration_ms: 0,
                    })
                    .await?;
                checkpoints.push(t.elapsed().as_secs_f64());
            }
            // Same host, packs in the cache since the stops.
            cached_restores.push(timed_restore(&cached, &dedup.state(), &restore_root).await?);
        }
        restores.push(timed_restore(&uncached, &dedup.state(), &restore_root).await?);
        let _ = std::fs::remove_file(src.join("new100.bin"));
    }
    let ws = median(whole_stop);
    let wr = median(whole_restore);
    let mut rows = Vec::new();
    for (i, name) in scenarios.iter().enumerate() {
        let secs = median(stops[i].iter().map(|s| s.0).collect());
        let bytes = median(stops[i].iter().map(|s| s.1 as f64).collect());
        let calls = median(stops[i].iter().map(|s| s.2 as f64).collect());
        rows.push(Row {
            group: "dedup",
            name: format!("{label}: stop, {name}"),
            value: format!(
                "{secs:.2}s, {:.2} MiB in {calls:.0} uploads",
                bytes / (1 << 20) as f64
            ),
            baseline: format!("whole tar {ws:.2}s"),
            ratio: Some(secs / ws),
        });
    }
    let cp = median(checkpoints);
    rows.push(Row {
        group: "dedup",
        name: format!("{label}: checkpoint after a command that changed 1 MiB (--checkpoint each-exec's extra time)"),
        value: format!("{:.0} ms", cp * 1e3),
        baseline: format!("whole tar stop {ws:.2}s"),
        ratio: Some(cp / ws),
    });
    let r = median(restores);
    rows.push(Row {
        group: "dedup",
        name: format!("{label}: restore (no pack cache)"),
        value: format!("{r:.2}s"),
        baseline: format!("whole tar {wr:.2}s"),
        ratio: Some(r / wr),
    });
    let c = median(cached_restores);
    rows.push(Row {
        group: "dedup",
        name: format!("{label}: restore from this host's pack cache"),
        value: format!("{c:.2}s"),
        baseline: format!("whole tar {wr:.2}s"),
        ratio: Some(c / wr),
    });
    Ok(rows)
}
