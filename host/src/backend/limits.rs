//! The bounds every backend puts on a sandbox by default, so that one
//! command cannot take the host's memory, CPUs, process table or disk:
//! Berth's built-in defaults, the host's own (`$BERTH_HOME/config.toml`,
//! [`HostDefaults`]), and the value a front end gives for one (`2GiB`,
//! `512`, `1.5`, or `unlimited`, an explicit opt-out that is logged as a
//! warning).
//!
//! Each backend applies them in its own way (Docker's `HostConfig`, a
//! swarm service's resources, cgroups and a filesystem image for the
//! local backend); this module only says what they are.

use std::path::{Path, PathBuf};

/// Memory a sandbox may use (swap included) unless its settings say
/// otherwise: 2 GiB, enough for a compiler or a test suite, small enough
/// that a runaway command does not take a shared host with it.
pub const DEFAULT_MEMORY_BYTES: u64 = 2 << 30;

/// Processes (threads included) a sandbox may hold at once unless its
/// settings say otherwise: Docker's usual bound, far above a build's
/// needs and far below a fork bomb's.
pub const DEFAULT_PIDS: u64 = 1024;

/// The workspace's disk quota unless its settings say otherwise: 10 GiB.
/// The quota is a sparse filesystem image, so the host pays only for
/// what the workspace holds.
pub const DEFAULT_DISK_BYTES: u64 = 10 << 30;

/// CPUs a sandbox may use unless its settings say otherwise, in
/// thousandths of a CPU: all of the host's but one (one on a one-CPU
/// host), so that Berth, its server and the other sandboxes always have
/// one.
pub fn default_cpus_millis() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    cpus.saturating_sub(1).max(1) * 1000
}

/// A bound as a front end gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// At most this many (bytes, processes).
    At(u64),
    /// No bound, chosen explicitly.
    Unlimited,
}

impl Bound {
    /// The limit, or `None` for unlimited.
    pub fn limit(self) -> Option<u64> {
        match self {
            Bound::At(n) => Some(n),
            Bound::Unlimited => None,
        }
    }
}

/// A CPU bound as a number of CPUs: `1`, `1.5`, `unlimited`.
pub fn cpus_text(bound: Bound) -> String {
    match bound {
        Bound::At(millis) if millis.is_multiple_of(1000) => (millis / 1000).to_string(),
        Bound::At(millis) => format!("{}", millis as f64 / 1000.0),
        Bound::Unlimited => "unlimited".into(),
    }
}

/// A size bound as people write it: `2GiB`, `unlimited`.
pub fn size_text(bound: Bound) -> String {
    match bound {
        Bound::At(bytes) => crate::units::size_text(bytes),
        Bound::Unlimited => "unlimited".into(),
    }
}

/// A count bound as people write it: `1024`, `unlimited`.
pub fn count_text(bound: Bound) -> String {
    match bound {
        Bound::At(n) => n.to_string(),
        Bound::Unlimited => "unlimited".into(),
    }
}

/// The bounds a new sandbox gets where its settings say nothing: Berth's
/// built-in ones ([`HostDefaults::builtin`]), or the host's, read from
/// `$BERTH_HOME/config.toml` ([`HostDefaults::load`]):
///
/// ```toml
/// [sandbox]
/// memory = "4GiB"     # swap included; or "unlimited"
/// pids = 2048         # processes and threads at once
/// cpus = 1.5          # CPUs' worth of time
/// disk = "20GiB"      # the workspace's quota
/// ```
///
/// A key left out keeps its built-in value. Every kind applies what it
/// can enforce (the swarm backend has no disk quota; it says so at
/// create).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostDefaults {
    /// Memory, swap included ([`DEFAULT_MEMORY_BYTES`]).
    pub memory: Bound,
    /// Processes and threads at once ([`DEFAULT_PIDS`]).
    pub pids: Bound,
    /// CPU time, in thousandths of a CPU ([`default_cpus_millis`]).
    pub cpus: Bound,
    /// The workspace's disk quota ([`DEFAULT_DISK_BYTES`]).
    pub disk: Bound,
    /// The file they were read from; `None`: built in.
    pub file: Option<PathBuf>,
}

