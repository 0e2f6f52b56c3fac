//! The Docker daemon restarted in the middle of a session: commands fail
//! clearly (no hang) while it is down, and the next start brings the same
//! container back with the workspace intact. Runs only where the test may
//! restart dockerd (as root, with dockerd started by `cargo xtask setup`, or
//! BERTH_ALLOW_DOCKERD_RESTART=1); required in CI.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, SandboxOptions, SandboxSpec, SnapshotSpec, StartBranch};
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;
use berth_tests::{
    berth_ok, berth_state, container_id, docker_or_skip, docker_required, sh, test_image,
    workspace_gen,
};

/// The pid of the engine the tests use: the dockerd whose pid file is the
/// default `/var/run/docker.pid`. Not merely the first `dockerd` running:
/// the swarm's nodes and the second engine are dockerds too (each with its
/// own `--pidfile`), and restarting one of those outside its network
/// namespace would take a node out of the swarm.
fn dockerd_pid() -> Option<u32> {
    let is_dockerd = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "dockerd")
    };
    if let Some(pid) = std::fs::read_to_string("/var/run/docker.pid")
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .filter(|pid| is_dockerd(*pid))
    {
        return Some(pid);
    }
    // No default pid file: a dockerd with none of its own (`--pidfile`).
    let out = Command::new("pgrep")
        .args(["-x", "dockerd"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                !c.split(|b| *b == 0)
                    .any(|a| a == b"--pidfile" || a.starts_with(b"--pidfile=") || a == b"-p")
            })
        })
}

#[allow(clippy::zombie_processes)] // dockerd is a daemon that outlives the test
fn restart_dockerd(pid: u32) {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let t = Instant::now();
    // Gone, or a zombie waiting for a parent that is not us: stopped.
    while berth_tests::process_running(pid) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "dockerd did not stop"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open("/tmp/berth-dockerd.log")
        .unwrap();
    Command::new("setsid")
        .args(&args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_restart_mid_session_is_survived() {
    let _daemon = berth_tests::DOCKERD.write().await;
    let allowed = std::env::var_os("BERTH_ALLOW_DOCKERD_RESTART").is_some()
        || std::path::Path::new("/tmp/berth-dockerd.log").exists();
    let Some(pid) = dockerd_pid().filter(|_| allowed) else {
        // In CI the daemon-restart disaster must be tested, not skipped.
        assert!(
            !docker_required(),
            "dockerd must be restartable in CI (set BERTH_ALLOW_DOCKERD_RESTART=1, or let `cargo xtask setup` start dockerd); found dockerd: {:?}, allowed: {allowed}",
            dockerd_pid()
        );
        berth_tests::skipped(
            "a_daemon_restart_mid_session_is_survived",
            "not allowed to restart dockerd here (BERTH_ALLOW_DOCKERD_RESTART unset)",
        );
        return;
    };
    let Some(_docker) = docker_or_skip("a_daemon_restart_mid_session_is_survived").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(dir.path().join("s")))
                .backend(BackendSpec::new(DockerOptions::new(test_image()))),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(&sb, "echo survived > f").await;
    let id = container_id(&sb.state());

    // Beside it, a generated workspace driven through the CLI: stopped
    // before the restart, resumed by a fresh `berth exec` after it.
    let home = dir.path().join("home");
    let berth = |args: &[&str]| berth_ok(&home, args);
    let image = test_image();
    berth(&["create", "gen", "--backend", "docker", "--image", &image]);
    berth(&["exec", "gen", "--", &workspace_gen::script(21, 4 << 20)]);
    let before = berth(&["exec", "gen", "--", workspace_gen::MANIFEST]);
    berth(&["stop", "gen"]);

    restart_dockerd(pid);
    // While the daemon is down or the container stopped: a clear error, fast.
    let t = Instant::now();
    let r = sb
        .exec(ExecRequest::new("cat f", Duration::from_secs(10)))
        .await;
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "exec hung while the daemon restarted"
    );
    // Either the command ran (the daemon was back, the agent's session
    // held) or it failed saying why; never a hang, never an unclear error.
    match &r {
        Ok(done) => println!("exec during the restart ran: {done:?}"),
        Err(e) => {
            let said = berth_tests::chain(e);
            assert!(
                said.contains("Docker daemon") || said.contains("not running"),
                "unclear error: {said}"
            );
        }
    }

    // Wait for the daemon, then resume: the same container, restarted.
    let t = Instant::now();
    let probe = DockerOptions::new(test_image()).into_state_for_probe();
    while berth_docker::check_engine(&probe).await.is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "dockerd did not come back"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut sb = client
        .resume(sb.state(), None, SandboxOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    assert_eq!(container_id(&sb.state()), id);
    assert_eq!(sh(&sb, "cat f").await, "survived\n");
    sb.shutdown().await.unwrap();

    berth(&["exec", "gen", "--", "true"]);
    let raw = Command::new("docker")
        .args(["exec", "-w", "/workspace"])
        .arg(container_id(&berth_state(&home, "gen")))
        .args(["sh", "-c", workspace_gen::MANIFEST])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&raw.stdout),
        before,
        "the generated workspace changed across the daemon restart"
    );
    berth(&["rm", "gen"]);
}
