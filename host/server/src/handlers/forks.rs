//! Forking a sandbox into many at once, by default live: a checkpoint of
//! the running workspace on the sandbox the server holds open, then the
//! children made and started in parallel from it, and kept open.

use std::sync::Arc;
use std::time::Instant;

use berth::snapshot::GenerationNote;
use futures::FutureExt;

use super::history::checkpoint_open;
use super::record;
use super::Answer;
use crate::api_pools::{Forked, ForksBody};
use crate::http::{json_reply, read_json};
use crate::route::Call;
use crate::Inner;

pub(crate) fn forks(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let source = call.param(0).to_string();
        let body: ForksBody = read_json(call.body, inner.limits.json_body).await?;
        let names = berth::sandbox::fork_names(&body.prefix, body.count)?;
        let named = inner.open.named();
        // Refused before a checkpoint is written for nothing.
        for name in &names {
            if named.read_text(name)?.is_some() {
                return Err(
                    berth::sandbox::NamedSandboxError::Exists { name: name.clone() }.into(),
                );
            }
        }
        let clock = Instant::now();
        let generation = match body.generation {
            Some(generation) => generation,
            None => {
                let note = GenerationNote::Checkpoint {
                    message: Some(format!("live fork into {}", body.count)),
                };
                checkpoint_open(&inner, &source, note).await?
            }
        };
        let checkpoint_ms = match body.generation {
            Some(_) => 0,
            None => clock.elapsed().as_millis() as u64,
        };
        let clock = Instant::now();
        let children = named
            .fork_many(
                &source,
                Some(generation),
                &names,
                body.start.unwrap_or(true),
            )
            .await?;
        let forks_ms = clock.elapsed().as_millis() as u64;
        let mut sandboxes = Vec::with_capacity(children.len());
        for (child, sandbox) in children {
            sandboxes.push(record(&child));
            if sandbox.is_running() {
                inner.open.insert(&child, sandbox)?;
            }
        }
        Ok(json_reply(&Forked {
            generation,
            sandboxes,
            checkpoint_ms,
            forks_ms,
        }))
    }
    .boxed()
}