/// One default as `berth info` and `GET /v1/info` show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DefaultEntry {
    /// The key, in `config.toml` and in every kind's settings.
    pub key: &'static str,
    /// Its value as it would be written there.
    pub value: String,
    /// Whether it comes from the file (else built in).
    pub from_file: bool,
    /// What it bounds.
    pub help: &'static str,
}

/// A `config.toml` that cannot be used; nothing is created until it is
/// fixed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}; it takes memory, pids, cpus and disk under [sandbox] (`berth info` shows the values in force)", path.display())]
pub struct DefaultsError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong in it.
    pub message: String,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DefaultsFile {
    #[serde(default)]
    sandbox: SandboxDefaults,
}

#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SandboxDefaults {
    #[serde(default, deserialize_with = "lenient::size")]
    memory: Option<Bound>,
    #[serde(default, deserialize_with = "lenient::count")]
    pids: Option<Bound>,
    #[serde(default, deserialize_with = "lenient::cpus")]
    cpus: Option<Bound>,
    #[serde(default, deserialize_with = "lenient::size")]
    disk: Option<Bound>,
}

impl HostDefaults {
    /// Berth's own defaults.
    pub fn builtin() -> Self {
        HostDefaults {
            memory: Bound::At(DEFAULT_MEMORY_BYTES),
            pids: Bound::At(DEFAULT_PIDS),
            cpus: Bound::At(default_cpus_millis()),
            disk: Bound::At(DEFAULT_DISK_BYTES),
            file: None,
        }
    }

    /// The defaults file of the home `home`.
    pub fn path(home: &Path) -> PathBuf {
        home.join("config.toml")
    }

    /// The defaults in force for `home`: its `config.toml` over the
    /// built-in ones, or the built-in ones where there is no file.
    pub fn load(home: &Path) -> Result<Self, DefaultsError> {
        let path = Self::path(home);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::builtin()),
            Err(e) => {
                return Err(DefaultsError {
                    path,
                    message: format!("cannot read it: {e}"),
                })
            }
        };
        Self::parse(&text)
            .map_err(|message| DefaultsError {
                path: path.clone(),
                message,
            })
            .map(|d| HostDefaults {
                file: Some(path),
                ..d
            })
    }

    /// The defaults a `config.toml`'s text gives.
    fn parse(text: &str) -> Result<Self, String> {
        let file: DefaultsFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let builtin = Self::builtin();
        let sandbox = file.sandbox;
        Ok(HostDefaults {
            memory: sandbox.memory.unwrap_or(builtin.memory),
            pids: sandbox.pids.unwrap_or(builtin.pids),
            cpus: sandbox.cpus.unwrap_or(builtin.cpus),
            disk: sandbox.disk.unwrap_or(builtin.disk),
            file: None,
        })
    }

    /// Every default, for display.
    pub fn entries(&self) -> Vec<DefaultEntry> {
        let builtin = Self::builtin();
        let from_file = |mine: Bound, theirs: Bound| self.file.is_some() && mine != theirs;
        vec![
            DefaultEntry {
                key: "memory",
                value: size_text(self.memory),
                from_file: from_file(self.memory, builtin.memory),
                help: "memory a sandbox's processes may use together, swap included",
            },
            DefaultEntry {
                key: "pids",
                value: count_text(self.pids),
                from_file: from_file(self.pids, builtin.pids),
                help: "processes and threads a sandbox may hold at once",
            },
            DefaultEntry {
                key: "cpus",
                value: cpus_text(self.cpus),
                from_file: from_file(self.cpus, builtin.cpus),
                help: "CPUs' worth of time a sandbox may use",
            },
            DefaultEntry {
                key: "disk",
                value: size_text(self.disk),
                from_file: from_file(self.disk, builtin.disk),
                help: "the workspace's disk quota (local and Docker; not the swarm)",
            },
        ]
    }
}

