//! Plugin manifests: which component, which world, what configuration, and
//! exactly which capabilities it is granted. Nothing is granted by default.
//!
//! ```toml
//! name = "fs-store"
//! component = "fs_store.wasm"          # relative to this file, or
//! # component = "oci://registry.example.com/plugins/fs-store:0.1.0@sha256:…"
//! # accept_unpinned = false            # true: a reference without @sha256 is taken
//! world = "remote-client-plugin"       # or "snapshot-plugin"
//!
//! [signature]                          # for an oci:// component: load it only
//! key = "cosign.pub"                   # if a cosign signature verifies with this key
//!
//! [config]                             # passed to the plugin's `open`
//! root = "/data"
//! token = "${STORE_TOKEN}"             # expanded from the environment
//!
//! [grants]
//! max_memory = "256MiB"                # default 256 MiB
//! deadline_secs = 300                  # per call, default 300
//! wall_clock = false                   # real time of day; default frozen at 0
//! http_hosts = ["http://127.0.0.1:3900"]
//! env = { RUST_LOG = "info" }
//!
//! [[grants.dirs]]
//! host = "./snapshots"                 # relative to this file
//! guest = "/data"
//! mode = "rw"                          # or "ro"
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::registry::{OciReference, SCHEME};
use crate::plugin_error::PluginError;

pub use crate::contract::World;
pub use crate::plugin_error::{ManifestError, OriginError};

/// Default memory grant.
pub const DEFAULT_MAX_MEMORY: u64 = 256 * 1024 * 1024;
/// Default per-call deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(300);
/// Largest memory grant the engine is configured for.
pub const MAX_MEMORY_CEILING: u64 = 4 * 1024 * 1024 * 1024;

/// Read-only or read-write access to a granted directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum DirMode {
    /// The guest may only read.
    #[serde(rename = "ro")]
    ReadOnly,
    /// The guest may read and write.
    #[serde(rename = "rw")]
    ReadWrite,
}

/// A host directory preopened for the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// Absolute host path.
    pub host: PathBuf,
    /// Path the guest sees.
    pub guest: String,
    /// Access mode.
    pub mode: DirMode,
}

/// An outbound HTTP origin the guest may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOrigin {
    /// `http` or `https`.
    pub scheme: String,
    /// Host name or address, lower case.
    pub host: String,
    /// Port (default 80 / 443).
    pub port: u16,
}

impl HttpOrigin {
    /// Parses `http://host[:port]` or `https://host[:port]`.
    pub fn parse(s: &str) -> Result<Self, OriginError> {
        Self::parse_text(s).map_err(|reason| OriginError {
            given: s.to_string(),
            reason,
        })
    }

    fn parse_text(s: &str) -> Result<Self, String> {
        let (scheme, rest) = s.split_once("://").ok_or_else(|| {
            format!("{s:?} needs a scheme: http://host:port or https://host:port")
        })?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            other => return Err(format!("{s:?}: scheme {other:?} is not http or https")),
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') || authority.contains('@') {
            return Err(format!(
                "{s:?} must be an origin (scheme://host[:port]) without path or user"
            ));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| format!("{s:?}: unterminated [ in IPv6 address"))?;
            (format!("[{}]", &v6[..end]), v6[end + 1..].strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("{s:?}: port {p:?} is not a number"))?,
            None => default_port,
        };
        Ok(HttpOrigin {
            scheme,
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

impl std::fmt::Display for HttpOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// Everything a plugin may use. The default grants nothing but memory and
/// time to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    /// Preopened directories.
    pub dirs: Vec<DirGrant>,
    /// Outbound HTTP origins.
    pub http: Vec<HttpOrigin>,
    /// Environment variables visible to the guest.
    pub env: Vec<(String, String)>,
    /// Linear-memory ceiling in bytes.
    pub max_memory: u64,
    /// Deadline for each call.
    pub deadline: Duration,
    /// Whether the guest sees the real time of day.
    pub wall_clock: bool,
}

impl Default for Grants {
    fn default() -> Self {
        Grants {
            dirs: Vec::new(),
            http: Vec::new(),
            env: Vec::new(),
            max_memory: DEFAULT_MAX_MEMORY,
            deadline: DEFAULT_DEADLINE,
            wall_clock: false,
        }
    }
}

/// Where a plugin's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComponentSource {
    /// A file (absolute once read from a manifest).
    Path(PathBuf),
    /// A registry reference, fetched through the plugin cache.
    Registry(OciReference),
}

impl ComponentSource {
    /// The file, for a path source.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ComponentSource::Path(p) => Some(p),
            ComponentSource::Registry(_) => None,
        }
    }
}

impl ComponentSource {
    /// The plugin name a manifest without `name` gets: the file's stem, or
    /// the repository's last part.
    fn default_name(&self) -> String {
        match self {
            ComponentSource::Path(p) => p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "plugin".into()),
            ComponentSource::Registry(r) => r
                .repository
                .rsplit('/')
                .next()
                .unwrap_or("plugin")
                .to_string(),
        }
    }
}

impl std::fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComponentSource::Path(p) => write!(f, "{}", p.display()),
            ComponentSource::Registry(r) => write!(f, "{r}"),
        }
    }
}

