//! The swarm backend on the three-node swarm fixture (each node a dockerd
//! in its own network namespace; `cargo xtask setup`), driven through the
//! CLI in fresh processes, as a user would: sandboxes spread over the
//! nodes; a node's dockerd killed and a node's link cut, each sandbox that
//! was there back on another node identical to its last stop; the lost
//! node back, its stale containers never used or persisted; the leader
//! lost; an unsatisfiable placement; four processes resuming one sandbox;
//! deduplicated stops walked on the node and forks of swarm sandboxes; a
//! node that drops no-new-privileges refused by name; a node engine behind
//! mutual TLS; egress by policy and secrets across a node loss and a
//! fork; and the backend conformance suite. A binary of its own: it
//! breaks the swarm on purpose, one test at a time.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod egress_support;
mod swarm_conformance;
mod swarm_egress;
mod swarm_engines;
mod swarm_isolation;
mod swarm_leader;
mod swarm_pools;

use berth::conformance::WORKSPACE_LISTING;
use berth_docker::swarm::SwarmState;
use berth_tests::swarm_fixture::{swarm_or_skip, NodeGuard, Swarm};
use berth_tests::{berth_in, berth_ok, berth_state, s3_manifest, s3_or_skip, test_image};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test's swarm, home and S3 snapshot manifest; every node brought back
/// when dropped.
struct Setup {
    swarm: Swarm,
    home: tempfile::TempDir,
    manifest: PathBuf,
    guard: Option<NodeGuard>,
}

impl Drop for Setup {
    /// Every node back, then the services of the sandboxes this test made
    /// removed, whatever happened (a failed test must not skew where the
    /// next one's sandboxes are placed).
    fn drop(&mut self) {
        drop(self.guard.take());
        let Ok(out) = std::process::Command::new(berth_tests::berth_bin())
            .env("BERTH_HOME", self.home.path())
            .args(["ls", "--json"])
            .output()
        else {
            return;
        };
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let services: Vec<String> = listed
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["state"]["session_id"].as_str())
            .map(|session| format!("berth-{session}"))
            .collect();
        if services.is_empty() {
            return;
        }
        let mut args = vec!["service", "rm"];
        args.extend(services.iter().map(String::as_str));
        let _ = self.swarm.docker(&self.swarm.any_manager(), &args);
    }
}

fn setup(test: &str) -> Option<Setup> {
    let swarm = swarm_or_skip(test)?;
    let s3 = s3_or_skip(test)?;
    swarm.wait_all_ready(Duration::from_secs(120));
    let home = tempfile::tempdir().unwrap();
    let prefix = format!("swarm-{test}-{}/", std::process::id());
    let manifest = s3_manifest(home.path(), &s3, &prefix);
    Some(Setup {
        guard: Some(NodeGuard(swarm.clone())),
        swarm,
        home,
        manifest,
    })
}

impl Setup {
    fn home(&self) -> &Path {
        self.home.path()
    }

    /// `berth create NAME --backend swarm …`, started.
    fn create(&self, name: &str, extra: &[&str]) {
        let out = self.try_create(name, extra);
        assert!(
            out.status.success(),
            "berth create {name} {extra:?}: {out:?}"
        );
    }

    /// `berth create NAME --backend swarm …`, whatever it says.
    fn try_create(&self, name: &str, extra: &[&str]) -> Output {
        let snapshot = format!("remote:{}", self.manifest.display());
        let mut args = vec![
            "create",
            name,
            "--backend",
            "swarm",
            "--engine",
            &self.swarm.manager,
            "--image",
            "",
            "--snapshot",
            &snapshot,
        ];
        let image = test_image();
        args[7] = &image;
        args.extend_from_slice(extra);
        berth_in(self.home(), &args)
    }

    fn swarm_state(&self, name: &str) -> SwarmState {
        berth_state(self.home(), name).backend.decode().unwrap()
    }

    /// The fixture node (`n1`…) the sandbox's task runs on.
    fn node_of(&self, name: &str) -> String {
        let state = self.swarm_state(name);
        let current = state.current.expect("the sandbox has a task");
        self.swarm.node_named(&current.node)
    }

    fn exec(&self, name: &str, command: &str) -> String {
        berth_ok(self.home(), &["exec", name, "--", command])
    }

