//! Restoring a snapshot into the workspace (one pass through a staging
//! directory, or spooled and validated whole), and hydrating an archive.

use std::path::{Path, PathBuf};

use tokio::io::AsyncRead;

use super::{sealing, Sandbox, SandboxError};
use crate::capped_writer::CappedWriter;
use crate::workspace::archive::{ArchiveError, ArchiveStats};

impl Sandbox {
    /// Extracts an archive into the workspace after the whole of it has
    /// passed the hydrate policy (see [`crate::workspace::archive`]). A
    /// tar, or a tar compressed with gzip or zstd (told by its first
    /// bytes); the size limit counts the tar's bytes.
    pub async fn hydrate_workspace(
        &self,
        archive: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<ArchiveStats, SandboxError> {
        let spool = self.spool_file()?;
        let file = tokio::fs::File::create(spool.path())
            .await
            .map_err(|e| SandboxError::Io {
                what: "creating the spool file",
                source: e,
            })?;
        let limit = self.options.limits.max_stream_bytes();
        let mut capped = CappedWriter::new(file, limit);
        // The cap counts the tar's bytes, after any decompression.
        let mut archive = decompressed(archive).await.map_err(|e| SandboxError::Io {
            what: "reading the archive",
            source: e,
        })?;
        let copied = tokio::io::copy(&mut archive, &mut capped).await;
        if capped.overran() {
            return Err(SandboxError::ArchiveTooLarge { limit });
        }
        copied.map_err(|e| SandboxError::Io {
            what: "spooling the archive",
            source: e,
        })?;
        drop(capped);
        // Merged into the live workspace, as `tar -x` would: validated
        // whole first (a staged restore replaces top-level names instead).
        self.extract_spooled(spool.path()).await
    }

    pub(super) fn spool_file(&self) -> Result<tempfile::NamedTempFile, SandboxError> {
        let made = match &self.options.spool_dir {
            Some(d) => tempfile::Builder::new()
                .prefix("berth-spool-")
                .tempfile_in(d),
            None => tempfile::Builder::new().prefix("berth-spool-").tempfile(),
        };
        made.map_err(|e| SandboxError::Io {
            what: "creating the spool file",
            source: e,
        })
    }

    /// Extracts a spooled archive after the whole of it passed the
    /// hydrate policy.
    pub(super) async fn extract_spooled(&self, path: &Path) -> Result<ArchiveStats, SandboxError> {
        let limits = self.options.limits;
        let stats = sealing::validate_spooled(path, limits).await?;
        let (clean, verdict) = sealing::stream_spooled(path, limits);
        let written = self.backend.write_archive(Box::new(clean)).await;
        let verdict = verdict.await.map_err(|e| SandboxError::Task {
            task: "archive filter",
            source: e,
        })?;
        match (verdict, written) {
            // The backend stopped reading (its own failure), so the filter
            // could not write: the backend's error is the cause.
            (Err(ArchiveError::Io(e)), Err(w)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                return Err(w.into())
            }
            (Err(v), _) => return Err(v.into()),
            (Ok(_), w) => w?,
        }
        tracing::info!(
            entries = stats.entries,
            bytes = stats.bytes,
            "archive extracted"
        );
        Ok(stats)
    }

    /// Restores the snapshot into the workspace: in one pass through the
    /// backend's staging directory when it has one (nothing spooled; the
    /// staged copy is moved into place only once the digest and every entry
    /// checked out, and removed otherwise), else spooled, verified,
    /// validated and extracted.
    pub(super) async fn restore(&mut self) -> Result<(), SandboxError> {
        let deadline = self.options.archive_deadline;
        let started = std::time::Instant::now();
        let timed_out = |_| SandboxError::Deadline {
            operation: "restore",
            seconds: deadline.as_secs(),
        };
        if let Some(dir) = self.backend.staging_dir() {
            let staged = tokio::time::timeout(deadline, self.restore_staged(&dir))
                .await
                .unwrap_or_else(|e| Err(timed_out(e)));
            let accepted = staged.and_then(|seal| self.accept_seal(seal));
            let finished = self.backend.finish_staging(&dir, accepted.is_ok()).await;
            tracing::debug!(
                ms = started.elapsed().as_secs_f64() * 1e3,
                "restore timings (one pass)"
            );
            return match (accepted, finished) {
                (Ok(()), finished) => finished.map_err(SandboxError::from),
                (Err(e), Err(f)) => {
                    tracing::warn!(error = %f, staging = %dir, "removing the staged archive failed; the next restore replaces it");
                    Err(e)
                }
                (Err(e), Ok(())) => Err(e),
            };
        }
        let spool = self.spool_file()?;
        let fetched = tokio::time::timeout(deadline, async {
            let file =
                tokio::fs::File::create(spool.path())
                    .await
                    .map_err(|e| SandboxError::Io {
                        what: "creating the spool file",
                        source: e,
                    })?;
            self.fetch_into(file).await
        })
        .await
        .map_err(timed_out)??;
        self.accept_seal(fetched)?;
        let fetched_at = started.elapsed();
        tokio::time::timeout(deadline, self.extract_spooled(spool.path()))
            .await
            .map_err(timed_out)??;
        // Where a restore's time goes, for `RUST_LOG=berth=debug`.
        tracing::debug!(
            fetch_and_verify_ms = fetched_at.as_secs_f64() * 1e3,
            extract_ms = (started.elapsed() - fetched_at).as_secs_f64() * 1e3,
            "restore timings"
        );
        Ok(())
    }

    /// Streams the snapshot through the archive filter into the staging
    /// directory `dir` while it is fetched and digested. Returns the seal;
    /// the caller checks it before anything is moved into place.
    pub(super) async fn restore_staged(&self, dir: &str) -> Result<sealing::Seal, SandboxError> {
        let (into_filter, from_store) = tokio::io::duplex(1 << 20);
        let (clean, verdict) =
            sealing::stream_filtered(from_store, self.options.limits, PathBuf::from(dir));
        let (fetched, written) = tokio::join!(
            self.fetch_into(into_filter),
            self.backend.write_archive(Box::new(clean))
        );
        let verdict = verdict.await.map_err(|e| SandboxError::Task {
            task: "archive filter",
            source: e,
        })?;
        // The first cause wins. A changed archive is reported as such,
        // whatever the filter made of it; a policy refusal stops the filter
        // reading, which breaks the fetch; a failed upload stops it
        // writing; a failed fetch truncates the archive, which the filter
        // then calls corrupt.
        if let Ok(seal) = &fetched {
            self.check_seal(seal)?;
        }
        let secondary =
            |v: &ArchiveError| matches!(v, ArchiveError::Io(_) | ArchiveError::Corrupt(_));
        match (fetched, verdict, written) {
            (_, Err(v), _) if !secondary(&v) => Err(v.into()),
            (_, Err(ArchiveError::Io(e)), Err(w)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                Err(w.into())
            }
            (Err(f), _, _) => Err(f),
            (Ok(_), Err(v), _) => Err(v.into()),
            (Ok(_), Ok(_), Err(w)) => Err(w.into()),
            (Ok(seal), Ok(stats), Ok(())) => {
                tracing::info!(
                    entries = stats.entries,
                    bytes = stats.bytes,
                    "archive extracted (staged)"
                );
                Ok(seal)
            }
        }
    }

    /// Never more than was persisted: the recorded size when the state
    /// knows it for sure, otherwise the archive limit.
    pub(super) fn restore_cap(&self) -> (u64, &'static str) {
        match (
            &self.state.snapshot.digest,
            self.state.snapshot.size,
            self.state.snapshot.persist_pending,
        ) {
            (Some(_), Some(size), false) => (size, "recorded when it was persisted"),
            _ => (
                self.options.limits.max_stream_bytes(),
                "of the archive limit (no size was recorded)",
            ),
        }
    }

    /// Fetches the stored archive into `sink` under the restore cap,
    /// digesting it, and closes `sink`.
    pub(super) async fn fetch_into<W: tokio::io::AsyncWrite + Unpin + Send>(
        &self,
        sink: W,
    ) -> Result<sealing::Seal, SandboxError> {
        let id = self.snapshot.id().to_string();
        let (cap, why) = self.restore_cap();
        let capped = CappedWriter::new(sink, cap);
        let overran = capped.flag();
        // A deduplicated generation checks every chunk and the tar's
        // BLAKE3 against its index itself; hashing here too would cost a
        // pass. (Its whole-archive fallback, with no generation yet, is
        // hashed here as any archive.)
        let self_verifying = self.snapshot.own_seal().is_some();
        let writer = if self_verifying {
            sealing::HashingWriter::counting(capped)
        } else {
            sealing::HashingWriter::new(capped, self.state.snapshot.digest.as_deref())
        };
        let mut writer = writer.with_progress(self.options.progress.clone(), "restore");
        let restored = self.snapshot.restore(&mut writer).await;
        if overran.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(SandboxError::SnapshotOverrun {
                id,
                limit: cap,
                why,
            });
        }
        restored?;
        tokio::io::AsyncWriteExt::shutdown(&mut writer)
            .await
            .map_err(|e| SandboxError::Io {
                what: "closing the restored archive",
                source: e,
            })?;
        let seal = writer.seal();
        if self_verifying {
            return self.own_seal(seal);
        }
        Ok(seal)
    }

