//! `berth cp` and `berth files`: files and trees in and out of a sandbox,
//! binary-safe, confined to its workspace.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use berth::sandbox::FileKind;
use clap::Subcommand;
use tokio::io::AsyncWriteExt;

use super::*;

/// One side of `berth cp`: `NAME:PATH` in a sandbox, or a host path.
enum Place {
    Sandbox { name: String, path: String },
    Host(PathBuf),
}

/// `NAME:PATH` when what is before the first `:` is a sandbox name (no
/// `/`, a valid id); anything else is a host path (`./a:b` is one).
fn place(arg: &str) -> Place {
    if let Some((name, path)) = arg.split_once(':') {
        if !name.contains('/') && berth::SnapshotId::parse(name).is_ok() {
            return Place::Sandbox {
                name: name.to_string(),
                path: if path.is_empty() {
                    ".".into()
                } else {
                    path.to_string()
                },
            };
        }
    }
    Place::Host(PathBuf::from(arg))
}

/// `berth cp SRC DEST`.
pub async fn cp(from: &str, to: &str) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    match (place(from), place(to)) {
        (Place::Host(src), Place::Sandbox { name, path }) => {
            let (lock, sandbox) = attach_locked(&home, &name).await?;
            drop(lock);
            let bytes = sandbox.files().copy_in(&src, &path).await?;
            eprintln!("copied {} into {name}:{path}", human_bytes(bytes));
        }
        (Place::Sandbox { name, path }, Place::Host(dest)) => {
            let (lock, sandbox) = attach_locked(&home, &name).await?;
            drop(lock);
            let written = sandbox.files().copy_out(&path, &dest).await?;
            eprintln!("copied {name}:{path} to {}", written.display());
        }
        (Place::Sandbox { .. }, Place::Sandbox { .. }) => {
            anyhow::bail!("both sides are sandboxes: copy out to the host, then in")
        }
        (Place::Host(_), Place::Host(_)) => {
            anyhow::bail!("neither side is a sandbox: write one as NAME:PATH")
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth files NAME …`.
#[derive(Subcommand)]
pub enum FilesCommand {
    /// List a directory (one line per entry, or JSON).
    Ls {
        /// A path relative to the workspace root (default: the root).
        #[arg(default_value = ".")]
        path: String,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Describe a path (a symlink itself), as JSON.
    Stat {
        /// The path.
        path: String,
    },
    /// Write a file's bytes to stdout.
    Read {
        /// The path.
        path: String,
    },
    /// Replace a file with stdin, atomically (an interrupted write leaves
    /// the old file).
    Write {
        /// The path.
        path: String,
        /// Permissions, in octal (default: the old file's, or 644).
        #[arg(long)]
        mode: Option<String>,
    },
    /// Remove a file, a symlink or an empty directory.
    Rm {
        /// The path.
        path: String,
        /// A directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Make a directory.
    Mkdir {
        /// The path.
        path: String,
        /// And its missing parents.
        #[arg(short, long)]
        parents: bool,
    },
}

pub async fn files(name: &str, command: FilesCommand) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let (lock, sandbox) = attach_locked(&home, name).await?;
    drop(lock);
    let files = sandbox.files();
    match command {
        FilesCommand::Ls { path, json } => {
            let entries = files.list(&path).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                let mut t = table::Table::new(&["MODE", "SIZE", "NAME"]);
                for e in entries {
                    let name = Path::new(&e.path)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let shown = match (e.kind, &e.target) {
                        (FileKind::Dir, _) => format!("{name}/"),
                        (FileKind::Symlink, Some(t)) => format!("{name} -> {t}"),
                        _ => name,
                    };
                    t.row(vec![format!("{:o}", e.mode), e.size.to_string(), shown]);
                }
                print!("{}", t.render());
            }
        }
        FilesCommand::Stat { path } => {
            println!(
                "{}",
                serde_json::to_string_pretty(&files.stat(&path).await?)?
            );
        }
        FilesCommand::Read { path } => {
            let mut reader = files.read(&path).await?;
            let mut stdout = tokio::io::stdout();
            tokio::io::copy(&mut reader, &mut stdout)
                .await
                .with_context(|| format!("reading {name}:{path}"))?;
            stdout.flush().await?;
        }
        FilesCommand::Write { path, mode } => {
            let mode = mode
                .map(|m| u32::from_str_radix(&m, 8))
                .transpose()
                .context("--mode takes octal permissions (e.g. 755)")?;
            // The size goes first, so stdin is spooled: an interrupted
            // pipe then changes nothing in the sandbox.
            let spool = tempfile::tempfile().context("making a spool file for stdin")?;
            let mut spool = tokio::fs::File::from_std(spool);
            let len = tokio::io::copy(&mut tokio::io::stdin(), &mut spool).await?;
            spool.flush().await?;
            let mut spool = spool.into_std().await;
            std::io::Seek::rewind(&mut spool)?;
            files
                .write(&path, tokio::fs::File::from_std(spool), len, mode)
                .await?;
        }
        FilesCommand::Rm { path, recursive } => files.remove(&path, recursive).await?,
        FilesCommand::Mkdir { path, parents } => files.make_dir(&path, parents).await?,
    }
    Ok(ExitCode::SUCCESS)
}
