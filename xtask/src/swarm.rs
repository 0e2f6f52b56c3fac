//! A Docker swarm of three nodes on one machine: each node a dockerd in a
//! network namespace of its own (`berth-n1`…`berth-n3`), joined by veth
//! pairs to a bridge in a fourth namespace (`berth-sw`), so nothing is
//! added to the root namespace. Each node has its own data root, exec
//! root, pid file, unix socket and containerd namespace, runs with
//! `--bridge=none` (a task given no network gets loopback only) and
//! `no-new-privileges` by default (its API, 1.41, ignores the service
//! field). All three are managers (so the leader can be lost), with a 1 s
//! dispatcher heartbeat and a task history of 1; each node carries the
//! `berth.engine` label naming its own socket, and holds the test image.
//! The tests read where everything is from [`ENV_FILE`].

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::docker::TEST_IMAGE;
use crate::process::{output, run, start_daemon};

/// Everything of the swarm lives here.
const DIR: &str = "/tmp/berth-swarm";
/// The nodes.
const NODES: [&str; 3] = ["n1", "n2", "n3"];
/// Where the tests find the nodes.
pub(crate) const ENV_FILE: &str = "/tmp/berth-swarm/swarm.env";

fn netns(node: &str) -> String {
    format!("berth-{node}")
}

fn address(index: usize) -> String {
    format!("10.231.0.{}", 11 + index)
}

fn socket(node: &str) -> String {
    format!("unix://{DIR}/{node}/docker.sock")
}

/// The links: the switch namespace with its bridge, and each node's
/// namespace with `eth0` (its address) paired to a port of the bridge.
/// Idempotent: what exists is left, a link that is down is brought up.
fn network() -> Result<()> {
    let mut script = String::from(
        "set -e\n\
         ip netns add berth-sw 2>/dev/null || true\n\
         ip -n berth-sw link add br0 type bridge 2>/dev/null || true\n\
         ip -n berth-sw link set br0 up\n\
         ip -n berth-sw link set lo up\n",
    );
    for (i, node) in NODES.iter().enumerate() {
        let ns = netns(node);
        let addr = address(i);
        script.push_str(&format!(
            "ip netns add {ns} 2>/dev/null || true\n\
             if ! ip -n {ns} link show eth0 >/dev/null 2>&1; then\n\
               ip link add v{node} netns berth-sw type veth peer name eth0 netns {ns}\n\
               ip -n berth-sw link set v{node} master br0\n\
               ip -n {ns} addr add {addr}/24 dev eth0\n\
             fi\n\
             ip -n berth-sw link set v{node} up\n\
             ip -n {ns} link set eth0 up\n\
             ip -n {ns} link set lo up\n"
        ));
    }
    run(Command::new("sh").args(["-c", &script]))
}

/// A node's dockerd command line, as a script the tests run again to
/// bring a node back after killing it.
fn start_script(node: &str) -> String {
    let dir = format!("{DIR}/{node}");
    format!(
        "exec nsenter --net=/run/netns/{ns} dockerd --config-file {dir}/daemon.json \
         --data-root {dir}/data --exec-root /tmp/bs{node} --pidfile {dir}/docker.pid \
         -H {sock} --bridge=none --iptables=false --ip6tables=false \
         --containerd-namespace berth-{node} --containerd-plugins-namespace berth-{node}-plugins\n",
        ns = netns(node),
        sock = socket(node),
    )
}

fn docker(node: &str) -> Command {
    let mut cmd = Command::new("docker");
    cmd.args(["-H", &socket(node)]);
    cmd
}