    /// Removes the task's container on its node (the swarm starts a new
    /// task): the next command restores the last stop.
    fn remove_container(&self, name: &str) {
        let task = self.swarm_state(name).current.expect("a task");
        let node = self.swarm.node_named(&task.node);
        self.swarm
            .docker(&node, &["rm", "-f", &task.container])
            .expect("docker rm -f");
    }

    fn listing(&self, name: &str) -> String {
        self.exec(name, WORKSPACE_LISTING)
    }

    /// A generated workspace (seeded), stopped; its listing.
    fn populate_and_stop(&self, name: &str, seed: u64) -> String {
        self.exec(name, &berth_tests::workspace_gen::script(seed, 256 * 1024));
        let listing = self.listing(name);
        berth_ok(self.home(), &["stop", name]);
        listing
    }

    /// `berth rm` each; their services are gone from the swarm.
    fn remove_all(&self, names: &[String]) {
        let services: Vec<String> = names
            .iter()
            .map(|n| format!("berth-{}", berth_state(self.home(), n).session_id))
            .collect();
        for n in names {
            let out = berth_in(self.home(), &["rm", n]);
            assert!(out.status.success(), "berth rm {n}: {out:?}");
        }
        let left = self.swarm.berth_services();
        for service in services {
            assert!(
                !left.contains(&service),
                "{service} was left behind: {left:?}"
            );
        }
    }
}

fn failed(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// At least `want` sandboxes named `prefix0…`, more until they cover every
/// node (the swarm spreads tasks, but counts every task a node runs, other
/// services' and stale ones too), at most 12; panics with the swarm's view
/// when they do not.
fn spread(s: &Setup, prefix: &str, want: usize) -> Vec<String> {
    let mut names = Vec::new();
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = format!("{prefix}{i}");
        s.create(&name, &[]);
        nodes.insert(s.node_of(&name));
        names.push(name);
        if names.len() >= want && nodes.len() == s.swarm.nodes.len() {
            return names;
        }
    }
    let m = s.swarm.any_manager();
    panic!(
        "12 sandboxes covered only {nodes:?}; the swarm's nodes:\n{}\ntasks:\n{}",
        s.swarm.docker(&m, &["node", "ls"]).unwrap_or_default(),
        s.swarm.docker(&m, &["service", "ls"]).unwrap_or_default()
    );
}

#[test]
fn sandboxes_spread_over_the_nodes_and_come_back_identical_after_a_node_is_lost() {
    let _serial = serial();
    let Some(s) =
        setup("sandboxes_spread_over_the_nodes_and_come_back_identical_after_a_node_is_lost")
    else {
        return;
    };
    // 1. Six (or more) sandboxes over three nodes; each one's work stopped.
    let names = spread(&s, "s", 6);
    let listings: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| s.populate_and_stop(n, 0x5A4D_0000 + i as u64))
        .collect();
    let nodes: Vec<String> = names.iter().map(|n| s.node_of(n)).collect();
    let used: std::collections::BTreeSet<&String> = nodes.iter().collect();
    assert_eq!(used.len(), 3, "{} sandboxes on {nodes:?}", names.len());
    let ls = berth_ok(s.home(), &["ls"]);
    assert!(ls.contains("NODE"), "{ls}");

    // Work after the stop, on the node about to be lost: it must not come back.
    let leader = s.swarm.leader();
    let victim = nodes
        .iter()
        .find(|n| **n != leader)
        .cloned()
        .expect("a sandbox off the leader");
    let lost: Vec<usize> = (0..names.len()).filter(|&i| nodes[i] == victim).collect();
    for &i in &lost {
        s.exec(&names[i], "echo unsaved > unsaved");
    }

    // 2. The node's dockerd SIGKILLed.
    s.swarm.kill_daemon(&victim);
    let lost_at = Instant::now();

    // 6. Four processes resume the first lost sandbox at once (in-process
    //    CLIs): one restore, four successes.
    let first = names[lost[0]].clone();
    let children: Vec<std::process::Child> = (0..4)
        .map(|_| {
            std::process::Command::new(berth_tests::berth_bin())
                .env("BERTH_HOME", s.home())
                .env("RUST_LOG", "berth=info")
                .args(["--no-server", "exec", &first, "--", WORKSPACE_LISTING])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut restores = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "a resume failed: {stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            listings[lost[0]],
            "a resume saw another workspace"
        );
        restores += stderr.matches("archive extracted").count();
    }
    let usable = lost_at.elapsed();
    assert_eq!(restores, 1, "four resumes restored {restores} times");
    eprintln!("node loss → {first} usable again on another node: {usable:?}");

    // Every sandbox that was there is back elsewhere, identical to its
    // last stop; the others are untouched.
    for (i, name) in names.iter().enumerate() {
        assert_eq!(
            s.listing(name),
            listings[i],
            "{name} differs from its last stop"
        );
        let now = s.node_of(name);
        if nodes[i] == victim {
            assert_ne!(now, victim, "{name} is still on the lost node");
            let state = s.swarm_state(name);
            assert!(
                state.history.len() >= 2,
                "{name}'s task history: {:?}",
                state.history
            );
        } else {
            assert_eq!(now, nodes[i], "{name} moved though its node was not lost");
        }
    }

    // 3. The lost node comes back: its stale containers are never used
    //    or persisted.
    s.swarm.start_daemon(&victim);
    s.swarm.wait_all_ready(Duration::from_secs(120));
    for &i in &lost {
        let name = &names[i];
        assert_eq!(
            s.exec(name, "test -e unsaved && echo stale || echo clean"),
            "clean\n"
        );
        assert_ne!(s.node_of(name), victim);
        berth_ok(s.home(), &["stop", name]);
        s.remove_container(name);
        assert_eq!(s.listing(name), listings[i], "{name} restored again");
    }
    s.remove_all(&names);
}

