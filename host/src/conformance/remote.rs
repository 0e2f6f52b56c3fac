//! Clauses for `remote-client` stores.

use std::time::Instant;

use futures::future::join_all;

use super::pattern::{DigestWriter, PatternReader};
use super::{expect_storage, human, is_kind, mib_per_s, ConformanceOptions, Report, INVALID_IDS};
use crate::remote_client::RemoteSnapshotClient;

async fn upload(
    client: &dyn RemoteSnapshotClient,
    id: &str,
    seed: u64,
    len: u64,
) -> Result<(), String> {
    let mut data = PatternReader::new(seed, len);
    client
        .upload(id, &mut data)
        .await
        .map_err(|e| format!("upload {id:?} ({}) failed: {e}", human(len)))
}

async fn download_matches(
    client: &dyn RemoteSnapshotClient,
    id: &str,
    seed: u64,
    len: u64,
) -> Result<(), String> {
    let mut sink = DigestWriter::default();
    client
        .download(id, &mut sink)
        .await
        .map_err(|e| format!("download {id:?} failed: {e}"))?;
    let (digest, got) = sink.finish();
    if got != len {
        return Err(format!(
            "download {id:?} returned {got} bytes, expected {len}"
        ));
    }
    if digest != PatternReader::digest_of(seed, len) {
        return Err(format!(
            "download {id:?} returned different bytes than were uploaded"
        ));
    }
    Ok(())
}

async fn roundtrip(
    client: &dyn RemoteSnapshotClient,
    id: &str,
    seed: u64,
    len: u64,
) -> Result<String, String> {
    let t = Instant::now();
    upload(client, id, seed, len).await?;
    let up = t.elapsed().as_secs_f64();
    let t = Instant::now();
    download_matches(client, id, seed, len).await?;
    let down = t.elapsed().as_secs_f64();
    let _ = client.delete(id).await;
    Ok(format!(
        "{} byte-identical; upload {}, download {}",
        human(len),
        mib_per_s(len, up),
        mib_per_s(len, down)
    ))
}

/// Runs every remote-client clause against `client`, in order: the round
/// trips, then each clause below (one function each).
pub async fn check_remote_client(
    subject: &str,
    client: &dyn RemoteSnapshotClient,
    opts: &ConformanceOptions,
) -> Report {
    let mut report = Report::new(subject, "remote-client");
    let p = opts.id_prefix.as_str();
    report
        .run_clause("roundtrip-empty", "an empty archive round-trips", async {
            roundtrip(client, &format!("{p}-empty"), 1, 0).await
        })
        .await;
    report
        .run_clause("roundtrip-1-byte", "a 1-byte archive round-trips", async {
            roundtrip(client, &format!("{p}-one"), 2, 1).await
        })
        .await;
    report
        .run_clause(
            "roundtrip-medium",
            "a 64 MiB archive round-trips byte-identical",
            async { roundtrip(client, &format!("{p}-medium"), 3, opts.medium_size).await },
        )
        .await;
    if opts.large_size > 0 {
        report
            .run_clause(
                "roundtrip-streamed-large",
                "a multi-GiB archive streams through and back byte-identical",
                async { roundtrip(client, &format!("{p}-large"), 4, opts.large_size).await },
            )
            .await;
    }
    report
        .run_clause(
            "exists-before-and-after",
            "exists is false before upload, true after, false after delete",
            exists_before_and_after(client, p),
        )
        .await;
    report
        .run_clause(
            "overwrite-replaces",
            "a second upload of an id replaces the first",
            overwrite_replaces(client, p),
        )
        .await;
    report
        .run_clause(
            "missing-id-not-found",
            "download and delete of a missing id give not-found; exists gives false",
            missing_id_not_found(client, p),
        )
        .await;
    report
        .run_clause(
            "invalid-ids-rejected",
            "ids outside [A-Za-z0-9._-]{1,128} (and . ..) give invalid-id on every operation",
            invalid_ids_rejected(client),
        )
        .await;
    report
        .run_clause(
            "interrupted-upload-keeps-previous",
            "an upload whose stream breaks mid-way fails and leaves the previous archive intact",
            interrupted_upload_keeps_previous(client, p),
        )
        .await;
    report
        .run_clause(
            "interrupted-first-upload-leaves-nothing",
            "a broken upload of a new id makes nothing visible",
            interrupted_first_upload_leaves_nothing(client, p),
        )
        .await;
    report
        .run_clause(
            "concurrent-different-ids",
            "concurrent uploads and downloads of different ids do not interfere",
            concurrent_different_ids(client, p, opts),
        )
        .await;
    report
}

/// Exists is false before upload, true after, false after delete.
async fn exists_before_and_after(
    client: &dyn RemoteSnapshotClient,
    p: &str,
) -> Result<String, String> {
    let id = format!("{p}-exists");
    match client.exists(&id).await {
        Ok(false) => {}
        other => {
            return Err(format!(
                "exists before upload: expected false, got {other:?}"
            ))
        }
    }
    upload(client, &id, 5, 1000).await?;
    match client.exists(&id).await {
        Ok(true) => {}
        other => return Err(format!("exists after upload: expected true, got {other:?}")),
    }
    client
        .delete(&id)
        .await
        .map_err(|e| format!("delete failed: {e}"))?;
    match client.exists(&id).await {
        Ok(false) => Ok("false → true → false".into()),
        other => Err(format!(
            "exists after delete: expected false, got {other:?}"
        )),
    }
}

