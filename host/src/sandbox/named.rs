//! Sandboxes kept by name under a home directory: one state file per name
//! (`HOME/sandboxes/NAME.json`) and the per-sandbox lock beside it.
//!
//! This is what the `berth` CLI and `berth serve` share, so that the two
//! can run side by side: each lifecycle change holds the sandbox's lock
//! from before it reads the state until after it has written it back, and
//! a process that keeps a sandbox open (the server) compares the state file
//! with what it last saw before reusing it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxState, StateFile, StateFileError,
    StateLock, StateSink,
};

/// Why a named sandbox could not be found, read, written or locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NamedSandboxError {
    /// The name is not a valid sandbox name (the snapshot id grammar:
    /// `[A-Za-z0-9._-]{1,128}`, not `.` or `..`).
    #[error("{name:?} is not a valid sandbox name")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        #[source]
        source: berth_id::IdGrammarError,
    },
    /// No state file for this name.
    #[error("no sandbox named {name:?} (looked for {}); see `berth ls`", path.display())]
    NotFound {
        /// The name.
        name: String,
        /// Where its state file would be.
        path: PathBuf,
    },
    /// The name is taken.
    #[error("a sandbox named {name:?} already exists; `berth rm {name}` removes it")]
    Exists {
        /// The name.
        name: String,
    },
    /// The state file is not a named sandbox's state.
    #[error("state file {} is corrupt", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
    /// Reading, writing or locking the state file failed.
    #[error(transparent)]
    StateFile(#[from] StateFileError),
    /// Resuming or attaching the sandbox failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// What is kept per named sandbox: its lifecycle state and the options it
/// was created with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NamedSandbox {
    /// Its name.
    pub name: String,
    /// Whether its snapshots are zstd-compressed.
    #[serde(default)]
    pub compression: bool,
    /// Whether the container is paused while `stop` reads the workspace.
    #[serde(default = "yes")]
    pub freeze: bool,
    /// Whether every command is followed by a checkpoint (a generation
    /// recording it; `berth create --checkpoint each-exec`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint_each_exec: bool,
    /// The lifecycle state.
    pub state: SandboxState,
}

fn yes() -> bool {
    true
}

/// The named sandboxes under one home, resumed through one client.
///
/// ```no_run
/// use berth::sandbox::{NamedSandboxes, SandboxClient};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let named = NamedSandboxes::new(SandboxClient::new("/var/lib/berth"));
/// // Lock, read the state, resume and attach, save what attaching changed.
/// let (lock, _record, sandbox) = named.attach_locked("box").await?;
/// drop(lock); // the sandbox is up: commands may run in parallel
/// let result = sandbox
///     .exec(berth::ExecRequest::new("ls", std::time::Duration::from_secs(10)))
///     .await?;
/// println!("{}", result.stdout_text());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct NamedSandboxes {
    client: SandboxClient,
    /// Where the state files are: `HOME/sandboxes`, or a pool's directory.
    dir: PathBuf,
}

impl NamedSandboxes {
    /// The named sandboxes under `client`'s home.
    pub fn new(client: SandboxClient) -> Self {
        let dir = client.home().join("sandboxes");
        NamedSandboxes { client, dir }
    }

    /// Named sandboxes whose state files are in `dir` instead (a warm
    /// pool's members: see [`super::Pools`]), resumed through `client`.
    pub fn in_dir(client: SandboxClient, dir: impl Into<PathBuf>) -> Self {
        NamedSandboxes {
            client,
            dir: dir.into(),
        }
    }

    /// The directory of the state files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The client sandboxes are created and resumed with.
    pub fn client(&self) -> &SandboxClient {
        &self.client
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        self.client.home()
    }

    /// The state file of `name` (the name checked).
    pub fn state_file(&self, name: &str) -> Result<StateFile, NamedSandboxError> {
        berth_id::check(name).map_err(|source| NamedSandboxError::InvalidName {
            name: name.to_string(),
            source,
        })?;
        Ok(StateFile::new(self.dir.join(format!("{name}.json"))))
    }

    /// Waits for `name`'s lock.
    pub async fn lock(&self, name: &str) -> Result<StateLock, NamedSandboxError> {
        Ok(self.state_file(name)?.lock().await?)
    }

    /// The state file's text as it is now, if there is one.
    pub fn read_text(&self, name: &str) -> Result<Option<String>, NamedSandboxError> {
        Ok(self.state_file(name)?.read()?)
    }

    /// Reads `name`'s record.
    pub fn load(&self, name: &str) -> Result<NamedSandbox, NamedSandboxError> {
        let file = self.state_file(name)?;
        let text = file.read()?.ok_or_else(|| NamedSandboxError::NotFound {
            name: name.to_string(),
            path: file.path().to_path_buf(),
        })?;
        Self::parse(file.path(), &text)
    }

