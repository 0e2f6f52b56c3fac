//! `berth`: the command-line face of the Berth sandbox runtime.

mod commands;
mod logging;
mod plugin;
mod sandboxes;
mod scaffold;
mod server;
mod table;

use std::process::ExitCode;
use std::time::Duration;

/// How long an interrupted command may take to undo what it began (resume
/// a container paused for a stop) before the process exits anyway.
const UNDO_GRACE: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
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
