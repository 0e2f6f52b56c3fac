//! `berth-egress serve DIR`: the egress daemon for one sandbox, started
//! (detached) by Berth when a sandbox with an egress policy starts. See
//! the `berth_egress` library for what it serves and how it is controlled.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = match args.as_slice() {
        [serve, dir] if serve == "serve" => PathBuf::from(dir),
        _ => {
            eprintln!(
                "usage: berth-egress serve DIR\n\nServes the egress point of the sandbox whose \
                 egress directory is DIR (written by Berth: policy.json, resolve.json)."
            );
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("berth-egress: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(berth_egress::serve(&berth_egress::EgressDir::new(dir))) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("berth-egress: {e}");
            ExitCode::FAILURE
        }
    }
}
