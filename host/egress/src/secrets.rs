//! Secrets by placeholder: the sandbox holds a placeholder; the egress
//! point puts the real value in its place, in the request headers of the
//! HTTPS connections to the hosts the secret is bound to, and nowhere else.
//!
//! A [`SecretBinding`] (name, hosts, placeholder) is part of the sandbox's
//! state; its [`SecretValue`] is not: it is kept only in the daemon's
//! directory (mode 0600, see [`crate::EgressDir::write_secrets`]) and in
//! the daemon's memory.

use std::fmt;

use rand::Rng as _;

use crate::rules::{HostRule, RuleError};

/// The longest value a secret may have.
pub const MAX_SECRET_BYTES: usize = 16 << 10;

/// A secret's name, host bindings and placeholder: what the sandbox's
/// state keeps of it (never its value).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretBinding {
    /// The environment variable that holds the placeholder in the sandbox.
    pub name: String,
    /// The hosts the real value is sent to (`--secret-hosts NAME=HOST`).
    pub hosts: Vec<HostRule>,
    /// What the sandbox holds instead of the value.
    pub placeholder: String,
}

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Its name is not an environment variable's.
    #[error("{0:?} is not a secret name: use letters, digits and `_`, not starting with a digit")]
    Name(String),
    /// It is bound to no host, so it could never be sent anywhere.
    #[error(
        "the secret {0} is bound to no host: say where it may be sent with --secret-hosts {0}=HOST"
    )]
    NoHosts(String),
    /// A host rule is not one.
    #[error("the secret {name}: {source}")]
    Host {
        /// The secret.
        name: String,
        /// What is wrong with the rule.
        #[source]
        source: RuleError,
    },
    /// Its value cannot travel in a request header.
    #[error("the secret {name}'s value {why}")]
    Value {
        /// The secret.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Two secrets have one name.
    #[error("the secret {0} is given twice")]
    Duplicate(String),
}

impl SecretBinding {
    /// A new binding of `name` to `hosts`, with a fresh random placeholder.
    pub fn new(name: &str, hosts: &[String]) -> Result<Self, SecretError> {
        let valid = !name.is_empty()
            && name.len() <= 128
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(SecretError::Name(name.to_string()));
        }
        if hosts.is_empty() {
            return Err(SecretError::NoHosts(name.to_string()));
        }
        let hosts = hosts
            .iter()
            .map(|h| HostRule::parse(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| SecretError::Host {
                name: name.to_string(),
                source,
            })?;
        let mut random = [0u8; 16];
        rand::thread_rng().fill(&mut random);
        let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
        Ok(SecretBinding {
            name: name.to_string(),
            hosts,
            placeholder: format!("BERTH_SECRET_{name}_{hex}"),
        })
    }

    /// Whether the value belongs to `host` (normalized) on `port`: a host
    /// rule names it, on its port or on the default ports.
    pub fn bound_to(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|rule| {
            rule.names(host)
                && rule
                    .port()
                    .map_or(crate::policy::DEFAULT_PORTS.contains(&port), |p| p == port)
        })
    }
}

/// A secret's value. Its `Debug` says nothing of it.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct SecretValue(String);

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

impl SecretValue {
    /// The value of `name` as read from a file or given: one trailing line
    /// end is dropped; what is left must fit in a header (no control
    /// characters), be non-empty and at most [`MAX_SECRET_BYTES`].
    pub fn new(name: &str, text: &str) -> Result<Self, SecretError> {
        let text = text
            .strip_suffix("\r\n")
            .or_else(|| text.strip_suffix('\n'))
            .unwrap_or(text);
        let refuse = |why| {
            Err(SecretError::Value {
                name: name.to_string(),
                why,
            })
        };
        if text.is_empty() {
            return refuse("is empty");
        }
        if text.len() > MAX_SECRET_BYTES {
            return refuse("is longer than 16 KiB");
        }
        if text.chars().any(|c| c.is_control()) {
            return refuse(
                "holds a control character (a line break, say), which no header can carry",
            );
        }
        Ok(SecretValue(text.to_string()))
    }

    /// The value itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// A secret as the daemon keeps it: its binding and its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredSecret {
    /// Its name, hosts and placeholder.
    #[serde(flatten)]
    pub binding: SecretBinding,
    /// Its value.
    pub value: SecretValue,
}

