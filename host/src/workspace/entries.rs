//! Turns manifest entries into a tar stream, so they reach the workspace
//! the same way a snapshot does — through the backend's archive upload,
//! never by writing to the host's copy of the root.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::spec::{Encoding, Entry, SpecError, WorkspaceSpec};
use crate::byte_pipe::{self, PipeReader};

/// Which entries to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// Every entry (a fresh workspace).
    All,
    /// Only ephemeral entries and bind mounts (after a restore, whose
    /// snapshot already holds the persistent ones as the agent left them).
    EphemeralOnly,
}

/// How the backend wants bind mounts expressed in the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMounts {
    /// As symlinks to the host path (the local backend).
    AsSymlinks,
    /// Left out: the backend mounts them itself (Docker).
    Skip,
}

/// Whether the selection writes anything (so an empty archive need not be
/// sent at all).
pub fn selects_any(spec: &WorkspaceSpec, selection: Selection, binds: BindMounts) -> bool {
    spec.flatten().map_or(true, |flat| {
        flat.iter().any(|f| match (selection, f.entry) {
            (_, Entry::BindMount { .. }) => binds != BindMounts::Skip,
            (Selection::All, _) => true,
            (Selection::EphemeralOnly, _) => f.ephemeral,
        })
    })
}

/// Checks that every host path the selection reads (`local_file`,
/// `local_dir`) or links (`bind_mount`) exists and is of the right kind, so
/// a mistyped path is refused by name before anything is written.
pub fn check_sources(spec: &WorkspaceSpec, selection: Selection) -> Result<(), SpecError> {
    for f in spec.flatten()? {
        let selected = match (selection, f.entry) {
            (_, Entry::BindMount { .. }) => true,
            (Selection::All, _) => true,
            (Selection::EphemeralOnly, _) => f.ephemeral,
        };
        let (path, want_dir) = match f.entry {
            Entry::LocalFile { path, .. } => (path, Some(false)),
            Entry::LocalDir { path, .. } => (path, Some(true)),
            Entry::BindMount { host_path, .. } => (host_path, None),
            _ => continue,
        };
        if !selected {
            continue;
        }
        let problem = match (std::fs::metadata(path), want_dir) {
            (Err(e), _) if e.kind() == io::ErrorKind::NotFound => "does not exist".to_string(),
            (Err(e), _) => format!("cannot be read: {e}"),
            (Ok(m), Some(true)) if !m.is_dir() => {
                "is not a directory (a local_dir entry copies a directory; use local_file for a file)"
                    .to_string()
            }
            (Ok(m), Some(false)) if !m.is_file() => {
                "is not a regular file (a local_file entry copies one file; use local_dir for a directory)"
                    .to_string()
            }
            _ => continue,
        };
        return Err(SpecError::HostPath {
            key: f.path.display().to_string(),
            path: path.clone(),
            problem,
        });
    }
    Ok(())
}

/// Streams the selected entries as a tar archive.
pub fn entries_archive(
    spec: &WorkspaceSpec,
    selection: Selection,
    binds: BindMounts,
) -> PipeReader {
    let spec = spec.clone();
    let (writer, reader) = byte_pipe::pipe();
    tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let result =
            write_entries(&mut builder, &spec, selection, binds).and_then(|()| builder.finish());
        match (result, builder.into_inner()) {
            (Ok(()), Ok(w)) => {
                let _ = w.finish();
            }
            (Err(e), Ok(w)) => w.fail(e),
            (_, Err(e)) => tracing::warn!(error = %e, "entries archive writer failed"),
        }
    });
    reader
}

fn header(kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    h
}

// Kept as one function: one match arm per kind of manifest entry.
fn write_entries<W: Write>(
    builder: &mut tar::Builder<W>,
    spec: &WorkspaceSpec,
    selection: Selection,
    binds: BindMounts,
) -> io::Result<()> {
    let flat = spec
        .flatten()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    // Parent directories of every selected entry, so ephemeral entries
    // inside persistent directories still have somewhere to land.
    let mut made_dirs = std::collections::HashSet::new();
    for f in &flat {
        let selected = match (selection, f.entry) {
            (_, Entry::BindMount { .. }) => true,
            (Selection::All, _) => true,
            (Selection::EphemeralOnly, _) => f.ephemeral,
        };
        if !selected {
            continue;
        }
        for parent in f
            .path
            .ancestors()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            if parent.as_os_str().is_empty() || !made_dirs.insert(parent.to_path_buf()) {
                continue;
            }
            builder.append_data(
                &mut header(tar::EntryType::Directory, 0, 0o755),
                parent,
                io::empty(),
            )?;
        }
        match f.entry {
            Entry::File {
                content,
                encoding,
                mode,
                ..
            } => {
                let bytes = match encoding {
                    Encoding::Utf8 => content.as_bytes().to_vec(),
                    Encoding::Base64 => base64::engine::general_purpose::STANDARD
                        .decode(content)
                        .map_err(|e| {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "entry {}: content is not valid base64: {e}",
                                f.path.display()
                            ),
                        )
                    })?,
                };
                let mut h = header(
                    tar::EntryType::Regular,
                    bytes.len() as u64,
                    mode.unwrap_or(0o644) & 0o777,
                );
                builder.append_data(&mut h, &f.path, bytes.as_slice())?;
            }
            Entry::Dir { .. } => {
                if made_dirs.insert(f.path.clone()) {
                    builder.append_data(
                        &mut header(tar::EntryType::Directory, 0, 0o755),
                        &f.path,
                        io::empty(),
                    )?;
                }
            }
            Entry::LocalFile { path, .. } => {
                let mut file =
                    std::fs::File::open(path).map_err(|e| with_path(e, path, &f.path))?;
                let meta = file.metadata()?;
                let mut h = header(tar::EntryType::Regular, meta.len(), 0o644);
                h.set_metadata(&meta);
                builder.append_data(&mut h, &f.path, &mut file)?;
            }
            Entry::LocalDir { path, .. } => {
                if !path.is_dir() {
                    return Err(with_path(
                        io::Error::new(io::ErrorKind::NotFound, "not a directory"),
                        path,
                        &f.path,
                    ));
                }
                made_dirs.insert(f.path.clone());
                copy_tree(builder, path, &f.path)?;
            }
            Entry::BindMount { host_path, .. } => {
                if binds == BindMounts::AsSymlinks {
                    let mut h = header(tar::EntryType::Symlink, 0, 0o777);
                    builder.append_link(&mut h, &f.path, host_path)?;
                }
            }
        }
    }
    Ok(())
}

/// An error reading host path `path` for workspace entry `entry`.
fn with_path(e: io::Error, path: &Path, entry: &Path) -> io::Error {
    io::Error::new(
        e.kind(),
        format!(
            "workspace entry {} (from {}): {e}",
            entry.display(),
            path.display()
        ),
    )
}

fn copy_tree<W: Write>(builder: &mut tar::Builder<W>, host: &Path, rel: &Path) -> io::Result<()> {
    builder
        .append_dir(rel, host)
        .map_err(|e| with_path(e, host, rel))?;
    let mut names: Vec<PathBuf> = std::fs::read_dir(host)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for full in names {
        let Some(name) = full.file_name() else {
            continue;
        };
        let rel_path = rel.join(name);
        let ft = std::fs::symlink_metadata(&full)?.file_type();
        if ft.is_dir() {
            copy_tree(builder, &full, &rel_path)?;
        } else if ft.is_file() || ft.is_symlink() {
            builder
                .append_path_with_name(&full, &rel_path)
                .map_err(|e| with_path(e, &full, &rel_path))?;
        }
    }
    Ok(())
}
