//! Commands as agents and people use them, on a real engine and on the
//! local backend, through the CLI in fresh processes where a user would
//! type them: output streamed as it is produced, binary output and stdin
//! byte-identical, caps that keep head and tail, partial output on
//! timeout, background processes that outlive their CLI and the agent
//! (bounded logs, kill, stop leaves them, a re-created container reports
//! them gone), an interactive shell on a real terminal (tmux), and the
//! file API's confinement and atomic writes.

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, Sandbox, SandboxClient, SandboxError};
use berth_docker::DockerOptions;
use berth_tests::{berth_bin, berth_in, berth_ok, docker_or_skip, sh, started_sandbox, test_image};
use sha2::Digest;

async fn docker_sandbox(client: &SandboxClient) -> Sandbox {
    started_sandbox(client, BackendSpec::new(DockerOptions::new(test_image()))).await
}

async fn local_sandbox(client: &SandboxClient) -> Sandbox {
    started_sandbox(client, BackendSpec::local()).await
}

/// Seconds since boot, as the kernel counts them (the same clock inside a
/// container: /proc/uptime is not namespaced).
fn uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn cli_sandbox(home: &Path, name: &str, docker: bool) {
    let mut args = vec!["create", name];
    if docker {
        args.extend(["--backend", "docker", "--image"]);
    }
    let image = test_image();
    if docker {
        args.push(&image);
    }
    berth_ok(home, &args);
}

