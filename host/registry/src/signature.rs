//! Key-based cosign signatures: the manifest `sha256-HEX.sig` beside the
//! artifact holds `simplesigning` payloads naming the manifest digest, each
//! with an ECDSA P-256 signature in the `dev.cosignproject.cosign/signature`
//! annotation. A plugin whose manifest asks for it loads only when one of
//! them verifies with the given public key.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use super::reference::Digest;
use super::RegistryError;

/// The payload layer's media type.
pub(crate) const PAYLOAD_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation carrying the base64 signature.
pub(crate) const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// Most signature layers looked at.
pub(crate) const MAX_SIGNATURES: usize = 16;

/// The DER prefix of a P-256 SubjectPublicKeyInfo, before the 65-byte point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// A cosign public key (`cosign.pub`): ECDSA P-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CosignKey {
    path: PathBuf,
    point: Vec<u8>,
}

impl CosignKey {
    /// Reads a PEM `PUBLIC KEY` file as `cosign generate-key-pair` writes it.
    pub fn from_file(path: &Path) -> Result<Self, RegistryError> {
        let bad = |m: String| RegistryError::Signature {
            message: format!("public key {}: {m}", path.display()),
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        Self::from_pem(&text).map_err(bad).map(|point| CosignKey {
            path: path.to_path_buf(),
            point,
        })
    }

    fn from_pem(text: &str) -> Result<Vec<u8>, String> {
        let body: String = text
            .lines()
            .skip_while(|l| !l.starts_with("-----BEGIN PUBLIC KEY-----"))
            .skip(1)
            .take_while(|l| !l.starts_with("-----END"))
            .collect();
        if body.is_empty() {
            return Err("no PEM PUBLIC KEY block".into());
        }
        let der = base64::engine::general_purpose::STANDARD
            .decode(body.trim())
            .map_err(|_| "the PEM body is not base64".to_string())?;
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(point.to_vec()),
            _ => Err("not an ECDSA P-256 public key (the key type cosign generates); other key types are not supported".into()),
        }
    }

    /// The file it came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn verifies(&self, payload: &[u8], signature_b64: &str) -> bool {
        let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(signature_b64.trim()) else {
            return false;
        };
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_ASN1,
            &self.point,
        )
        .verify(payload, &sig)
        .is_ok()
    }
}

#[derive(Deserialize)]
pub(crate) struct SignatureManifest {
    #[serde(default)]
    pub(crate) layers: Vec<SignatureLayer>,
}

#[derive(Deserialize)]
pub(crate) struct SignatureLayer {
    #[serde(rename = "mediaType")]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    digest: String,
}

/// The signature tag cosign uses for `digest`.
pub(crate) fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// Whether `payload`, signed as `signature`, says `key` vouches for
/// `digest`.
pub(crate) fn payload_vouches(
    key: &CosignKey,
    payload: &[u8],
    signature: &str,
    digest: &Digest,
) -> bool {
    if !key.verifies(payload, signature) {
        return false;
    }
    match serde_json::from_slice::<Payload>(payload) {
        Ok(p) => {
            p.critical.kind == "cosign container image signature"
                && p.critical.image.digest == digest.as_str()
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::KeyPair;

    fn pem(point: &[u8]) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(point);
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(der)
        )
    }

    #[test]
    fn verifies_what_the_key_signed_and_nothing_else() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &rng,
        )
        .unwrap();
        let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let key = CosignKey {
            path: "k".into(),
            point: CosignKey::from_pem(&pem(pair.public_key().as_ref())).unwrap(),
        };
        let digest = Digest::of(b"manifest");
        let payload = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"r/x"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
        );
        let sig = base64::engine::general_purpose::STANDARD
            .encode(pair.sign(&rng, payload.as_bytes()).unwrap());
        assert!(payload_vouches(&key, payload.as_bytes(), &sig, &digest));
        assert!(!payload_vouches(
            &key,
            payload.as_bytes(),
            &sig,
            &Digest::of(b"other")
        ));
        let tampered = payload.replace("r/x", "r/y");
        assert!(!payload_vouches(&key, tampered.as_bytes(), &sig, &digest));
        assert!(
            CosignKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
                .is_err()
        );
    }
}