    /// Whether a fetched archive is the one the state recorded (or the
    /// newer one an interrupted stop committed).
    pub(super) fn check_seal(&self, fetched: &sealing::Seal) -> Result<(), SandboxError> {
        let id = self.snapshot.id().to_string();
        match &self.state.snapshot.digest {
            Some(expected) if *expected != fetched.digest => {
                if !self.state.snapshot.persist_pending {
                    return Err(SandboxError::DigestMismatch {
                        id,
                        expected: expected.clone(),
                        actual: fetched.digest.clone(),
                    });
                }
                // A stop was interrupted after the store committed its
                // (complete, atomically written) archive but before the new
                // digest was recorded. Accept it; the hydrate policy still
                // checks every entry.
                tracing::warn!(snapshot = %id, recorded = %expected, found = %fetched.digest,
                    "an interrupted stop left a newer archive; restoring it");
            }
            Some(_) => {}
            None => {
                tracing::warn!(snapshot = %id, "no digest recorded for this snapshot; restoring unverified")
            }
        }
        Ok(())
    }

    /// Checks a fetched archive's seal and records it in the state.
    pub(super) fn accept_seal(&mut self, fetched: sealing::Seal) -> Result<(), SandboxError> {
        self.check_seal(&fetched)?;
        self.state.snapshot.digest = Some(fetched.digest);
        self.state.snapshot.size = Some(fetched.size);
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        Ok(())
    }
}