fn answers(node: &str) -> bool {
    docker(node)
        .arg("version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Starts each node's dockerd unless it answers.
fn daemons() -> Result<()> {
    for node in NODES {
        let dir = format!("{DIR}/{node}");
        std::fs::create_dir_all(format!("{dir}/data"))?;
        std::fs::write(
            format!("{dir}/daemon.json"),
            format!(
                "{{\"deprecated-key-path\": \"{dir}/key.json\", \"no-new-privileges\": true}}\n"
            ),
        )?;
        let script = format!("{dir}/start.sh");
        std::fs::write(&script, start_script(node))?;
        if answers(node) {
            continue;
        }
        let log = format!("{dir}/dockerd.log");
        eprintln!("xtask: starting swarm node {node}'s dockerd (log: {log})");
        start_daemon("sh", &[script.as_ref()], Path::new(&log))?;
    }
    let started = Instant::now();
    for node in NODES {
        while !answers(node) {
            if started.elapsed() > Duration::from_secs(90) {
                bail!("swarm node {node}'s dockerd did not answer within 90 s; see {DIR}/{node}/dockerd.log");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    Ok(())
}

fn info(node: &str, format: &str) -> Result<String> {
    Ok(output(docker(node).args(["info", "--format", format]))?
        .trim()
        .to_string())
}

/// Initialises the swarm on n1 and joins n2 and n3 as managers, unless
/// they are in it already.
fn swarm() -> Result<()> {
    if info("n1", "{{.Swarm.LocalNodeState}}")? != "active" {
        eprintln!("xtask: initialising the swarm on n1");
        run(docker("n1").args([
            "swarm",
            "init",
            "--advertise-addr",
            &address(0),
            "--listen-addr",
            &format!("{}:2377", address(0)),
            "--dispatcher-heartbeat",
            "1s",
            "--task-history-limit",
            "1",
        ]))?;
    }
    let token = output(docker("n1").args(["swarm", "join-token", "-q", "manager"]))?;
    for (i, node) in NODES.iter().enumerate().skip(1) {
        if info(node, "{{.Swarm.LocalNodeState}}")? == "active" {
            continue;
        }
        eprintln!("xtask: joining {node} to the swarm");
        run(docker(node).args([
            "swarm",
            "join",
            "--token",
            token.trim(),
            "--advertise-addr",
            &address(i),
            "--listen-addr",
            &format!("{}:2377", address(i)),
            &format!("{}:2377", address(0)),
        ]))?;
    }
    Ok(())
}

/// Labels each node with its own engine, and imports the test image.
fn nodes() -> Result<()> {
    for node in NODES {
        let id = info(node, "{{.Swarm.NodeID}}")?;
        let label = format!("berth.engine={}", socket(node));
        let current = output(docker("n1").args([
            "node",
            "inspect",
            &id,
            "--format",
            "{{index .Spec.Labels \"berth.engine\"}}",
        ]))?;
        if current.trim() != socket(node) {
            run(docker("n1").args(["node", "update", "--label-add", &label, &id]))?;
        }
        let has_image = docker(node)
            .args(["image", "inspect", TEST_IMAGE])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_image {
            let script = format!(
                "docker save {TEST_IMAGE} | docker -H {} load -q",
                socket(node)
            );
            run(Command::new("sh").args(["-c", &script]))?;
        }
    }
    Ok(())
}

/// Waits until every node is ready in the swarm's view.
fn ready() -> Result<()> {
    let started = Instant::now();
    loop {
        let states = output(docker("n1").args(["node", "ls", "--format", "{{.Status}}"]))
            .unwrap_or_default();
        let ready = states.lines().filter(|l| l.trim() == "Ready").count();
        if ready == NODES.len() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "only {ready} of {} swarm nodes are ready after 60 s",
                NODES.len()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The swarm fixture, and the file that tells the tests where it is.
pub(crate) fn swarm_setup() -> Result<()> {
    std::fs::create_dir_all(DIR)?;
    network().context("setting up the swarm's network namespaces")?;
    daemons()?;
    swarm()?;
    ready()?;
    nodes()?;
    let mut env = format!(
        "BERTH_SWARM_MANAGER={}\nBERTH_SWARM_DIR={DIR}\n",
        socket("n1")
    );
    env.push_str(&format!("BERTH_SWARM_NODES={}\n", NODES.join(",")));
    std::fs::write(ENV_FILE, env).with_context(|| format!("writing {ENV_FILE}"))?;
    eprintln!(
        "xtask: swarm of {} nodes ready (manager {})",
        NODES.len(),
        socket("n1")
    );
    Ok(())
}

/// The ids of the swarm's services with Berth's session label (none when
/// there is no swarm fixture).
pub(crate) fn berth_services() -> Vec<String> {
    if !Path::new(ENV_FILE).is_file() {
        return Vec::new();
    }
    output(docker("n1").args(["service", "ls", "-q", "--filter", "label=berth.session"]))
        .map(|ids| ids.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Removes the services that appeared during the run and are still
/// there (a failed assertion skips a test's `berth rm`). Says how many.
pub(crate) fn sweep_test_services(before: &[String]) {
    let left: Vec<String> = berth_services()
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    if left.is_empty() {
        return;
    }
    eprintln!(
        "xtask: removing {} swarm service(s) the tests left behind",
        left.len()
    );
    // Through any manager that answers (one that just rejoined may have no
    // leader yet), a few times.
    for _ in 0..10 {
        for node in NODES {
            let removed = docker(node)
                .args(["service", "rm"])
                .args(&left)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if removed {
                return;
            }
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    eprintln!("xtask: warning: could not remove the swarm services {left:?}");
}