/// A sandbox's bounds as its settings chose them; `None` takes the
/// host's default ([`HostDefaults`]) when the sandbox is made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chosen {
    /// Memory, swap included.
    pub memory: Option<Bound>,
    /// Processes and threads at once.
    pub pids: Option<Bound>,
    /// CPU time, in thousandths of a CPU.
    pub cpus: Option<Bound>,
    /// The workspace's disk quota.
    pub disk: Option<Bound>,
}

/// The bounds a new sandbox gets: what its settings chose, else the
/// host's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Memory, swap included.
    pub memory: Bound,
    /// Processes and threads at once.
    pub pids: Bound,
    /// CPU time, in thousandths of a CPU.
    pub cpus: Bound,
    /// The workspace's disk quota.
    pub disk: Bound,
}

impl Chosen {
    /// The bounds for a new sandbox of `backend`, logging a warning for
    /// each that is unlimited (by its settings or by the host's file).
    pub fn resolve(&self, defaults: &HostDefaults, backend: &str) -> Bounds {
        let bounds = Bounds {
            memory: self.memory.unwrap_or(defaults.memory),
            pids: self.pids.unwrap_or(defaults.pids),
            cpus: self.cpus.unwrap_or(defaults.cpus),
            disk: self.disk.unwrap_or(defaults.disk),
        };
        for (bound, what) in [
            (bounds.memory, "memory"),
            (bounds.pids, "process count"),
            (bounds.cpus, "CPU time"),
            (bounds.disk, "workspace disk"),
        ] {
            if bound == Bound::Unlimited {
                warn_unbounded(backend, what);
            }
        }
        bounds
    }
}

/// Logs, once per sandbox made, that `what` is unbounded by choice.
pub fn warn_unbounded(backend: &str, what: &str) {
    tracing::warn!(
        backend,
        "this sandbox's {what} is unlimited (chosen explicitly, by its settings or the host's config.toml): one command can take all of the host's"
    );
}

/// Deserializers for a bound's text (`2GiB`, `512`, `unlimited`), for a
/// kind's settings fields.
pub mod lenient {
    use super::Bound;
    use serde::de::{Deserializer, Error};
    use serde::Deserialize;
    use serde_json::Value;

