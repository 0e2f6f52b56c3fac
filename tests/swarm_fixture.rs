//! The three-node swarm `cargo xtask setup` starts (each node a dockerd in
//! its own network namespace), and the faults tests inflict on it: a
//! node's dockerd killed and started again, a node's link cut and
//! restored, a node's runtime weakened. [`NodeGuard`] brings every node
//! back, whatever a test did.

use std::process::Command;
use std::time::{Duration, Instant};

/// The swarm fixture.
#[derive(Debug, Clone)]
pub struct Swarm {
    /// The first manager's engine (`unix:///…/n1/docker.sock`).
    pub manager: String,
    /// Where the nodes keep their files.
    pub dir: String,
    /// The nodes' names (`n1`, `n2`, `n3`).
    pub nodes: Vec<String>,
    /// Each node's swarm id, in the order of `nodes`.
    pub ids: Vec<String>,
}

/// The swarm, or `None` (with a message) when it is not set up and Docker
/// is not required. Panics when it is required and missing.
pub fn swarm_or_skip(test: &str) -> Option<Swarm> {
    let mut vars = std::collections::HashMap::new();
    if let Ok(text) = std::fs::read_to_string("/tmp/berth-swarm/swarm.env") {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
    }
    let found = (|| {
        Some(Swarm {
            manager: vars.get("BERTH_SWARM_MANAGER")?.clone(),
            dir: vars.get("BERTH_SWARM_DIR")?.clone(),
            nodes: vars
                .get("BERTH_SWARM_NODES")?
                .split(',')
                .map(str::to_string)
                .collect(),
            ids: Vec::new(),
        })
    })();
    let found = found.filter(|s| s.nodes.iter().all(|n| s.answers(n)));
    match found {
        Some(mut s) => {
            s.ids = s.nodes.iter().map(|n| s.node_id(n)).collect();
            Some(s)
        }
        _ if crate::docker_required() => panic!(
            "{test}: the swarm fixture is required (CI/BERTH_REQUIRE_DOCKER) but does not answer: run `cargo xtask setup` as root"
        ),
        _ => {
            crate::skipped(test, "no swarm fixture; run `cargo xtask setup` as root");
            None
        }
    }
}

