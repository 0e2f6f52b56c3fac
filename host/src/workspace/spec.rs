//! The workspace manifest: what a sandbox's workspace is made of.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default in-sandbox workspace root.
pub const DEFAULT_ROOT: &str = "/workspace";

fn default_root() -> String {
    DEFAULT_ROOT.to_string()
}

/// The workspace of a sandbox: its root, environment and initial entries.
///
/// Unknown keys are refused, naming the key and the known ones: a typo
/// (`"entrys"`) must not silently give an empty workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSpec {
    /// Absolute path of the workspace inside the sandbox.
    #[serde(default = "default_root")]
    pub root: String,
    /// Environment for every exec.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// Entries keyed by path relative to the root.
    #[serde(default)]
    pub entries: BTreeMap<String, Entry>,
}

impl Default for WorkspaceSpec {
    fn default() -> Self {
        WorkspaceSpec {
            root: default_root(),
            environment: BTreeMap::new(),
            entries: BTreeMap::new(),
        }
    }
}

/// How a file entry's content is written in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Content is the text itself.
    #[default]
    Utf8,
    /// Content is base64.
    Base64,
}

/// One workspace entry. `ephemeral` entries are applied on every start but
/// never persisted in a snapshot; bind mounts are never archived at all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Entry {
    /// A file with inline content.
    File {
        /// The content, per `encoding`.
        content: String,
        /// How `content` is encoded.
        #[serde(default)]
        encoding: Encoding,
        /// Permission bits (default 0644).
        #[serde(default)]
        mode: Option<u32>,
        /// Never persisted.
        #[serde(default)]
        ephemeral: bool,
    },
    /// A directory with children.
    Dir {
        /// Children keyed by name (relative paths).
        #[serde(default)]
        children: BTreeMap<String, Entry>,
        /// Never persisted (nor its children).
        #[serde(default)]
        ephemeral: bool,
    },
    /// A file copied from the host.
    LocalFile {
        /// Host path.
        path: PathBuf,
        /// Never persisted.
        #[serde(default)]
        ephemeral: bool,
    },
    /// A directory tree copied from the host (symlinks kept as links).
    LocalDir {
        /// Host path.
        path: PathBuf,
        /// Never persisted.
        #[serde(default)]
        ephemeral: bool,
    },
    /// A host path mounted into the workspace; never archived.
    BindMount {
        /// Host path.
        host_path: PathBuf,
        /// Mount read-only (enforced by isolating backends).
        #[serde(default)]
        read_only: bool,
    },
}

/// Why a manifest is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// An entry key is absolute, empty, or climbs out with `..`.
    #[error("workspace entry {key:?}: {reason}; keys are paths relative to the workspace root, without '..'")]
    BadKey {
        /// The offending key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The root is not an absolute path.
    #[error("workspace root {0:?} must be an absolute path like /workspace")]
    BadRoot(String),
    /// Base64 content does not decode.
    #[error("workspace entry {key:?}: content is not valid base64: {message}")]
    BadBase64 {
        /// The entry.
        key: String,
        /// The decoder's complaint.
        message: String,
    },
    /// A `local_file`, `local_dir` or `bind_mount` entry names a host path
    /// that is missing or of the wrong kind.
    #[error("workspace entry {key:?}: its host path {} {problem}", path.display())]
    HostPath {
        /// The entry (its path relative to the root).
        key: String,
        /// The host path it names.
        path: PathBuf,
        /// What is wrong with it, e.g. "does not exist".
        problem: String,
    },
}

/// One entry flattened to its full relative path.
#[derive(Debug, Clone)]
pub struct FlatEntry<'a> {
    /// Path relative to the root.
    pub path: PathBuf,
    /// The entry.
    pub entry: &'a Entry,
    /// Ephemeral itself or inside an ephemeral directory.
    pub ephemeral: bool,
}

/// Checks a key and turns it into a normalised relative path.
pub fn relative_key(key: &str) -> Result<PathBuf, SpecError> {
    let bad = |reason| SpecError::BadKey {
        key: key.to_string(),
        reason,
    };
    if key.is_empty() {
        return Err(bad("empty path"));
    }
    if key.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    let path = Path::new(key);
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("contains '..'")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("is absolute")),
        }
    }
    if out.as_os_str().is_empty() {
        return Err(bad("names the root itself"));
    }
    Ok(out)
}

impl WorkspaceSpec {
    /// Checks the root and every key, recursively.
    pub fn validate(&self) -> Result<(), SpecError> {
        if !self.root.starts_with('/') || self.root.contains("..") {
            return Err(SpecError::BadRoot(self.root.clone()));
        }
        self.flatten().map(|_| ())
    }

