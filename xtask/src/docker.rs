//! The Docker engine the tests use: Debian's docker.io started off the
//! network, and a busybox test image imported without a registry.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::process::{have, is_root, output, run, start_daemon};

/// Whether Docker-backed tests must run (and so setup must succeed).
pub(crate) fn docker_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("BERTH_REQUIRE_DOCKER").is_some()
}

/// The image the Docker tests use; made locally, no registry needed.
pub(crate) const TEST_IMAGE: &str = "berth-test:busybox";

pub(crate) fn docker_reachable() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Makes sure a Docker engine answers and the test image exists: installs
/// Debian's docker.io and busybox-static when missing, starts dockerd off
/// the network (`--bridge=none --iptables=false`), imports the image.
pub(crate) fn docker_setup() -> Result<()> {
    if !docker_reachable() {
        if !is_root() {
            bail!("no Docker daemon answers and we are not root, so we cannot start one");
        }
        if !have("dockerd") || !Path::new("/bin/busybox").exists() || !have("docker") {
            run(Command::new("apt-get").arg("update").arg("-qq"))?;
            run(Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "docker.io", "busybox-static"]))?;
        }
        eprintln!("xtask: starting dockerd (log: /tmp/berth-dockerd.log)");
        start_daemon(
            "dockerd",
            &[
                "--bridge=none".as_ref(),
                "--iptables=false".as_ref(),
                "--ip6tables=false".as_ref(),
            ],
            Path::new("/tmp/berth-dockerd.log"),
        )?;
        let started = std::time::Instant::now();
        while !docker_reachable() {
            if started.elapsed() > std::time::Duration::from_secs(90) {
                bail!("dockerd did not answer within 90 s; see /tmp/berth-dockerd.log");
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    eprintln!("xtask: Docker engine answers");
    let has_image = Command::new("docker")
        .args(["image", "inspect", TEST_IMAGE])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_image {
        import_test_image()?;
    }
    Ok(())
}

/// A busybox rootfs imported as an image: no registry is reachable here.
pub(crate) fn import_test_image() -> Result<()> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox is missing: apt-get install busybox-static");
    }
    let rootfs = std::env::temp_dir().join(format!("berth-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rootfs);
    for d in ["bin", "tmp", "etc", "root", "workspace"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
    let applets = output(Command::new(busybox).arg("--list"))?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )?;
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    let script = format!(
        "tar -C '{}' -c . | docker import -c 'ENV PATH=/bin' - {TEST_IMAGE}",
        rootfs.display()
    );
    run(Command::new("sh").args(["-c", &script]))?;
    let _ = std::fs::remove_dir_all(&rootfs);
    eprintln!("xtask: imported {TEST_IMAGE}");
    Ok(())
}

/// The runtime name gVisor is registered under, and its arguments: the
/// ptrace platform (works without nested virtualisation); no network
/// stack of its own (a sandbox's network is `none` unless the user gives
/// one, and this runsc refuses Docker's `none` network otherwise); and
/// shared file access, so files the engine writes into the container (a
/// restore, the agent) are seen inside at once rather than from gVisor's
/// cache.
const GVISOR_RUNTIME: &str = "runsc";
const GVISOR_ARGS: &[&str] = &[
    "--platform=ptrace",
    "--network=none",
    "--file-access=shared",
];

fn engine_runtimes() -> String {
    output(Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]))
        .unwrap_or_default()
}

/// Installs gVisor's `runsc` (Debian's package) when missing and registers
/// it with the test engine in `/etc/docker/daemon.json`, reloading the
/// engine (`SIGHUP`), so the tests can run sandboxes with `runtime=runsc`.
pub(crate) fn gvisor_setup() -> Result<()> {
    if GVISOR_ARGS
        .iter()
        .all(|arg| engine_runtimes().contains(arg))
    {
        eprintln!("xtask: the engine has the {GVISOR_RUNTIME} runtime");
        return Ok(());
    }
    if !is_root() {
        bail!("the engine lacks the {GVISOR_RUNTIME} runtime and we are not root to register it");
    }
    crate::process::apt_install("runsc", "runsc")?;
    let runsc = output(Command::new("sh").args(["-c", "command -v runsc"]))?;
    let config = Path::new("/etc/docker/daemon.json");
    let mut json: serde_json::Value = match std::fs::read_to_string(config) {
        Ok(text) if !text.trim().is_empty() => serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", config.display()))?,
        _ => serde_json::json!({}),
    };
    let Some(object) = json.as_object_mut() else {
        bail!("{} is not a JSON object", config.display());
    };
    let runtimes = object
        .entry("runtimes")
        .or_insert_with(|| serde_json::json!({}));
    runtimes[GVISOR_RUNTIME] = serde_json::json!({
        "path": runsc.trim(),
        "runtimeArgs": GVISOR_ARGS,
    });
    std::fs::create_dir_all("/etc/docker")?;
    std::fs::write(config, serde_json::to_string_pretty(&json)? + "\n")?;
    eprintln!(
        "xtask: registered {GVISOR_RUNTIME} in {}; reloading dockerd",
        config.display()
    );
    // The default engine's pid file (the second engine and the swarm
    // nodes keep theirs elsewhere).
    run(Command::new("sh").args(["-c", "kill -HUP $(cat /var/run/docker.pid)"]))?;
    let started = std::time::Instant::now();
    while !GVISOR_ARGS
        .iter()
        .all(|arg| engine_runtimes().contains(arg))
    {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            bail!("dockerd did not take the {GVISOR_RUNTIME} runtime within 30 s; see /tmp/berth-dockerd.log");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    Ok(())
}
