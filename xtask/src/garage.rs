//! The 3-node Garage S3 cluster on loopback the S3 tests use.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::process::{cargo_installed, have, output, run, start_daemon};

/// Where the test Garage cluster lives; `s3.env` there tells the tests how
/// to reach it.
pub(crate) const GARAGE_DIR: &str = "/tmp/berth-garage";

pub(crate) fn garage_bin() -> PathBuf {
    cargo_installed("garage")
}

pub(crate) fn garage(config: &Path, args: &[&str]) -> Result<String> {
    output(Command::new(garage_bin()).arg("-c").arg(config).args(args))
}

pub(crate) fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Installs Garage (cached in ~/.cargo/bin) and starts a 3-node cluster on
/// loopback with replication factor 3, a bucket and a key. Idempotent: a
/// running cluster is reused.
pub(crate) fn garage_setup() -> Result<()> {
    let dir = Path::new(GARAGE_DIR);
    let env_file = dir.join("s3.env");
    if env_file.exists() && port_open(3900) && port_open(3910) && port_open(3920) {
        eprintln!("xtask: Garage cluster answers ({})", env_file.display());
        return Ok(());
    }
    if !garage_bin().exists() && !have("garage") {
        eprintln!("xtask: building Garage (cargo install garage --locked; ~17 min on 2 cores, cached afterwards)");
        run(Command::new("cargo").args(["install", "garage", "--locked"]))?;
    }
    if !have("python3") {
        bail!("python3 is needed for the boto3 cross-check");
    }
    // boto3: the stock S3 client the tests read objects back with.
    if Command::new("python3")
        .args(["-c", "import boto3"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "boto3"]))?;
    }
    // Nodes left over from an earlier run hold the ports and would make the
    // new ones fail to bind: stop them before wiping their directories.
    let _ = Command::new("pkill")
        .args(["-f", &format!("{GARAGE_DIR}/n[0-9]/garage.toml server")])
        .status();
    let started = std::time::Instant::now();
    while port_open(3900) || port_open(3910) || port_open(3920) {
        if started.elapsed() > std::time::Duration::from_secs(20) {
            bail!("ports 3900/3910/3920 are held by something other than Berth's Garage nodes; stop it and rerun");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let secret: String = {
        use std::hash::{BuildHasher, Hasher};
        (0..4)
            .map(|i| {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u32(i);
                format!("{:016x}", h.finish())
            })
            .collect()
    };
    let mut pids = Vec::new();
    for n in 0..3u16 {
        let node = dir.join(format!("n{n}"));
        std::fs::create_dir_all(node.join("meta"))?;
        std::fs::create_dir_all(node.join("data"))?;
        let config = node.join("garage.toml");
        std::fs::write(
            &config,
            format!(
                "metadata_dir = \"{meta}\"\ndata_dir = \"{data}\"\ndb_engine = \"sqlite\"\nreplication_factor = 3\n\
                 rpc_secret = \"{secret}\"\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\n\
                 [s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
                 [admin]\napi_bind_addr = \"127.0.0.1:{admin}\"\n",
                meta = node.join("meta").display(),
                data = node.join("data").display(),
                rpc = 3901 + 10 * n,
                s3 = 3900 + 10 * n,
                admin = 3903 + 10 * n,
            ),
        )?;
        start_daemon(
            garage_bin(),
            &["-c".as_ref(), config.as_os_str(), "server".as_ref()],
            &node.join("garage.log"),
        )?;
    }
    // The nodes were forked away from us: find their pids by config path.
    for n in 0..3 {
        let config = dir.join(format!("n{n}/garage.toml"));
        let started = std::time::Instant::now();
        loop {
            let found = output(
                Command::new("pgrep")
                    .arg("-f")
                    .arg(format!("{} server", config.display())),
            )
            .ok()
            .and_then(|o| o.lines().next().and_then(|l| l.trim().parse::<u32>().ok()));
            if let Some(pid) = found {
                pids.push(pid);
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                bail!("garage node {n} did not start; see {GARAGE_DIR}/n{n}/garage.log");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    let c0 = dir.join("n0/garage.toml");
    let started = std::time::Instant::now();
    while garage(&c0, &["status"]).is_err() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            bail!("garage did not answer within 60 s; see {GARAGE_DIR}/n*/garage.log");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let mut ids = Vec::new();
    for n in 0..3 {
        // A node writes its key only once it has started; `status` on node 0
        // answering says nothing about nodes 1 and 2, so wait for each.
        let config = dir.join(format!("n{n}/garage.toml"));
        let started = std::time::Instant::now();
        let id = loop {
            match garage(&config, &["node", "id", "-q"]) {
                Ok(id) => break id.trim().to_string(),
                Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => {
                    return Err(e.context(format!(
                        "garage node {n} has no node key after 60 s; see {GARAGE_DIR}/n{n}/garage.log"
                    )));
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(300)),
            }
        };
        if n > 0 {
            garage(&c0, &["node", "connect", &id])?;
        }
        ids.push(id.split('@').next().unwrap_or_default().to_string());
    }
    for id in &ids {
        garage(&c0, &["layout", "assign", "-z", "dc1", "-c", "1G", id])?;
    }
    garage(&c0, &["layout", "apply", "--version", "1"])?;
    garage(&c0, &["bucket", "create", "berth-test"])?;
    let key = garage(&c0, &["key", "create", "berth-test-key"])?;
    let field = |label: &str| {
        key.lines()
            .find(|l| l.trim_start().starts_with(label))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("no {label:?} in `garage key create` output:\n{key}"))
    };
    let (key_id, secret_key) = (field("Key ID")?, field("Secret key")?);
    garage(
        &c0,
        &[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            "berth-test",
            "--key",
            "berth-test-key",
        ],
    )?;
    let started = std::time::Instant::now();
    while !(port_open(3900) && port_open(3910) && port_open(3920)) {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            bail!("garage S3 ports did not open");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    std::fs::write(
        &env_file,
        format!(
            "BERTH_S3_ENDPOINT=http://127.0.0.1:3900\nBERTH_S3_REGION=garage\nBERTH_S3_BUCKET=berth-test\n\
             BERTH_S3_ACCESS_KEY_ID={key_id}\nBERTH_S3_SECRET_ACCESS_KEY={secret_key}\n\
             BERTH_GARAGE_PIDS={}\nBERTH_GARAGE_BIN={}\nBERTH_GARAGE_DIR={GARAGE_DIR}\n",
            pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            garage_bin().display()
        ),
    )?;
    eprintln!("xtask: Garage 3-node cluster up ({})", env_file.display());
    Ok(())
}
