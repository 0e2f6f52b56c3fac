//! The in-container agent on a real engine: commands through one exec
//! session (streams, exit codes, caps, many at once), timeouts that leave
//! nothing running (fork loops, children ignoring SIGTERM, children that
//! start sessions of their own) through the agent and through the plain
//! exec path, persistent shell sessions, and the fallback when the agent
//! cannot run or misbehaves.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, Sandbox, SandboxClient};
use berth_docker::DockerOptions;
use berth_tests::{berth_bin, docker_or_skip, sh, started_sandbox, test_image};

async fn sandbox(client: &SandboxClient, options: DockerOptions) -> Sandbox {
    started_sandbox(client, BackendSpec::new(options)).await
}

/// The agent's processes in the container (busybox `ps`).
async fn agents_running(sb: &Sandbox) -> usize {
    sh(sb, "ps -o args | grep -c '^/.berth/agent' || true")
        .await
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_run_through_one_agent_session_with_streams_codes_and_caps() {
    if docker_or_skip("commands_run_through_one_agent_session")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = sandbox(&client, DockerOptions::new(test_image())).await;
    let r = sb
        .exec(ExecRequest::new(
            "echo out; echo err >&2; printf 'no newline'; exit 3",
            Duration::from_secs(20),
        ))
        .await
        .unwrap();
    assert_eq!(
        (
            r.exit_code,
            r.stdout_text().as_ref(),
            r.stderr_text().as_ref(),
            r.timed_out
        ),
        (3, "out\nno newline", "err\n", false)
    );
    // One agent, reused by every command (this one included): the same
    // process before and after five more (a fresh agent per command would
    // be another pid each time).
    let agent_pid = || async {
        sh(
            &sb,
            "ps -o pid,args | grep ' /.berth/agent' | grep -v grep | awk '{print $1}'",
        )
        .await
        .trim()
        .to_string()
    };
    let before = agent_pid().await;
    assert!(!before.is_empty(), "no agent process in the container");
    for _ in 0..5 {
        sh(&sb, "true").await;
    }
    assert_eq!(agents_running(&sb).await, 1);
    assert_eq!(
        agent_pid().await,
        before,
        "the agent was replaced between commands"
    );
    let mut req = ExecRequest::new(
        "head -c 300000 /dev/zero; head -c 5000 /dev/zero >&2",
        Duration::from_secs(20),
    );
    req.stdout_cap = 1000;
    req.stderr_cap = 10;
    let r = sb.exec(req).await.unwrap();
    assert_eq!(
        (
            r.stdout.len(),
            r.stdout_dropped,
            r.stderr.len(),
            r.stderr_dropped,
            r.truncated
        ),
        (1000, 299_000, 10, 4990, true)
    );
    // Environment, working directory, and a signal's exit code.
    let mut req = ExecRequest::new("echo $WHO; pwd; kill -9 $$", Duration::from_secs(20));
    req.env.insert("WHO".into(), "agent".into());
    let r = sb.exec(req).await.unwrap();
    assert_eq!(
        (r.stdout_text().as_ref(), r.exit_code),
        ("agent\n/workspace\n", 137)
    );
    // Many at once: each waits until all have started.
    let n = 8;
    let runs = (0..n).map(|i| {
        sb.exec(ExecRequest::new(
            format!(
                "touch /tmp/c{i}; k=0; while [ $(ls /tmp/c* | wc -l) -lt {n} ]; do sleep 0.05; k=$((k+1)); [ $k -gt 400 ] && exit 9; done; echo {i}"
            ),
            Duration::from_secs(60),
        ))
    });
    let results = futures::future::join_all(runs).await;
    for (i, r) in results.into_iter().enumerate() {
        let r = r.unwrap();
        assert_eq!(
            (r.exit_code, r.stdout_text().trim()),
            (0, i.to_string().as_str())
        );
    }
    sb.shutdown().await.unwrap();
}

async fn timeout_leaves_nothing_running(agent: bool) {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = sandbox(
        &client,
        DockerOptions::new(test_image())
            .agent(agent)
            .run_args(vec!["--pids-limit".into(), "200".into()]),
    )
    .await;
    // Children that ignore SIGTERM, and through the agent (which kills
    // with system calls alone and follows descendants as well as the
    // process group) a loop forking orphans until the pids limit stops it
    // and a child that starts a session of its own. (Plain execs cannot
    // promise those two: the kill is itself an exec, which a full pids
    // limit refuses, and it reaches the process group only.)
    let escapee = if agent {
        "setsid sh -c \"trap '' TERM; sleep 1002\" & \
         (while :; do (sleep 1003 &) 2>/dev/null; done) & "
    } else {
        "sleep 1003 & "
    };
    let r = sb
        .exec(ExecRequest::new(
            format!(
                "trap '' TERM; echo started; \
                 (trap '' TERM; sleep 1001) & {escapee}\
                 sleep 1004"
            ),
            Duration::from_secs(3),
        ))
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 124);
    assert!(r.stdout_text().contains("started"), "{r:?}");
    // Everything is gone (give the engine a moment to reap).
    let mut left = String::new();
    for _ in 0..50 {
        left = sh(&sb, "ps -o args | grep 'sleep 100' | grep -v grep || true").await;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "agent={agent}: survived the timeout:\n{left}"
    );
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_through_the_agent_leaves_nothing_running() {
    if docker_or_skip("a_timeout_through_the_agent")
        .await
        .is_none()
    {
        return;
    }
    timeout_leaves_nothing_running(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_through_plain_execs_leaves_nothing_running() {
    if docker_or_skip("a_timeout_through_plain_execs")
        .await
        .is_none()
    {
        return;
    }
    timeout_leaves_nothing_running(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shell_sessions_keep_their_directory_and_exports() {
    if docker_or_skip("shell_sessions_keep_their_directory_and_exports")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = sandbox(&client, DockerOptions::new(test_image())).await;
    let run = |cmd: &str, session: Option<&str>| {
        let mut req = ExecRequest::new(cmd, Duration::from_secs(20));
        if let Some(s) = session {
            req = req.in_session(s);
        }
        sb.exec(req)
    };
    let r = run(
        "mkdir -p sub/deeper && cd sub && export FOO='a b' && BAR=unexported",
        Some("s"),
    )
    .await
    .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let r = run("pwd; echo \"$FOO|$BAR\"; cd deeper", Some("s"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "/workspace/sub\na b|\n");
    assert_eq!(
        run("pwd", Some("s")).await.unwrap().stdout,
        "/workspace/sub/deeper\n"
    );
    // Another session, and no session, start afresh.
    assert_eq!(
        run("pwd; echo \"$FOO\"", Some("t")).await.unwrap().stdout,
        "/workspace\n\n"
    );
    assert_eq!(run("pwd", None).await.unwrap().stdout, "/workspace\n");
    // A command that fails keeps the session's state up to its failure.
    let r = run("cd /tmp; false", Some("s")).await.unwrap();
    assert_eq!(r.exit_code, 1);
    assert_eq!(run("pwd", Some("s")).await.unwrap().stdout, "/tmp\n");
    sb.shutdown().await.unwrap();

    // Without the agent, a session is a clear error, not a silent fresh shell.
    let mut sb = sandbox(&client, DockerOptions::new(test_image()).agent(false)).await;
    let err = sb
        .exec(ExecRequest::new("pwd", Duration::from_secs(20)).in_session("s"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs the in-container agent"), "{err}");
    assert_eq!(sh(&sb, "echo plain").await, "plain\n");
    sb.shutdown().await.unwrap();
}

/// `berth ARGS` with its own agent binary and warnings on stderr:
/// in-process, since the warnings checked here are the library's logs,
/// which a server writes to its own log.
fn berth_with_agent(home: &Path, agent: &Path, args: &[&str]) -> Output {
    Command::new(berth_bin())
        .env("BERTH_NO_SERVER", "1")
        .env("BERTH_HOME", home)
        .env("BERTH_AGENT", agent)
        .env("RUST_LOG", "berth=warn")
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_fall_back_to_execs_when_the_agent_cannot_run_or_misbehaves() {
    if docker_or_skip("commands_fall_back_to_execs")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let real_agent = berth_bin().with_file_name("berth-agent-static");
    assert!(real_agent.is_file(), "run `cargo xtask build-agent`");
    let image = test_image();
    let create = |name: &str, agent: &Path, extra: &[&str]| {
        let mut args = vec![
            "create",
            name,
            "--backend",
            "docker",
            "--image",
            &image,
            "--snapshot",
            "noop",
        ];
        args.extend_from_slice(extra);
        berth_with_agent(&home, agent, &args)
    };
    let text = |o: &Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    // Its directory is a noexec tmpfs: the agent cannot run.
    let out = create(
        "ro",
        &real_agent,
        &["--run-arg=--tmpfs", "--run-arg=/.berth:noexec"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = berth_with_agent(&home, &real_agent, &["exec", "ro", "--", "echo via exec"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via exec\n");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(log.matches("agent cannot run").count(), 1, "{log}");
    // Words through a plain exec: as given, and a missing program as a
    // shell reports it.
    let words = [
        "exec",
        "ro",
        "--no-shell",
        "--",
        "printf",
        "[%s]",
        "$HOME",
        "*",
        "it's",
    ];
    let out = berth_with_agent(&home, &real_agent, &words);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[$HOME][*][it's]");
    let missing = ["exec", "ro", "--no-shell", "--", "berth-no-such-program"];
    let out = berth_with_agent(&home, &real_agent, &missing);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out));
    assert!(
        text(&out).contains("berth-no-such-program: not found"),
        "{}",
        text(&out)
    );

    // An "agent" that is not one (it prints help and exits).
    let out = create("notagent", Path::new("/bin/busybox"), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = berth_with_agent(
        &home,
        Path::new("/bin/busybox"),
        &["exec", "notagent", "--", "echo fine"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent cannot run"));

    // An agent that says hello, then sends a frame over the limit: the
    // session ends with an error naming it; the next command starts anew.
    let liar = dir.path().join("liar");
    std::fs::write(
        &liar,
        // (the hello's last byte is the protocol's version, 3)
        "#!/bin/sh\nprintf '\\000\\000\\000\\011\\012\\000\\000\\000\\000\\000\\000\\000\\003'\nsleep 1\nprintf '\\377\\377\\377\\377'\nsleep 5\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&liar, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = create("liar", &liar, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let out = berth_with_agent(&home, &liar, &["exec", "liar", "--", "echo x"]);
    assert!(!out.status.success(), "{}", text(&out));
    let err = text(&out);
    assert!(
        err.contains("in-container agent") && err.contains("a frame of 4294967295 bytes"),
        "{err}"
    );
    for n in ["ro", "notagent", "liar"] {
        let out = berth_with_agent(&home, &real_agent, &["rm", n]);
        assert!(out.status.success(), "{}", text(&out));
    }
}

/// A deduplicated stop's walk stops every other process of the sandbox
/// while it runs (the agent's session too); killed then (SIGKILL: no
/// destructor runs), it must not leave them stopped. Its thaw guard
/// continues them. Driven with `docker exec`, which the freeze does not
/// stop (it starts after it).
#[tokio::test(flavor = "multi_thread")]
async fn a_walk_killed_mid_freeze_leaves_no_process_stopped() {
    if docker_or_skip("a_walk_killed_mid_freeze_leaves_no_process_stopped")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = sandbox(&client, DockerOptions::new(test_image())).await;
    // Enough entries that the walk's output overruns its buffer and the
    // pipe below, whose reader it stops: it then blocks, frozen.
    sh(
        &sb,
        "mkdir many && cd many && seq 20000 | sed 's/^/a-rather-long-name-to-fill-the-pipe-/' | xargs touch",
    )
    .await;
    sh(&sb, "setsid sleep 1000 </dev/null >/dev/null 2>&1 &").await;
    let root = sh(&sb, "pwd").await;
    let container = berth_tests::container_id(&sb.state());
    let docker = |detach: bool, script: &str| {
        let mut args = vec!["exec"];
        if detach {
            args.push("-d");
        }
        let out = Command::new("docker")
            .args(args)
            .args([container.as_str(), "sh", "-c", script])
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    docker(
        false,
        r"printf 'BWK1\000\000\000\000\000\000\000\000\000\000\000\000' > /tmp/req",
    );
    docker(
        true,
        &format!(
            "/.berth/agent fs {} walk --freeze < /tmp/req | sleep 1000",
            root.trim()
        ),
    );
    let stopped = "grep -l ') T ' /proc/[0-9]*/stat 2>/dev/null | wc -l";
    let frozen = docker(
        false,
        &format!("for i in $(seq 100); do n=$({stopped}); [ $n -gt 1 ] && break; sleep 0.1; done; echo $n"),
    );
    assert!(
        frozen.parse::<u32>().unwrap() > 1,
        "the walk stopped nothing: {frozen}"
    );
    // The walk, not its guard (the guard's parent is the walk).
    let killed = docker(
        false,
        r#"m=""; for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); case "$c" in "/.berth/agent fs "*" walk --freeze"*) m="$m ${p#/proc/}";; esac; done
t=""; for q in $m; do pp=$(cut -d' ' -f4 /proc/$q/stat); case " $m " in *" $pp "*) ;; *) t="$t $q";; esac; done
kill -9 $t && echo killed"#,
    );
    assert_eq!(killed, "killed");
    let left = docker(
        false,
        &format!("for i in $(seq 50); do n=$({stopped}); [ $n -eq 0 ] && break; sleep 0.1; done; echo $n"),
    );
    assert_eq!(
        left, "0",
        "processes left stopped after the walk was killed"
    );
    // The agent's session was among them: it answers again.
    assert_eq!(sh(&sb, "echo back").await.trim(), "back");
    sh(&sb, "pkill sleep; true").await;
    sb.shutdown().await.unwrap();
}
