//! Warm pools: sandboxes created and started ahead of time from a
//! template, each handed whole to one new owner.
//!
//! A pool is its template (`HOME/pools/POOL.json`: a backend kind and its
//! settings, the snapshot store, the egress policy, and how many members to
//! keep) and its members, named sandboxes of their own directory
//! (`HOME/pools/POOL/MEMBER.json`), started and never used. A claim makes
//! one member into the named sandbox asked for: it checks the member's
//! workspace is empty, applies the claim's manifest, and moves the
//! member's state file to the new name with one `rename(2)`, so a member
//! belongs to the pool or to its owner, never to both, whatever is killed
//! when. A claim that finds no member creates the sandbox cold from the
//! template instead, and says so; it never fails for that reason.
//!
//! Keeping a pool full is its holder's job: `berth serve` refills each
//! pool in the background and keeps its members open ([`Pools::fill`] is
//! the one-shot form the in-process CLI uses).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    CreateRequest, NamedSandbox, NamedSandboxError, NamedSandboxes, Sandbox, SandboxError,
    StateFile,
};
use crate::backend::BackendSettings;
use crate::workspace::WorkspaceSpec;

/// The most members a pool keeps.
pub const MAX_POOL_SIZE: u32 = 256;

/// A pool: what its members are made from, and how many to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolSpec {
    /// Its name (the sandbox name grammar).
    pub name: String,
    /// How many started members to keep (1 to [`MAX_POOL_SIZE`]).
    pub size: u32,
    /// The backend: `{"type": KIND, KEY: VALUE, ...}`, as
    /// [`BackendSettings::from_json`] reads it.
    pub backend: serde_json::Value,
    /// The snapshot store, as `berth create --snapshot` takes it. By
    /// default, `local`.
    #[serde(default = "local")]
    pub snapshot: String,
    /// Keep this many deduplicated generations (a `remote:` store only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_keep: Option<u32>,
    /// Write a generation after every command.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint_each_exec: bool,
    /// Compress snapshots with zstd.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compression: bool,
    /// Pause the sandbox while a stop reads the workspace. By default, yes.
    #[serde(default = "yes")]
    pub freeze: bool,
    /// The egress policy every member is held to (no secrets: their values
    /// are never stored, so a template cannot carry them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressSettings>,
}

fn local() -> String {
    "local".into()
}

fn yes() -> bool {
    true
}

impl PoolSpec {
    /// A pool `name` of `size` members on `backend`, every other setting
    /// its default.
    pub fn new(name: impl Into<String>, size: u32, backend: &BackendSettings) -> Self {
        PoolSpec {
            name: name.into(),
            size,
            backend: backend.to_json(),
            snapshot: local(),
            dedup_keep: None,
            checkpoint_each_exec: false,
            compression: false,
            freeze: true,
            egress: None,
        }
    }

    /// The backend's settings.
    pub fn backend_settings(&self) -> Result<BackendSettings, PoolError> {
        let bad = |message: String| PoolError::Template {
            pool: self.name.clone(),
            message,
        };
        let settings =
            BackendSettings::from_json(self.backend.clone(), "").map_err(|e| bad(e.to_string()))?;
        if settings.kind().is_empty() {
            return Err(bad("the template names no backend kind (`type`)".into()));
        }
        Ok(settings)
    }

    /// The create request for a sandbox `name` made from this template.
    pub fn request(
        &self,
        name: impl Into<String>,
        workspace: WorkspaceSpec,
    ) -> Result<CreateRequest, PoolError> {
        let mut request = CreateRequest::new(name, self.backend_settings()?);
        request.workspace = workspace;
        request.snapshot = self.snapshot.clone();
        request.dedup_keep = self.dedup_keep;
        request.checkpoint_each_exec = self.checkpoint_each_exec;
        request.compression = self.compression;
        request.freeze = self.freeze;
        request.egress = self.egress.clone();
        Ok(request)
    }
}