/// Each line a command prints every 100 ms reaches the CLI's stdout
/// within 300 ms of being printed (by the kernel's clock on both sides).
fn lines_arrive_as_printed(home: &Path, name: &str) {
    let mut child = Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .args([
            "exec",
            name,
            "--",
            "for i in 1 2 3 4 5 6 7 8; do cat /proc/uptime; sleep 0.1; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lags = Vec::new();
    for line in out.lines() {
        let line = line.unwrap();
        let printed: f64 = line.split_whitespace().next().unwrap().parse().unwrap();
        lags.push(uptime() - printed);
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(lags.len(), 8, "{lags:?}");
    // /proc/uptime has 10 ms steps.
    assert!(
        lags.iter().all(|&l| l < 0.3 + 0.02),
        "lines reached the CLI late (seconds after being printed): {lags:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cli_output_streams_as_it_is_produced_on_both_backends() {
    let home = tempfile::tempdir().unwrap();
    cli_sandbox(home.path(), "loc", false);
    lines_arrive_as_printed(home.path(), "loc");
    if docker_or_skip("cli_output_streams_as_it_is_produced")
        .await
        .is_none()
    {
        return;
    }
    cli_sandbox(home.path(), "box", true);
    lines_arrive_as_printed(home.path(), "box");
    berth_ok(home.path(), &["rm", "box"]);
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_output_stdin_and_copies_come_back_byte_identical() {
    if docker_or_skip("binary_output_stdin_and_copies")
        .await
        .is_none()
    {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    cli_sandbox(home.path(), "box", true);
    let h = home.path();
    // 100 MB of random bytes made in the sandbox, out through exec.
    berth_ok(
        h,
        &[
            "exec",
            "box",
            "--",
            "head -c 100000000 /dev/urandom > big.bin",
        ],
    );
    let inside = berth_ok(h, &["exec", "box", "--", "sha256sum big.bin"]);
    let out = berth_in(h, &["exec", "box", "--", "cat big.bin"]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 100_000_000);
    assert_eq!(inside.split_whitespace().next().unwrap(), sha(&out.stdout));
    // Out through cp, and back in through cp and through stdin.
    let dir = tempfile::tempdir().unwrap();
    berth_ok(h, &["cp", "box:big.bin", dir.path().to_str().unwrap()]);
    let copied = std::fs::read(dir.path().join("big.bin")).unwrap();
    assert_eq!(sha(&copied), sha(&out.stdout));
    berth_ok(
        h,
        &[
            "cp",
            dir.path().join("big.bin").to_str().unwrap(),
            "box:/workspace/back/",
        ],
    );
    let back = berth_ok(h, &["exec", "box", "--", "sha256sum < back/big.bin"]);
    assert_eq!(back.split_whitespace().next().unwrap(), sha(&copied));
    let mut child = Command::new(berth_bin())
        .env("BERTH_HOME", h)
        .args(["exec", "box", "-i", "--", "sha256sum"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = copied.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&data).unwrap());
    let mut hashed = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut hashed)
        .unwrap();
    writer.join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(hashed.split_whitespace().next().unwrap(), sha(&copied));
    berth_ok(h, &["rm", "box"]);
}

async fn caps_and_timeouts(sb: &Sandbox) {
    // `seq 1 200000` is 1,288,895 bytes; keep 1000, the last 100 of them.
    let r = sb
        .exec(
            ExecRequest::new("seq 1 200000", Duration::from_secs(30))
                .caps(1000, 1000)
                .tail_kept(100),
        )
        .await
        .unwrap();
    let text = r.stdout_text();
    assert_eq!(r.stdout.len(), 1000);
    assert!(text.starts_with("1\n2\n3\n"), "{text:.40}");
    assert!(text.ends_with("199999\n200000\n"), "{text}");
    assert_eq!(r.stdout_dropped, 1_288_895 - 1000);
    assert!(r.truncated);
    // A timeout keeps what was printed before it.
    let r = sb
        .exec(ExecRequest::new(
            "echo started; echo warn >&2; sleep 30; echo never",
            Duration::from_secs(1),
        ))
        .await
        .unwrap();
    assert!(r.timed_out, "{r:?}");
    assert_eq!(r.exit_code, 124);
    assert_eq!(
        (r.stdout_text().as_ref(), r.stderr_text().as_ref()),
        ("started\n", "warn\n")
    );
    assert!(r.notes.iter().any(|n| n.contains("timed out")), "{r:?}");
    // Binary stdout is bytes, never a lossy string.
    let r = sb
        .exec(ExecRequest::new(
            "printf '\\377\\000\\376'",
            Duration::from_secs(10),
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout.as_ref(), &[0xff, 0x00, 0xfe]);
}

#[tokio::test(flavor = "multi_thread")]
async fn caps_keep_head_and_tail_and_timeouts_keep_partial_output() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut local = local_sandbox(&client).await;
    caps_and_timeouts(&local).await;
    local.shutdown().await.unwrap();
    if docker_or_skip("caps_keep_head_and_tail").await.is_none() {
        return;
    }
    let mut sb = docker_sandbox(&client).await;
    caps_and_timeouts(&sb).await;
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_streamed_command_stops_it_in_the_sandbox() {
    if docker_or_skip("dropping_a_streamed_command")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = docker_sandbox(&client).await;
    let mut p = sb
        .exec_stream(ExecRequest::new(
            "echo up; exec sleep 97",
            Duration::from_secs(120),
        ))
        .await
        .unwrap();
    let first = p.next_event().await.unwrap().unwrap();
    assert_eq!(first, berth::backend::ExecEvent::Stdout("up\n".into()));
    drop(p);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh(&sb, "ps -o args").await.contains("sleep 97") {
        assert!(Instant::now() < deadline, "the dropped command still runs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sb.shutdown().await.unwrap();
}

fn container_of(home: &Path, name: &str) -> String {
    berth_tests::container_id(&berth_tests::berth_state(home, name))
}

#[tokio::test(flavor = "multi_thread")]
async fn background_processes_outlive_their_cli_and_the_agent() {
    if docker_or_skip("background_processes_outlive")
        .await
        .is_none()
    {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    cli_sandbox(h, "box", true);
    let id = berth_ok(
        h,
        &[
            "exec",
            "box",
            "--detach",
            "--name",
            "web",
            "--",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.05; done",
        ],
    );
    assert_eq!(id.trim(), "web");
    // Another process sees it.
    let ps = berth_ok(h, &["ps", "box", "--json"]);
    let list: serde_json::Value = serde_json::from_str(&ps).unwrap();
    assert_eq!(list[0]["id"], "web");
    assert_eq!(list[0]["state"], "running");
    // Following: a CLI whose agent session is killed behind Berth's back
    // ends; the process goes on, and the next CLI (a new agent session)
    // re-attaches and sees new lines.
    let container = container_of(h, "box");
    let follow = |tail: &str| {
        let mut child = Command::new(berth_bin())
            .env("BERTH_HOME", h)
            .args(["logs", "box", "web", "--follow", "--tail", tail])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    };
    let (mut first, mut lines) = follow("1");
    let a: u64 = lines.next().unwrap().unwrap()[5..].parse().unwrap();
    let killed = Command::new("docker")
        .args([
            "exec",
            &container,
            "sh",
            "-c",
            // Session agents run without arguments; supervisors have them.
            "pids=$(ps -o pid,args | awk '$2 == \"/.berth/agent\" && NF == 2 {print $1}'); \
             [ -n \"$pids\" ] && kill -9 $pids && echo $pids | wc -w",
        ])
        .output()
        .unwrap();
    assert!(
        killed.status.success(),
        "no agent session to kill: {}",
        String::from_utf8_lossy(&killed.stderr)
    );
    let status = first.wait().unwrap();
    assert!(!status.success(), "the follower whose agent died must fail");
    let (mut second, mut lines) = follow("1");
    let b: u64 = lines.next().unwrap().unwrap()[5..].parse().unwrap();
    let c: u64 = lines.nth(3).unwrap().unwrap()[5..].parse().unwrap();
    assert!(a < b && b < c, "{a}, then {b} and {c}");
    second.kill().unwrap();
    let _ = second.wait();
    let tail = berth_ok(h, &["logs", "box", "web", "--tail", "2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    // A flood keeps at most its ring on disk.
    berth_ok(
        h,
        &[
            "exec",
            "box",
            "--detach",
            "--name",
            "flood",
            "--log-ring",
            "1048576",
            "--",
            "yes 0123456789abcdef | head -c 1000000000",
        ],
    );
    assert_eq!(berth_ok(h, &["wait", "box", "flood"]).trim(), "0");
    let du = berth_ok(
        h,
        &[
            "exec",
            "box",
            "--",
            "cat /.berth/run/flood/stdout.* | wc -c",
        ],
    );
    let kept: u64 = du.trim().parse().unwrap();
    assert!(
        kept <= 1 << 20 && kept > 0,
        "{kept} bytes kept of a 1 GB flood"
    );
    // stop persists and leaves it running.
    berth_ok(h, &["stop", "box"]);
    let ps = berth_ok(h, &["ps", "box"]);
    assert!(
        ps.lines()
            .any(|l| l.starts_with("web") && l.contains("running")),
        "{ps}"
    );
    // kill.
    berth_ok(h, &["kill", "box", "web", "--signal", "TERM"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ps = berth_ok(h, &["ps", "box", "--json"]);
        let list: serde_json::Value = serde_json::from_str(&ps).unwrap();
        let web = list
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == "web")
            .unwrap()
            .clone();
        if web["state"] == "exited" {
            assert_eq!(web["exit_code"], 143);
            break;
        }
        assert!(Instant::now() < deadline, "web still runs after TERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    // One still running when the container is removed: the restore says it
    // did not come back.
    berth_ok(
        h,
        &[
            "exec",
            "box",
            "--detach",
            "--name",
            "srv",
            "--",
            "sleep 1000",
        ],
    );
    let rm = Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap();
    assert!(rm.status.success());
    let start = berth_in(h, &["start", "box"]);
    assert!(start.status.success());
    let stderr = String::from_utf8_lossy(&start.stderr);
    assert!(
        stderr.contains("background process srv") && stderr.contains("did not come back"),
        "{stderr}"
    );
    assert!(berth_tests::berth_state(h, "box").background.is_empty());
    // A wrong id is named.
    let out = berth_in(h, &["logs", "box", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    berth_ok(h, &["rm", "box"]);
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tmux {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the pane shows `text`.
fn pane_shows(session: &str, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pane = tmux(&["capture-pane", "-p", "-t", session]);
        if pane.contains(text) {
            return pane;
        }
        assert!(
            Instant::now() < deadline,
            "the pane never showed {text:?}:\n{pane}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn berth_shell_on_a_real_terminal() {
    if docker_or_skip("berth_shell_on_a_real_terminal")
        .await
        .is_none()
    {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(
            !berth_tests::docker_required(),
            "tmux is required for the shell test"
        );
        berth_tests::skipped("berth_shell_on_a_real_terminal", "no tmux");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    cli_sandbox(h, "box", true);
    let session = format!("berth-shell-{}", std::process::id());
    let exit_file = h.join("exit");
    let cmd = format!(
        "env BERTH_HOME={} {} shell box; echo $? > {}",
        h.display(),
        berth_bin().display(),
        exit_file.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "100",
        "-y",
        "30",
        &cmd,
    ]);
    tmux(&["send-keys", "-t", &session, "echo hi-$((1+2))", "Enter"]);
    pane_shows(&session, "hi-3");
    tmux(&["send-keys", "-t", &session, "stty size", "Enter"]);
    pane_shows(&session, "30 100");
    tmux(&["resize-window", "-t", &session, "-x", "120", "-y", "40"]);
    std::thread::sleep(Duration::from_millis(300));
    tmux(&["send-keys", "-t", &session, "stty size", "Enter"]);
    pane_shows(&session, "40 120");
    // Ctrl-C reaches the sandbox's foreground process, not berth.
    let t = Instant::now();
    tmux(&[
        "send-keys",
        "-t",
        &session,
        "sleep 60; echo after-$?",
        "Enter",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    tmux(&["send-keys", "-t", &session, "C-c"]);
    tmux(&["send-keys", "-t", &session, "echo still-$((40+2))", "Enter"]);
    pane_shows(&session, "still-42");
    assert!(t.elapsed() < Duration::from_secs(30));
    tmux(&["send-keys", "-t", &session, "exit 3", "Enter"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !exit_file.exists() {
        assert!(Instant::now() < deadline, "berth shell did not end");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read_to_string(&exit_file).unwrap().trim(), "3");
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", &session])
        .output();
    berth_ok(h, &["rm", "box"]);
}

async fn file_api_confinement(sb: &Sandbox) {
    sh(
        sb,
        "mkdir -p d && echo old > d/f && ln -s /etc evil && ln -s ../.. up",
    )
    .await;
    let files = sb.files();
    for path in [
        "../x",
        "/etc/passwd",
        "evil/passwd",
        "up/etc/passwd",
        "d/../../x",
    ] {
        match files.read(path).await {
            Err(SandboxError::PathRefused { .. }) => {}
            other => panic!("{path}: {:?}", other.map(|_| "a reader")),
        }
    }
    assert!(matches!(
        files.write("evil/x", &b"no"[..], 2, None).await,
        Err(SandboxError::PathRefused { .. })
    ));
    assert!(matches!(
        files.stat("nothing-here").await,
        Err(SandboxError::NotFound { .. })
    ));
    // A source that ends half-way leaves the old file.
    assert!(files.write("d/f", &b"new"[..], 10, None).await.is_err());
    assert_eq!(&files.read_to_bytes("d/f").await.unwrap()[..], b"old\n");
    // A whole write replaces it, binary-safe, with the mode given.
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    files
        .write("d/f", &data[..], data.len() as u64, Some(0o600))
        .await
        .unwrap();
    assert_eq!(files.read_to_bytes("d/f").await.unwrap(), data);
    let info = files.stat("d/f").await.unwrap();
    assert_eq!((info.size, info.mode), (300_000, 0o600));
    let listed: Vec<String> = files
        .list("")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.path)
        .collect();
    assert_eq!(listed, ["d", "evil", "up"]);
    files.remove("evil", false).await.unwrap();
    files.make_dir("a/b/c", true).await.unwrap();
    files.remove("a", true).await.unwrap();
    assert!(sh(sb, "ls /etc/passwd && ls").await.contains("d\nup"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_file_api_is_confined_to_the_workspace_and_writes_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut local = local_sandbox(&client).await;
    file_api_confinement(&local).await;
    local.shutdown().await.unwrap();
    if docker_or_skip("the_file_api_is_confined").await.is_none() {
        return;
    }
    let mut sb = docker_sandbox(&client).await;
    file_api_confinement(&sb).await;
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn exposed_ports_need_a_network_and_reach_a_detached_server() {
    if docker_or_skip("exposed_ports_need_a_network")
        .await
        .is_none()
    {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let image = test_image();
    // On no network, nothing could be published: refused, nothing made.
    let out = berth_in(
        h,
        &[
            "create",
            "nonet",
            "--backend",
            "docker",
            "--image",
            &image,
            "--expose",
            "8000",
        ],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("network=NET") && stderr.contains("docker network create"),
        "{stderr}"
    );
    assert!(!berth_in(h, &["inspect", "nonet"]).status.success());
    // On a network of the user's, the port is published on loopback.
    let net = format!("berth-test-ports-{}", std::process::id());
    let made = Command::new("docker")
        .args(["network", "create", &net])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    berth_ok(
        h,
        &[
            "create",
            "web",
            "--backend",
            "docker",
            "--image",
            &image,
            "--network",
            &net,
            "--expose",
            "8000",
        ],
    );
    berth_ok(h, &["exec", "web", "--", "echo served > index.html"]);
    berth_ok(
        h,
        &[
            "exec",
            "web",
            "--detach",
            "--name",
            "httpd",
            "--",
            "httpd -f -p 8000 -h /workspace",
        ],
    );
    let address = berth_ok(h, &["port", "web", "8000"]).trim().to_string();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    let listing = berth_ok(h, &["port", "web"]);
    assert!(listing.contains("8000/tcp -> 127.0.0.1:"), "{listing}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        let answer = std::net::TcpStream::connect(&address).and_then(|mut s| {
            s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n")?;
            let mut text = String::new();
            s.read_to_string(&mut text)?;
            Ok(text)
        });
        match answer {
            Ok(text) if text.contains("served") => break text,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("the detached server did not answer on {address}: {other:?}"),
        }
    };
    assert!(
        body.starts_with("HTTP/1.") && body.contains(" 200 "),
        "{body}"
    );
    berth_ok(h, &["rm", "web"]);
    let _ = Command::new("docker")
        .args(["network", "rm", &net])
        .output();
}
