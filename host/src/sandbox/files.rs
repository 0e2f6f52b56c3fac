//! The file API: single files and trees in a sandbox's workspace, both
//! ways, without a tar round trip of the whole workspace.
//!
//! Every operation runs Berth's helper in the sandbox (through the
//! in-container agent on Docker, on the host for the local backend), which
//! resolves paths beneath the workspace root in the kernel: `..`, an
//! absolute path elsewhere, or a symlink leading out (planted by the
//! sandboxed code) is [`SandboxError::PathRefused`] and touches nothing.
//! Writes are atomic (a new file renamed over the old one): an interrupted
//! write leaves the old file. What comes back from the sandbox is capped.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use super::helper::{helper_failure, STREAMED};
use super::{Sandbox, SandboxError};
use crate::backend::{ExecEvent, ExecInput, ExecProcess};
use crate::workspace::archive::{self, ArchiveLimits};

/// What kind of file a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by the file API).
    Symlink,
    /// Anything else (a device, a socket, a pipe).
    Other,
}

/// A path's description.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[non_exhaustive]
pub struct FileInfo {
    /// The path, relative to the workspace root (empty for the root).
    pub path: String,
    /// Its kind.
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Its size in bytes.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Its modification time, in seconds since the Unix epoch.
    pub mtime: i64,
    /// A symlink's target, as written.
    #[serde(default)]
    pub target: Option<String>,
}

/// A sandbox's files (see [`Sandbox::files`]).
pub struct Files<'a> {
    sandbox: &'a Sandbox,
    cap: u64,
}

impl Sandbox {
    /// The file API of this running sandbox.
    ///
    /// ```no_run
    /// # async fn f(sandbox: &berth::Sandbox) -> Result<(), berth::SandboxError> {
    /// let files = sandbox.files();
    /// files.write("in/data.csv", &b"a,b\n1,2\n"[..], 8, None).await?;
    /// let back = files.read_to_bytes("in/data.csv").await?;
    /// assert_eq!(&back[..], b"a,b\n1,2\n");
    /// # Ok(()) }
    /// ```
    pub fn files(&self) -> Files<'_> {
        Files {
            sandbox: self,
            cap: ArchiveLimits::default().max_bytes,
        }
    }
}