/// Why a pool could not be made, read, filled, claimed from or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// No pool of this name.
    #[error("no pool named {pool:?}; `berth pool ls` lists them")]
    NotFound {
        /// The name.
        pool: String,
    },
    /// The name is taken.
    #[error("a pool named {pool:?} already exists; `berth pool rm {pool}` removes it")]
    Exists {
        /// The name.
        pool: String,
    },
    /// The template cannot make sandboxes.
    #[error("pool {pool:?}: {message}")]
    Template {
        /// The pool.
        pool: String,
        /// What is wrong.
        message: String,
    },
    /// The pool's file does not parse.
    #[error("pool file {} is corrupt", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A member or the claimed name: its state file, its lock.
    #[error(transparent)]
    Named(#[from] NamedSandboxError),
    /// Making a member, or a cold create, failed.
    #[error(transparent)]
    Create(Box<super::CreateError>),
    /// Removing a member failed (it is kept; `berth pool rm` again).
    #[error("removing pool member {member}")]
    Remove {
        /// The member.
        member: String,
        /// Why.
        #[source]
        source: Box<super::RemoveError>,
    },
    /// The sandbox did not take the claim's manifest.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

impl From<super::CreateError> for PoolError {
    fn from(e: super::CreateError) -> Self {
        PoolError::Create(Box::new(e))
    }
}

/// What a claim asks for: the new sandbox's name and workspace.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The new sandbox's name.
    pub name: String,
    /// Its workspace manifest, host paths resolved. By default, empty.
    pub workspace: WorkspaceSpec,
}

impl ClaimRequest {
    /// A claim of sandbox `name` with an empty workspace.
    pub fn new(name: impl Into<String>) -> Self {
        ClaimRequest {
            name: name.into(),
            workspace: WorkspaceSpec::default(),
        }
    }
}

impl ClaimRequest {
    /// Why no warm member can take this workspace, which a cold create
    /// can: its root is not the default one, or it names bind mounts (a
    /// member's backend fixed both when it was made). `None` when a
    /// member can. A manifest that is not valid is an error.
    pub fn needs_cold_create(&self) -> Result<Option<String>, PoolError> {
        self.workspace.validate().map_err(SandboxError::from)?;
        let usual = WorkspaceSpec::default().root;
        if self.workspace.root != usual {
            return Ok(Some(format!(
                "its workspace root is {}, and the pool's sandboxes have theirs at {usual}",
                self.workspace.root
            )));
        }
        let binds = self.workspace.bind_mounts().map_err(SandboxError::from)?;
        if !binds.is_empty() {
            return Ok(Some(
                "its workspace names bind mounts, which a sandbox gets only when it is made".into(),
            ));
        }
        Ok(None)
    }
}

/// Where a claimed sandbox came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimSource {
    /// A warm member of the pool (its member name).
    Member(String),
    /// Created cold from the template, for this reason.
    Cold(String),
}

/// A claimed sandbox.
pub struct Claim {
    /// Its record, as saved under its new name.
    pub record: NamedSandbox,
    /// The sandbox, running.
    pub sandbox: Sandbox,
    /// Where it came from.
    pub source: ClaimSource,
}

/// Why a member was not handed over; `member_spoiled` says whether the
/// member must be removed rather than kept for another claim.
#[derive(Debug)]
pub struct HandOverError {
    /// What failed.
    pub error: PoolError,
    /// The member was written to or is unusable: remove it.
    pub member_spoiled: bool,
    /// The member was gone (claimed by another process): forget it, remove
    /// nothing.
    pub member_gone: bool,
}

/// A pool's state, as listed.
#[derive(Debug, Clone)]
pub struct PoolStatus {
    /// The template.
    pub spec: PoolSpec,
    /// Member names, warm or being made.
    pub members: Vec<String>,
}

/// The warm pools under one home.
#[derive(Clone, Debug)]
pub struct Pools {
    named: NamedSandboxes,
}

impl Pools {
    /// The pools of `named`'s home; claims become sandboxes of `named`.
    pub fn new(named: NamedSandboxes) -> Self {
        Pools { named }
    }

    /// The named sandboxes claims become.
    pub fn named(&self) -> &NamedSandboxes {
        &self.named
    }

    fn dir(&self) -> PathBuf {
        self.named.home().join("pools")
    }

    fn spec_file(&self, pool: &str) -> Result<StateFile, PoolError> {
        berth_id::check(pool).map_err(|source| NamedSandboxError::InvalidName {
            name: pool.to_string(),
            source,
        })?;
        Ok(StateFile::new(self.dir().join(format!("{pool}.json"))))
    }

    /// The members of `pool`, as named sandboxes of their own directory.
    pub fn members(&self, pool: &str) -> Result<NamedSandboxes, PoolError> {
        self.spec_file(pool)?;
        Ok(NamedSandboxes::in_dir(
            self.named.client().clone(),
            self.dir().join(pool),
        ))
    }