#[test]
fn a_node_cut_off_is_fenced_and_its_stale_container_is_never_used_or_persisted() {
    let _serial = serial();
    let Some(s) =
        setup("a_node_cut_off_is_fenced_and_its_stale_container_is_never_used_or_persisted")
    else {
        return;
    };
    let names = spread(&s, "f", 3);
    let leader = s.swarm.leader();
    let name = names
        .iter()
        .find(|n| s.node_of(n) != leader)
        .cloned()
        .expect("a sandbox off the leader");
    let victim = s.node_of(&name);
    let listing = s.populate_and_stop(&name, 0xFE4C_E001);
    let before_cut = berth_state(s.home(), &name);
    let task = before_cut
        .backend
        .decode::<SwarmState>()
        .unwrap()
        .current
        .unwrap();
    // Work after the stop, and the sandbox kept open by the server.
    s.exec(&name, "echo unsaved > unsaved");

    s.swarm.cut_link(&victim);
    let cut_at = Instant::now();
    s.swarm.wait_task_replaced(
        &format!("berth-{}", before_cut.session_id),
        &task.task,
        Duration::from_secs(60),
    );
    // The server's open sandbox is fenced: the command runs on the new
    // task, restored from the last stop.
    assert_eq!(s.listing(&name), listing);
    eprintln!(
        "link cut → {name} usable on another node: {:?}",
        cut_at.elapsed()
    );
    assert_ne!(s.node_of(&name), victim);
    // The stale container still runs on the cut-off node, reachable on its
    // socket; a stop from the old state is refused and persists nothing.
    let stale = s
        .swarm
        .docker(
            &victim,
            &[
                "ps",
                "-q",
                "--no-trunc",
                "--filter",
                &format!("id={}", task.container),
            ],
        )
        .unwrap_or_else(|e| panic!("asking the cut-off node {victim} for its containers: {e}"));
    assert!(
        stale.contains(&task.container),
        "the stale container {} no longer runs on the cut-off node {victim}: {stale:?}",
        task.container
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let refused = runtime.block_on(async {
        let client = berth_tests::client_builder(s.home().join("lib"))
            .save_state(false)
            .build();
        let mut old = client
            .resume(
                before_cut.clone(),
                None,
                berth::sandbox::SandboxOptions::default(),
            )
            .await
            .unwrap();
        let refused = old.stop().await;
        (refused, old.state().snapshot.digest)
    });
    match refused.0 {
        Err(berth::SandboxError::LineageMismatch { .. })
        | Err(berth::SandboxError::Backend(berth::BackendError::Stale { .. })) => {}
        other => panic!("a stop of the stale container was not refused: {other:?}"),
    }
    assert_eq!(refused.1, before_cut.snapshot.digest);

    // The node comes back: still never used.
    s.swarm.restore_link(&victim);
    s.swarm.wait_all_ready(Duration::from_secs(120));
    assert_eq!(
        s.exec(&name, "test -e unsaved && echo stale || echo clean"),
        "clean\n"
    );
    berth_ok(s.home(), &["stop", &name]);
    s.remove_container(&name);
    assert_eq!(s.listing(&name), listing);
    s.remove_all(&names);
}

#[test]
fn with_the_leader_lost_sandboxes_are_reached_through_the_other_managers() {
    let _serial = serial();
    let Some(s) = setup("with_the_leader_lost_sandboxes_are_reached_through_the_other_managers")
    else {
        return;
    };
    let names = spread(&s, "l", 3);
    let leader = s.swarm.leader();
    let listings: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| s.populate_and_stop(n, 0x1EAD_0000 + i as u64))
        .collect();
    let nodes: Vec<String> = names.iter().map(|n| s.node_of(n)).collect();
    let on_leader = nodes
        .iter()
        .position(|n| *n == leader)
        .unwrap_or_else(|| panic!("no sandbox on the leader {leader}: {nodes:?}"));
    let name = names[on_leader].clone();
    s.exec(&name, "echo unsaved > unsaved");
    let state = berth_state(s.home(), &name);
    let task = state
        .backend
        .decode::<SwarmState>()
        .unwrap()
        .current
        .unwrap();

    s.swarm.cut_link(&leader);
    let cut_at = Instant::now();
    // The remaining managers elect a leader, see the node down and
    // replace its task.
    s.swarm.wait_task_replaced(
        &format!("berth-{}", state.session_id),
        &task.task,
        Duration::from_secs(120),
    );
    assert_eq!(
        s.listing(&name),
        listings[on_leader],
        "{name} after the leader was lost"
    );
    eprintln!(
        "leader lost → {name} usable on another node: {:?}",
        cut_at.elapsed()
    );
    assert_ne!(s.node_of(&name), leader);
    assert_eq!(
        s.exec(&name, "test -e unsaved && echo stale || echo clean"),
        "clean\n"
    );
    for (i, other) in names.iter().enumerate() {
        assert_eq!(
            s.listing(other),
            listings[i],
            "{other} after the leader was lost"
        );
    }
    assert_ne!(s.swarm.leader(), leader, "no new leader was elected");
    s.swarm.restore_link(&leader);
    s.swarm.wait_all_ready(Duration::from_secs(180));
    for (i, name) in names.iter().enumerate() {
        assert_eq!(s.listing(name), listings[i]);
    }
    s.remove_all(&names);
}