impl Files<'_> {
    /// Refuses to read more than `bytes` from the sandbox in one operation
    /// (a file, or a tree's archive). By default, the archive limit
    /// (64 GiB).
    pub fn cap(mut self, bytes: u64) -> Self {
        self.cap = bytes;
        self
    }

    async fn answer(&self, op: &str, path: &str, extra: &[&str]) -> Result<String, SandboxError> {
        let mut args = vec![op, path];
        args.extend_from_slice(extra);
        let r = self.sandbox.run_helper("fs", &args, path).await?;
        Ok(r.stdout_text().into_owned())
    }

    /// Describes `path` (a symlink itself, not what it points to).
    pub async fn stat(&self, path: &str) -> Result<FileInfo, SandboxError> {
        let line = self.answer("stat", path, &[]).await?;
        parse_info(line.trim())
    }

    /// The entries of the directory `path`, sorted by name.
    pub async fn list(&self, path: &str) -> Result<Vec<FileInfo>, SandboxError> {
        let text = self.answer("ls", path, &[]).await?;
        text.lines()
            .filter(|l| !l.is_empty())
            .map(parse_info)
            .collect()
    }

    /// Removes a file, a symlink, an empty directory, or with `recursive`
    /// a whole tree (never following a symlink in it).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<(), SandboxError> {
        let extra: &[&str] = if recursive { &["-r"] } else { &[] };
        self.answer("rm", path, extra).await.map(drop)
    }

    /// Makes a directory; with `parents`, the missing ones above it too
    /// (and an existing directory is fine).
    pub async fn make_dir(&self, path: &str, parents: bool) -> Result<(), SandboxError> {
        let extra: &[&str] = if parents { &["-p"] } else { &[] };
        self.answer("mkdir", path, extra).await.map(drop)
    }

    /// Streams a file's bytes. A missing file, a directory or a refused
    /// path is an error here, before any byte; a failure later is an I/O
    /// error of the reader.
    pub async fn read(&self, path: &str) -> Result<FileReader, SandboxError> {
        let mut process = self
            .sandbox
            .start_helper("fs", &["read", path], STREAMED, false)
            .await?;
        // The first event tells a refusal from a file (even an empty one).
        let mut first = None;
        let mut stderr = Vec::new();
        while first.is_none() {
            match process.next_event().await {
                Some(Ok(ExecEvent::Stdout(b))) => first = Some(b),
                Some(Ok(ExecEvent::Stderr(b))) => push_capped(&mut stderr, &b),
                Some(Ok(ExecEvent::Exit(exit))) => {
                    if exit.exit_code != 0 {
                        return Err(helper_failure(
                            "fs read",
                            path,
                            exit.exit_code,
                            &String::from_utf8_lossy(&stderr),
                        ));
                    }
                    return Ok(FileReader::done());
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(FileReader::done()),
            }
        }
        Ok(FileReader {
            process: Some(process),
            pending: first.unwrap_or_default(),
            stderr,
            read: 0,
            cap: self.cap,
            path: path.to_string(),
        })
    }

    /// Reads a whole file into memory (up to the cap).
    pub async fn read_to_bytes(&self, path: &str) -> Result<Bytes, SandboxError> {
        let mut reader = self.read(path).await?;
        let mut out = Vec::new();
        reader
            .read_to_end(&mut out)
            .await
            .map_err(|e| SandboxError::Helper {
                operation: format!("fs read {path}"),
                message: e.to_string(),
            })?;
        Ok(Bytes::from(out))
    }

    /// Writes `len` bytes of `data` to `path`, atomically: a new file
    /// beside it, renamed over it once complete. `mode` sets the
    /// permissions; `None` keeps an existing file's (new files: 0644). A
    /// source that ends early, or a write cut off, leaves the old file.
    pub async fn write(
        &self,
        path: &str,
        data: impl AsyncRead + Unpin + Send,
        len: u64,
        mode: Option<u32>,
    ) -> Result<(), SandboxError> {
        let size = len.to_string();
        let mode = mode.map(|m| format!("{m:o}")).unwrap_or_else(|| "-".into());
        let process = self
            .sandbox
            .start_helper("fs", &["write", path, &size, &mode], STREAMED, true)
            .await?;
        let source_error = |e: std::io::Error| SandboxError::Helper {
            operation: format!("fs write {path}"),
            message: format!("reading the source: {e}; the file was left as it was"),
        };
        feed_helper(process, data, len, "fs write", path, source_error)
            .await
            .map(drop)
    }

    /// Copies the host path `from` (a file, or a directory's tree) into
    /// the sandbox as `to`. Like `cp -r`: when `to` is an existing
    /// directory (or ends with `/`), the copy goes inside it under its own
    /// name. Returns the bytes copied.
    pub async fn copy_in(&self, from: &Path, to: &str) -> Result<u64, SandboxError> {
        let meta = tokio::fs::metadata(from)
            .await
            .map_err(|e| host_error(from, e))?;
        let name = from
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let into_dir = to.ends_with('/')
            || matches!(
                self.stat(to).await,
                Ok(FileInfo {
                    kind: FileKind::Dir,
                    ..
                })
            );
        if to.ends_with('/') {
            self.make_dir(to.trim_end_matches('/'), true).await?;
        }
        let dest = if into_dir {
            format!("{}/{name}", to.trim_end_matches('/'))
        } else {
            to.to_string()
        };
        if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let file = tokio::fs::File::open(from)
                .await
                .map_err(|e| host_error(from, e))?;
            self.write(
                &dest,
                file,
                meta.len(),
                Some(meta.permissions().mode() & 0o7777),
            )
            .await?;
            return Ok(meta.len());
        }
        if !meta.is_dir() {
            return Err(SandboxError::PathRefused {
                path: from.display().to_string(),
                reason: "only files and directories are copied".into(),
            });
        }
        let cap = self.cap.to_string();
        let process = self
            .sandbox
            .start_helper("fs", &["untar", &dest, &cap], STREAMED, true)
            .await?;
        let tar = archive::pack_dir(from.to_path_buf(), Vec::new());
        feed_helper(process, tar, u64::MAX, "fs untar", &dest, |e| {
            host_error(from, e)
        })
        .await
    }

    /// Copies the sandbox path `from` (a file, or a directory's tree) to
    /// the host path `to`. Like `cp -r`: when `to` is an existing
    /// directory, the copy goes inside it under its own name. A tree passes
    /// the hydrate filter (no entry may lead out, caps hold) into a staging
    /// directory beside its destination, which is renamed into place once
    /// all of it passed: a refused tree leaves nothing behind.
    // Kept as one function: a file and a tree each with its staging and
    // rename, side by side so they stay alike.
    pub async fn copy_out(&self, from: &str, to: &Path) -> Result<PathBuf, SandboxError> {
        let info = self.stat(from).await?;
        let name = Path::new(from.trim_end_matches('/'))
            .file_name()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("workspace"));
        let dest = if to.is_dir() {
            to.join(&name)
        } else {
            to.to_path_buf()
        };
        let parent = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let staging = tempfile::Builder::new()
            .prefix(".berth-copy-")
            .tempdir_in(&parent)
            .map_err(|e| host_error(&parent, e))?;
        match info.kind {
            FileKind::File => {
                let mut reader = self.read(from).await?;
                let tmp = staging.path().join("file");
                let mut file = tokio::fs::File::create(&tmp)
                    .await
                    .map_err(|e| host_error(&tmp, e))?;
                tokio::io::copy(&mut reader, &mut file).await.map_err(|e| {
                    SandboxError::Helper {
                        operation: format!("fs read {from}"),
                        message: e.to_string(),
                    }
                })?;
                use std::os::unix::fs::PermissionsExt;
                let _ =
                    tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(info.mode))
                        .await;
                file.sync_all().await.map_err(|e| host_error(&tmp, e))?;
                tokio::fs::rename(&tmp, &dest)
                    .await
                    .map_err(|e| host_error(&dest, e))?;
            }
            FileKind::Dir => {
                let process = self
                    .sandbox
                    .start_helper("fs", &["tar", from], STREAMED, false)
                    .await?;
                let tree = staging.path().join("tree");
                tokio::fs::create_dir(&tree)
                    .await
                    .map_err(|e| host_error(&tree, e))?;
                let limits = ArchiveLimits {
                    max_bytes: self.cap,
                    ..ArchiveLimits::default()
                };
                let stream = FileReader::of(process, from, limits.max_stream_bytes());
                let (clean_w, clean_r) = crate::byte_pipe::pipe();
                let source = crate::byte_pipe::batched_reader(Box::new(stream));
                let filtering = tokio::task::spawn_blocking(move || {
                    let mut clean_w = clean_w;
                    let r = archive::filter(source, Some(&mut clean_w), limits);
                    match &r {
                        Ok(_) => {
                            let _ = clean_w.finish();
                        }
                        Err(e) => clean_w.fail(std::io::Error::other(e.to_string())),
                    }
                    r
                });
                let unpacked = archive::extract_stream(Box::new(clean_r), tree.clone()).await;
                let filtered = filtering.await.map_err(|source| SandboxError::Task {
                    task: "copy filter",
                    source,
                })?;
                filtered?;
                unpacked?;
                if dest.exists() && !dest.is_dir() {
                    return Err(SandboxError::PathRefused {
                        path: dest.display().to_string(),
                        reason: "a directory cannot replace a file".into(),
                    });
                }
                if dest.is_dir() {
                    // Into an existing directory: entries replace theirs.
                    merge_into(&tree, &dest).map_err(|e| host_error(&dest, e))?;
                } else {
                    tokio::fs::rename(&tree, &dest)
                        .await
                        .map_err(|e| host_error(&dest, e))?;
                }
            }
            FileKind::Symlink | FileKind::Other => {
                return Err(SandboxError::PathRefused {
                    path: from.to_string(),
                    reason: format!(
                        "it is a {:?}; only files and directories are copied",
                        info.kind
                    )
                    .to_lowercase(),
                })
            }
        }
        Ok(dest)
    }
}