    /// Every entry with its full relative path, parents before children.
    pub fn flatten(&self) -> Result<Vec<FlatEntry<'_>>, SpecError> {
        let mut out = Vec::new();
        flatten_into(&self.entries, Path::new(""), false, &mut out)?;
        Ok(out)
    }

    /// Paths never included in a snapshot: ephemeral entries and bind
    /// mounts.
    pub fn excluded_from_snapshots(&self) -> Result<Vec<PathBuf>, SpecError> {
        Ok(self
            .flatten()?
            .into_iter()
            .filter(|f| f.ephemeral || matches!(f.entry, Entry::BindMount { .. }))
            .map(|f| f.path)
            .collect())
    }

    /// Makes every relative host path (`local_file`, `local_dir`,
    /// `bind_mount`) absolute against `base`, the directory of the manifest
    /// file, so a manifest means the same files whichever directory later
    /// commands run from.
    pub fn resolve_host_paths(&mut self, base: &Path) {
        fn walk(entries: &mut BTreeMap<String, Entry>, base: &Path) {
            for entry in entries.values_mut() {
                match entry {
                    Entry::LocalFile { path, .. } | Entry::LocalDir { path, .. } => {
                        if path.is_relative() {
                            *path = base.join(&*path);
                        }
                    }
                    Entry::BindMount { host_path, .. } => {
                        if host_path.is_relative() {
                            *host_path = base.join(&*host_path);
                        }
                    }
                    Entry::Dir { children, .. } => walk(children, base),
                    Entry::File { .. } => {}
                }
            }
        }
        walk(&mut self.entries, base);
    }

    /// The bind mounts, with their relative paths.
    pub fn bind_mounts(&self) -> Result<Vec<BindMount>, SpecError> {
        Ok(self
            .flatten()?
            .into_iter()
            .filter_map(|f| match f.entry {
                Entry::BindMount {
                    host_path,
                    read_only,
                } => Some(BindMount {
                    relative: f.path,
                    host: host_path.clone(),
                    read_only: *read_only,
                }),
                _ => None,
            })
            .collect())
    }
}

/// A bind-mount entry of a manifest, typed: the backend mounts `host` at
/// `relative` under the workspace root, read-only when `read_only`.
/// Backends that mount binds themselves keep these in their state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindMount {
    /// Where, relative to the workspace root.
    pub relative: PathBuf,
    /// The host directory or file.
    pub host: PathBuf,
    /// Whether writes through the mount are refused.
    #[serde(default)]
    pub read_only: bool,
}

fn flatten_into<'a>(
    entries: &'a BTreeMap<String, Entry>,
    parent: &Path,
    parent_ephemeral: bool,
    out: &mut Vec<FlatEntry<'a>>,
) -> Result<(), SpecError> {
    for (key, entry) in entries {
        let path = parent.join(relative_key(key)?);
        let ephemeral = parent_ephemeral
            || match entry {
                Entry::File { ephemeral, .. }
                | Entry::Dir { ephemeral, .. }
                | Entry::LocalFile { ephemeral, .. }
                | Entry::LocalDir { ephemeral, .. } => *ephemeral,
                Entry::BindMount { .. } => false,
            };
        out.push(FlatEntry {
            path: path.clone(),
            entry,
            ephemeral,
        });
        if let Entry::Dir { children, .. } = entry {
            flatten_into(children, &path, ephemeral, out)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_stay_inside() {
        assert_eq!(relative_key("a/./b").unwrap(), PathBuf::from("a/b"));
        for bad in ["", "/etc/passwd", "../x", "a/../../x", ".", "a\0b"] {
            assert!(relative_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unknown_keys_are_refused_by_name_with_the_known_ones() {
        let typo = serde_json::from_str::<WorkspaceSpec>(r#"{"entrys": {}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            typo.contains("`entrys`") && typo.contains("`entries`"),
            "{typo}"
        );
        let entry = serde_json::from_str::<WorkspaceSpec>(
            r#"{"entries": {"a": {"type": "file", "contents": "x"}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            entry.contains("`contents`") && entry.contains("`content`"),
            "{entry}"
        );
        let nested = serde_json::from_str::<WorkspaceSpec>(
            r#"{"entries": {"d": {"type": "dir", "children": {"x": {"type": "dir", "ephemeral": true, "childs": {}}}}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(nested.contains("`childs`"), "{nested}");
    }

    #[test]
    fn flatten_inherits_ephemeral_and_lists_exclusions() {
        let spec: WorkspaceSpec = serde_json::from_str(
            r#"{"entries": {
                "src": {"type": "dir", "children": {"main.py": {"type": "file", "content": "print(1)"}}},
                "tmp": {"type": "dir", "ephemeral": true, "children": {"x": {"type": "file", "content": ""}}},
                "data": {"type": "bind_mount", "host_path": "/srv/data", "read_only": true}
            }}"#,
        )
        .unwrap();
        assert_eq!(spec.root, "/workspace");
        let flat = spec.flatten().unwrap();
        assert_eq!(flat.len(), 5);
        let excluded = spec.excluded_from_snapshots().unwrap();
        assert_eq!(
            excluded,
            vec![
                PathBuf::from("data"),
                PathBuf::from("tmp"),
                PathBuf::from("tmp/x")
            ]
        );
        let bad: WorkspaceSpec =
            serde_json::from_str(r#"{"entries": {"../up": {"type": "file", "content": ""}}}"#)
                .unwrap();
        assert!(bad.validate().is_err());
    }
}