/// Checks a set of secrets: no name twice.
pub fn check_unique(secrets: &[SecretBinding]) -> Result<(), SecretError> {
    for (i, secret) in secrets.iter().enumerate() {
        if secrets[..i].iter().any(|s| s.name == secret.name) {
            return Err(SecretError::Duplicate(secret.name.clone()));
        }
    }
    Ok(())
}

/// `value` with every placeholder of `secrets` replaced by its value;
/// `None` when none occurs. The names of those replaced go to `used`.
pub fn substitute(
    value: &[u8],
    secrets: &[&StoredSecret],
    used: &mut Vec<String>,
) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for secret in secrets {
        let current = out.as_deref().unwrap_or(value);
        let placeholder = secret.binding.placeholder.as_bytes();
        if !contains(current, placeholder) {
            continue;
        }
        let replaced = replace(current, placeholder, secret.value.expose().as_bytes());
        out = Some(replaced);
        if !used.contains(&secret.binding.name) {
            used.push(secret.binding.name.clone());
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn stored(name: &str, value: &str) -> StoredSecret {
        StoredSecret {
            binding: SecretBinding::new(name, &["api.example.test".to_string()]).unwrap(),
            value: SecretValue::new(name, value).unwrap(),
        }
    }

    /// Over generated header values: every placeholder is replaced, no
    /// placeholder is left, and text around it is kept byte for byte.
    #[test]
    fn substitution_replaces_every_placeholder_and_keeps_the_rest() {
        let mut rng = StdRng::seed_from_u64(38);
        let a = stored("A_KEY", "sk-aaaa");
        let b = stored("B_KEY", "value with spaces");
        for _ in 0..500 {
            let mut text = String::new();
            let mut expected = String::new();
            for _ in 0..rng.gen_range(0..6) {
                let filler: String = (0..rng.gen_range(0..8))
                    .map(|_| rng.gen_range(b'a'..=b'z') as char)
                    .collect();
                text.push_str(&filler);
                expected.push_str(&filler);
                match rng.gen_range(0..3) {
                    0 => {
                        text.push_str(&a.binding.placeholder);
                        expected.push_str("sk-aaaa");
                    }
                    1 => {
                        text.push_str(&b.binding.placeholder);
                        expected.push_str("value with spaces");
                    }
                    _ => {}
                }
            }
            let mut used = Vec::new();
            let out = substitute(text.as_bytes(), &[&a, &b], &mut used);
            let got = out.clone().unwrap_or_else(|| text.as_bytes().to_vec());
            assert_eq!(String::from_utf8(got).unwrap(), expected);
            assert_eq!(out.is_some(), text != expected);
            assert!(used.iter().all(|n| n == "A_KEY" || n == "B_KEY"));
        }
    }

    #[test]
    fn a_placeholder_not_given_is_left_alone() {
        let a = stored("A_KEY", "sk-aaaa");
        let b = stored("B_KEY", "sk-bbbb");
        let text = format!("Bearer {}", b.binding.placeholder);
        let mut used = Vec::new();
        assert_eq!(substitute(text.as_bytes(), &[&a], &mut used), None);
        assert!(used.is_empty());
    }

    #[test]
    fn bad_secrets_are_refused_saying_why() {
        assert!(matches!(
            SecretBinding::new("1X", &["a.test".into()]),
            Err(SecretError::Name(_))
        ));
        assert!(matches!(
            SecretBinding::new("X", &[]),
            Err(SecretError::NoHosts(_))
        ));
        assert!(SecretBinding::new("X", &["10.0.0.1".into()]).is_err());
        assert!(SecretValue::new("X", "a\nb").is_err());
        assert!(SecretValue::new("X", "\n").is_err());
        assert_eq!(SecretValue::new("X", "abc\n").unwrap().expose(), "abc");
        assert!(!format!("{:?}", SecretValue::new("X", "abc").unwrap()).contains("abc"));
    }

    #[test]
    fn a_binding_names_its_hosts_on_their_ports() {
        let s = SecretBinding::new("K", &["api.example.test".into(), "*.git.test:8443".into()])
            .unwrap();
        assert!(s.bound_to("api.example.test", 443));
        assert!(!s.bound_to("api.example.test", 8443));
        assert!(s.bound_to("a.git.test", 8443));
        assert!(!s.bound_to("git.test", 8443));
        assert!(!s.bound_to("other.test", 443));
        assert_ne!(
            SecretBinding::new("K", &["a.test".into()])
                .unwrap()
                .placeholder,
            SecretBinding::new("K", &["a.test".into()])
                .unwrap()
                .placeholder
        );
    }
}
