//! Forking a named sandbox into many at once, for every front end: the
//! CLI's `berth fork NAME --count N`, the server's `POST
//! /v1/sandboxes/{name}/forks`. With a fresh checkpoint first (a live
//! fork), the children start from the workspace as it is now while the
//! parent keeps running.

use super::{NamedSandbox, NamedSandboxError, NamedSandboxes, Sandbox, SandboxError};

/// The most children one fork makes.
pub const MAX_FORKS: u32 = 64;

/// Why a fork into many did not happen. Nothing of it is left: children
/// made before a failure are removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// A child's name: invalid or taken; or the source's lock or state.
    #[error(transparent)]
    Named(#[from] NamedSandboxError),
    /// The count is out of range.
    #[error("a fork makes 1 to {MAX_FORKS} sandboxes, not {0}")]
    Count(u32),
    /// Making or starting a child failed (the others were removed).
    #[error("fork {name} failed; no fork was kept")]
    Child {
        /// The child.
        name: String,
        /// Why.
        #[source]
        source: Box<SandboxError>,
    },
}

/// The names `prefix1` … `prefixN`.
pub fn fork_names(prefix: &str, count: u32) -> Result<Vec<String>, ForkError> {
    if count == 0 || count > MAX_FORKS {
        return Err(ForkError::Count(count));
    }
    Ok((1..=count).map(|i| format!("{prefix}{i}")).collect())
}

impl NamedSandboxes {
    /// New sandboxes `names`, each starting from generation `generation`
    /// (by default the newest) of `source`'s deduplicated snapshot, made
    /// and started in parallel; returns them in the order of `names`.
    /// Holds `source`'s lock and every child's throughout. Every child
    /// gets `source`'s manifest, store and egress policy, and the backend
    /// `source` runs on. If any child fails, those made are removed and
    /// no name is left taken.
    pub async fn fork_many(
        &self,
        source: &str,
        generation: Option<u64>,
        names: &[String],
        start: bool,
    ) -> Result<Vec<(NamedSandbox, Sandbox)>, ForkError> {
        let _source_lock = self.lock(source).await?;
        let record = self.load(source)?;
        let mut locks = Vec::with_capacity(names.len());
        for name in names {
            locks.push(self.lock(name).await?);
            if self.read_text(name)?.is_some() {
                return Err(NamedSandboxError::Exists { name: name.clone() }.into());
            }
        }
        let made = futures::future::join_all(
            names
                .iter()
                .map(|name| self.fork_one(&record, generation, name, start)),
        )
        .await;
        let mut children = Vec::with_capacity(names.len());
        let mut failed = None;
        for (name, result) in names.iter().zip(made) {
            match result {
                Ok(child) => children.push(child),
                Err((partial, source)) => {
                    if let Some(sandbox) = partial {
                        children.push((self.record_of(&record, name, &sandbox), sandbox));
                    }
                    failed.get_or_insert(ForkError::Child {
                        name: name.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        if let Some(error) = failed {
            for (child, mut sandbox) in children {
                if let Err(e) = sandbox.shutdown().await {
                    tracing::warn!(child = %child.name, error = %e, "removing a fork after another failed");
                    // Kept, so that `rm` can finish it.
                    let _ = self.save(&self.record_of(&record, &child.name, &sandbox));
                    continue;
                }
                if let Some(deleted) = sandbox.delete_snapshot().await.err() {
                    tracing::warn!(child = %child.name, error = %deleted, "deleting a removed fork's snapshot");
                }
                let _ = self.remove(&child.name);
            }
            return Err(error);
        }
        for (child, _) in &children {
            self.save(child)?;
        }
        drop(locks);
        Ok(children)
    }

    /// The record of a child `name` of `source` holding `sandbox`.
    fn record_of(&self, source: &NamedSandbox, name: &str, sandbox: &Sandbox) -> NamedSandbox {
        NamedSandbox {
            checkpoint_each_exec: false,
            name: name.to_string(),
            compression: false,
            freeze: source.freeze,
            state: sandbox.state(),
        }
    }

    /// One child: made, and started when asked. On failure, the sandbox
    /// if one was made (for its removal) and why.
    async fn fork_one(
        &self,
        source: &NamedSandbox,
        generation: Option<u64>,
        name: &str,
        start: bool,
    ) -> Result<(NamedSandbox, Sandbox), (Option<Sandbox>, SandboxError)> {
        let client = self.client();
        let backend = client
            .backend_like(&source.state.backend)
            .map_err(|e| (None, e))?;
        let options = self.options(name, false, source.freeze, false);
        let mut sandbox = client
            .fork(&source.state, generation, None, backend, options)
            .await
            .map_err(|e| (None, e))?;
        if start {
            if let Err(e) = sandbox.start().await {
                return Err((Some(sandbox), e));
            }
        }
        Ok((self.record_of(source, name, &sandbox), sandbox))
    }
}
