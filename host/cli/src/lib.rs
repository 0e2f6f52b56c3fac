//! `berth`: the command-line face of the Berth sandbox runtime, as a
//! library so that a program embedding Berth can ship the same command
//! with its own backend kinds:
//!
//! ```no_run
//! # struct MyProvider;
//! # fn provider() -> std::sync::Arc<dyn berth::backend::BackendProvider> { unimplemented!() }
//! fn main() -> std::process::ExitCode {
//!     berth_cli::Berth::new().backend_provider(provider()).main()
//! }
//! ```
//!
//! Its kinds then reach `berth create --backend KIND` (their settings as
//! flags and in `--help`), `berth serve`'s API and everything after; a
//! snapshot kind added with [`Berth::snapshot_provider`] reaches
//! `--snapshot KIND[:ARGUMENT]`, the API's `snapshot`, resume and
//! `berth gc --orphans` the same way.

mod commands;
mod home;
mod info;
mod logging;
mod notice;
mod plugin;
mod sandboxes;
mod scaffold;
mod server;
mod table;

use std::process::ExitCode;
use std::sync::Arc;

use berth::backend::BackendProvider;
use berth::snapshot::SnapshotProvider;
use std::time::Duration;

/// How long an interrupted command may take to undo what it began (resume
/// a container paused for a stop) before the process exits anyway.
const UNDO_GRACE: Duration = Duration::from_secs(20);

/// The kinds an embedder added (see [`Berth::backend_provider`] and
/// [`Berth::snapshot_provider`]).
static EXTRA_KINDS: std::sync::OnceLock<Berth> = std::sync::OnceLock::new();

/// The backend providers registered beside the built-in ones.
pub(crate) fn extra_providers() -> &'static [Arc<dyn BackendProvider>] {
    EXTRA_KINDS
        .get()
        .map(|b| b.providers.as_slice())
        .unwrap_or_default()
}

/// The snapshot providers registered beside the built-in ones.
pub(crate) fn extra_snapshot_providers() -> &'static [Arc<dyn SnapshotProvider>] {
    EXTRA_KINDS
        .get()
        .map(|b| b.snapshot_providers.as_slice())
        .unwrap_or_default()
}

/// The `berth` command, with the backend and snapshot kinds it knows.
#[derive(Default)]
pub struct Berth {
    providers: Vec<Arc<dyn BackendProvider>>,
    snapshot_providers: Vec<Arc<dyn SnapshotProvider>>,
}

impl Berth {
    /// The `berth` command with the built-in kinds (local, Docker, swarm).
    pub fn new() -> Self {
        Berth::default()
    }

    /// Adds a backend kind (replacing a built-in one of the same kind).
    pub fn backend_provider(mut self, provider: Arc<dyn BackendProvider>) -> Self {
        self.providers.push(provider);
        self
    }

    /// Adds a snapshot kind (replacing a built-in one of the same kind).
    pub fn snapshot_provider(mut self, provider: Arc<dyn SnapshotProvider>) -> Self {
        self.snapshot_providers.push(provider);
        self
    }

    /// Parses the process's arguments and runs the command, as the
    /// `berth` binary does.
    pub fn main(self) -> ExitCode {
        // The first call wins: one set of kinds per process.
        let _ = EXTRA_KINDS.set(self);
        main()
    }
}

fn main() -> ExitCode {
    berth::allocator::bound_allocator_retention();
    let args = commands::Cli::parse_with_hints();
    logging::init(args.is_serve());
    // One TLS crypto provider for the process (Docker over TLS, registries),
    // chosen here rather than left to rustls' feature detection.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = if args.handles_interrupt() {
        runtime.block_on(commands::run(args))
    } else {
        runtime.block_on(interruptible(args))
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; on Ctrl-C (or SIGTERM) cancels it — the library's
/// operations are cancel safe: a cancelled stop keeps the previous
/// snapshot and removes its unfinished archive — waits for what undoes it
/// (a container paused for the stop is resumed), and exits 130.
async fn interruptible(args: commands::Cli) -> anyhow::Result<ExitCode> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let finished = {
        let command = commands::run(args);
        tokio::pin!(command);
        tokio::select! {
            result = &mut command => Some(result),
            _ = tokio::signal::ctrl_c() => None,
            _ = term.recv() => None,
        }
        // The command's future is dropped here, before the wait below.
    };
    if let Some(result) = finished {
        return result;
    }
    if berth::cleanup::finish_cleanups(UNDO_GRACE).await {
        eprintln!("berth: interrupted; the command was cancelled and what it had begun was undone (an interrupted stop keeps the previous snapshot)");
    } else {
        eprintln!("berth: interrupted; the command was cancelled, but resuming what it had paused did not finish within {} s: the next command on the sandbox resumes it", UNDO_GRACE.as_secs());
    }
    Ok(ExitCode::from(130))
}
