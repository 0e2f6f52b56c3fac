//! Command-line parsing and dispatch.

use crate::{plugin, sandboxes};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Berth: sandboxes for AI-agent workspaces, with WebAssembly snapshot stores.
///
/// Sandboxes are kept by name under $BERTH_HOME (default: the XDG data
/// directory). Set RUST_LOG=info (or debug) for logs.
#[derive(Parser)]
#[command(name = "berth", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a sandbox (and start it, unless --no-start).
    Create(Box<sandboxes::CreateArgs>),
    /// Start a sandbox: reuse, rebuild or restore its workspace.
    Start(sandboxes::StartArgs),
    /// Run a shell command in a sandbox; its exit code becomes berth's.
    Exec(sandboxes::ExecArgs),
    /// Persist the workspace into its snapshot (destroys nothing).
    Stop {
        /// Sandbox name.
        name: String,
    },
    /// Stop, destroy what the sandbox owns, and forget it.
    Rm {
        /// Sandbox name.
        name: String,
        /// Forget it even if stop or shutdown fails.
        #[arg(long)]
        force: bool,
    },
    /// List sandboxes.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a sandbox's state JSON.
    Inspect {
        /// Sandbox name.
        name: String,
    },
    /// Write the workspace as a tar file.
    Persist {
        /// Sandbox name.
        name: String,
        /// Output file.
        #[arg(long)]
        out: PathBuf,
    },
    /// Extract a tar file into the workspace (validated first, entirely).
    Hydrate {
        /// Sandbox name.
        name: String,
        /// The tar file.
        file: PathBuf,
    },
    /// Delete what no kept generation of a deduplicated snapshot needs
    /// (dropped generations, packs an interrupted stop left).
    Gc {
        /// Sandboxes (default: every one with a deduplicated snapshot).
        names: Vec<String>,
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Make a new sandbox that starts from NAME's latest generation,
    /// sharing its chunks (NAME needs a deduplicated snapshot).
    Fork {
        /// The sandbox to fork.
        name: String,
        /// The new sandbox's name.
        new: String,
        /// Create without starting.
        #[arg(long)]
        no_start: bool,
    },
    /// Check, inspect and try snapshot-store plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Create(a) => sandboxes::create(*a).await,
        Command::Start(a) => sandboxes::start(a).await,
        Command::Exec(a) => sandboxes::exec(a).await,
        Command::Stop { name } => sandboxes::stop(&name).await,
        Command::Rm { name, force } => sandboxes::rm(&name, force).await,
        Command::Ls { json } => sandboxes::ls(json).await,
        Command::Inspect { name } => sandboxes::inspect(&name).await,
        Command::Persist { name, out } => sandboxes::persist(&name, &out).await,
        Command::Hydrate { name, file } => sandboxes::hydrate(&name, &file).await,
        Command::Gc { names, dry_run } => sandboxes::gc(names, dry_run).await,
        Command::Fork {
            name,
            new,
            no_start,
        } => sandboxes::fork(&name, &new, no_start).await,
        Command::Plugin(cmd) => plugin::run(cmd).await,
    }
}
