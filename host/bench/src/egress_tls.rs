//! What secrets by placeholder cost: the time to first byte of an HTTPS
//! request from a confined sandbox through its egress point, to a host a
//! secret is bound to (the point ends TLS, opens its own, relays the
//! request with the value put in) and to one it is not (the tunnel passes
//! TLS through unread), against the same curl on the host straight to the
//! server. The server is this process's, on loopback, with a certificate
//! from a CA of the bench's own, which the egress daemon trusts through
//! `SSL_CERT_FILE` (set by `main` before any thread exists: the host's
//! roots and this CA).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use berth::backend::local::LocalOptions;
use berth::backend::ExecRequest;
use berth::egress::{EgressPolicy, EgressSettings};
use berth::sandbox::{BackendSpec, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// The bench's CA and a certificate for `*.bench.test` it signed.
pub(crate) struct BenchTls {
    _dir: tempfile::TempDir,
    /// The host's roots and the CA, as `SSL_CERT_FILE` names them: what
    /// curl on the host loads, as curl in the sandbox loads its bundle
    /// (parsing ~140 roots costs curl ~18 ms per process, on both sides).
    bundle: PathBuf,
    chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    key: Vec<u8>,
}

static TLS: OnceLock<BenchTls> = OnceLock::new();

/// Makes the CA and points `SSL_CERT_FILE` at the host's roots plus it.
/// Called by `main` before the runtime starts any thread.
pub(crate) fn prepare() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "berth bench CA");
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let leaf =
        CertificateParams::new(vec!["*.bench.test".to_string()])?.signed_by(&key, &issuer)?;
    let system = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .unwrap_or_default();
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{system}\n{}", ca_cert.pem()))?;
    // SAFETY: called from main before the runtime (or any other thread)
    // exists, so nothing reads the environment meanwhile.
    unsafe { std::env::set_var("SSL_CERT_FILE", &bundle) };
    let _ = TLS.set(BenchTls {
        _dir: dir,
        bundle,
        chain: vec![leaf.der().clone()],
        key: key.serialize_der(),
    });
    Ok(())
}

/// An HTTPS server on loopback answering every request with 2 bytes.
async fn tls_server(tls: &BenchTls) -> anyhow::Result<u16> {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(
        tls.chain.clone(),
        rustls::pki_types::PrivateKeyDer::Pkcs8(tls.key.clone().into()),
    )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = acceptor.accept(stream).await else {
                    return;
                };
                let mut head = vec![0u8; 8192];
                let mut got = 0;
                while !head[..got].windows(4).any(|w| w == b"\r\n\r\n") && got < head.len() {
                    match stream.read(&mut head[got..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got += n,
                    }
                }
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(port)
}

fn curl_on_host(roots: &Path, host: &str, port: u16) -> anyhow::Result<f64> {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--noproxy",
            "*",
            "-o",
            "/dev/null",
            "-w",
            "%{time_starttransfer}",
        ])
        .arg("--cacert")
        .arg(roots)
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .arg(format!("https://{host}:{port}/small"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "curl on the host: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The rows: time to first byte, intercepted and passed through.
pub(crate) async fn secret_rows(base: &Path, runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    let tls = TLS
        .get()
        .ok_or_else(|| anyhow::anyhow!("the bench's TLS fixture was not made"))?;
    let port = tls_server(tls).await?;
    let client = berth_tests::client(base.join("egress-tls-home"));
    let mut settings = EgressSettings {
        policy: EgressPolicy {
            allow_hosts: vec![
                format!("api.bench.test:{port}").parse()?,
                format!("tls.bench.test:{port}").parse()?,
            ],
            deny_hosts: vec![],
            allow_cidrs: vec![format!("127.0.0.0/8:{port}").parse()?],
        },
        test_resolve: vec!["*.bench.test=127.0.0.1".parse()?],
        ..EgressSettings::default()
    };
    settings.add_secret("BENCH_KEY", "sk-bench", &[format!("api.bench.test:{port}")])?;
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(LocalOptions::default()))
                .egress(settings),
        )
        .await?;
    sb.start().await?;
    let n = if quick { 5 } else { 10 * runs.max(1) };
    let mut rows = Vec::new();
    for (host, what) in [
        (
            "api.bench.test",
            "a secret's host (TLS ended and re-opened, value put in)",
        ),
        ("tls.bench.test", "another host (TLS passed through unread)"),
    ] {
        let (mut through, mut direct) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let r = sb
                .exec(ExecRequest::new(
                    format!(
                        "curl -sS -o /dev/null -H \"Authorization: Bearer $BENCH_KEY\" -w '%{{time_starttransfer}}' https://{host}:{port}/small"
                    ),
                    Duration::from_secs(60),
                ))
                .await?;
            anyhow::ensure!(r.exit_code == 0, "curl in the sandbox: {}", r.stderr_text());
            through.push(r.stdout_text().trim().parse::<f64>()?);
            direct.push(curl_on_host(&tls.bundle, host, port)?);
        }
        let (t, d) = (median(through), median(direct));
        rows.push(Row {
            group: "egress",
            name: format!("HTTPS time to first byte, {what}"),
            value: format!("{:.2} ms (+{:.2} ms)", t * 1e3, (t - d) * 1e3),
            baseline: format!("direct {:.2} ms", d * 1e3),
            ratio: Some(t / d),
        });
    }
    sb.shutdown().await?;
    Ok(rows)
}
