//! Command-line parsing and dispatch.

use crate::{plugin, sandboxes, server};

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
    /// Run the command in this process instead of through `berth serve`
    /// (as BERTH_NO_SERVER=1 does): `berth --no-server exec …`. By default,
    /// commands that reach a sandbox go through the server on
    /// $BERTH_HOME/berth.sock, started on demand.
    #[arg(long)]
    no_server: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a sandbox (and start it, unless --no-start).
    Create(Box<sandboxes::CreateArgs>),
    /// Start a sandbox: reuse, rebuild or restore its workspace.
    Start(sandboxes::StartArgs),
    /// Run a command in a sandbox (a shell command line, or words with
    /// --no-shell), its output streamed as it comes;
    /// its exit code becomes berth's. With --detach, in the background.
    Exec(sandboxes::ExecArgs),
    /// List a sandbox's background processes.
    Ps {
        /// Sandbox name.
        name: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a background process's output (what its log ring keeps).
    Logs(sandboxes::LogsArgs),
    /// Send a background process a signal.
    Kill {
        /// Sandbox name.
        name: String,
        /// The background process's id.
        id: String,
        /// The signal (TERM, KILL, INT, HUP, … or a number).
        #[arg(long, short, default_value = "TERM")]
        signal: String,
    },
    /// Wait for a background process to exit; its exit code becomes berth's.
    Wait {
        /// Sandbox name.
        name: String,
        /// The background process's id.
        id: String,
    },
    /// An interactive shell (or COMMAND) in a sandbox, on a terminal.
    Shell {
        /// Sandbox name.
        name: String,
        /// A command instead of the shell.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Where a sandbox's published ports are reached on this host.
    Port {
        /// Sandbox name.
        name: String,
        /// Only this port (`8080` or `8080/tcp`): print its address alone.
        port: Option<String>,
    },
    /// Copy files or trees between this host and a sandbox
    /// (`berth cp ./in box:/workspace/in`, `berth cp box:out.csv .`,
    /// `berth cp box:out.csv - | head`).
    Cp {
        /// Where from: a host path, NAME:PATH, or `-` (stdin, into one file).
        from: String,
        /// Where to: a host path, NAME:PATH, or `-` (one file's bytes to
        /// stdout).
        to: String,
    },
    /// Single-file operations in a sandbox's workspace, binary-safe.
    Files {
        /// Sandbox name.
        name: String,
        #[command(subcommand)]
        command: sandboxes::FilesCommand,
    },
    /// Persist the workspace into its snapshot (destroys nothing).
    Stop {
        /// Sandbox name.
        name: String,
    },
    /// End the sandbox's instance — its container, or its background
    /// processes on the local backend — after saving the workspace into
    /// its snapshot (as `berth stop`). The sandbox stays: `berth start`
    /// (or any command) brings it back from the snapshot.
    Shutdown {
        /// Sandbox name.
        name: String,
        /// End it without saving the workspace first (what changed since
        /// the last stop is lost with the container).
        #[arg(long)]
        discard: bool,
    },
    /// Destroy what the sandbox owns — its container or workspace
    /// directory and the snapshots Berth made for it — and forget it.
    ///
    /// Prints what it deleted. Generations a fork starts from are kept
    /// (`berth gc --orphans` deletes them once no fork needs them). A
    /// snapshot plugin, whose contract has no delete, keeps its archive.
    Rm {
        /// Sandbox name.
        name: String,
        /// Forget it even if shutdown or deleting the snapshot fails.
        #[arg(long)]
        force: bool,
        /// Save the workspace into its snapshot first (as `berth stop`)
        /// and keep the snapshot.
        #[arg(long)]
        keep_snapshot: bool,
    },
    /// List sandboxes.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where Berth keeps its sandboxes, and the bounds (memory, processes,
    /// CPUs, disk) a new sandbox gets where its settings say nothing: from
    /// $BERTH_HOME/config.toml, else Berth's own.
    Info {
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
        /// The tar file (plain, gzip or zstd).
        file: PathBuf,
    },
    /// Delete what no kept generation of a deduplicated snapshot needs
    /// (dropped generations, packs an interrupted stop left).
    Gc {
        /// Sandboxes (default: every one with a deduplicated snapshot).
        #[arg(conflicts_with = "orphans")]
        names: Vec<String>,
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Instead, find what no known sandbox uses any more: the snapshot
        /// files each kind names (the local kind's archives in
        /// $BERTH_HOME/snapshots), and generations `berth rm`
        /// kept for forks that are gone since. Lists them; deletes them
        /// only with --yes.
        #[arg(long)]
        orphans: bool,
        /// With --orphans: delete what it lists.
        #[arg(long, requires = "orphans", conflicts_with = "dry_run")]
        yes: bool,
    },
    /// List the kept generations of NAME's deduplicated snapshot: when,
    /// which command (with --checkpoint each-exec), paths added, changed
    /// and removed, bytes stored. `*` marks the workspace's own.
    History {
        /// Sandbox name.
        name: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// The paths added (+), removed (-) and modified (M: kind, mode,
    /// size, content, target) between two kept generations, read from
    /// their indexes (nothing else is downloaded).
    Diff {
        /// Sandbox name.
        name: String,
        /// The older generation.
        from: u64,
        /// The newer generation.
        to: u64,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make the workspace generation K. The workspace as it is is saved
    /// first as a new generation, so a rewind can be undone by rewinding
    /// to that one. The sandbox's instance is re-created (background
    /// processes end).
    Rewind {
        /// Sandbox name.
        name: String,
        /// The kept generation to go back to (see `berth history NAME`).
        generation: u64,
    },
    /// Write a generation of NAME's running workspace now (a deduplicated
    /// snapshot), with a message for `berth history`.
    Checkpoint {
        /// Sandbox name.
        name: String,
        /// What to say of it in the history.
        #[arg(short, long)]
        message: Option<String>,
    },
    /// Make a new sandbox that starts from NAME's newest generation (or
    /// --generation K, or with --live the workspace as it is now),
    /// sharing its chunks (NAME needs a deduplicated snapshot); with
    /// --count N, N of them at once.
    Fork(sandboxes::ForkArgs),
    /// A sandbox's egress policy and the log of its connections (time,
    /// host, port, bytes, allowed or denied and by which rule); with
    /// --allow-host and the like, the policy changed while it runs (from
    /// its next connection).
    Egress(sandboxes::EgressArgs),
    /// Warm pools: sandboxes of a template kept started, claimed at once
    /// by `berth create NAME --from-pool POOL`.
    #[command(subcommand)]
    Pool(sandboxes::PoolCommand),
    /// Check and inspect snapshot-store plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Serve Berth's HTTP/JSON API (sandboxes kept open, agent sessions
    /// warm) on $BERTH_HOME/berth.sock, and on loopback TCP with a bearer
    /// token when asked. The CLI starts one on demand; this runs it in the
    /// foreground.
    Serve(server::ServeArgs),
    /// The background server the CLI starts on demand: whether one runs,
    /// and stopping it.
    #[command(subcommand)]
    Server(server::ServerCommand),
}

impl Cli {
    /// Parses the command line (clap's errors and help, exit 2).
    /// With `create`'s backend-setting flags (`--memory 2GiB`) expanded
    /// into `-o` options, and every kind's settings in `create --help`;
    /// both come from the kinds, not from this file.
    pub fn parse_with_hints() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let docs = sandboxes::backend_settings_docs();
        let mut command = Self::command();
        let own_of = |c: &clap::Command| -> Vec<String> {
            c.get_arguments()
                .filter_map(|a| a.get_long().map(String::from))
                .collect()
        };
        let mut own: Vec<String> = command
            .find_subcommand("create")
            .map(own_of)
            .unwrap_or_default();
        if let Some(c) = command
            .find_subcommand("pool")
            .and_then(|p| p.find_subcommand("create"))
        {
            own.extend(own_of(c));
        }
        let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let args = match args
            .iter()
            .map(|a| a.to_str().map(String::from))
            .collect::<Option<Vec<String>>>()
        {
            Some(text) => sandboxes::expand_setting_flags(text, &docs, &own)
                .into_iter()
                .map(Into::into)
                .collect(),
            // Not text: nothing to expand that clap would accept anyway.
            None => args,
        };
        let help = format!(
            "{}\n\nSnapshot kinds (--snapshot): {}",
            sandboxes::settings_help(&docs).trim_end(),
            sandboxes::snapshot_choices().join(", ")
        );
        command = command.mut_subcommand("create", |c| c.after_long_help(help.clone()));
        command = command.mut_subcommand("pool", |p| {
            p.mut_subcommand("create", |c| c.after_long_help(help))
        });
        let matches = command.get_matches_from(args);
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }

    /// Whether this is `berth serve` (its log is a file: lines get times).
    pub fn is_serve(&self) -> bool {
        matches!(self.command, Command::Serve(_))
    }

    /// Whether the command deals with Ctrl-C itself: a streamed exec stops
    /// its command, a shell sends it to its terminal, a server shuts down.
    /// Every other command is cancelled (and what it began undone) by
    /// `main`.
    pub fn handles_interrupt(&self) -> bool {
        matches!(
            self.command,
            Command::Exec(_) | Command::Shell { .. } | Command::Serve(_) | Command::Logs(_)
        )
    }
}

/// Runs the parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.no_server {
        server::forbid();
    }
    match cli.command {
        Command::Create(a) => sandboxes::create(*a).await,
        Command::Start(a) => sandboxes::start(a).await,
        Command::Exec(a) => sandboxes::exec(a).await,
        Command::Ps { name, json } => sandboxes::ps(&name, json).await,
        Command::Logs(a) => sandboxes::logs(a).await,
        Command::Kill { name, id, signal } => sandboxes::kill(&name, &id, &signal).await,
        Command::Wait { name, id } => sandboxes::wait(&name, &id).await,
        Command::Shell { name, command } => sandboxes::shell(&name, &command).await,
        Command::Port { name, port } => sandboxes::port(&name, port.as_deref()).await,
        Command::Cp { from, to } => sandboxes::cp(&from, &to).await,
        Command::Files { name, command } => sandboxes::files(&name, command).await,
        Command::Stop { name } => sandboxes::stop(&name).await,
        Command::Shutdown { name, discard } => sandboxes::shutdown(&name, discard).await,
        Command::Rm {
            name,
            force,
            keep_snapshot,
        } => sandboxes::rm(&name, force, keep_snapshot).await,
        Command::Ls { json } => sandboxes::ls(json).await,
        Command::Info { json } => crate::info::info(json).map(|()| ExitCode::SUCCESS),
        Command::Inspect { name } => sandboxes::inspect(&name).await,
        Command::Persist { name, out } => sandboxes::persist(&name, &out).await,
        Command::Hydrate { name, file } => sandboxes::hydrate(&name, &file).await,
        Command::Gc {
            orphans: true, yes, ..
        } => sandboxes::gc_orphans(yes).await,
        Command::Gc { names, dry_run, .. } => sandboxes::gc(names, dry_run).await,
        Command::Fork(a) => sandboxes::fork(a).await,
        Command::History { name, json } => sandboxes::history(&name, json).await,
        Command::Diff {
            name,
            from,
            to,
            json,
        } => sandboxes::diff(&name, from, to, json).await,
        Command::Rewind { name, generation } => sandboxes::rewind(&name, generation).await,
        Command::Checkpoint { name, message } => sandboxes::checkpoint(&name, message).await,
        Command::Egress(a) => sandboxes::egress(a).await,
        Command::Pool(c) => sandboxes::pool(c).await,
        Command::Plugin(cmd) => plugin::run(cmd).await,
        Command::Serve(a) => server::serve(a).await,
        Command::Server(c) => server::manage(c).await,
    }
}
