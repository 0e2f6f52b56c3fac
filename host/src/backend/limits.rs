//! The bounds every backend puts on a sandbox by default, so that one
//! command cannot take the host's memory or fill its process table: the
//! defaults, and the value a front end gives for one (`2GiB`, `512`, or
//! `unlimited`, an explicit opt-out that is logged as a warning).
//!
//! Each backend applies them in its own way (Docker's `HostConfig`, a
//! swarm service's resources, cgroups for the local backend); this module
//! only says what they are.

/// Memory a sandbox may use (swap included) unless its settings say
/// otherwise: 2 GiB, enough for a compiler or a test suite, small enough
/// that a runaway command does not take a shared host with it.
pub const DEFAULT_MEMORY_BYTES: u64 = 2 << 30;

/// Processes (threads included) a sandbox may hold at once unless its
/// settings say otherwise: Docker's usual bound, far above a build's
/// needs and far below a fork bomb's.
pub const DEFAULT_PIDS: u64 = 1024;

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

/// Logs, once per sandbox made, that `what` is unbounded by choice.
pub fn warn_unbounded(backend: &str, what: &str) {
    tracing::warn!(
        backend,
        "this sandbox's {what} is unlimited (chosen explicitly): one command can take all of the host's"
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
