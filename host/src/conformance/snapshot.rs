//! Clauses for `snapshot` stores.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use futures::future::join_all;

use super::pattern::{DigestWriter, PatternReader};
use super::{expect_storage, human, is_kind, mib_per_s, ConformanceOptions, Report, INVALID_IDS};
use crate::snapshot::SandboxSnapshot;
use crate::store_error::StoreError;

/// Opens the snapshot with a given id: how the suite makes as many
/// snapshots of one kind as it needs.
pub type OpenSnapshot = Box<
    dyn Fn(
            String,
        )
            -> Pin<Box<dyn Future<Output = Result<Box<dyn SandboxSnapshot>, StoreError>> + Send>>
        + Send
        + Sync,
>;

async fn open(opener: &OpenSnapshot, id: &str) -> Result<Box<dyn SandboxSnapshot>, String> {
    opener(id.to_string())
        .await
        .map_err(|e| format!("open {id:?} failed: {e}"))
}

async fn persist(snap: &dyn SandboxSnapshot, seed: u64, len: u64) -> Result<(), String> {
    let mut data = PatternReader::new(seed, len);
    snap.persist(&mut data)
        .await
        .map_err(|e| format!("persist of {} failed: {e}", human(len)))
}

async fn restore_matches(snap: &dyn SandboxSnapshot, seed: u64, len: u64) -> Result<(), String> {
    let mut sink = DigestWriter::default();
    snap.restore(&mut sink)
        .await
        .map_err(|e| format!("restore failed: {e}"))?;
    let (digest, got) = sink.finish();
    if got != len {
        return Err(format!("restore returned {got} bytes, expected {len}"));
    }
    if digest != PatternReader::digest_of(seed, len) {
        return Err("restore returned different bytes than were persisted".into());
    }
    Ok(())
}

async fn roundtrip(opener: &OpenSnapshot, id: &str, seed: u64, len: u64) -> Result<String, String> {
    let snap = open(opener, id).await?;
    let t = Instant::now();
    persist(snap.as_ref(), seed, len).await?;
    let up = t.elapsed().as_secs_f64();
    let t = Instant::now();
    restore_matches(snap.as_ref(), seed, len).await?;
    let down = t.elapsed().as_secs_f64();
    Ok(format!(
        "{} byte-identical; persist {}, restore {}",
        human(len),
        mib_per_s(len, up),
        mib_per_s(len, down)
    ))
}

/// Runs every snapshot clause; which ones depends on whether the snapshot
/// reports persistence enabled.
pub async fn check_snapshot(
    subject: &str,
    opener: &OpenSnapshot,
    opts: &ConformanceOptions,
) -> Report {
    let mut report = Report::new(subject, "snapshot");
    let p = &opts.id_prefix;

    let mut persistence = None;
    report
        .run_clause(
            "identity",
            "id() is the id opened with; kind() is non-empty",
            async {
                let id = format!("{p}-identity");
                let snap = open(opener, &id).await?;
                if snap.id() != id {
                    return Err(format!("id() = {:?}, opened with {id:?}", snap.id()));
                }
                if snap.kind().is_empty() {
                    return Err("kind() is empty".into());
                }
                persistence = Some(snap.persistence_enabled());
                Ok(format!(
                    "kind {:?}, persistence {}",
                    snap.kind(),
                    if snap.persistence_enabled() {
                        "enabled"
                    } else {
                        "disabled"
                    }
                ))
            },
        )
        .await;
    report
        .run_clause(
            "invalid-ids-rejected",
            "open with an id outside the grammar gives invalid-id",
            async {
                for bad in INVALID_IDS {
                    expect_storage(
                        &format!("open {bad:?}"),
                        opener(bad.to_string()).await.map(|_| ()),
                        "invalid-id",
                    )?;
                }
                Ok(format!("{} ids refused", INVALID_IDS.len()))
            },
        )
        .await;

    match persistence {
        Some(true) => persistent_clauses(&mut report, opener, opts).await,
        Some(false) => {
            report.not_run.push(
                "the persistence clauses (round trips, restorable, atomic replace, delete): the snapshot says persistence is disabled"
                    .into(),
            );
            noop_clauses(&mut report, opener, opts).await
        }
        None => {}
    }
    report
}

async fn noop_clauses(report: &mut Report, opener: &OpenSnapshot, opts: &ConformanceOptions) {
    let p = &opts.id_prefix;
    report
        .run_clause(
            "noop-persist-drains",
            "without persistence, persist reads the archive to its end and succeeds",
            async {
                let snap = open(opener, &format!("{p}-noop")).await?;
                persist(snap.as_ref(), 20, opts.medium_size).await?;
                Ok(format!("{} drained", human(opts.medium_size)))
            },
        )
        .await;
    report
        .run_clause(
            "noop-never-restorable",
            "without persistence, is-restorable is false and restore gives not-found",
            async {
                let snap = open(opener, &format!("{p}-noop")).await?;
                match snap.is_restorable().await {
                    Ok(false) => {}
                    other => return Err(format!("is-restorable: expected false, got {other:?}")),
                }
                expect_storage(
                    "restore",
                    snap.restore(&mut DigestWriter::default()).await,
                    "not-found",
                )?;
                Ok("false, not-found".into())
            },
        )
        .await;
}

