//! A sandbox's generations: history, diff, checkpoint, rewind — and the
//! checkpoint an exec takes after its command, on the open sandbox (its
//! snapshot's state, files cache and store instance already warm).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use berth::snapshot::GenerationNote;
use futures::FutureExt;

use super::record;
use super::sandboxes::{resumed, saved, Answer};
use crate::api::Checkpointed;
use crate::api_history::{CheckpointBody, Diff, History, RewindBody, Rewound};
use crate::http::{json_reply, read_json, ApiError};
use crate::route::Call;
use crate::Inner;

/// `GET …/history`: read from the state file (nothing is downloaded).
pub(crate) fn history(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let named = inner.open.named();
        let r = named.load(call.param(0))?;
        let sandbox = named.resume(&r, |_| {}).await?;
        Ok(json_reply(&History::from(sandbox.history()?)))
    }
    .boxed()
}

/// `GET …/diff?from=A&to=B`: read from the two generations' indexes.
pub(crate) fn diff(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let (from, to) = (required(&call, "from")?, required(&call, "to")?);
        let named = inner.open.named();
        let r = named.load(call.param(0))?;
        let sandbox = named.resume(&r, |_| {}).await?;
        Ok(json_reply(&Diff::from(sandbox.diff(from, to).await?)))
    }
    .boxed()
}

fn required(call: &Call, key: &str) -> Result<u64, ApiError> {
    call.number(key)?
        .ok_or_else(|| ApiError::bad_request(format!("the query parameter {key:?} is missing")))
}

/// `POST …/checkpoint`: a generation of the running workspace now.
pub(crate) fn checkpoint(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let body: CheckpointBody = read_json(call.body, inner.limits.json_body).await?;
        let note = GenerationNote::Checkpoint {
            message: body.message,
        };
        let started = Instant::now();
        let generation = checkpoint_open(&inner, &name, note).await?;
        Ok(json_reply(&Checkpointed {
            generation: Some(generation),
            duration_ms: started.elapsed().as_millis() as u64,
            error: None,
        }))
    }
    .boxed()
}

/// Writes a generation of `name`'s workspace recording `note`, on the
/// sandbox the server holds open (under the sandbox's lock; commands keep
/// running). Returns the generation's number.
///
/// The checkpoint returns at its commit; the tidying after it (removing
/// its journal, collecting generations it dropped) runs once the reply is
/// on its way, still under the sandbox's lock, so the next change of the
/// sandbox waits for it and a command's reply does not.
pub(crate) async fn checkpoint_open(
    inner: &Arc<Inner>,
    name: &str,
    note: GenerationNote,
) -> Result<u64, ApiError> {
    let (lock, open) = inner.open.get_locked(name).await?;
    let mut sandbox = open.sandbox.write().await;
    // A snapshot that keeps no generations is refused before anything is
    // written (a checkpoint would be a whole-archive stop).
    sandbox.history()?;
    let result = sandbox.checkpoint_settling_later(note).await;
    inner.open.saved(name, &open, &sandbox)?;
    result?;
    let generation = sandbox.history()?.current.unwrap_or_default();
    drop(sandbox);
    settle_after_reply(inner.clone(), name.to_string(), lock, open);
    Ok(generation)
}

/// Tidies after `open`'s checkpoint in a task, keeping the sandbox's lock
/// until it is done, then saves the state the tidying changed (a
/// collection updates the snapshot's record).
fn settle_after_reply(
    inner: Arc<Inner>,
    name: String,
    lock: berth::sandbox::StateLock,
    open: Arc<crate::open::OpenSandbox>,
) {
    tokio::spawn(async move {
        let sandbox = open.sandbox.read().await;
        sandbox.settle().await;
        if let Err(e) = inner.open.saved(&name, &open, &sandbox) {
            tracing::warn!(sandbox = %name, error = %e,
                "saving the state after a checkpoint's tidying failed; the next change saves it");
        }
        drop(sandbox);
        drop(lock);
    });
}

/// The checkpoint after a command of `name`: what it wrote, or why it
/// failed (the command's own result stands either way).
pub(crate) async fn after_command(
    inner: &Arc<Inner>,
    name: &str,
    command: &str,
    exit_code: i32,
    started: SystemTime,
    duration_ms: u64,
) -> Checkpointed {
    let note = GenerationNote::Exec {
        command: command.to_string(),
        exit_code,
        started_ms: started
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        duration_ms,
    };
    let clock = Instant::now();
    let result = checkpoint_open(inner, name, note).await;
    let duration_ms = clock.elapsed().as_millis() as u64;
    match result {
        Ok(generation) => Checkpointed {
            generation: Some(generation),
            duration_ms,
            error: None,
        },
        Err(e) => {
            tracing::warn!(
                sandbox = name,
                "the checkpoint after a command failed: {}",
                e.detail().message
            );
            Checkpointed {
                generation: None,
                duration_ms,
                error: Some(e.detail()),
            }
        }
    }
}

/// `POST …/rewind`: the workspace saved as a generation, then generation
/// K restored in a re-created instance. The server's open copy is
/// forgotten; the next command opens the rewound sandbox.
pub(crate) fn rewind(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let name = call.param(0).to_string();
        let body: RewindBody = read_json(call.body, inner.limits.json_body).await?;
        let (_lock, mut r, mut sandbox) = resumed(&inner, &name).await?;
        let result = if r.state.workspace_root_ready {
            match sandbox.attach().await {
                Ok(_) => sandbox.rewind(body.generation).await,
                Err(e) => Err(e),
            }
        } else {
            sandbox.rewind(body.generation).await
        };
        let saved_as = saved(&inner, &mut r, &sandbox, result)?;
        Ok(json_reply(&Rewound {
            generation: body.generation,
            saved_as,
            sandbox: record(&r),
        }))
    }
    .boxed()
}