#[test]
fn an_unsatisfiable_placement_is_refused_with_the_swarms_reason_and_leaves_nothing() {
    let _serial = serial();
    let Some(s) =
        setup("an_unsatisfiable_placement_is_refused_with_the_swarms_reason_and_leaves_nothing")
    else {
        return;
    };
    let before = s.swarm.berth_services();
    let snapshot = format!("remote:{}", s.manifest.display());
    let image = test_image();
    let base = [
        "--backend",
        "swarm",
        "--engine",
        &s.swarm.manager,
        "--image",
        &image,
        "--snapshot",
        &snapshot,
        "--placement-timeout",
        "4s",
    ];
    for (extra, reason) in [
        (
            vec!["--constraint", "node.labels.pool==gpu"],
            "no suitable node",
        ),
        (
            vec!["--reserve-memory", "65536GiB"],
            "insufficient resources",
        ),
    ] {
        let mut args = vec!["create", "u1"];
        args.extend_from_slice(&base);
        args.extend(extra.iter().copied());
        let err = failed(&berth_in(s.home(), &args), "an unsatisfiable create");
        assert!(err.contains(reason), "{err}");
        assert!(
            err.contains("u1 was not created") && err.contains("pending"),
            "{err}"
        );
        assert_eq!(
            err.matches(reason).count(),
            1,
            "the reason said once: {err}"
        );
        assert!(!berth_ok(s.home(), &["ls"]).contains("u1"));
        assert_eq!(
            s.swarm.berth_services(),
            before,
            "a service was left behind"
        );
    }
    // A snapshot only this host reads is refused before anything is made.
    let err = failed(
        &berth_in(
            s.home(),
            &[
                "create",
                "u2",
                "--backend",
                "swarm",
                "--engine",
                &s.swarm.manager,
                "--image",
                &image,
                "--snapshot",
                "local",
            ],
        ),
        "a swarm sandbox with a local snapshot",
    );
    assert!(err.contains("shared store"), "{err}");
    assert_eq!(s.swarm.berth_services(), before);
}

