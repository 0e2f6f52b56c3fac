//! `oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]`: the one grammar of a
//! plugin reference.

use std::fmt;
use std::str::FromStr;

/// The scheme every reference starts with.
pub const SCHEME: &str = "oci://";

/// Why a text is not a plugin reference (or a digest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct ReferenceError {
    /// The text given.
    pub given: String,
    /// What is wrong with it, and how to write it.
    pub reason: String,
}

impl ReferenceError {
    fn new(given: &str, reason: String) -> Self {
        ReferenceError {
            given: given.to_string(),
            reason,
        }
    }
}

/// A `sha256:` digest: 64 lower-case hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        Self::parse_text(s).map_err(|reason| ReferenceError::new(s, reason))
    }

    fn parse_text(s: &str) -> Result<Self, String> {
        let hex = s.strip_prefix("sha256:").ok_or_else(|| {
            format!("{s:?} is not a sha256 digest (sha256:<64 hex digits>); other algorithms are not accepted")
        })?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "{s:?}: a sha256 digest has 64 lower-case hex digits"
            ));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        use sha2::Digest as _;
        Digest(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(bytes))
        ))
    }

    /// The digest of a file's bytes, streamed.
    pub fn of_file(path: &std::path::Path) -> std::io::Result<Self> {
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        std::io::copy(&mut std::fs::File::open(path)?, &mut h)?;
        Ok(Self::from_hasher(h))
    }

    /// From a finished hasher.
    pub(crate) fn from_hasher(h: sha2::Sha256) -> Self {
        use sha2::Digest as _;
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
    }

    /// `sha256:…`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A component in a registry. The digest, when present, names the manifest
/// and wins over the tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciReference {
    /// `host[:port]`, as written (lower case).
    pub registry: String,
    /// `path/to/repo`.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The manifest digest, if pinned.
    pub digest: Option<Digest>,
}

impl OciReference {
    /// Whether the reference names its bytes (carries a digest).
    pub fn is_pinned(&self) -> bool {
        self.digest.is_some()
    }

    /// This reference pinned to `digest` (the tag kept for people).
    pub fn pinned(&self, digest: Digest) -> Self {
        OciReference {
            digest: Some(digest),
            ..self.clone()
        }
    }

    /// What to ask the registry for: the digest if pinned, else the tag
    /// (`latest` is never assumed).
    pub(crate) fn manifest_ref(&self) -> Option<&str> {
        match (&self.digest, &self.tag) {
            (Some(d), _) => Some(d.as_str()),
            (None, Some(t)) => Some(t),
            (None, None) => None,
        }
    }
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|part| {
            !part.is_empty()
                && part.split(['.', '_', '-']).all(|w| {
                    !w.is_empty()
                        && w.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                })
        })
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_host(host: &str) -> Result<(), String> {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(']') || n.starts_with('[') => (n, Some(p)),
        _ => (host, None),
    };
    if let Some(p) = port {
        p.parse::<u16>()
            .map_err(|_| format!("registry port {p:?} is not a number"))?;
    }
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'))
    {
        return Err(format!("{host:?} is not a registry host name"));
    }
    // Fully qualified: a dot, a port or localhost. No silent Docker Hub.
    if !(name.contains('.') || port.is_some() || name == "localhost" || name.starts_with('[')) {
        return Err(format!(
            "{host:?} is not a fully qualified registry host; write the registry's name \
             (e.g. oci://registry.example.com/... or oci://localhost:5000/...): Berth never \
             assumes Docker Hub"
        ));
    }
    Ok(())
}

impl FromStr for OciReference {
    type Err = ReferenceError;

    fn from_str(s: &str) -> Result<Self, ReferenceError> {
        OciReference::parse_text(s).map_err(|reason| ReferenceError::new(s, reason))
    }
}

impl OciReference {
    fn parse_text(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix(SCHEME)
            .ok_or_else(|| format!("{s:?} is not a registry reference: it starts with oci://"))?;
        let (rest, digest) = match rest.split_once('@') {
            Some((r, d)) => (
                r,
                Some(Digest::parse_text(d).map_err(|e| format!("{s:?}: {e}"))?),
            ),
            None => (rest, None),
        };
        let (host, path) = rest.split_once('/').ok_or_else(|| {
            format!("{s:?} has no repository: oci://HOST[:PORT]/REPO[:TAG]@sha256:DIGEST")
        })?;
        let host = host.to_ascii_lowercase();
        valid_host(&host).map_err(|e| format!("{s:?}: {e}"))?;
        let last = path.rfind('/').map(|i| i + 1).unwrap_or(0);
        let (repository, tag) = match path[last..].find(':') {
            Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
            None => (path, None),
        };
        if !valid_repository(repository) {
            return Err(format!(
                "{s:?}: repository {repository:?} must be lower-case letters, digits and \
                 . _ - separated by /"
            ));
        }
        if let Some(t) = tag {
            if !valid_tag(t) {
                return Err(format!(
                    "{s:?}: tag {t:?} must be 1-128 letters, digits, . _ - (not starting with . or -)"
                ));
            }
        }
        if tag.is_none() && digest.is_none() {
            return Err(format!(
                "{s:?} names neither a tag nor a digest; Berth never assumes :latest. Write \
                 {s}:TAG@sha256:DIGEST (`berth plugin push` prints it)"
            ));
        }
        Ok(OciReference {
            registry: host,
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }
}

impl fmt::Display for OciReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_and_prints_back() {
        for s in [
            format!("oci://127.0.0.1:5055/plugins/my-store:0.1.0@{D}"),
            format!("oci://registry.example.com/a/b/c@{D}"),
            "oci://localhost/x:v1".to_string(),
            "oci://ghcr.io/org/store_x.y:1.0-rc1".to_string(),
        ] {
            let r: OciReference = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
        }
        let r: OciReference = format!("oci://h.io:8080/p/q:t@{D}").parse().unwrap();
        assert_eq!(r.registry, "h.io:8080");
        assert_eq!(r.repository, "p/q");
        assert_eq!(r.tag.as_deref(), Some("t"));
        assert_eq!(r.manifest_ref(), Some(D));
    }

    #[test]
    fn refuses_with_reasons() {
        let cases = [
            ("docker.io/x:1", "oci://"),
            ("oci://store:1", "no repository"),
            ("oci://library/store:1", "fully qualified"),
            ("oci://h.io/Store:1", "lower-case"),
            ("oci://h.io/store", ":latest"),
            ("oci://h.io/store:1@sha256:abc", "64"),
            ("oci://h.io/store@md5:abc", "sha256"),
            ("oci://h.io/store:-x", "tag"),
            ("oci://h.io:99999/s:1", "port"),
        ];
        for (s, want) in cases {
            let e = s.parse::<OciReference>().unwrap_err();
            assert_eq!(e.given, s);
            assert!(e.reason.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn digest_of_bytes() {
        assert_eq!(
            Digest::of(b"").as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