    /// Records a new pool (refusing a name taken, a size out of range, a
    /// template whose backend settings or snapshot choice do not parse, or
    /// one with secrets). Makes no member: [`Pools::fill`] or a server
    /// does.
    pub async fn create(&self, spec: &PoolSpec) -> Result<(), PoolError> {
        let bad = |message: String| PoolError::Template {
            pool: spec.name.clone(),
            message,
        };
        if spec.size == 0 || spec.size > MAX_POOL_SIZE {
            return Err(bad(format!(
                "a pool keeps 1 to {MAX_POOL_SIZE} sandboxes, not {}",
                spec.size
            )));
        }
        if spec.egress.as_ref().is_some_and(|e| !e.secrets.is_empty()) {
            return Err(bad(
                "a pool's template cannot hold secrets (their values are never stored); create the sandbox itself with --secret".into(),
            ));
        }
        let client = self.named.client();
        client
            .backend_from_settings(&spec.backend_settings()?)
            .map_err(|e| bad(e.to_string()))?;
        let snapshot = client
            .snapshot_from_choice(&spec.snapshot)
            .map_err(|e| bad(e.to_string()))?;
        if spec.dedup_keep.is_some() && snapshot.is_remote_store() != Some(true) {
            return Err(bad(format!(
                "deduplicated generations need a remote store (such as remote:MANIFEST), not {:?}",
                spec.snapshot
            )));
        }
        let file = self.spec_file(&spec.name)?;
        let _lock = file.lock().await.map_err(NamedSandboxError::from)?;
        if file.read().map_err(NamedSandboxError::from)?.is_some() {
            return Err(PoolError::Exists {
                pool: spec.name.clone(),
            });
        }
        let text = serde_json::to_string_pretty(spec).map_err(|source| PoolError::Corrupt {
            path: file.path().to_path_buf(),
            source,
        })?;
        file.write(&text).map_err(NamedSandboxError::from)?;
        Ok(())
    }

    /// `pool`'s template.
    pub fn load(&self, pool: &str) -> Result<PoolSpec, PoolError> {
        let file = self.spec_file(pool)?;
        let text = file
            .read()
            .map_err(NamedSandboxError::from)?
            .ok_or_else(|| PoolError::NotFound {
                pool: pool.to_string(),
            })?;
        serde_json::from_str(&text).map_err(|source| PoolError::Corrupt {
            path: file.path().to_path_buf(),
            source,
        })
    }