/// Feeds at most `limit` bytes of `source` to a helper's stdin, closing it
/// where the source (or the limit) ends, while reading the helper's
/// answer. Returns the bytes sent once the helper exits 0; otherwise the
/// error its exit names (`operation subject`), or the source's, made by
/// `source_error`.
async fn feed_helper(
    mut process: ExecProcess,
    mut source: impl AsyncRead + Unpin,
    limit: u64,
    operation: &str,
    subject: &str,
    source_error: impl Fn(std::io::Error) -> SandboxError,
) -> Result<u64, SandboxError> {
    let input = process.input();
    let mut stderr = Vec::new();
    let mut sent = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let mut source_done = false;
    loop {
        tokio::select! {
            n = source.read(&mut buf), if !source_done => {
                let n = (n.map_err(&source_error)? as u64).min(limit - sent) as usize;
                if n == 0 {
                    source_done = true;
                    let _ = input.send(ExecInput::CloseStdin).await;
                    continue;
                }
                sent += n as u64;
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                if input.send(ExecInput::Stdin(chunk)).await.is_err() {
                    source_done = true;
                }
            }
            event = process.next_event() => match event {
                Some(Ok(ExecEvent::Stderr(b))) => push_capped(&mut stderr, &b),
                Some(Ok(ExecEvent::Stdout(_))) => {}
                Some(Ok(ExecEvent::Exit(exit))) => {
                    return if exit.exit_code == 0 {
                        Ok(sent)
                    } else {
                        Err(helper_failure(
                            operation,
                            subject,
                            exit.exit_code,
                            &String::from_utf8_lossy(&stderr),
                        ))
                    };
                }
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(SandboxError::Helper {
                        operation: format!("{operation} {subject}"),
                        message: "the helper ended without an answer".into(),
                    })
                }
            }
        }
    }
}

