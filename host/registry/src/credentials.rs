//! Registry credentials as Docker users configure them: `config.json` in
//! `$DOCKER_CONFIG` (else `~/.docker`), its `auths`, `credHelpers` and
//! `credsStore`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use serde::Deserialize;

use super::RegistryError;

/// A user name and secret for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or token.
    pub secret: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("secret", &"…")
            .finish()
    }
}

#[derive(Deserialize, Default)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(Deserialize, Default)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Deserialize)]
struct HelperAnswer {
    #[serde(rename = "Username")]
    username: String,
    #[serde(rename = "Secret")]
    secret: String,
}

/// `$DOCKER_CONFIG`, else `~/.docker`.
pub(crate) fn default_docker_config_dir() -> Option<PathBuf> {
    std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
}

/// The key a docker config entry names, as `host[:port]`.
fn normalize(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key).to_ascii_lowercase()
}

/// The credentials the docker config in `dir` holds for `registry`, if any.
pub(crate) fn lookup(dir: &Path, registry: &str) -> Result<Option<Credentials>, RegistryError> {
    let path = dir.join("config.json");
    let text = match std::fs::read(&path) {
        Ok(t) if t.len() > 4 << 20 => {
            return Err(RegistryError::Credentials {
                registry: registry.into(),
                message: format!("{} is over 4 MiB", path.display()),
            })
        }
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(RegistryError::Credentials {
                registry: registry.into(),
                message: format!("cannot read {}: {e}", path.display()),
            })
        }
    };
    let config: DockerConfig =
        serde_json::from_slice(&text).map_err(|e| RegistryError::Credentials {
            registry: registry.into(),
            message: format!("{} is not a docker config: {e}", path.display()),
        })?;
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| normalize(k) == registry)
        .map(|(_, v)| v.clone());
    if let Some(helper) = helper {
        return run_helper(&helper, registry);
    }
    if let Some((_, entry)) = config.auths.iter().find(|(k, _)| normalize(k) == registry) {
        return decode_entry(entry, registry, &path).map(Some);
    }
    match config.creds_store {
        Some(store) if !store.is_empty() => run_helper(&store, registry),
        _ => Ok(None),
    }
}

fn decode_entry(
    entry: &AuthEntry,
    registry: &str,
    path: &Path,
) -> Result<Credentials, RegistryError> {
    if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
        return Ok(Credentials {
            username: u.clone(),
            secret: p.clone(),
        });
    }
    let bad = |why: &str| RegistryError::Credentials {
        registry: registry.into(),
        message: format!("auths entry in {}: {why}", path.display()),
    };
    let auth = entry.auth.as_deref().ok_or_else(|| bad("no auth field"))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| bad("auth is not base64"))?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad("auth is not UTF-8"))?;
    let (u, p) = decoded
        .split_once(':')
        .ok_or_else(|| bad("auth is not base64 of user:password"))?;
    Ok(Credentials {
        username: u.into(),
        secret: p.into(),
    })
}

/// Runs `docker-credential-HELPER get`, as Docker does.
fn run_helper(helper: &str, registry: &str) -> Result<Option<Credentials>, RegistryError> {
    let program = format!("docker-credential-{helper}");
    let fail = |message: String| RegistryError::Credentials {
        registry: registry.into(),
        message,
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            fail(format!(
                "the docker config names the credential helper {helper}, but {program} cannot run: {e}"
            ))
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(registry.as_bytes())
            .map_err(|e| fail(format!("writing to {program}: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| fail(format!("waiting for {program}: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if stdout.contains("credentials not found") {
            return Ok(None);
        }
        return Err(fail(format!(
            "{program} get failed ({}): {}{}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let answer: HelperAnswer = serde_json::from_slice(&out.stdout).map_err(|e| {
        fail(format!(
            "{program} answered something that is not credentials: {e}"
        ))
    })?;
    Ok(Some(Credentials {
        username: answer.username,
        secret: answer.secret,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_auths_in_every_key_form() {
        let dir = tempfile::tempdir().unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode("alice:pw:with:colons");
        std::fs::write(
            dir.path().join("config.json"),
            format!(r#"{{"auths":{{"https://reg.example.com:5000/v1/":{{"auth":"{auth}"}},"other.io":{{"username":"bob","password":"x"}}}}}}"#),
        )
        .unwrap();
        let c = lookup(dir.path(), "reg.example.com:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.secret.as_str()),
            ("alice", "pw:with:colons")
        );
        assert_eq!(
            lookup(dir.path(), "other.io").unwrap().unwrap().username,
            "bob"
        );
        assert!(lookup(dir.path(), "nowhere.io").unwrap().is_none());
        assert!(format!("{c:?}").contains('…') && !format!("{c:?}").contains("pw"));
    }

    #[test]
    fn a_missing_helper_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"credHelpers":{"reg.io":"surely-absent"}}"#,
        )
        .unwrap();
        let e = lookup(dir.path(), "reg.io").unwrap_err().to_string();
        assert!(e.contains("docker-credential-surely-absent"), "{e}");
    }
}