    fn is_unlimited(s: &str) -> bool {
        matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "unlimited" | "none" | "max"
        )
    }

    /// A size in bytes (a number or `"2GiB"`) or `"unlimited"`.
    pub fn size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bound>, D::Error> {
        match Option::<Value>::deserialize(d)? {
            None => Ok(None),
            Some(Value::String(s)) if is_unlimited(&s) => Ok(Some(Bound::Unlimited)),
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| Some(Bound::At(n)))
                .ok_or_else(|| D::Error::custom(format!("{n} is not a size in bytes"))),
            Some(Value::String(s)) => match crate::units::parse_size(&s) {
                Ok(0) => Err(D::Error::custom(
                    "0 bytes would stop every command; give a size, or `unlimited`",
                )),
                Ok(n) => Ok(Some(Bound::At(n))),
                Err(e) => Err(D::Error::custom(format!("{e} (or `unlimited`)"))),
            },
            Some(other) => Err(D::Error::custom(format!("{other} is not a size"))),
        }
    }

    /// A number of CPUs (`1`, `1.5`, `"0.5"`) or `"unlimited"`, as
    /// thousandths of a CPU.
    pub fn cpus<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bound>, D::Error> {
        let bad = |v: &dyn std::fmt::Display| {
            D::Error::custom(format!(
                "{v} is not a number of CPUs of at least 0.01 (or `unlimited`)"
            ))
        };
        let millis = |cpus: f64| {
            let millis = (cpus * 1000.0).round();
            (cpus.is_finite() && (10.0..1e12).contains(&millis)).then_some(millis as u64)
        };
        match Option::<Value>::deserialize(d)? {
            None => Ok(None),
            Some(Value::String(s)) if is_unlimited(&s) => Ok(Some(Bound::Unlimited)),
            Some(Value::Number(n)) => n
                .as_f64()
                .and_then(millis)
                .map(|m| Some(Bound::At(m)))
                .ok_or_else(|| bad(&n)),
            Some(Value::String(s)) => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(millis)
                .map(|m| Some(Bound::At(m)))
                .ok_or_else(|| bad(&s)),
            Some(other) => Err(bad(&other)),
        }
    }

    /// A count (a number or `"512"`) or `"unlimited"`.
    pub fn count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Bound>, D::Error> {
        let bad = |v: &dyn std::fmt::Display| {
            D::Error::custom(format!(
                "{v} is not a positive whole number (or `unlimited`)"
            ))
        };
        match Option::<Value>::deserialize(d)? {
            None => Ok(None),
            Some(Value::String(s)) if is_unlimited(&s) => Ok(Some(Bound::Unlimited)),
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| Some(Bound::At(n)))
                .ok_or_else(|| bad(&n)),
            Some(Value::String(s)) => match s.trim().parse::<u64>() {
                Ok(n) if n > 0 => Ok(Some(Bound::At(n))),
                _ => Err(bad(&s)),
            },
            Some(other) => Err(bad(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct S {
        #[serde(default, deserialize_with = "lenient::size")]
        memory: Option<Bound>,
        #[serde(default, deserialize_with = "lenient::count")]
        pids: Option<Bound>,
    }

    fn parse(v: serde_json::Value) -> Result<S, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    #[test]
    fn a_defaults_file_over_the_builtin_ones() {
        let builtin = HostDefaults::builtin();
        let d =
            HostDefaults::parse("[sandbox]\nmemory = \"4GiB\"\ncpus = 1.5\ndisk = \"unlimited\"\n")
                .unwrap();
        assert_eq!(d.memory, Bound::At(4 << 30));
        assert_eq!(d.cpus, Bound::At(1500));
        assert_eq!(d.disk, Bound::Unlimited);
        assert_eq!(d.pids, builtin.pids);
        assert_eq!(HostDefaults::parse("").unwrap(), builtin);
        for (bad, says) in [
            ("[sandbox]\nmemroy = \"1GiB\"", "memroy"),
            ("[sandbox]\ncpus = 0", "0.01"),
            ("[sandbx]\n", "sandbx"),
            ("[sandbox]\ndisk = \"big\"", "big"),
        ] {
            let e = HostDefaults::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let home = tempfile::tempdir().unwrap();
        assert_eq!(HostDefaults::load(home.path()).unwrap(), builtin);
        std::fs::write(HostDefaults::path(home.path()), "[sandbox]\npids = 0\n").unwrap();
        let e = HostDefaults::load(home.path()).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("pids"), "{e}");
    }

    #[test]
    fn shown_values_read_back_as_the_same_defaults() {
        let d = HostDefaults::parse(
            "[sandbox]\nmemory = \"1536MiB\"\ncpus = 0.25\npids = \"unlimited\"",
        )
        .unwrap();
        let text = d
            .entries()
            .iter()
            .map(|e| format!("{} = \"{}\"", e.key, e.value))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            HostDefaults::parse(&format!("[sandbox]\n{text}")).unwrap(),
            d
        );
    }

    #[test]
    fn bounds_as_people_type_them() {
        let s = parse(serde_json::json!({"memory": "512MiB", "pids": "64"})).unwrap();
        assert_eq!(s.memory, Some(Bound::At(512 << 20)));
        assert_eq!(s.pids, Some(Bound::At(64)));
        let s = parse(serde_json::json!({"memory": "unlimited", "pids": "Unlimited"})).unwrap();
        assert_eq!(s.memory, Some(Bound::Unlimited));
        assert_eq!(s.pids, Some(Bound::Unlimited));
        let s = parse(serde_json::json!({})).unwrap();
        assert_eq!((s.memory, s.pids), (None, None));
        for bad in [
            serde_json::json!({"memory": "0"}),
            serde_json::json!({"memory": "lots"}),
            serde_json::json!({"pids": 0}),
            serde_json::json!({"pids": "-3"}),
        ] {
            let e = parse(bad.clone())
                .err()
                .unwrap_or_else(|| panic!("{bad} taken"));
            assert!(e.contains("unlimited") || e.contains("0 bytes"), "{e}");
        }
    }
}
