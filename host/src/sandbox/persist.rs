//! Stop: lineage check → freeze → backend tar stream → (zstd) → seal →
//! snapshot `persist` → store → thaw.

use tokio::io::AsyncRead;

use super::{sealing, Sandbox, SandboxError, ThawOnDrop};

impl Sandbox {
    /// A tar stream of the workspace (ephemeral entries and bind mounts left
    /// out), exactly what `stop` persists before compression.
    pub async fn persist_workspace(&self) -> Result<crate::backend::ArchiveStream, SandboxError> {
        let exclude = self.state.manifest.excluded_from_snapshots()?;
        Ok(self.backend.read_archive(&exclude).await?)
    }

    /// Writes [`Sandbox::persist_workspace`]'s tar into `out`, with the
    /// sandbox frozen while it is read (as `stop` does; see
    /// [`SandboxOptions::freeze_during_stop`]). Returns the bytes written.
    pub async fn persist_workspace_to(
        &self,
        out: &mut (dyn tokio::io::AsyncWrite + Unpin + Send),
    ) -> Result<u64, SandboxError> {
        self.while_frozen(async {
            let mut tar = self.persist_workspace().await?;
            tokio::io::copy(&mut tar, out)
                .await
                .map_err(|e| SandboxError::Io {
                    what: "writing the workspace archive",
                    source: e,
                })
        })
        .await
    }

    /// Runs `read` with the sandbox's processes paused when
    /// [`SandboxOptions::freeze_during_stop`] is on, resuming them after,
    /// whether `read` succeeded or not.
    pub(super) async fn while_frozen<T>(
        &self,
        read: impl std::future::Future<Output = Result<T, SandboxError>>,
    ) -> Result<T, SandboxError> {
        let frozen = if self.options.freeze_during_stop {
            self.backend.freeze().await?
        } else {
            false
        };
        // Dropped before the thaw below (the caller cancelled): the guard
        // starts one on its own.
        let guard = ThawOnDrop(if frozen {
            self.backend.thaw_detached()
        } else {
            None
        });
        let result = read.await;
        guard.disarm();
        if frozen {
            if let Err(e) = self.backend.thaw().await {
                tracing::warn!(error = %e, "resuming the sandbox's processes after reading its workspace failed; the next command resumes them");
            }
        }
        result
    }

    /// Persists the workspace into the snapshot (if persistence is on).
    /// Destroys nothing.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future part-way loses nothing: the previous snapshot
    /// stays restorable (stores commit atomically), the state says a
    /// persist was under way (`persist_pending`), so the next start
    /// accepts whichever archive the store holds, and a sandbox frozen for
    /// the read is thawed (by a detached task when the backend can; the
    /// next command otherwise).
    pub async fn stop(&mut self) -> Result<(), SandboxError> {
        if !self.snapshot.persistence_enabled() {
            self.running = false;
            return Ok(());
        }
        if !self.state.workspace_root_ready {
            return Err(SandboxError::NeverSetUp);
        }
        self.check_lineage().await?;
        // Crash safety: the state says a persist is under way before the
        // store can commit, so a kill between the store's commit and the
        // state write below is recognised on restore (see `restore`).
        self.state.snapshot.persist_pending = true;
        self.save_state()?;
        let deadline = self.options.archive_deadline;
        let late = |_| SandboxError::Deadline {
            operation: "persist",
            seconds: deadline.as_secs(),
        };
        // A walk (the files cache) freezes what it must itself; an archive
        // is read with the sandbox frozen.
        let seal = match tokio::time::timeout(deadline, self.persist_by_walk())
            .await
            .map_err(late)??
        {
            Some(seal) => seal,
            None => {
                self.while_frozen(async {
                    tokio::time::timeout(deadline, self.persist_into_snapshot())
                        .await
                        .map_err(late)?
                })
                .await?
            }
        };
        if let Some(lineage) = self.state.lineage.as_mut() {
            lineage.snapshot_digest = Some(seal.digest.clone());
        }
        self.state.snapshot.digest = Some(seal.digest);
        self.state.snapshot.size = Some(seal.size);
        self.state.snapshot.compression = self.compresses().then(|| "zstd".to_string());
        self.state.snapshot.persist_pending = false;
        self.sync_snapshot_fields();
        self.save_state()?;
        self.running = false;
        Ok(())
    }