/// A loaded, validated manifest.
#[derive(Debug, Clone)]
pub struct PluginManifest {
    /// Plugin name, used in logs and errors.
    pub name: String,
    /// The component: a file or a registry reference.
    pub component: ComponentSource,
    /// Whether a registry reference without a digest is taken (and the
    /// digest it resolved to logged). By default, it is refused.
    pub accept_unpinned: bool,
    /// Which world it implements.
    pub world: World,
    /// Configuration passed to `open`, with `${ENV}` expanded.
    pub config: Vec<(String, String)>,
    /// Capabilities.
    pub grants: Grants,
    /// The manifest file, when it came from one.
    pub source: Option<PathBuf>,
    /// A cosign public key (PEM) that must verify a signature on a
    /// registry component before it is compiled. By default, none.
    pub signature_key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    name: Option<String>,
    component: String,
    #[serde(default)]
    accept_unpinned: bool,
    world: World,
    #[serde(default)]
    config: BTreeMap<String, String>,
    #[serde(default)]
    grants: RawGrants,
    signature: Option<RawSignature>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSignature {
    key: PathBuf,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawGrants {
    #[serde(default)]
    dirs: Vec<RawDir>,
    #[serde(default)]
    http_hosts: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    max_memory: Option<ByteSize>,
    deadline_secs: Option<f64>,
    #[serde(default)]
    wall_clock: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDir {
    host: PathBuf,
    guest: String,
    mode: DirMode,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ByteSize {
    Bytes(u64),
    Text(String),
}

impl ByteSize {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            ByteSize::Bytes(n) => Ok(*n),
            ByteSize::Text(s) => crate::units::parse_size(s).map_err(|e| e.to_string()),
        }
    }
}

/// Expands `${NAME}` from the environment; `$$` is a literal `$`.
fn expand_env(value: &str, key: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("{key}: unterminated ${{ in {value:?}"))?;
            let var = &body[..end];
            let val = std::env::var(var).map_err(|_| {
                format!("{key} refers to ${{{var}}}, but the environment variable {var} is not set; the manifest is read again by every command that uses the plugin, so export {var} wherever berth runs (or change the manifest)")
            })?;
            out.push_str(&val);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

impl PluginManifest {
    /// A manifest for `component` with no grants, named after the file.
    pub fn for_component(component: impl Into<PathBuf>, world: World) -> Self {
        Self::for_source(ComponentSource::Path(component.into()), world)
    }

    /// A manifest for the component `reference` names, with no grants,
    /// named after its repository's last part.
    pub fn for_reference(reference: OciReference, world: World) -> Self {
        Self::for_source(ComponentSource::Registry(reference), world)
    }

    fn for_source(component: ComponentSource, world: World) -> Self {
        PluginManifest {
            name: component.default_name(),
            component,
            accept_unpinned: false,
            world,
            config: Vec::new(),
            grants: Grants::default(),
            source: None,
            signature_key: None,
        }
    }

    /// Adds a configuration value.
    pub fn with_config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Grants a preopened directory.
    pub fn with_dir(
        mut self,
        host: impl Into<PathBuf>,
        guest: impl Into<String>,
        mode: DirMode,
    ) -> Self {
        self.grants.dirs.push(DirGrant {
            host: host.into(),
            guest: guest.into(),
            mode,
        });
        self
    }

    /// Reads and validates a manifest file.
    pub fn from_file(path: &Path) -> Result<Self, PluginError> {
        let text = std::fs::read_to_string(path).map_err(|e| PluginError::Manifest {
            path: path.to_path_buf(),
            source: ManifestError::Read(e),
        })?;
        let base = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Self::from_toml(&text, &base, Some(path)).map_err(|source| PluginError::Manifest {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Parses manifest text; relative paths resolve against `base`.
    pub fn from_toml(
        text: &str,
        base: &Path,
        source: Option<&Path>,
    ) -> Result<Self, ManifestError> {
        let raw: RawManifest =
            toml::from_str(text).map_err(|e| ManifestError::Toml(Box::new(e)))?;
        let resolve = |p: &Path| -> PathBuf {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let component = if raw.component.starts_with(SCHEME) {
            ComponentSource::Registry(
                raw.component
                    .parse::<OciReference>()
                    .map_err(ManifestError::Component)?,
            )
        } else {
            ComponentSource::Path(resolve(Path::new(&raw.component)))
        };
        let name = raw.name.unwrap_or_else(|| component.default_name());
        let mut config = Vec::new();
        for (k, v) in &raw.config {
            config.push((
                k.clone(),
                expand_env(v, &format!("config.{k}")).map_err(ManifestError::Invalid)?,
            ));
        }
        let mut grants = Grants::default();
        for d in raw.grants.dirs {
            if !d.guest.starts_with('/') {
                return Err(ManifestError::Invalid(format!(
                    "grants.dirs: guest path {:?} must be absolute",
                    d.guest
                )));
            }
            grants.dirs.push(DirGrant {
                host: resolve(&d.host),
                guest: d.guest,
                mode: d.mode,
            });
        }
        for h in raw.grants.http_hosts {
            grants
                .http
                .push(HttpOrigin::parse(&h).map_err(ManifestError::HttpHost)?);
        }
        for (k, v) in &raw.grants.env {
            grants.env.push((
                k.clone(),
                expand_env(v, &format!("grants.env.{k}")).map_err(ManifestError::Invalid)?,
            ));
        }
        if let Some(m) = raw.grants.max_memory {
            let bytes = m
                .bytes()
                .map_err(|e| ManifestError::Invalid(format!("grants.max_memory: {e}")))?;
            if bytes == 0 || bytes > MAX_MEMORY_CEILING {
                return Err(ManifestError::Invalid(format!(
                    "grants.max_memory must be between 1 byte and 4 GiB, got {bytes}"
                )));
            }
            grants.max_memory = bytes;
        }
        if let Some(secs) = raw.grants.deadline_secs {
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(ManifestError::Invalid(format!(
                    "grants.deadline_secs must be positive, got {secs}"
                )));
            }
            grants.deadline = Duration::from_secs_f64(secs);
        }
        grants.wall_clock = raw.grants.wall_clock;
        let signature_key = match (raw.signature, &component) {
            (None, _) => None,
            (Some(s), ComponentSource::Registry(_)) => Some(resolve(&s.key)),
            (Some(_), ComponentSource::Path(_)) => {
                return Err(ManifestError::Invalid(
                    "signature applies to oci:// components (a signature names a registry \
                     manifest digest); remove [signature] or push the component and name it by reference"
                        .into(),
                ))
            }
        };
        Ok(PluginManifest {
            signature_key,
            name,
            component,
            accept_unpinned: raw.accept_unpinned,
            world: raw.world,
            config,
            grants,
            source: source.map(Path::to_path_buf),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_manifest() {
        std::env::set_var("BERTH_TEST_SECRET", "s3cr3t");
        let m = PluginManifest::from_toml(
            r#"
            component = "x.wasm"
            world = "remote-client-plugin"
            [config]
            root = "/data"
            key = "${BERTH_TEST_SECRET}-$$"
            [grants]
            max_memory = "64MiB"
            deadline_secs = 2.5
            http_hosts = ["http://127.0.0.1:3900", "https://S3.example.com"]
            [[grants.dirs]]
            host = "snap"
            guest = "/data"
            mode = "rw"
            "#,
            Path::new("/base"),
            None,
        )
        .unwrap();
        assert_eq!(m.name, "x");
        assert_eq!(m.component, ComponentSource::Path("/base/x.wasm".into()));
        assert!(m.config.contains(&("key".into(), "s3cr3t-$".into())));
        assert_eq!(m.grants.max_memory, 64 << 20);
        assert_eq!(m.grants.deadline, Duration::from_millis(2500));
        assert_eq!(m.grants.http[0].port, 3900);
        assert_eq!(m.grants.http[1].host, "s3.example.com");
        assert_eq!(m.grants.http[1].port, 443);
        assert_eq!(m.grants.dirs[0].host, PathBuf::from("/base/snap"));
    }

    #[test]
    fn rejects_bad_input_with_reasons() {
        let base = Path::new("/");
        // The error with its sources, as the CLI and the API print it.
        let text = |e: ManifestError| crate::error_text::causes(&e);
        let missing = PluginManifest::from_toml(
            "component='x'\nworld='snapshot-plugin'\n[config]\nk='${BERTH_SURELY_UNSET_VAR}'",
            base,
            None,
        )
        .unwrap_err();
        let missing = text(missing);
        assert!(missing.contains("BERTH_SURELY_UNSET_VAR"), "{missing}");
        let unknown =
            text(PluginManifest::from_toml("component='x'\nworld='nope'", base, None).unwrap_err());
        assert!(unknown.contains("nope"), "{unknown}");
        let grant = PluginManifest::from_toml(
            "component='x'\nworld='snapshot-plugin'\n[grants]\nhttp_hosts=['ftp://x']",
            base,
            None,
        )
        .unwrap_err();
        let grant = text(grant);
        assert!(grant.contains("ftp"), "{grant}");
        let typo = PluginManifest::from_toml(
            "component='x'\nworld='snapshot-plugin'\n[grants]\nmax_memroy=1",
            base,
            None,
        )
        .unwrap_err();
        let typo = text(typo);
        assert!(typo.contains("max_memroy"), "{typo}");
    }

    #[test]
    fn registry_references() {
        let d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let m = PluginManifest::from_toml(
            &format!("component='oci://127.0.0.1:5055/plugins/my-store:0.1.0@{d}'\nworld='remote-client-plugin'"),
            Path::new("/"),
            None,
        )
        .unwrap();
        assert_eq!(m.name, "my-store");
        assert!(!m.accept_unpinned);
        assert!(matches!(&m.component, ComponentSource::Registry(r) if r.is_pinned()));
        let e = PluginManifest::from_toml(
            "component='oci://store:1'\nworld='remote-client-plugin'",
            Path::new("/"),
            None,
        )
        .unwrap_err();
        assert!(matches!(e, ManifestError::Component(_)), "{e}");
    }
}