    /// Every pool with its members, by name (unreadable pool files are
    /// skipped with a warning).
    pub fn list(&self) -> Vec<PoolStatus> {
        let mut pools = Vec::new();
        let Ok(dir) = std::fs::read_dir(self.dir()) else {
            return pools;
        };
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(name) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            match self.load(name) {
                Ok(spec) => pools.push(PoolStatus {
                    members: self.member_names(name),
                    spec,
                }),
                Err(e) => tracing::warn!(pool = name, error = %e, "skipping a pool"),
            }
        }
        pools.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        pools
    }

    /// The names of `pool`'s members (those still the pool's: a member
    /// file a killed claim left naming its new owner is not one).
    pub fn member_names(&self, pool: &str) -> Vec<String> {
        let Ok(members) = self.members(pool) else {
            return Vec::new();
        };
        self.member_files(pool)
            .into_iter()
            .filter(|stem| members.load(stem).is_ok_and(|r| r.name == *stem))
            .collect()
    }

    /// The stems of the state files in `pool`'s directory, sorted.
    fn member_files(&self, pool: &str) -> Vec<String> {
        let mut stems: Vec<String> = std::fs::read_dir(self.dir().join(pool))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".json"))
                    .map(str::to_string)
            })
            .collect();
        stems.sort();
        stems
    }

    /// A name for a new member of `pool`.
    pub fn new_member_name(pool: &str) -> String {
        format!("{pool}-{:016x}", crate::random_id::random_u64())
    }

    /// Makes the member `member` of `spec`'s pool (a name from
    /// [`Pools::new_member_name`]), started; returns its record and the
    /// running sandbox.
    pub async fn add_member(
        &self,
        spec: &PoolSpec,
        member: &str,
    ) -> Result<(NamedSandbox, Sandbox), PoolError> {
        let request = spec.request(member, WorkspaceSpec::default())?;
        Ok(self.members(&spec.name)?.create(request, |_| {}).await?)
    }

    /// Makes members until `pool` has its size; returns how many were
    /// made. The pool's holder in one process (the in-process CLI); a
    /// server keeps its pools full itself.
    pub async fn fill(&self, pool: &str) -> Result<usize, PoolError> {
        let spec = self.load(pool)?;
        let have = self.member_names(pool).len();
        let mut made = 0;
        for _ in have..spec.size as usize {
            self.add_member(&spec, &Self::new_member_name(pool)).await?;
            made += 1;
        }
        Ok(made)
    }

    /// Hands `member` (the running `sandbox` of `pool`'s member of that
    /// name) over as the new sandbox `request` asks for. Holds the new
    /// name's lock and the member's; the member's state file becomes the
    /// new sandbox's by one rename.
    pub async fn hand_over(
        &self,
        pool: &str,
        member: &str,
        mut sandbox: Sandbox,
        request: &ClaimRequest,
    ) -> Result<(NamedSandbox, Sandbox), HandOverError> {
        let keep = |error: PoolError| HandOverError {
            error,
            member_spoiled: false,
            member_gone: false,
        };
        let members = self.members(pool).map_err(keep)?;
        let _lock = self
            .named
            .lock(&request.name)
            .await
            .map_err(|e| keep(e.into()))?;
        if self
            .named
            .read_text(&request.name)
            .map_err(|e| keep(e.into()))?
            .is_some()
        {
            return Err(keep(
                NamedSandboxError::Exists {
                    name: request.name.clone(),
                }
                .into(),
            ));
        }
        let _member_lock = members.lock(member).await.map_err(|e| keep(e.into()))?;
        let mut record = match members.load(member) {
            Ok(record) => record,
            Err(NamedSandboxError::NotFound { .. }) => {
                return Err(HandOverError {
                    error: PoolError::Template {
                        pool: pool.to_string(),
                        message: format!("member {member} was claimed by another process"),
                    },
                    member_spoiled: false,
                    member_gone: true,
                })
            }
            Err(e) => return Err(keep(e.into())),
        };
        let options = self.named.options(
            &request.name,
            record.compression,
            record.freeze,
            record.checkpoint_each_exec,
        );
        if let Err(e) = sandbox.take_over(request.workspace.clone(), options).await {
            // Refused before writing (a bad manifest) keeps the member;
            // anything else spoils it.
            let spoiled = !matches!(e, SandboxError::Spec(_) | SandboxError::PathRefused { .. });
            return Err(HandOverError {
                error: e.into(),
                member_spoiled: spoiled,
                member_gone: false,
            });
        }
        record.name = request.name.clone();
        record.state = sandbox.state();
        let spoiled = |error: PoolError| HandOverError {
            error,
            member_spoiled: true,
            member_gone: false,
        };
        // The new record in the member's file, then the file to the new
        // name: a claim killed between the two leaves a member file naming
        // its new owner, which `recover` finishes moving.
        members
            .save_as(member, &record)
            .map_err(|e| spoiled(e.into()))?;
        let from = members.state_file(member).map_err(|e| spoiled(e.into()))?;
        let to = self
            .named
            .state_file(&request.name)
            .map_err(|e| spoiled(e.into()))?;
        std::fs::rename(from.path(), to.path()).map_err(|e| {
            spoiled(
                NamedSandboxError::StateFile(super::StateFileError::Io {
                    what: "moving a pool member's state to its new name",
                    path: to.path().to_path_buf(),
                    source: e,
                })
                .into(),
            )
        })?;
        Ok((record, sandbox))
    }

    /// Claims a sandbox from `pool` in this process: a member resumed and
    /// handed over, else (none left, or none usable) a cold create from
    /// the template. Members found unusable are removed.
    pub async fn claim(&self, pool: &str, request: &ClaimRequest) -> Result<Claim, PoolError> {
        let spec = self.load(pool)?;
        if let Some(reason) = request.needs_cold_create()? {
            return self.claim_cold(&spec, request, &reason).await;
        }
        let members = self.members(pool)?;
        for member in self.member_names(pool) {
            let Ok(record) = members.load(&member) else {
                continue;
            };
            if record.name != member {
                continue;
            }
            let mut sandbox = match members.resume(&record, |_| {}).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(member, error = %e, "a pool member does not resume; removing it");
                    self.remove_member(pool, &member).await;
                    continue;
                }
            };
            if let Err(e) = sandbox.attach().await {
                tracing::warn!(member, error = %e, "a pool member does not attach; removing it");
                self.remove_member(pool, &member).await;
                continue;
            }
            match self.hand_over(pool, &member, sandbox, request).await {
                Ok((record, sandbox)) => {
                    return Ok(Claim {
                        record,
                        sandbox,
                        source: ClaimSource::Member(member),
                    })
                }
                Err(e) if e.member_gone => continue,
                Err(e) => {
                    if e.member_spoiled {
                        self.remove_member(pool, &member).await;
                        if matches!(e.error, PoolError::Sandbox(SandboxError::NotFresh { .. })) {
                            continue;
                        }
                    }
                    return Err(e.error);
                }
            }
        }
        self.claim_cold(&spec, request, "the pool had no warm sandbox")
            .await
    }

    /// A claim served by a cold create from `spec`, for `reason`.
    pub async fn claim_cold(
        &self,
        spec: &PoolSpec,
        request: &ClaimRequest,
        reason: &str,
    ) -> Result<Claim, PoolError> {
        let create = spec.request(request.name.clone(), request.workspace.clone())?;
        let (record, sandbox) = self.named.create(create, |_| {}).await?;
        Ok(Claim {
            record,
            sandbox,
            source: ClaimSource::Cold(reason.to_string()),
        })
    }

    /// Removes `pool`'s member `member` (its sandbox shut down, its state
    /// forgotten); a failure is logged and the member kept for the next
    /// `pool rm`.
    pub async fn remove_member(&self, pool: &str, member: &str) {
        if let Err(e) = self.try_remove_member(pool, member).await {
            tracing::warn!(member, error = %e, "removing a pool member");
        }
    }

    async fn try_remove_member(&self, pool: &str, member: &str) -> Result<(), PoolError> {
        let members = self.members(pool)?;
        let lock = members.lock(member).await?;
        if members.read_text(member)?.is_none() {
            return Ok(());
        }
        let record = members.load(member)?;
        if record.name != member {
            // Being handed over: it is its new owner's now.
            return Ok(());
        }
        members
            .remove_locked(&lock, member, super::RemoveOptions::default())
            .await
            .map_err(|source| PoolError::Remove {
                member: member.to_string(),
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// Removes `pool`: every member (shut down, forgotten), then its
    /// template. Returns how many members were removed. A member that
    /// cannot be removed keeps the pool, for another try.
    pub async fn remove(&self, pool: &str) -> Result<usize, PoolError> {
        let file = self.spec_file(pool)?;
        let _lock = file.lock().await.map_err(NamedSandboxError::from)?;
        if file.read().map_err(NamedSandboxError::from)?.is_none() {
            return Err(PoolError::NotFound {
                pool: pool.to_string(),
            });
        }
        let names = self.member_names(pool);
        for member in &names {
            self.try_remove_member(pool, member).await?;
        }
        file.remove().map_err(NamedSandboxError::from)?;
        let _ = std::fs::remove_dir(self.dir().join(pool));
        Ok(names.len())
    }

    /// Finishes hand-overs a killed claim left half done: a member file
    /// that already names its new owner moves to that name (if it is
    /// free). Returns the names moved.
    pub async fn recover(&self, pool: &str) -> Result<Vec<String>, PoolError> {
        let members = self.members(pool)?;
        let mut moved = Vec::new();
        for stem in self.member_files(pool) {
            let stem = stem.as_str();
            let path = members.state_file(stem)?.path().to_path_buf();
            let _member_lock = members.lock(stem).await?;
            let Ok(record) = members.load(stem) else {
                continue;
            };
            if record.name == stem {
                continue;
            }
            let _lock = self.named.lock(&record.name).await?;
            let to = self.named.state_file(&record.name)?;
            if to.path().exists() {
                tracing::warn!(member = stem, owner = %record.name,
                    "a half-claimed pool member names a sandbox that exists; leaving it for `berth pool rm`");
                continue;
            }
            std::fs::rename(&path, to.path()).map_err(|e| {
                NamedSandboxError::StateFile(super::StateFileError::Io {
                    what: "finishing a claim",
                    path: to.path().to_path_buf(),
                    source: e,
                })
            })?;
            moved.push(record.name);
        }
        Ok(moved)
    }
}
