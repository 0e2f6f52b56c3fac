//! The docker CLI's own configuration, read the way the docker CLI reads
//! it, so an engine or registry a Docker user has set up works unchanged:
//! the config directory (`$DOCKER_CONFIG`, else `~/.docker`), its
//! `config.json` (current context, registry credentials and credential
//! helpers) and its contexts (`contexts/meta/<sha256 of the name>/meta.json`,
//! TLS files under `contexts/tls/<sha256 of the name>/docker/`).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;
use sha2::Digest;

/// The docker CLI's config directory: `$DOCKER_CONFIG`, else `~/.docker`.
pub(crate) fn config_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return PathBuf::from(dir);
    }
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"))
        .join(".docker")
}

/// The parts of `config.json` Berth uses.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConfigFile {
    #[serde(default)]
    pub current_context: Option<String>,
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default)]
    creds_store: Option<String>,
    #[serde(default)]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// Registry credentials found for one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegistryCredentials {
    pub username: Option<String>,
    pub password: Option<String>,
    pub identity_token: Option<String>,
}

impl ConfigFile {
    /// `config.json` in `dir`; a missing file is an empty config, an
    /// unreadable one an error naming it.
    pub(crate) fn load(dir: &Path) -> Result<Self, String> {
        let path = dir.join("config.json");
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() > 4 << 20 => {
                Err(format!("{} is larger than 4 MiB", path.display()))
            }
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{} is not valid docker config JSON: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ConfigFile::default()),
            Err(e) => Err(format!("reading {}: {e}", path.display())),
        }
    }

    /// Credentials for `registry` (a host\[:port\], or Docker Hub's
    /// `https://index.docker.io/v1/`): a credential helper for that
    /// registry, else the credentials store, else the `auths` entry.
    pub(crate) fn credentials(
        &self,
        registry: &str,
    ) -> Result<Option<RegistryCredentials>, String> {
        let helper = self
            .cred_helpers
            .get(registry)
            .or(self.creds_store.as_ref());
        if let Some(helper) = helper {
            if let Some(found) = credential_helper(helper, registry)? {
                return Ok(Some(found));
            }
        }
        let entry = self.auths.get(registry).or_else(|| {
            // `docker login` may have written the key with a scheme.
            self.auths.iter().find_map(|(k, v)| {
                let bare = k
                    .trim_start_matches("https://")
                    .trim_start_matches("http://")
                    .trim_end_matches('/');
                (bare == registry).then_some(v)
            })
        });
        let Some(entry) = entry else {
            return Ok(None);
        };
        let (mut username, mut password) = (entry.username.clone(), entry.password.clone());
        if let Some(auth) = &entry.auth {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .map_err(|e| format!("the auth of {registry} in config.json is not base64: {e}"))?;
            let text = String::from_utf8_lossy(&decoded).into_owned();
            if let Some((u, p)) = text.split_once(':') {
                username = Some(u.to_string());
                password = Some(p.to_string());
            }
        }
        Ok(Some(RegistryCredentials {
            username,
            password,
            identity_token: entry.identity_token.clone(),
        }))
    }
}

/// Asks `docker-credential-<helper> get` for `registry`'s credentials, as
/// the docker CLI does. A helper that knows no credentials for it answers
/// nothing.
fn credential_helper(helper: &str, registry: &str) -> Result<Option<RegistryCredentials>, String> {
    use std::io::Write;
    let program = format!("docker-credential-{helper}");
    let mut child = std::process::Command::new(&program)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            format!("config.json names the credential helper {program}, which cannot run: {e}")
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(registry.as_bytes());
    }
    // The helper's answer is a small JSON object: read at most 1 MiB.
    let mut answer = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.take(1 << 20).read_to_end(&mut answer);
    }
    let status = child.wait().map_err(|e| format!("{program} failed: {e}"))?;
    if !status.success() {
        // "credentials not found in native keychain": none for this one.
        return Ok(None);
    }
    #[derive(Deserialize)]
    struct Answer {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let answer: Answer = serde_json::from_slice(&answer)
        .map_err(|e| format!("{program} answered something unreadable: {e}"))?;
    // `<token>` as the user name marks an identity token.
    Ok(Some(if answer.username == "<token>" {
        RegistryCredentials {
            username: None,
            password: None,
            identity_token: Some(answer.secret),
        }
    } else {
        RegistryCredentials {
            username: Some(answer.username),
            password: Some(answer.secret),
            identity_token: None,
        }
    }))
}