/// A second upload of an id replaces the first.
async fn overwrite_replaces(client: &dyn RemoteSnapshotClient, p: &str) -> Result<String, String> {
    let id = format!("{p}-overwrite");
    upload(client, &id, 6, 300_000).await?;
    upload(client, &id, 7, 200_000).await?;
    download_matches(client, &id, 7, 200_000).await?;
    let _ = client.delete(&id).await;
    Ok("second archive returned".into())
}

/// Download and delete of a missing id give not-found; exists gives false.
async fn missing_id_not_found(
    client: &dyn RemoteSnapshotClient,
    p: &str,
) -> Result<String, String> {
    let id = format!("{p}-missing");
    expect_storage(
        "download",
        client.download(&id, &mut DigestWriter::default()).await,
        "not-found",
    )?;
    expect_storage("delete", client.delete(&id).await, "not-found")?;
    match client.exists(&id).await {
        Ok(false) => Ok("not-found, not-found, false".into()),
        other => Err(format!("exists: expected false, got {other:?}")),
    }
}

/// Ids outside `[A-Za-z0-9._-]{1,128}` (and `.`, `..`) give invalid-id on
/// every operation.
async fn invalid_ids_rejected(client: &dyn RemoteSnapshotClient) -> Result<String, String> {
    for bad in INVALID_IDS {
        let mut data = PatternReader::new(8, 10);
        expect_storage(
            &format!("upload {bad:?}"),
            client.upload(bad, &mut data).await,
            "invalid-id",
        )?;
        expect_storage(
            &format!("download {bad:?}"),
            client.download(bad, &mut DigestWriter::default()).await,
            "invalid-id",
        )?;
        expect_storage(
            &format!("exists {bad:?}"),
            client.exists(bad).await,
            "invalid-id",
        )?;
        expect_storage(
            &format!("delete {bad:?}"),
            client.delete(bad).await,
            "invalid-id",
        )?;
    }
    Ok(format!("{} ids refused on 4 operations", INVALID_IDS.len()))
}

/// An upload whose stream breaks mid-way fails and leaves the previous archive intact.
async fn interrupted_upload_keeps_previous(
    client: &dyn RemoteSnapshotClient,
    p: &str,
) -> Result<String, String> {
    let id = format!("{p}-interrupted");
    upload(client, &id, 9, 1 << 20).await?;
    let mut broken = PatternReader::failing(10, 8 << 20, 3 << 20);
    if client.upload(&id, &mut broken).await.is_ok() {
        return Err("the interrupted upload reported success".into());
    }
    download_matches(client, &id, 9, 1 << 20)
        .await
        .map_err(|e| format!("previous archive damaged: {e}"))?;
    let _ = client.delete(&id).await;
    Ok("failed as it should; previous archive byte-identical".into())
}

/// A broken upload of a new id makes nothing visible.
async fn interrupted_first_upload_leaves_nothing(
    client: &dyn RemoteSnapshotClient,
    p: &str,
) -> Result<String, String> {
    let id = format!("{p}-partial");
    let mut broken = PatternReader::failing(11, 8 << 20, 3 << 20);
    if client.upload(&id, &mut broken).await.is_ok() {
        return Err("the interrupted upload reported success".into());
    }
    match client.exists(&id).await {
        Ok(false) => {}
        other => return Err(format!("a partial archive is visible: exists = {other:?}")),
    }
    match client.download(&id, &mut DigestWriter::default()).await {
        Err(e) if is_kind(&e, "not-found") => Ok("nothing visible".into()),
        other => Err(format!(
            "download of the partial id: expected not-found, got {other:?}"
        )),
    }
}

/// Concurrent uploads and downloads of different ids do not interfere.
async fn concurrent_different_ids(
    client: &dyn RemoteSnapshotClient,
    p: &str,
    opts: &ConformanceOptions,
) -> Result<String, String> {
    let n = opts.concurrency;
    let len = 4u64 << 20;
    let ids: Vec<String> = (0..n).map(|i| format!("{p}-conc{i}")).collect();
    let t = Instant::now();
    let ups = join_all(
        ids.iter()
            .enumerate()
            .map(|(i, id)| upload(client, id, 100 + i as u64, len)),
    )
    .await;
    ups.into_iter().collect::<Result<Vec<_>, _>>()?;
    let downs = join_all(
        ids.iter()
            .enumerate()
            .map(|(i, id)| download_matches(client, id, 100 + i as u64, len)),
    )
    .await;
    downs.into_iter().collect::<Result<Vec<_>, _>>()?;
    for id in &ids {
        let _ = client.delete(id).await;
    }
    Ok(format!(
        "{n} × {} in {:.2}s",
        human(len),
        t.elapsed().as_secs_f64()
    ))
}