/// The Python client through `berth serve`: a swarm sandbox placed, its
/// task replaced behind the server's open sandbox (`Stale` once, then the
/// sandbox resumed where the swarm placed it), an unsatisfiable placement
/// refused (`PlacementFailed`) leaving nothing.
#[test]
fn an_agent_framework_places_a_sandbox_on_the_swarm_through_the_api() {
    let _serial = serial();
    let Some(s) = setup("an_agent_framework_places_a_sandbox_on_the_swarm_through_the_api") else {
        return;
    };
    let before = s.swarm.berth_services();
    // The server, as `berth serve` runs it.
    let mut server = std::process::Command::new(berth_tests::berth_bin())
        .env("BERTH_HOME", s.home())
        .args(["serve"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let socket = s.home().join("berth.sock");
    let started = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "no server");
        std::thread::sleep(Duration::from_millis(50));
    }
    let python = |script: &str| berth_tests::python_client(&[("BERTH_SOCKET", &socket)], script);
    let ok = |out: &Output| {
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let placed = python(&format!(
        r#"
import berth_client as b
c = b.Berth()
sb = c.create("py", backend="swarm", engine={manager:?}, image={image:?},
              snapshot={snapshot:?}, pids_limit=256, reserve_memory=8 << 20)
r = sb.exec("echo placed > w; cat w")
assert r.stdout_bytes == b"placed\n", r
sb.stop()
sb.exec("echo unsaved > unsaved")
print("ok")
"#,
        manager = s.swarm.manager,
        image = test_image(),
        snapshot = format!("remote:{}", s.manifest.display()),
    ));
    ok(&placed);
    // The swarm replaces the task behind the server's open sandbox: the
    // next call is refused as stale, the one after runs where the swarm
    // placed it, restored from the last stop.
    let task = s.swarm_state("py").current.expect("a task").task;
    let service = format!("berth-{}", berth_state(s.home(), "py").session_id);
    s.remove_container("py");
    s.swarm
        .wait_task_replaced(&service, &task, Duration::from_secs(60));
    let rest = python(&format!(
        r#"
import berth_client as b
c = b.Berth()
sb = c.sandbox("py")
try:
    sb.files.read("w")
    raise SystemExit("a replaced task was used")
except b.Stale as e:
    assert "is stale" in e.message and {task:?} in e.message, e.message
assert sb.files.read("w") == b"placed\n"
r = sb.exec("test -e unsaved && echo kept || echo restored")
assert r.stdout_bytes == b"restored\n", r
try:
    c.create("nowhere", backend="swarm", engine={manager:?}, image={image:?},
             snapshot={snapshot:?}, constraints=["node.labels.pool==gpu"],
             placement_timeout_secs=3)
    raise SystemExit("an unsatisfiable placement was accepted")
except b.PlacementFailed as e:
    assert "no suitable node" in e.message, e.message
try:
    c.sandbox("nowhere").inspect()
    raise SystemExit("the failed create left a sandbox")
except b.NotFound:
    pass
sb.remove()
print("ok")
"#,
        manager = s.swarm.manager,
        image = test_image(),
        snapshot = format!("remote:{}", s.manifest.display()),
    ));
    let _ = server.kill();
    let _ = server.wait();
    ok(&rest);
    assert_eq!(
        s.swarm.berth_services(),
        before,
        "a service was left behind"
    );
}

#[test]
fn a_service_removed_behind_berths_back_is_created_again_and_restored() {
    let _serial = serial();
    let Some(s) = setup("a_service_removed_behind_berths_back_is_created_again_and_restored")
    else {
        return;
    };
    s.create("gone", &["--pids-limit", "300", "--memory", "256MiB"]);
    let listing = s.populate_and_stop("gone", 0x6011E);
    s.exec("gone", "echo unsaved > unsaved");
    let state = berth_state(s.home(), "gone");
    let service = format!("berth-{}", state.session_id);
    s.swarm
        .docker(&s.swarm.any_manager(), &["service", "rm", &service])
        .unwrap();
    // From a fresh process: the service is made again, with the same
    // settings, and the last stop restored into its new task.
    assert_eq!(s.listing("gone"), listing);
    assert_eq!(
        s.exec("gone", "test -e unsaved && echo stale || echo clean"),
        "clean\n"
    );
    let limits = s
        .swarm
        .docker(
            &s.swarm.any_manager(),
            &[
                "service",
                "inspect",
                &service,
                "--format",
                "{{.Spec.TaskTemplate.Resources.Limits.Pids}} {{.Spec.TaskTemplate.Resources.Limits.MemoryBytes}}",
            ],
        )
        .unwrap();
    assert_eq!(limits, format!("300 {}", 256u64 << 20));
    let history = s.swarm_state("gone").history;
    assert_eq!(history.len(), 2, "{history:?}");
    s.remove_all(&["gone".to_string()]);
}

/// The last stop's figures of a deduplicated sandbox.
fn last_stop(s: &Setup, name: &str) -> berth::snapshot::StopStats {
    let state = berth_state(s.home(), name);
    berth::snapshot::DedupRecord::from_fields(&state.snapshot.fields)
        .and_then(|r| r.last_stop)
        .unwrap_or_else(|| panic!("{name} has no deduplicated stop: {:?}", state.snapshot))
}

/// A deduplicated stop on the swarm walks the workspace in the task's
/// container (the agent's walk, with its files cache): after a small
/// change the second stop reads and uploads about that change, not the
/// workspace; the newest generation comes back in a new task once the
/// container is removed, with the root's own time (a stop then seals
/// what the last one did); and a fork of a swarm sandbox is a swarm sandbox
/// that starts from the source's stop and shares its chunks.
#[test]
fn deduplicated_stops_walk_on_the_node_and_forks_stay_on_the_swarm() {
    let _serial = serial();
    let Some(s) = setup("deduplicated_stops_walk_on_the_node_and_forks_stay_on_the_swarm") else {
        return;
    };
    s.create("dd", &["--dedup"]);
    s.exec(
        "dd",
        "head -c 8000000 /dev/urandom > big.bin && mkdir -p src && echo one > src/note",
    );
    // Past the files cache's racy window, so the first stop's walk may
    // vouch for big.bin (a file changed just before a walk is read again).
    std::thread::sleep(berth::workspace::tree::RACY_WINDOW + Duration::from_millis(100));
    berth_ok(s.home(), &["stop", "dd"]);
    let first = last_stop(&s, "dd");
    assert!(first.uploaded_bytes >= 8_000_000, "{first:?}");
    s.exec("dd", "echo two > src/note");
    berth_ok(s.home(), &["stop", "dd"]);
    let second = last_stop(&s, "dd");
    assert_eq!(second.generation, first.generation + 1, "{second:?}");
    assert!(second.uploaded_bytes < 1 << 20, "{second:?}");
    assert!(second.read_bytes < 1 << 20, "the walk read {second:?}");
    assert!(second.files_unchanged >= 1, "{second:?}");
    let want = s.exec("dd", "sha256sum big.bin src/note");
    let sealed = berth_state(s.home(), "dd").snapshot.digest;
    let root_time = s.exec("dd", "stat -c %y .");
    s.remove_container("dd");
    assert_eq!(s.exec("dd", "sha256sum big.bin src/note"), want);
    // No change, no new content: the restore put the root's own time back
    // in the new task, so a stop now seals what the last one did.
    assert_eq!(s.exec("dd", "stat -c %y ."), root_time, "the root's time");
    berth_ok(s.home(), &["stop", "dd"]);
    assert_eq!(
        berth_state(s.home(), "dd").snapshot.digest,
        sealed,
        "an unchanged workspace was sealed anew after its restore on the swarm"
    );

    berth_ok(s.home(), &["fork", "dd", "ff"]);
    assert_eq!(berth_state(s.home(), "ff").backend.kind, "swarm");
    assert_eq!(s.exec("ff", "sha256sum big.bin src/note"), want);
    assert!(
        s.swarm_state("ff").current.is_some(),
        "the fork has no task"
    );
    s.exec("ff", "echo mine > mine");
    berth_ok(s.home(), &["stop", "ff"]);
    let forked = last_stop(&s, "ff");
    assert!(forked.uploaded_bytes < 1 << 20, "{forked:?}");
    // The source is untouched by its fork.
    assert_eq!(
        s.exec("dd", "test -e mine && echo forked || echo own"),
        "own\n"
    );
    s.remove_all(&["dd".to_string(), "ff".to_string()]);
}