/// What a command printed, or why it failed.
fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Swarm {
    /// A node's engine endpoint.
    pub fn socket(&self, node: &str) -> String {
        format!("unix://{}/{node}/docker.sock", self.dir)
    }

    /// `docker -H NODE ARGS…`, given 15 s (a manager cut off from the
    /// others can hold an answer until its election times out).
    pub fn docker(&self, node: &str, args: &[&str]) -> Result<String, String> {
        output(
            Command::new("timeout")
                .args(["15", "docker", "-H"])
                .arg(self.socket(node))
                .args(args),
        )
    }

    /// Whether a node's engine answers.
    pub fn answers(&self, node: &str) -> bool {
        self.docker(node, &["version", "--format", "{{.Server.Version}}"])
            .is_ok()
    }

    /// A node's swarm id, as its engine says.
    fn node_id(&self, node: &str) -> String {
        self.docker(node, &["info", "--format", "{{.Swarm.NodeID}}"])
            .expect("the node answers")
    }

    /// The node (`n1`…) whose swarm id is `id`.
    pub fn node_named(&self, id: &str) -> String {
        self.ids
            .iter()
            .position(|i| i == id)
            .map(|p| self.nodes[p].clone())
            .unwrap_or_else(|| panic!("no node of the fixture has swarm id {id}"))
    }

    /// A manager that answers with a leader (`n1` unless it is lost).
    pub fn any_manager(&self) -> String {
        self.nodes
            .iter()
            .find(|n| self.docker(n, &["node", "ls", "-q"]).is_ok())
            .cloned()
            .unwrap_or_else(|| "n1".into())
    }

    /// The current leader (`n1`…).
    pub fn leader(&self) -> String {
        let m = self.any_manager();
        let id = self
            .docker(
                &m,
                &[
                    "node",
                    "ls",
                    "--filter",
                    "role=manager",
                    "--format",
                    "{{.ID}} {{.ManagerStatus}}",
                ],
            )
            .expect("a manager answers");
        let leader = id
            .lines()
            .find(|l| l.ends_with("Leader"))
            .and_then(|l| l.split_whitespace().next())
            .expect("the swarm has a leader")
            .to_string();
        self.node_named(&leader)
    }

    /// Kills a node's dockerd with SIGKILL (its containers keep running
    /// until it is started again).
    pub fn kill_daemon(&self, node: &str) {
        let pid = std::fs::read_to_string(format!("{}/{node}/docker.pid", self.dir))
            .expect("the node's pid file");
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) with a pid read from dockerd's own pid file.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        let started = Instant::now();
        while self.answers(node) && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts a node's dockerd again (after [`Swarm::kill_daemon`]).
    pub fn start_daemon(&self, node: &str) {
        if self.answers(node) {
            return;
        }
        let log = std::fs::File::create(format!("{}/{node}/dockerd.log", self.dir)).unwrap();
        crate::start_detached(&format!("{}/{node}/start.sh", self.dir), log);
        let started = Instant::now();
        while !self.answers(node) {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "node {node}'s dockerd did not come back"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Makes a node's engine run new containers through a runtime that
    /// turns no-new-privileges off (a wrapper around `runc` that edits the
    /// bundle's spec before `create`), as a node whose engine ignores the
    /// setting would. Reloaded live (`SIGHUP`: `runtimes` and
    /// `default-runtime` are reloadable), so the node stays in the swarm.
    /// [`Swarm::restore_runtime`] undoes it; [`NodeGuard`] does too.
    pub fn weaken_runtime(&self, node: &str) {
        let dir = format!("{}/{node}", self.dir);
        let wrapper = format!("{dir}/weak-runc");
        std::fs::write(
            &wrapper,
            "#!/bin/sh\n\
             # Test fixture: no-new-privileges off in every container this runtime creates.\n\
             prev=\n\
             for a in \"$@\"; do\n\
               if [ \"$prev\" = --bundle ]; then\n\
                 sed -i 's/\"noNewPrivileges\":true/\"noNewPrivileges\":false/' \"$a/config.json\"\n\
               fi\n\
               prev=$a\n\
             done\n\
             exec runc \"$@\"\n",
        )
        .expect("writing the weak runtime");
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("making the weak runtime executable");
        let config = format!("{dir}/daemon.json");
        let backup = format!("{dir}/daemon.json.strict");
        if !std::path::Path::new(&backup).exists() {
            std::fs::copy(&config, &backup).expect("keeping the node's daemon.json");
        }
        let mut weak: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&backup).unwrap()).unwrap();
        weak["runtimes"] = serde_json::json!({ "berth-weak": { "path": wrapper } });
        weak["default-runtime"] = "berth-weak".into();
        std::fs::write(&config, weak.to_string()).unwrap();
        self.reload(node, "berth-weak");
    }

    /// Undoes [`Swarm::weaken_runtime`] (nothing when it was not done).
    pub fn restore_runtime(&self, node: &str) {
        let dir = format!("{}/{node}", self.dir);
        let backup = format!("{dir}/daemon.json.strict");
        if !std::path::Path::new(&backup).exists() {
            return;
        }
        // A reload leaves a key the file lacks as it was: name the default
        // runtime for the reload, then put the file back as it was.
        let config = format!("{dir}/daemon.json");
        let mut strict: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&backup).unwrap()).unwrap();
        strict["default-runtime"] = "runc".into();
        std::fs::write(&config, strict.to_string()).unwrap();
        if self.answers(node) {
            self.reload(node, "runc");
        }
        std::fs::rename(&backup, &config).expect("restoring daemon.json");
    }

    /// Sends the node's dockerd `SIGHUP` and waits until its default
    /// runtime is `runtime`.
    fn reload(&self, node: &str, runtime: &str) {
        let pid = std::fs::read_to_string(format!("{}/{node}/docker.pid", self.dir))
            .expect("the node's pid file");
        let pid: i32 = pid.trim().parse().expect("a pid");
        // SAFETY: kill(2) with a pid read from dockerd's own pid file.
        unsafe {
            libc::kill(pid, libc::SIGHUP);
        }
        let started = Instant::now();
        loop {
            let now = self
                .docker(node, &["info", "--format", "{{.DefaultRuntime}}"])
                .unwrap_or_default();
            if now == runtime {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "node {node}'s default runtime is {now:?}, not {runtime:?}, 20 s after a reload"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn link(&self, node: &str, state: &str) {
        let out = Command::new("ip")
            .args(["-n", &format!("berth-{node}"), "link", "set", "eth0", state])
            .output()
            .unwrap();
        assert!(out.status.success(), "ip link set {state}: {out:?}");
    }

    /// Cuts a node's link to the others (its engine still answers on its
    /// socket).
    pub fn cut_link(&self, node: &str) {
        self.link(node, "down");
    }

    /// Restores a node's link.
    pub fn restore_link(&self, node: &str) {
        self.link(node, "up");
    }

    /// Waits until every node is `Ready` in a manager's view.
    pub fn wait_all_ready(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let m = self.any_manager();
            let states = self
                .docker(&m, &["node", "ls", "--format", "{{.Status}}"])
                .unwrap_or_default();
            if states.lines().filter(|l| *l == "Ready").count() == self.nodes.len() {
                return;
            }
            assert!(
                started.elapsed() < within,
                "the swarm's nodes are not all ready after {within:?}: {states}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The tasks of `service` the swarm wants running: id and current
    /// state (`Running 3 seconds ago`), as `docker service ps` says.
    pub fn wanted_tasks(&self, service: &str) -> Vec<(String, String)> {
        self.docker(
            &self.any_manager(),
            &[
                "service",
                "ps",
                service,
                "--filter",
                "desired-state=running",
                "--no-trunc",
                "--format",
                "{{.ID}} {{.CurrentState}}",
            ],
        )
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(id, state)| (id.to_string(), state.to_string()))
        .collect()
    }

    /// Waits until the swarm has stopped wanting `task` to run (it noticed
    /// its node is lost and rescheduled it).
    pub fn wait_task_replaced(&self, service: &str, task: &str, within: Duration) {
        let started = Instant::now();
        loop {
            let wanted = self.wanted_tasks(service);
            if !wanted.is_empty() && !wanted.iter().any(|(id, _)| id == task) {
                return;
            }
            assert!(
                started.elapsed() < within,
                "the swarm still wants task {task} of {service} running after {within:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The services whose name starts with `berth-` (sandboxes'). Panics
    /// when no manager answers: an empty list must mean "none", never
    /// "could not ask" (every "nothing left behind" check relies on it).
    pub fn berth_services(&self) -> Vec<String> {
        let manager = self.any_manager();
        match self.docker(
            &manager,
            &[
                "service",
                "ls",
                "--filter",
                "name=berth-",
                "--format",
                "{{.Name}}",
            ],
        ) {
            Ok(listed) => listed.lines().map(str::to_string).collect(),
            Err(e) => panic!("listing the swarm's services through {manager}: {e}"),
        }
    }
}

/// Brings every node back when dropped (links up, daemons started,
/// runtimes restored, all ready), so a failed test leaves the swarm whole for the next.
pub struct NodeGuard(pub Swarm);

impl Drop for NodeGuard {
    fn drop(&mut self) {
        for node in self.0.nodes.clone() {
            let _ = Command::new("ip")
                .args(["-n", &format!("berth-{node}"), "link", "set", "eth0", "up"])
                .status();
            if !self.0.answers(&node) {
                self.0.start_daemon(&node);
            }
            self.0.restore_runtime(&node);
        }
        if !std::thread::panicking() {
            self.0.wait_all_ready(Duration::from_secs(120));
        }
    }
}