/// `archive` as a tar stream: a gzip (`.tgz`) or zstd (`.tar.zst`) archive,
/// told by its first bytes, is decompressed as it is read; anything else is
/// passed through as it is.
pub(super) async fn decompressed<'a>(
    archive: &'a mut (dyn AsyncRead + Unpin + Send),
) -> std::io::Result<std::pin::Pin<Box<dyn AsyncRead + Send + 'a>>> {
    use tokio::io::AsyncReadExt;
    const GZIP: &[u8] = &[0x1f, 0x8b];
    const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
    let mut head = Vec::with_capacity(4);
    while head.len() < 4 {
        let mut byte = [0u8; 4];
        let n = archive.read(&mut byte[..4 - head.len()]).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&byte[..n]);
    }
    let gzip = head.starts_with(GZIP);
    let zstd = head.starts_with(ZSTD);
    let whole = tokio::io::BufReader::new(std::io::Cursor::new(head).chain(archive));
    Ok(if gzip {
        let mut decoder = async_compression::tokio::bufread::GzipDecoder::new(whole);
        decoder.multiple_members(true);
        Box::pin(decoder)
    } else if zstd {
        Box::pin(async_compression::tokio::bufread::ZstdDecoder::new(whole))
    } else {
        Box::pin(whole)
    })
}
