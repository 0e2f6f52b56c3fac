//! A sandbox's own certificate authority, made by `rcgen`: it signs the
//! certificates the egress point shows for the hosts a secret is bound to
//! (and only those: its name constraints permit no other name, so even
//! its key could vouch for nothing else). Its certificate is given to the
//! sandbox; its key stays in the daemon's directory (mode 0600).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;

use crate::rules::HostRule;

/// The CA's common name.
const CA_NAME: &str = "Berth sandbox egress CA";
/// The ALPN protocol the egress point speaks to a sandbox it intercepts.
const HTTP11: &[u8] = b"http/1.1";

/// The CA could not be made, read, or sign.
#[derive(Debug, thiserror::Error)]
#[error("the sandbox's certificate authority: {0}")]
pub struct CaError(String);

fn ca_error(e: impl std::fmt::Display) -> CaError {
    CaError(e.to_string())
}

/// A sandbox's CA and the TLS settings it has made for each host.
pub(crate) struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    certificate_pem: String,
    configs: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxCa").finish_non_exhaustive()
    }
}

/// The CA's parameters: the same each time for the same hosts, so a key
/// kept on disk makes the same issuer after a daemon restart.
fn ca_params(hosts: &[&HostRule]) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca_error)?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let mut permitted: Vec<GeneralSubtree> = hosts
        .iter()
        .map(|rule| GeneralSubtree::DnsName(rule.name().to_string()))
        .collect();
    permitted.dedup();
    params.name_constraints = Some(NameConstraints {
        permitted_subtrees: permitted,
        excluded_subtrees: Vec::new(),
    });
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(3650);
    Ok(params)
}

impl SandboxCa {
    /// The CA whose key is in `key_file` (made, with its certificate in
    /// `certificate_file`, when there is none), for `hosts`.
    pub(crate) fn load_or_create(
        key_file: &Path,
        certificate_file: &Path,
        hosts: &[&HostRule],
    ) -> Result<Self, CaError> {
        let params = ca_params(hosts)?;
        let (key, certificate_pem) = match std::fs::read_to_string(key_file) {
            Ok(pem) => {
                let key = KeyPair::from_pem(&pem).map_err(ca_error)?;
                let certificate = std::fs::read_to_string(certificate_file)
                    .map_err(|e| CaError(format!("{}: {e}", certificate_file.display())))?;
                (key, certificate)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = KeyPair::generate().map_err(ca_error)?;
                let certificate = params.clone().self_signed(&key).map_err(ca_error)?.pem();
                write_private(key_file, key.serialize_pem().as_bytes())
                    .map_err(|e| CaError(format!("{}: {e}", key_file.display())))?;
                std::fs::write(certificate_file, &certificate)
                    .map_err(|e| CaError(format!("{}: {e}", certificate_file.display())))?;
                (key, certificate)
            }
            Err(e) => return Err(CaError(format!("{}: {e}", key_file.display()))),
        };
        Ok(SandboxCa {
            issuer: Issuer::new(params, key),
            certificate_pem,
            configs: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (PEM), for the sandbox's trust store.
    pub(crate) fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// TLS settings showing a certificate for `host` this CA signed
    /// (made once per host), speaking HTTP/1.1.
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let mut configs = self
            .configs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = configs.get(host) {
            return Ok(config.clone());
        }
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(ca_error)?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, host);
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(365);
        let key = KeyPair::generate().map_err(ca_error)?;
        let certificate = params.signed_by(&key, &self.issuer).map_err(ca_error)?;
        let chain = vec![CertificateDer::from(certificate.der().to_vec())];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(ca_error)?
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(ca_error)?;
        config.alpn_protocols = vec![HTTP11.to_vec()];
        let config = Arc::new(config);
        configs.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

/// Writes `bytes` to a new file of mode 0600 (replacing any).
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
