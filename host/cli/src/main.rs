//! `berth`: the command-line face of the Berth sandbox runtime.

mod commands;
mod leftovers;
mod plugin;
mod sandboxes;
mod scaffold;
mod server;
mod table;

use clap::Parser;

fn main() -> std::process::ExitCode {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        // `berth serve` hands the warnings of a request to its client.
        .with(berth_server::WarningRelay.with_filter(berth_server::WarningRelay::filter()))
        .init();
    // One TLS crypto provider for the process (Docker over TLS, registries),
    // chosen here rather than left to rustls' feature detection.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = commands::Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
