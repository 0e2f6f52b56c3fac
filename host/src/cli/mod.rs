//! Command-line parsing and dispatch.

mod plugin;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Berth: sandboxes for AI-agent workspaces, with WebAssembly snapshot stores.
#[derive(Parser)]
#[command(name = "berth", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check, inspect and try snapshot-store plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Plugin(cmd) => plugin::run(cmd).await,
    }
}