/// A Docker context's endpoint and TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContextEndpoint {
    pub host: String,
    /// The directory holding `ca.pem`, `cert.pem` and `key.pem`, when the
    /// context has TLS material.
    pub tls_dir: Option<PathBuf>,
}

/// Reads context `name` from `dir` (the docker config directory).
pub(crate) fn context(dir: &Path, name: &str) -> Result<ContextEndpoint, String> {
    let id = hex::encode(sha2::Sha256::digest(name.as_bytes()));
    let meta = dir
        .join("contexts")
        .join("meta")
        .join(&id)
        .join("meta.json");
    let bytes = std::fs::read(&meta).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "no Docker context named {name:?} (looked for {}); see `docker context ls`, or give an endpoint such as unix:///var/run/docker.sock or tcp://HOST:2376",
                meta.display()
            )
        } else {
            format!("reading {}: {e}", meta.display())
        }
    })?;
    #[derive(Deserialize)]
    struct Meta {
        #[serde(rename = "Endpoints", default)]
        endpoints: std::collections::BTreeMap<String, Endpoint>,
    }
    #[derive(Deserialize)]
    struct Endpoint {
        #[serde(rename = "Host", default)]
        host: Option<String>,
        #[serde(rename = "SkipTLSVerify", default)]
        skip_tls_verify: bool,
    }
    let meta_doc: Meta = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not a Docker context: {e}", meta.display()))?;
    let docker = meta_doc.endpoints.get("docker").ok_or_else(|| {
        format!(
            "context {name:?} has no docker endpoint ({})",
            meta.display()
        )
    })?;
    if docker.skip_tls_verify {
        return Err(format!(
            "context {name:?} skips TLS verification, which Berth does not do: give the context the engine's CA (`docker context update {name} --docker ca=...`)"
        ));
    }
    let host = docker
        .host
        .clone()
        .ok_or_else(|| format!("context {name:?} has no docker host ({})", meta.display()))?;
    let tls = dir.join("contexts").join("tls").join(&id).join("docker");
    Ok(ContextEndpoint {
        host,
        tls_dir: tls.is_dir().then_some(tls),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_and_credentials_are_read_as_the_docker_cli_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let id = hex::encode(sha2::Sha256::digest(b"remote"));
        let meta = dir.path().join("contexts/meta").join(&id);
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(
            meta.join("meta.json"),
            r#"{"Name":"remote","Metadata":{},"Endpoints":{"docker":{"Host":"tcp://10.0.0.2:2376","SkipTLSVerify":false}}}"#,
        )
        .unwrap();
        let tls = dir.path().join("contexts/tls").join(&id).join("docker");
        std::fs::create_dir_all(&tls).unwrap();
        let found = context(dir.path(), "remote").unwrap();
        assert_eq!(found.host, "tcp://10.0.0.2:2376");
        assert_eq!(found.tls_dir.as_deref(), Some(tls.as_path()));
        let missing = context(dir.path(), "elsewhere").unwrap_err();
        assert!(
            missing.contains("no Docker context named \"elsewhere\""),
            "{missing}"
        );

        std::fs::write(
            dir.path().join("config.json"),
            r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYXNzOndvcmQ="},"https://reg.example/":{"username":"a","password":"b"}},"currentContext":"remote"}"#,
        )
        .unwrap();
        let config = ConfigFile::load(dir.path()).unwrap();
        assert_eq!(config.current_context.as_deref(), Some("remote"));
        let c = config.credentials("127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(c.username.as_deref(), Some("user"));
        assert_eq!(c.password.as_deref(), Some("pass:word"));
        let c = config.credentials("reg.example").unwrap().unwrap();
        assert_eq!(c.username.as_deref(), Some("a"));
        assert_eq!(config.credentials("other:5000").unwrap(), None);
        assert!(ConfigFile::load(&dir.path().join("nothing")).is_ok());
    }
}
