//! `berth cp` and `berth files`: files and trees in and out of a sandbox,
//! binary-safe, confined to its workspace.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use berth::sandbox::{FileInfo, FileKind};
use clap::Subcommand;
use http::Method;
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;

use super::*;
use crate::server::{encode, Remote};

/// One side of `berth cp`: `NAME:PATH` in a sandbox, a host path, or `-`
/// (stdout as the destination, stdin as the source).
enum Place {
    Sandbox { name: String, path: String },
    Host(PathBuf),
    Standard,
}

/// `NAME:PATH` when what is before the first `:` is a sandbox name (no
/// `/`, a valid id); anything else is a host path (`./a:b` is one).
fn place(arg: &str) -> Place {
    if arg == "-" {
        return Place::Standard;
    }
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
        // `-` as docker cp takes it, for one file: its bytes to stdout,
        // or stdin as its new content.
        (Place::Sandbox { name, path }, Place::Standard) => {
            return files(&name, FilesCommand::Read { path }).await;
        }
        (Place::Standard, Place::Sandbox { name, path }) => {
            // As a copy of a host file does, missing parents are made.
            if let Some(parent) = Path::new(&path)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
            {
                let parent = parent.to_string_lossy().into_owned();
                files(
                    &name,
                    FilesCommand::Mkdir {
                        path: parent,
                        parents: true,
                    },
                )
                .await?;
            }
            return files(&name, FilesCommand::Write { path, mode: None }).await;
        }
        (Place::Sandbox { .. }, Place::Sandbox { .. }) => {
            anyhow::bail!("both sides are sandboxes: copy out to the host, then in")
        }
        (Place::Host(_) | Place::Standard, Place::Host(_) | Place::Standard) => {
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

/// `berth files ls`'s output.
fn print_listing(entries: Vec<FileInfo>, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
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
    Ok(())
}

fn octal_mode(mode: Option<String>) -> anyhow::Result<Option<u32>> {
    mode.map(|m| u32::from_str_radix(&m, 8))
        .transpose()
        .context("--mode takes octal permissions (e.g. 755)")
}

/// Stdin in a spool file, and its length: the size goes first, so an
/// interrupted pipe then changes nothing in the sandbox.
async fn spool_stdin() -> anyhow::Result<(std::fs::File, u64)> {
    let spool = tempfile::tempfile().context("making a spool file for stdin")?;
    let mut spool = tokio::fs::File::from_std(spool);
    let len = tokio::io::copy(&mut tokio::io::stdin(), &mut spool).await?;
    spool.flush().await?;
    let mut spool = spool.into_std().await;
    std::io::Seek::rewind(&mut spool)?;
    Ok((spool, len))
}

/// `berth files` through the server: the same output.
async fn files_through(remote: &Remote, name: &str, command: FilesCommand) -> anyhow::Result<()> {
    let base = format!("{}/files", through_server::sandbox_path(name));
    let q = |path: &str| format!("path={}", encode(path));
    match command {
        FilesCommand::Ls { path, json } => {
            let entries = remote
                .json(Method::GET, &format!("{base}/list?{}", q(&path)), None)
                .await?;
            print_listing(entries, json)?;
        }
        FilesCommand::Stat { path } => {
            let info: FileInfo = remote
                .json(Method::GET, &format!("{base}/stat?{}", q(&path)), None)
                .await?;
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
        FilesCommand::Read { path } => {
            let answer = remote
                .send(Method::GET, &format!("{base}/content?{}", q(&path)), None)
                .await?;
            let mut body = answer.body;
            let mut stdout = tokio::io::stdout();
            while let Some(frame) = body.frame().await {
                let frame = frame.with_context(|| format!("reading {name}:{path}"))?;
                if let Ok(data) = frame.into_data() {
                    stdout.write_all(&data).await?;
                }
            }
            stdout.flush().await?;
        }
        FilesCommand::Write { path, mode } => {
            let mode = octal_mode(mode)?;
            let (spool, len) = spool_stdin().await?;
            let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(spool));
            let body = http_body_util::StreamBody::new(futures::StreamExt::map(stream, |r| {
                r.map(http_body::Frame::data)
                    .map_err(berth_server::BoxError::from)
            }))
            .boxed_unsync();
            let mut target = format!("{base}/content?{}", q(&path));
            if let Some(m) = mode {
                target.push_str(&format!("&mode={m:o}"));
            }
            remote
                .send_with(
                    Method::PUT,
                    &target,
                    Some(body),
                    vec![(http::header::CONTENT_LENGTH, len.to_string())],
                )
                .await?;
        }
        FilesCommand::Rm { path, recursive } => {
            remote
                .json::<serde_json::Value>(
                    Method::DELETE,
                    &format!("{base}?{}&recursive={recursive}", q(&path)),
                    None,
                )
                .await?;
        }
        FilesCommand::Mkdir { path, parents } => {
            remote
                .json::<serde_json::Value>(
                    Method::POST,
                    &format!("{base}/mkdir?{}&parents={parents}", q(&path)),
                    None,
                )
                .await?;
        }
    }
    Ok(())
}

pub async fn files(name: &str, command: FilesCommand) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    if let Some(remote) = Remote::for_home(&home).await {
        files_through(&remote, name, command).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (lock, sandbox) = attach_locked(&home, name).await?;
    drop(lock);
    let files = sandbox.files();
    match command {
        FilesCommand::Ls { path, json } => print_listing(files.list(&path).await?, json)?,
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
            let mode = octal_mode(mode)?;
            let (spool, len) = spool_stdin().await?;
            files
                .write(&path, tokio::fs::File::from_std(spool), len, mode)
                .await?;
        }
        FilesCommand::Rm { path, recursive } => files.remove(&path, recursive).await?,
        FilesCommand::Mkdir { path, parents } => files.make_dir(&path, parents).await?,
    }
    Ok(ExitCode::SUCCESS)
}