/// The clauses of a snapshot that persists, in order: the round trips,
/// then each clause below (one function each).
async fn persistent_clauses(report: &mut Report, opener: &OpenSnapshot, opts: &ConformanceOptions) {
    let p = opts.id_prefix.as_str();
    report
        .run_clause("roundtrip-empty", "an empty archive round-trips", async {
            roundtrip(opener, &format!("{p}-empty"), 1, 0).await
        })
        .await;
    report
        .run_clause("roundtrip-1-byte", "a 1-byte archive round-trips", async {
            roundtrip(opener, &format!("{p}-one"), 2, 1).await
        })
        .await;
    report
        .run_clause(
            "roundtrip-medium",
            "a 64 MiB archive round-trips byte-identical",
            async { roundtrip(opener, &format!("{p}-medium"), 3, opts.medium_size).await },
        )
        .await;
    if opts.large_size > 0 {
        report
            .run_clause(
                "roundtrip-streamed-large",
                "a multi-GiB archive streams through and back byte-identical",
                async { roundtrip(opener, &format!("{p}-large"), 4, opts.large_size).await },
            )
            .await;
    }
    report
        .run_clause("restorable-before-and-after", "is-restorable is false before the first persist and true after; restore before gives not-found", restorable_before_and_after(opener, p))
        .await;
    report
        .run_clause(
            "overwrite-replaces",
            "a second persist replaces the first",
            overwrite_replaces(opener, p),
        )
        .await;
    report
        .run_clause(
            "interrupted-persist-keeps-previous",
            "a persist whose stream breaks mid-way fails and leaves the previous archive intact",
            interrupted_persist_keeps_previous(opener, p),
        )
        .await;
    report
        .run_clause(
            "interrupted-first-persist-leaves-nothing",
            "a broken first persist leaves the snapshot not restorable",
            interrupted_first_persist_leaves_nothing(opener, p),
        )
        .await;
    report
        .run_clause(
            "concurrent-different-ids",
            "concurrent persists and restores of different snapshots do not interfere",
            concurrent_different_ids(opener, p, opts),
        )
        .await;
}

/// Is-restorable is false before the first persist and true after; restore before gives not-found.
async fn restorable_before_and_after(opener: &OpenSnapshot, p: &str) -> Result<String, String> {
    let snap = open(opener, &format!("{p}-restorable")).await?;
    match snap.is_restorable().await {
        Ok(false) => {}
        other => return Err(format!("before persist: expected false, got {other:?}")),
    }
    expect_storage(
        "restore before persist",
        snap.restore(&mut DigestWriter::default()).await,
        "not-found",
    )?;
    persist(snap.as_ref(), 5, 1000).await?;
    match snap.is_restorable().await {
        Ok(true) => Ok("false → true".into()),
        other => Err(format!("after persist: expected true, got {other:?}")),
    }
}

/// A second persist replaces the first.
async fn overwrite_replaces(opener: &OpenSnapshot, p: &str) -> Result<String, String> {
    let snap = open(opener, &format!("{p}-overwrite")).await?;
    persist(snap.as_ref(), 6, 300_000).await?;
    persist(snap.as_ref(), 7, 200_000).await?;
    restore_matches(snap.as_ref(), 7, 200_000).await?;
    Ok("second archive returned".into())
}

/// A persist whose stream breaks mid-way fails and leaves the previous archive intact.
async fn interrupted_persist_keeps_previous(
    opener: &OpenSnapshot,
    p: &str,
) -> Result<String, String> {
    let snap = open(opener, &format!("{p}-interrupted")).await?;
    persist(snap.as_ref(), 9, 1 << 20).await?;
    let mut broken = PatternReader::failing(10, 8 << 20, 3 << 20);
    if snap.persist(&mut broken).await.is_ok() {
        return Err("the interrupted persist reported success".into());
    }
    restore_matches(snap.as_ref(), 9, 1 << 20)
        .await
        .map_err(|e| format!("previous archive damaged: {e}"))?;
    Ok("failed as it should; previous archive byte-identical".into())
}

/// A broken first persist leaves the snapshot not restorable.
async fn interrupted_first_persist_leaves_nothing(
    opener: &OpenSnapshot,
    p: &str,
) -> Result<String, String> {
    let snap = open(opener, &format!("{p}-partial")).await?;
    let mut broken = PatternReader::failing(11, 8 << 20, 3 << 20);
    if snap.persist(&mut broken).await.is_ok() {
        return Err("the interrupted persist reported success".into());
    }
    match snap.is_restorable().await {
        Ok(false) => {}
        other => {
            return Err(format!(
                "a partial archive is visible: is-restorable = {other:?}"
            ))
        }
    }
    match snap.restore(&mut DigestWriter::default()).await {
        Err(e) if is_kind(&e, "not-found") => Ok("nothing visible".into()),
        other => Err(format!("restore: expected not-found, got {other:?}")),
    }
}

/// Concurrent persists and restores of different snapshots do not interfere.
async fn concurrent_different_ids(
    opener: &OpenSnapshot,
    p: &str,
    opts: &ConformanceOptions,
) -> Result<String, String> {
    let n = opts.concurrency;
    let len = 4u64 << 20;
    let t = Instant::now();
    let mut snaps = Vec::new();
    for i in 0..n {
        snaps.push(open(opener, &format!("{p}-conc{i}")).await?);
    }
    let ups = join_all(
        snaps
            .iter()
            .enumerate()
            .map(|(i, s)| persist(s.as_ref(), 100 + i as u64, len)),
    )
    .await;
    ups.into_iter().collect::<Result<Vec<_>, _>>()?;
    let downs = join_all(
        snaps
            .iter()
            .enumerate()
            .map(|(i, s)| restore_matches(s.as_ref(), 100 + i as u64, len)),
    )
    .await;
    downs.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(format!(
        "{n} × {} in {:.2}s",
        human(len),
        t.elapsed().as_secs_f64()
    ))
}