    /// Refuses a stop whose workspace did not come from the snapshot it
    /// would replace (see the module docs).
    pub(super) async fn check_lineage(&self) -> Result<(), SandboxError> {
        let id = self.state.snapshot.id.to_string();
        let Some(lineage) = &self.state.lineage else {
            // State from a version that recorded no lineage: nothing to
            // compare against (attach adopts one).
            return Ok(());
        };
        if let Some(recorded) = &self.state.snapshot.digest {
            if lineage.snapshot_digest.as_ref() != Some(recorded) {
                return Err(SandboxError::LineageMismatch {
                    id,
                    reason: match &lineage.snapshot_digest {
                        None => "the workspace was set up from the manifest, not restored from this snapshot".into(),
                        Some(d) => format!("the workspace descends from {d}, not from the snapshot's {recorded}"),
                    },
                });
            }
        }
        let current = self.backend.instance_id().await?;
        if lineage.instance != current {
            return Err(SandboxError::LineageMismatch {
                id,
                reason: format!(
                    "the workspace was set up in {} but the sandbox is now {} (re-created or replaced behind Berth's back)",
                    lineage.instance.as_deref().unwrap_or("nothing"),
                    current.as_deref().unwrap_or("gone"),
                ),
            });
        }
        Ok(())
    }

    pub(super) fn save_state(&self) -> Result<(), SandboxError> {
        match &self.options.state_sink {
            Some(sink) => (sink.0)(&self.state()).map_err(SandboxError::SaveState),
            None => Ok(()),
        }
    }

    /// Persists a walk of the workspace, when the snapshot records files
    /// and the backend can walk (the files cache: unchanged files are not
    /// read); `None` otherwise.
    pub(super) async fn persist_by_walk(&self) -> Result<Option<sealing::Seal>, SandboxError> {
        let Some(known) = self.snapshot.known_files().await else {
            return Ok(None);
        };
        let instance = self.backend.instance_id().await?;
        let known = known.for_instance(instance.as_deref());
        let exclude = self.state.manifest.excluded_from_snapshots()?;
        let freeze = self.options.freeze_during_stop;
        let Some(walk) = self.backend.walk_workspace(&exclude, known, freeze).await? else {
            return Ok(None);
        };
        self.snapshot.persist_walk(walk, instance).await?;
        let own = self
            .snapshot
            .own_seal()
            .ok_or_else(|| SandboxError::SnapshotContract {
                id: self.state.snapshot.id.to_string(),
                problem: "it does not record the walk it persisted",
            })?;
        Ok(Some(sealing::Seal {
            digest: own.digest,
            size: own.size,
        }))
    }

    pub(super) async fn persist_into_snapshot(&self) -> Result<sealing::Seal, SandboxError> {
        let tar = self.persist_workspace().await?;
        let stored: Box<dyn AsyncRead + Send + Unpin> = if self.compresses() {
            Box::new(async_compression::tokio::bufread::ZstdEncoder::new(
                tokio::io::BufReader::with_capacity(256 * 1024, tar),
            ))
        } else {
            tar
        };
        // A snapshot that digests the archive itself (a deduplicated one,
        // in parallel with chunking) is only counted: hashing it here too
        // would cost a pass.
        let seals_itself = self.snapshot.seals_itself();
        let (sealed, seal) = if seals_itself {
            sealing::HashingReader::counting(stored)
        } else {
            sealing::HashingReader::new(stored)
        };
        let mut sealed = sealed.with_progress(self.options.progress.clone(), "persist");
        self.snapshot.persist(&mut sealed).await?;
        let seal = seal.lock().ok().and_then(|s| s.clone()).ok_or_else(|| {
            SandboxError::SnapshotContract {
                id: self.state.snapshot.id.to_string(),
                problem: "it did not read the archive to its end",
            }
        })?;
        if seals_itself {
            return self.own_seal(seal);
        }
        Ok(seal)
    }

    /// The seal of an archive that passed (counted, not hashed) through a
    /// snapshot that seals itself: the digest is the one the snapshot
    /// verified, whose size must match what passed.
    pub(super) fn own_seal(&self, mut seal: sealing::Seal) -> Result<sealing::Seal, SandboxError> {
        let own = self
            .snapshot
            .own_seal()
            .filter(|s| s.size == seal.size)
            .ok_or_else(|| SandboxError::SnapshotContract {
                id: self.state.snapshot.id.to_string(),
                problem: "it does not record the archive that passed through it",
            })?;
        seal.digest = own.digest;
        Ok(seal)
    }

    /// Whether `stop` compresses the whole archive (a snapshot that
    /// compresses itself, as a deduplicated one does its chunks, is not
    /// given a compressed one).
    pub(super) fn compresses(&self) -> bool {
        self.options.compression && !self.snapshot.compresses_itself()
    }

    /// Copies the snapshot's own state fields (a deduplicated snapshot's
    /// generations) into the state.
    pub(super) fn sync_snapshot_fields(&mut self) {
        self.state
            .snapshot
            .fields
            .extend(self.snapshot.state_fields());
    }
}
