//! Work that undoes a cancelled operation after its caller has gone.
//!
//! Lifecycle futures are cancel safe: dropping a `stop` part-way leaves the
//! previous snapshot in place. Some of the undoing cannot run inside `Drop`
//! (resuming a container paused for the stop is an API call), so it is
//! spawned here instead. A program that cancels an operation and is about
//! to exit (the CLI on Ctrl-C) calls [`finish_cleanups`] first, so the
//! process does not end with a sandbox left paused.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio_util::task::TaskTracker;

fn tracker() -> &'static TaskTracker {
    static TRACKER: OnceLock<TaskTracker> = OnceLock::new();
    TRACKER.get_or_init(TaskTracker::new)
}

/// Runs `cleanup` on the current tokio runtime, tracked so that
/// [`finish_cleanups`] can wait for it. Without a runtime (a drop outside
/// one) it cannot run: it is logged and dropped, and the next command on
/// the sandbox repairs what it would have (a paused container is resumed
/// when it is next attached).
pub fn spawn_cleanup(what: &'static str, cleanup: impl Future<Output = ()> + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            tracker().spawn_on(cleanup, &runtime);
        }
        Err(_) => {
            tracing::warn!("{what} could not run (no async runtime); the next command repairs it")
        }
    }
}

/// Waits up to `timeout` for the cleanups started by [`spawn_cleanup`] to
/// finish. Returns whether all of them did.
pub async fn finish_cleanups(timeout: Duration) -> bool {
    let tracker = tracker();
    if tracker.is_empty() {
        return true;
    }
    tracker.close();
    let done = tokio::time::timeout(timeout, tracker.wait()).await.is_ok();
    tracker.reopen();
    done
}
