//! Sandboxes the server keeps open between requests, so a command costs a
//! message on a warm session, not a resume and an attach.
//!
//! The state file stays the truth: before reusing an open sandbox, the
//! server takes the sandbox's lock and compares the state file's text with
//! the text it saw when it opened it. A CLI command run in-process beside
//! the server (a stop, a start, an `rm`) changes the file, and the server
//! then opens the sandbox afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use berth::sandbox::{NamedSandbox, NamedSandboxError, NamedSandboxes, Sandbox, StateLock};

/// One open sandbox.
pub(crate) struct OpenSandbox {
    /// The sandbox; commands take it shared while they spawn, lifecycle
    /// changes take it exclusively.
    pub(crate) sandbox: tokio::sync::RwLock<Sandbox>,
    /// The state file's text when it was last opened or written here.
    seen: Mutex<String>,
    /// Whether it was created to checkpoint after every command (a
    /// change of the state file opens it afresh, so this stays true).
    pub(crate) checkpoint_each_exec: bool,
}

/// The open sandboxes, by name.
pub(crate) struct OpenSandboxes {
    named: NamedSandboxes,
    open: Mutex<HashMap<String, Arc<OpenSandbox>>>,
}

impl OpenSandboxes {
    pub(crate) fn new(named: NamedSandboxes) -> Self {
        OpenSandboxes {
            named,
            open: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn named(&self) -> &NamedSandboxes {
        &self.named
    }

    /// How many sandboxes are open.
    pub(crate) fn count(&self) -> usize {
        self.map().len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OpenSandbox>>> {
        // A panic while holding this map's lock leaves a map that is still
        // whole: keep using it.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets `name`'s open sandbox (the next request opens it afresh).
    pub(crate) fn forget(&self, name: &str) {
        self.map().remove(name);
    }

    /// `name`, open and attached, with its lock held: reused when the
    /// state file is as the server last saw it, else resumed and attached
    /// (and what attaching changed saved).
    pub(crate) async fn get_locked(
        &self,
        name: &str,
    ) -> Result<(StateLock, Arc<OpenSandbox>), NamedSandboxError> {
        let lock = self.named.lock(name).await?;
        let file = self.named.state_file(name)?;
        let Some(text) = self.named.read_text(name)? else {
            self.forget(name);
            return Err(NamedSandboxError::NotFound {
                name: name.to_string(),
                path: file.path().to_path_buf(),
            });
        };
        let cached = self.map().get(name).cloned();
        if let Some(open) = cached {
            let same = *open.seen_text() == text;
            if same && open.sandbox.read().await.is_running() {
                return Ok((lock, open));
            }
        }
        let record = NamedSandboxes::parse(file.path(), &text)?;
        let open = Arc::new(self.attach(record).await?);
        self.map().insert(name.to_string(), open.clone());
        Ok((lock, open))
    }

    /// Keeps `sandbox`, running, open under `record`'s name (its lock held
    /// by the caller, its state file just written): the next command
    /// reuses it.
    pub(crate) fn insert(
        &self,
        record: &NamedSandbox,
        sandbox: Sandbox,
    ) -> Result<(), NamedSandboxError> {
        let seen = self.named.read_text(&record.name)?.unwrap_or_default();
        let open = Arc::new(OpenSandbox {
            sandbox: tokio::sync::RwLock::new(sandbox),
            seen: Mutex::new(seen),
            checkpoint_each_exec: record.checkpoint_each_exec,
        });
        self.map().insert(record.name.clone(), open);
        Ok(())
    }

    /// `name`, open and attached; its lock released (commands may run in
    /// parallel once it is up).
    pub(crate) async fn get(&self, name: &str) -> Result<Arc<OpenSandbox>, NamedSandboxError> {
        let (_lock, open) = self.get_locked(name).await?;
        Ok(open)
    }

    async fn attach(&self, mut record: NamedSandbox) -> Result<OpenSandbox, NamedSandboxError> {
        let mut sandbox = self.named.resume(&record, |_| {}).await?;
        let attached = sandbox.attach().await;
        record.state = sandbox.state();
        self.named.save(&record)?;
        attached?;
        let seen = self.named.read_text(&record.name)?.unwrap_or_default();
        Ok(OpenSandbox {
            sandbox: tokio::sync::RwLock::new(sandbox),
            seen: Mutex::new(seen),
            checkpoint_each_exec: record.checkpoint_each_exec,
        })
    }

    /// After a change made through `open` (its lock held): saves the
    /// sandbox's state and remembers the file's new text. Returns the
    /// record as saved.
    pub(crate) fn saved(
        &self,
        name: &str,
        open: &OpenSandbox,
        sandbox: &Sandbox,
    ) -> Result<NamedSandbox, NamedSandboxError> {
        let mut record = self.named.load(name)?;
        record.state = sandbox.state();
        self.named.save(&record)?;
        *open.seen_text() = self.named.read_text(name)?.unwrap_or_default();
        Ok(record)
    }
}

impl OpenSandbox {
    fn seen_text(&self) -> std::sync::MutexGuard<'_, String> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
