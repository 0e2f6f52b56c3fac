//! Helpers of the egress tests (shared by the integration and swarm test
//! binaries): test servers on loopback, test certificates, and the CLI.

#![allow(dead_code)] // each binary uses its share

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use berth_tests::{berth_in, berth_ok};

/// A Python server on loopback (HTTP, or HTTPS with `cert`): `/` answers
/// `hello from HOST`, `/redirect?to=URL` answers 302 to URL, `/auth`
/// answers `auth=` and the Authorization header it was sent.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const SERVER: &str = r#"
import http.server, ssl, sys, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", urllib.parse.parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if url.path == "/auth":
            body = ("auth=" + self.headers.get("Authorization", "-") + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = ("hello from " + self.headers.get("Host", "-") + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
if len(sys.argv) > 1:
    c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    c.load_cert_chain(sys.argv[1], sys.argv[2])
    s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

pub(crate) fn server(tls: Option<(&Path, &Path)>) -> Server {
    let mut command = Command::new("/usr/bin/python3");
    command.arg("-c").arg(SERVER);
    if let Some((cert, key)) = tls {
        command.arg(cert).arg(key);
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    Server {
        child,
        port: line.trim().parse().expect("the server says its port"),
    }
}

/// A self-signed certificate for `*.pkg.test` (its own CA), made by
/// openssl: (certificate, key).
pub(crate) fn certificate(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args([
            "-subj",
            "/CN=pkg.test",
            "-addext",
            "subjectAltName=DNS:*.pkg.test",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (cert, key)
}

/// `berth exec NAME -- SCRIPT` (the CLI runs its words joined, under
/// `sh -c`): (exit code, stdout + stderr).
pub(crate) fn sh(home: &Path, name: &str, script: &str) -> (i32, String) {
    let out = berth_in(home, &["exec", name, "--", script]);
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

pub(crate) fn log(home: &Path, name: &str) -> serde_json::Value {
    serde_json::from_str(&berth_ok(home, &["egress", name, "--json"])).unwrap()
}

/// The newest logged connection to `host`, as (verdict, why).
pub(crate) fn verdict_of(home: &Path, name: &str, host: &str) -> (String, String) {
    let log = log(home, name);
    let entry = log["connections"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|c| c["host"] == host)
        .unwrap_or_else(|| panic!("no connection to {host} in {log:#}"));
    (
        entry["verdict"].as_str().unwrap().to_string(),
        entry
            .get("reason")
            .or_else(|| entry.get("rule"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
    )
}

pub(crate) fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA and a server certificate for `*.pkg.test` it signed, as a
/// real server's would be (rustls, which the egress point verifies with,
/// refuses a CA certificate used as a server's): (CA, certificate, key).
pub(crate) fn ca_and_certificate(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=pkg.test test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=pkg.test",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:*.pkg.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "ext.cnf",
        ],
    );
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// `berth ARGS` with `BERTH_HOME=home` and the test server's certificate
/// as the host's trust roots (`SSL_CERT_FILE`, which the egress daemon
/// reads, as OpenSSL does).
pub(crate) fn berth(home: &Path, roots: &Path, args: &[&str]) -> Output {
    Command::new(berth_tests::berth_bin())
        .env("BERTH_HOME", home)
        .env("SSL_CERT_FILE", roots)
        .args(args)
        .output()
        .unwrap()
}

pub(crate) fn ok(out: Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed: {text}");
    text
}