    /// Parses a state file's text.
    pub fn parse(path: &Path, text: &str) -> Result<NamedSandbox, NamedSandboxError> {
        serde_json::from_str(text).map_err(|source| NamedSandboxError::Corrupt {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Writes `record` atomically (temp file, fsync, rename).
    pub fn save(&self, record: &NamedSandbox) -> Result<(), NamedSandboxError> {
        self.save_as(&record.name, record)
    }

    /// Writes `record` atomically into the state file of `file_name`, which
    /// may differ from the record's own name (a pool member's record
    /// naming its new owner, just before the file moves to that name).
    pub fn save_as(&self, file_name: &str, record: &NamedSandbox) -> Result<(), NamedSandboxError> {
        let file = self.state_file(file_name)?;
        let text =
            serde_json::to_string_pretty(record).map_err(|source| NamedSandboxError::Corrupt {
                path: file.path().to_path_buf(),
                source,
            })?;
        file.write(&text)?;
        Ok(())
    }

    /// Forgets `name` (its state file and lock file).
    pub fn remove(&self, name: &str) -> Result<(), NamedSandboxError> {
        Ok(self.state_file(name)?.remove()?)
    }

    /// Every named sandbox, by name, and the state files that did not
    /// parse.
    pub fn list(&self) -> (Vec<NamedSandbox>, Vec<PathBuf>) {
        let mut rows = Vec::new();
        let mut unreadable = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "json") {
                    match std::fs::read_to_string(&p)
                        .ok()
                        .and_then(|t| serde_json::from_str::<NamedSandbox>(&t).ok())
                    {
                        Some(s) => rows.push(s),
                        None => unreadable.push(p),
                    }
                }
            }
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        unreadable.sort();
        (rows, unreadable)
    }

    /// Options for a named sandbox: the state file is rewritten
    /// (atomically) whenever the lifecycle says a crash must not lose the
    /// moment, keeping the record's own settings (`compression`, `freeze`,
    /// `checkpoint_each_exec`). By default, no progress is reported.
    pub fn options(
        &self,
        name: &str,
        compression: bool,
        freeze: bool,
        checkpoint_each_exec: bool,
    ) -> SandboxOptions {
        let this = self.clone();
        let name = name.to_string();
        let sink = move |state: &SandboxState| {
            let record = NamedSandbox {
                checkpoint_each_exec,
                name: name.clone(),
                compression,
                freeze,
                state: state.clone(),
            };
            this.save(&record)
                .map_err(|e| Box::<dyn std::error::Error + Send + Sync>::from(e.to_string()))
        };
        SandboxOptions {
            compression,
            freeze_during_stop: freeze,
            state_sink: Some(StateSink(Arc::new(sink))),
            ..SandboxOptions::default()
        }
    }

    /// Resumes `record` (without attaching), with `adjust` applied to its
    /// options.
    pub async fn resume(
        &self,
        record: &NamedSandbox,
        adjust: impl FnOnce(&mut SandboxOptions),
    ) -> Result<Sandbox, NamedSandboxError> {
        let mut options = self.options(
            &record.name,
            record.compression,
            record.freeze,
            record.checkpoint_each_exec,
        );
        adjust(&mut options);
        Ok(self
            .client
            .resume(record.state.clone(), None, options)
            .await?)
    }

    /// Settles a create whose start failed with `error`, holding `name`'s
    /// lock: what the start made (a container, a workspace directory Berth
    /// owns) is removed and the name forgotten, so that the same create
    /// can simply be tried again. Only when removing fails is the sandbox
    /// kept (its state saved, for `berth rm` to finish); the error of that
    /// removal is returned. A snapshot that existed before is never
    /// touched.
    pub async fn settle_failed_create(
        &self,
        record: &mut NamedSandbox,
        sandbox: &mut Sandbox,
        error: &SandboxError,
    ) -> Result<(), SandboxError> {
        let removed = if error.left_nothing() {
            Ok(())
        } else {
            sandbox.shutdown().await
        };
        match removed {
            Ok(()) => {
                // The lifecycle may have saved the state while starting.
                if let Err(e) = self.remove(&record.name) {
                    tracing::warn!(error = %e, "forgetting a sandbox whose create failed");
                }
                Ok(())
            }
            Err(e) => {
                record.state = sandbox.state();
                if let Err(save) = self.save(record) {
                    tracing::warn!(error = %save, "saving a sandbox whose create failed");
                }
                Err(e)
            }
        }
    }

    /// Takes `name`'s lock, resumes it and attaches (restoring the
    /// workspace if it is gone), saving what that changed even when it
    /// failed. Returns the lock (still held), the record as saved, and the
    /// running sandbox.
    pub async fn attach_locked(
        &self,
        name: &str,
    ) -> Result<(StateLock, NamedSandbox, Sandbox), NamedSandboxError> {
        self.attach_locked_with(name, |_| {}).await
    }

    /// [`attach_locked`](Self::attach_locked), with `adjust` applied to
    /// the sandbox's options.
    pub async fn attach_locked_with(
        &self,
        name: &str,
        adjust: impl FnOnce(&mut SandboxOptions),
    ) -> Result<(StateLock, NamedSandbox, Sandbox), NamedSandboxError> {
        let lock = self.lock(name).await?;
        let mut record = self.load(name)?;
        let mut sandbox = self.resume(&record, adjust).await?;
        let attached = sandbox.attach().await;
        record.state = sandbox.state();
        self.save(&record)?;
        attached?;
        Ok((lock, record, sandbox))
    }
}