fn host_error(path: &Path, e: std::io::Error) -> SandboxError {
    SandboxError::Helper {
        operation: format!("on this host, {}", path.display()),
        message: e.to_string(),
    }
}

fn parse_info(line: &str) -> Result<FileInfo, SandboxError> {
    serde_json::from_str(line).map_err(|e| SandboxError::Helper {
        operation: "fs stat".into(),
        message: format!("an unreadable answer ({e}): {line:.200}"),
    })
}

const STDERR_CAP: usize = 64 * 1024;

fn push_capped(into: &mut Vec<u8>, bytes: &[u8]) {
    let room = STDERR_CAP.saturating_sub(into.len());
    into.extend_from_slice(&bytes[..room.min(bytes.len())]);
}

/// Moves every entry of `from` into `to`, replacing what is there.
fn merge_into(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let is_dir = entry.file_type()?.is_dir();
        match std::fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() && is_dir => merge_into(&entry.path(), &target)?,
            Ok(m) if m.is_dir() => {
                std::fs::remove_dir_all(&target)?;
                std::fs::rename(entry.path(), &target)?;
            }
            Ok(_) => {
                std::fs::remove_file(&target)?;
                std::fs::rename(entry.path(), &target)?;
            }
            Err(_) => std::fs::rename(entry.path(), &target)?,
        }
    }
    Ok(())
}

/// A file's bytes as they come from the sandbox (see [`Files::read`]).
pub struct FileReader {
    process: Option<ExecProcess>,
    pending: Bytes,
    stderr: Vec<u8>,
    read: u64,
    cap: u64,
    path: String,
}

impl FileReader {
    fn of(process: ExecProcess, path: &str, cap: u64) -> Self {
        FileReader {
            process: Some(process),
            pending: Bytes::new(),
            stderr: Vec::new(),
            read: 0,
            cap,
            path: path.to_string(),
        }
    }

    fn done() -> Self {
        FileReader {
            process: None,
            pending: Bytes::new(),
            stderr: Vec::new(),
            read: 0,
            cap: u64::MAX,
            path: String::new(),
        }
    }
}

impl AsyncRead for FileReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(n);
                self.read += n as u64;
                if self.read > self.cap {
                    self.process = None;
                    return Poll::Ready(Err(std::io::Error::other(format!(
                        "{} is larger than the {} bytes allowed",
                        self.path, self.cap
                    ))));
                }
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            let Some(process) = self.process.as_mut() else {
                return Poll::Ready(Ok(()));
            };
            match futures::ready!(process.poll_next_event(cx)) {
                Some(Ok(ExecEvent::Stdout(b))) => self.pending = b,
                Some(Ok(ExecEvent::Stderr(b))) => push_capped(&mut self.stderr, &b),
                Some(Ok(ExecEvent::Exit(exit))) => {
                    self.process = None;
                    if exit.exit_code != 0 {
                        let e = helper_failure(
                            "fs read",
                            &self.path,
                            exit.exit_code,
                            &String::from_utf8_lossy(&self.stderr),
                        );
                        return Poll::Ready(Err(std::io::Error::other(e)));
                    }
                }
                Some(Err(e)) => {
                    self.process = None;
                    return Poll::Ready(Err(std::io::Error::other(e)));
                }
                None => self.process = None,
            }
        }
    }
}
