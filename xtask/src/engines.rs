//! More than one machine, on one: a second Docker engine beside the first
//! (its own data root, exec root, pid file and socket, and a mutual-TLS
//! listener on a loopback port, with a CA, server and client certificates
//! made here), and a local image registry (Debian's `docker-registry`)
//! holding the test image. The tests read where everything is from
//! [`ENV_FILE`].

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::docker::TEST_IMAGE;
use crate::process::{apt_install, run, start_daemon};

/// Everything of the second engine lives here.
const DIR: &str = "/tmp/berth-engine2";
/// Its exec root: short, as Unix socket paths max out at 108 bytes.
const EXEC_ROOT: &str = "/tmp/bd2x";
/// The TLS listener.
const TLS_ADDR: &str = "127.0.0.1:23760";
/// The registry.
const REGISTRY_DIR: &str = "/tmp/berth-registry";
const REGISTRY_ADDR: &str = "127.0.0.1:5055";
/// Where the tests find the engine, its certificates and the registry.
pub(crate) const ENV_FILE: &str = "/tmp/berth-engine2/engine.env";

/// Installs Debian's `package` unless `tool` is on PATH.
fn answers(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some()
}

fn docker2_answers() -> bool {
    Command::new("docker")
        .args(["-H", &format!("unix://{DIR}/docker.sock"), "version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The CA, the engine's certificate (for 127.0.0.1 and localhost), a
/// client certificate, and a second CA that signed nothing of this
/// engine's (for the wrong-CA test), made with openssl.
fn make_certificates() -> Result<()> {
    if Path::new(DIR).join("client/key.pem").exists() {
        return Ok(());
    }
    apt_install("openssl", "openssl")?;
    let script = r#"
set -e
cd "$1"
mkdir -p certs client wrong-ca
ca() { openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1-key.pem" -out "$1.pem" -days 3650 \
  -subj "/CN=$2" -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null; }
leaf() { openssl req -newkey rsa:2048 -nodes -keyout "$1-key.pem" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA certs/ca.pem -CAkey certs/ca-key.pem -CAcreateserial -days 3650 \
    -extfile "$1.ext" -out "$1-cert.pem" 2>/dev/null; }
ca certs/ca "berth test engine CA"
leaf certs/server localhost "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
leaf certs/client berth-client "extendedKeyUsage=clientAuth"
cp certs/ca.pem client/ca.pem
cp certs/client-cert.pem client/cert.pem
cp certs/client-key.pem client/key.pem
ca wrong-ca/ca "some other CA"
cp certs/client-cert.pem wrong-ca/cert.pem
cp certs/client-key.pem wrong-ca/key.pem
"#;
    run(Command::new("sh").args(["-c", script, "sh", DIR]))
}

/// The second engine's command line, as a script the tests run again to
/// bring the engine back after stopping it.
fn start_script() -> String {
    format!(
        "exec dockerd --config-file {DIR}/daemon.json --data-root {DIR}/data --exec-root {EXEC_ROOT} \
         --pidfile {DIR}/docker.pid -H unix://{DIR}/docker.sock -H tcp://{TLS_ADDR} \
         --tlsverify --tlscacert {DIR}/certs/ca.pem --tlscert {DIR}/certs/server-cert.pem \
         --tlskey {DIR}/certs/server-key.pem --bridge=none --iptables=false --ip6tables=false \
         --containerd-namespace berth2 --containerd-plugins-namespace berth2-plugins\n"
    )
}

fn wait_for(what: &str, log: &str, ready: impl Fn() -> bool) -> Result<()> {
    let started = Instant::now();
    while !ready() {
        if started.elapsed() > Duration::from_secs(90) {
            bail!("{what} did not answer within 90 s; see {log}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Ok(())
}

/// Starts the second engine (TLS on [`TLS_ADDR`]) unless it answers.
fn second_engine() -> Result<()> {
    std::fs::create_dir_all(Path::new(DIR).join("data"))?;
    make_certificates()?;
    std::fs::write(Path::new(DIR).join("daemon.json"), "{}\n")?;
    let script = Path::new(DIR).join("start.sh");
    std::fs::write(&script, start_script())?;
    let log = format!("{DIR}/dockerd.log");
    if !docker2_answers() {
        eprintln!("xtask: starting a second dockerd (TLS on {TLS_ADDR}; log: {log})");
        start_daemon("sh", &[script.as_os_str()], Path::new(&log))?;
        wait_for("the second dockerd", &log, docker2_answers)?;
    }
    eprintln!("xtask: second Docker engine answers (unix://{DIR}/docker.sock, tcp://{TLS_ADDR})");
    Ok(())
}

/// Starts the registry and pushes the test image into it.
fn registry() -> Result<()> {
    apt_install("docker-registry", "docker-registry")?;
    let log = format!("{REGISTRY_DIR}/registry.log");
    if !answers(REGISTRY_ADDR) {
        std::fs::create_dir_all(Path::new(REGISTRY_DIR).join("data"))?;
        let config = Path::new(REGISTRY_DIR).join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {REGISTRY_DIR}/data\n  delete:\n    enabled: true\nhttp:\n  addr: {REGISTRY_ADDR}\n"
            ),
        )?;
        eprintln!("xtask: starting docker-registry on {REGISTRY_ADDR} (log: {log})");
        start_daemon(
            "docker-registry",
            &["serve".as_ref(), config.as_os_str()],
            Path::new(&log),
        )?;
        wait_for("docker-registry", &log, || answers(REGISTRY_ADDR))?;
    }
    let image = registry_image();
    run(Command::new("docker").args(["tag", TEST_IMAGE, &image]))?;
    let out = Command::new("docker")
        .args(["push", &image])
        .output()
        .context("running docker push")?;
    if !out.status.success() {
        bail!(
            "docker push {image} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    eprintln!("xtask: registry {REGISTRY_ADDR} holds {image}");
    Ok(())
}

fn registry_image() -> String {
    format!("{REGISTRY_ADDR}/{TEST_IMAGE}")
}

/// The second engine, the registry, and the file that tells the tests
/// where they are.
pub(crate) fn engines_setup() -> Result<()> {
    second_engine()?;
    // The swarm tests put a node's engine behind mutual TLS with it, using
    // this engine's certificates.
    apt_install("stunnel", "stunnel4")?;
    registry()?;
    let env = format!(
        "BERTH_ENGINE2_TLS=tcp://{TLS_ADDR}\n\
         BERTH_ENGINE2_SOCKET=unix://{DIR}/docker.sock\n\
         BERTH_ENGINE2_CERTS={DIR}/client\n\
         BERTH_ENGINE2_WRONG_CA={DIR}/wrong-ca\n\
         BERTH_ENGINE2_PIDFILE={DIR}/docker.pid\n\
         BERTH_ENGINE2_START={DIR}/start.sh\n\
         BERTH_ENGINE2_LOG={DIR}/dockerd.log\n\
         BERTH_REGISTRY={REGISTRY_ADDR}\n\
         BERTH_REGISTRY_IMAGE={}\n",
        registry_image()
    );
    std::fs::write(ENV_FILE, env).with_context(|| format!("writing {ENV_FILE}"))?;
    Ok(())
}
