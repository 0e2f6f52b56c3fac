//! The CLI through the server: it says the same as in-process, and a server
//! killed mid-exec, mid-write or mid-stop loses nothing.

use super::*;

/// The same CLI session, through the server and in-process: the same
/// stdout, stderr and exit code at every step (durations and times
/// aside), for successes and errors alike.
#[tokio::test]
async fn the_cli_says_the_same_through_the_server_and_in_process() {
    let Some(_docker) = docker_or_skip("server::cli_both_ways").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let image = test_image();
    let steps: Vec<(Vec<&str>, &[u8])> = vec![
        (
            vec!["create", "box", "--backend", "docker", "--image", &image],
            b"",
        ),
        (
            vec!["exec", "box", "--", "echo out; echo err >&2; exit 3"],
            b"",
        ),
        (vec!["exec", "box", "--", "printf '\\377\\000bin'"], b""),
        (
            vec!["exec", "-i", "box", "--", "tr a-z A-Z"],
            b"from stdin\n",
        ),
        (
            vec!["exec", "box", "--env", "K=v", "--", "echo $K > kept.txt"],
            b"",
        ),
        (
            vec![
                "exec",
                "box",
                "--timeout",
                "3",
                "--",
                "echo before; sleep 30",
            ],
            b"",
        ),
        (
            vec![
                "exec",
                "box",
                "--detach",
                "--name",
                "bg",
                "--",
                "echo bg-out; exit 7",
            ],
            b"",
        ),
        (vec!["wait", "box", "bg"], b""),
        (vec!["logs", "box", "bg"], b""),
        (vec!["logs", "box", "nope"], b""),
        (vec!["kill", "box", "bg", "--signal", "BOGUS"], b""),
        (vec!["files", "box", "mkdir", "-p", "d/e"], b""),
        (
            vec!["files", "box", "write", "d/e/f.bin", "--mode", "600"],
            b"\x00\x01binary\xff",
        ),
        (vec!["files", "box", "read", "d/e/f.bin"], b""),
        (vec!["files", "box", "read", "../../etc/passwd"], b""),
        (vec!["files", "box", "read", "missing"], b""),
        (vec!["files", "box", "rm", "-r", "d"], b""),
        (vec!["stop", "box"], b""),
        (vec!["start", "box"], b""),
        (vec!["exec", "box", "--", "cat kept.txt"], b""),
        (vec!["exec", "nosuch", "--", "true"], b""),
        (vec!["ps", "nosuch"], b""),
        (vec!["port", "box"], b""),
        (vec!["rm", "box"], b""),
    ];
    let mut seen: Vec<Vec<(String, String, i32)>> = Vec::new();
    for in_process in [false, true] {
        let home = tempfile::tempdir().unwrap();
        let mut outputs = Vec::new();
        for (args, stdin) in &steps {
            let (out, err, code) = cli(home.path(), in_process, args, stdin);
            // Times and digests vary by run.
            let norm = |s: &str| {
                s.lines()
                    .map(|l| {
                        if l.starts_with("stopped box")
                            || l.starts_with("created box")
                            || l.contains(" ago ")
                            || l.starts_with("  ")
                        {
                            l.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
                        } else {
                            l.to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            outputs.push((norm(&out), norm(&err), code));
        }
        // The first pass went through a server (the CLI started one on
        // demand); the second did not start one.
        let status = berth_in(home.path(), &["server", "status"]);
        assert_eq!(
            status.status.success(),
            !in_process,
            "in-process {in_process}: berth server status said {}",
            String::from_utf8_lossy(&status.stdout)
        );
        berth_ok(home.path(), &["server", "stop"]);
        seen.push(outputs);
    }
    for (i, (through, in_process)) in seen[0].iter().zip(&seen[1]).enumerate() {
        assert_eq!(
            through, in_process,
            "step {:?}: through the server (left) and in-process (right) differ",
            steps[i].0
        );
    }
    // And they did what they should.
    assert_eq!(seen[0][1].2, 3);
    assert_eq!(seen[0][3].0, "FROM STDIN");
    assert_eq!(seen[0][7].0, "7");
    assert_eq!(seen[0][13].0, "\u{0}\u{1}binary\u{fffd}");
    assert_ne!(seen[0][14].2, 0);
    assert_eq!(seen[0][19].0, "v");
    assert_ne!(seen[0][20].2, 0);
}

fn sigkill(pid: i32) {
    // SAFETY: kill sends a signal; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// The server the CLI started on demand is SIGKILLed during an exec,
/// during a file write and during a stop: the CLI says what broke, the
/// next command starts a new server, no half-written file appears, and
/// the workspace is whole (the old snapshot or the new one).
#[tokio::test]
async fn a_server_killed_mid_exec_mid_write_or_mid_stop_loses_nothing() {
    let Some(_docker) = docker_or_skip("server::killed").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let image = test_image();
    berth_ok(
        h,
        &["create", "box", "--backend", "docker", "--image", &image],
    );
    berth_ok(
        h,
        &[
            "exec",
            "box",
            "--",
            "head -c 200000000 /dev/urandom > data.bin; sha256sum data.bin > data.sum",
        ],
    );
    berth_ok(h, &["stop", "box"]);

    // Mid-exec: the CLI reports the broken connection and exits non-zero.
    let pid = server_pid(h).await;
    let exec = Command::new(berth_bin())
        .env("BERTH_HOME", h)
        .args(["exec", "box", "--", "echo started; sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    sigkill(pid);
    let started = Instant::now();
    let out = exec.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("server"), "{stderr}");

    // The next command starts another server (and does not fall back to
    // running in its own process).
    let next = berth_in(h, &["exec", "box", "--", "echo ok"]);
    let next_err = String::from_utf8_lossy(&next.stderr);
    assert!(next.status.success(), "{next_err}");
    assert!(!next_err.contains("in this process"), "{next_err}");
    assert_eq!(String::from_utf8_lossy(&next.stdout), "ok\n");
    let pid2 = server_pid(h).await;
    assert_ne!(pid, pid2);

    // Mid-write: half a file sent, then the server dies; no file, no
    // leftover appears.
    let before = berth_ok(h, &["exec", "box", "--", "ls -a"]);
    let client = Client::Unix(h.join("berth.sock"));
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::io::Error>(http_body::Frame::data(b)), rx))
    }))
    .boxed_unsync();
    let write = tokio::spawn(async move {
        client
            .send_raw(
                Method::PUT,
                "/v1/sandboxes/box/files/content?path=half.bin",
                &[("content-length", (8u64 << 20).to_string())],
                body,
            )
            .await
    });
    for _ in 0..4 {
        tx.send(Bytes::from(vec![1u8; 1 << 20])).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    sigkill(pid2);
    let written = write.await.unwrap();
    assert!(written.is_err() || !written.unwrap().status().is_success());
    drop(tx);
    let after = berth_ok(h, &["exec", "box", "--", "ls -a"]);
    assert_eq!(before, after, "a killed write left something");

    // Mid-stop: the stop is cut off; the workspace is whole afterwards and
    // a stop then succeeds.
    berth_ok(h, &["exec", "box", "--", "echo second > second.txt"]);
    let pid3 = server_pid(h).await;
    let stop = Command::new(berth_bin())
        .env("BERTH_HOME", h)
        .args(["stop", "box"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed while the stop reads the workspace (the container is paused
    // for that moment): the stop was under way, not done and not yet begun.
    let container = berth_tests::container_id(&berth_tests::berth_state(h, "box"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if berth_tests::container_paused(&container) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stop never paused the container"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    sigkill(pid3);
    let stopped = stop.wait_with_output().unwrap();
    assert!(
        !stopped.status.success(),
        "the stop finished although its server was killed mid-way: {}",
        String::from_utf8_lossy(&stopped.stdout)
    );
    let check = berth_in(
        h,
        &[
            "exec",
            "box",
            "--",
            "sha256sum -c data.sum && cat second.txt",
        ],
    );
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    berth_ok(h, &["stop", "box"]);
    // The container goes away: the snapshot has both files.
    let container = berth_tests::container_id(&berth_tests::berth_state(h, "box"));
    assert!(Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap()
        .status
        .success());
    let restored = berth_ok(
        h,
        &[
            "exec",
            "box",
            "--",
            "sha256sum -c data.sum >/dev/null && cat second.txt",
        ],
    );
    assert_eq!(restored, "second\n");
    berth_ok(h, &["rm", "box"]);
}
