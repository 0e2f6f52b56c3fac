//! The CLI's manners, round two, each through `berth` in fresh processes:
//! a shell without a terminal refuses at once, `cp … -` streams, `berth
//! shutdown` ends what `stop` leaves running, the background server can be
//! seen and stopped, log lines are plain text off a terminal, errors say
//! what failed without the machinery's words, and no lock file outlives
//! the name it guards.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::{berth_bin, berth_in, berth_ok};

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `berth ARGS` without `RUST_LOG` (as a user runs it), stdin empty.
fn berth_plain(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `berth ARGS`, which must fail; its stderr, checked to be one plain
/// `error:` line-set without debug formatting.
fn refused(home: &Path, args: &[&str]) -> String {
    let out = berth_plain(home, args);
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "berth {args:?} succeeded: {stdout}{stderr}"
    );
    assert!(!stderr.contains('\u{1b}'), "escapes in {stderr:?}");
    assert!(
        !stderr.contains("Error {") && !stderr.contains("Os {"),
        "debug formatting: {stderr}"
    );
    stderr
}

#[test]
fn a_shell_without_a_terminal_refuses_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut shell = Command::new(berth_bin())
        .env("BERTH_HOME", dir.path())
        .args(["shell", "box"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while shell.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = shell.kill();
            panic!("berth shell without a terminal did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = shell.wait_with_output().unwrap();
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stdout.is_empty(),
        "it wrote to the terminal that is not: {stdout:?}"
    );
    assert!(
        stderr.contains("needs a terminal") && stderr.contains("berth exec box --"),
        "{stderr}"
    );
}

#[test]
fn cp_streams_one_file_through_stdin_and_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    berth_ok(home, &["create", "box"]);
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 256) as u8).collect();
    let mut cp_in = Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .args(["cp", "-", "box:in/data.bin"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    cp_in
        .stdin
        .take()
        .unwrap()
        .write_all(&payload[..1000])
        .unwrap();
    assert!(cp_in.wait().unwrap().success());
    // Again, over it: its directory exists now; the file is replaced.
    let mut cp_in = Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .args(["cp", "-", "box:in/data.bin"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    cp_in.stdin.take().unwrap().write_all(&payload).unwrap();
    assert!(cp_in.wait().unwrap().success());
    let out = berth_plain(home, &["cp", "box:in/data.bin", "-"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert_eq!(out.stdout, payload);
    assert!(!Path::new("-").exists(), "a file named - was written");
    berth_ok(home, &["server", "stop"]);
    berth_ok(home, &["rm", "box"]);
}

/// `berth shutdown` saves the workspace, then ends the instance and its
/// background processes; the next command brings it back from the
/// snapshot. `--discard` ends it without saving.
#[test]
fn shutdown_saves_then_ends_the_instance() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    berth_ok(home, &["create", "box"]);
    berth_ok(
        home,
        &[
            "exec",
            "box",
            "--detach",
            "--name",
            "tick",
            "--",
            "while true; do sleep 1; done",
        ],
    );
    berth_ok(home, &["exec", "box", "--", "echo kept > kept.txt"]);
    let out = berth_ok(home, &["shutdown", "box"]);
    assert!(
        out.contains("stopped box") && out.contains("shut down box"),
        "{out}"
    );
    assert!(!berth_tests::berth_state(home, "box").workspace_root_ready);
    assert_eq!(
        berth_ok(home, &["exec", "box", "--", "cat kept.txt"]),
        "kept\n"
    );
    let ps = berth_ok(home, &["ps", "box"]);
    assert!(
        !ps.contains("tick"),
        "the background process survived: {ps}"
    );
    berth_ok(home, &["exec", "box", "--", "echo lost > lost.txt"]);
    berth_ok(home, &["shutdown", "--discard", "box"]);
    let ls = berth_ok(home, &["exec", "box", "--", "ls"]);
    assert_eq!(ls, "kept.txt\n", "--discard saved the workspace");
    berth_ok(home, &["server", "stop"]);
    berth_ok(home, &["rm", "box"]);
}

/// `berth server start|status|stop`, and `berth serve` beside a running
/// server: refused in one line, before it says it serves.
#[test]
fn the_background_server_can_be_seen_and_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let none = berth_plain(home, &["server", "status"]);
    assert_eq!(none.status.code(), Some(1));
    assert!(
        text(&none).0.contains("no berth server"),
        "{:?}",
        text(&none)
    );
    let started = berth_ok(home, &["server", "start"]);
    assert!(
        started.contains("started a berth server (pid "),
        "{started}"
    );
    let status = berth_ok(home, &["server", "status"]);
    assert!(
        status.contains("answers on") && status.contains("through it"),
        "{status}"
    );
    let pid: i32 = status
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {status}"));
    let twice = berth_plain(home, &["serve"]);
    let (stdout, stderr) = text(&twice);
    assert!(!twice.status.success());
    assert!(
        !stderr.contains("serving on") && stdout.is_empty(),
        "{stderr}"
    );
    assert!(
        stderr.contains("already answers") && stderr.contains("berth server stop"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let stopped = berth_ok(home, &["server", "stop"]);
    assert!(stopped.contains(&format!("pid {pid}")), "{stopped}");
    // Gone, or a zombie nobody reaped (where pid 1 does not reap).
    assert!(
        !berth_tests::process_running(pid as u32),
        "the server is still there"
    );
    assert_eq!(
        berth_plain(home, &["server", "status"]).status.code(),
        Some(1)
    );
    assert!(berth_ok(home, &["server", "stop"]).contains("no berth server"));
}

/// Without `RUST_LOG`, on a stderr that is not a terminal: warnings and
/// errors are plain lines (`berth: warning: …`, `error: …`), without
/// colour escapes, timestamps or module paths, and an unreachable engine
/// is said with the system's reason, not the HTTP client's layers.
#[test]
fn log_lines_are_plain_text_and_errors_name_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let stderr = refused(
        home,
        &[
            "create",
            "box",
            "--backend",
            "docker",
            "--image",
            "berth-test:busybox",
            "--engine",
            "tcp://127.0.0.1:1",
        ],
    );
    for line in stderr.lines() {
        assert!(
            line.starts_with("berth: warning: ") || line.starts_with("error: "),
            "{line:?} in {stderr}"
        );
        assert!(!line.contains("berth::"), "a module path: {line}");
    }
    assert!(
        stderr.contains("tcp://127.0.0.1:1") && stderr.contains("refused"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("hyper") && !stderr.contains("client error"),
        "{stderr}"
    );
    // The server's log is a file: plain lines too, each with its time.
    berth_ok(home, &["server", "start"]);
    berth_ok(home, &["server", "stop"]);
    let log = std::fs::read_to_string(home.join("server.log")).unwrap_or_default();
    assert!(!log.contains('\u{1b}'), "escapes in server.log: {log:?}");
}

/// Errors for a newcomer's usual mistakes: what failed and what to do,
/// without internal names; and the mistakes that used to be silent.
#[test]
fn newcomers_mistakes_get_clear_errors_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let err = refused(&home, &["create", "bad name"]);
    assert!(err.contains("not a valid sandbox name"), "{err}");
    assert!(!err.contains("snapshot id"), "{err}");

    // A manifest key typo is refused, naming the key and the known ones.
    let ws = dir.path().join("ws.json");
    std::fs::write(
        &ws,
        r#"{"entrys": {"a.txt": {"type": "file", "content": "x"}}}"#,
    )
    .unwrap();
    let err = refused(
        &home,
        &["create", "typo", "--workspace", ws.to_str().unwrap()],
    );
    assert!(
        err.contains("`entrys`") && err.contains("`entries`"),
        "{err}"
    );

    berth_ok(&home, &["create", "box"]);
    // A command without `--`, as docker exec takes it; options before it
    // are still berth's.
    assert_eq!(berth_ok(&home, &["exec", "box", "echo", "-n", "hi"]), "hi");
    let json = berth_ok(&home, &["exec", "box", "--json", "--", "echo", "x"]);
    assert!(json.contains("\"exit_code\": 0"), "{json}");

    // persist into a directory that does not exist: named, nothing left.
    let out = dir.path().join("nowhere/x.tar");
    let err = refused(&home, &["persist", "box", "--out", out.to_str().unwrap()]);
    assert!(
        err.contains(&dir.path().join("nowhere").display().to_string()),
        "{err}"
    );
    assert!(!err.contains("partial"), "{err}");
    // ... and into one that does: only the file, nothing hidden beside it.
    let tar = dir.path().join("ws.tar");
    berth_ok(&home, &["exec", "box", "--", "echo one > one.txt"]);
    berth_ok(&home, &["persist", "box", "--out", tar.to_str().unwrap()]);
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");

    // A compressed archive is hydrated (gzip and zstd), not refused as a
    // truncated tar.
    for (compressor, ext) in [("gzip", "tgz"), ("zstd", "tar.zst")] {
        let packed = dir.path().join(format!("ws.{ext}"));
        let status = Command::new(compressor)
            .arg("-c")
            .arg(&tar)
            .stdout(std::fs::File::create(&packed).unwrap())
            .status();
        match status {
            Ok(s) if s.success() => {}
            _ => {
                assert_eq!(compressor, "zstd", "gzip is everywhere");
                continue;
            }
        }
        berth_ok(&home, &["exec", "box", "--", "rm one.txt"]);
        let out = berth_ok(&home, &["hydrate", "box", packed.to_str().unwrap()]);
        assert!(out.contains("extracted"), "{out}");
        assert_eq!(
            berth_ok(&home, &["exec", "box", "--", "cat one.txt"]),
            "one\n"
        );
    }

    // kill of a process that has exited, and of one that never was.
    berth_ok(
        &home,
        &["exec", "box", "--detach", "--name", "tick", "--", "true"],
    );
    berth_ok(&home, &["wait", "box", "tick"]);
    let err = refused(&home, &["kill", "box", "tick"]);
    assert!(
        err.contains("\"tick\" has exited") && !err.contains("proc kill"),
        "{err}"
    );
    let err = refused(&home, &["kill", "box", "nosuch"]);
    assert!(
        err.contains("background process \"nosuch\": not found"),
        "{err}"
    );

    // `--no-server` is the top level's option, not every subcommand's.
    let help = berth_ok(&home, &["ls", "--help"]);
    assert!(!help.contains("--no-server"), "{help}");
    assert!(berth_ok(&home, &["--help"]).contains("--no-server"));

    berth_ok(&home, &["server", "stop"]);
    berth_ok(&home, &["rm", "box"]);
    // No lock file for the typo, the failed create or the removed box.
    let left: Vec<_> = std::fs::read_dir(home.join("sandboxes"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in sandboxes/: {left:?}");
    let out = berth_in(&home, &["inspect", "never-made"]);
    assert!(!out.status.success());
    assert!(!home.join("sandboxes/never-made.json.lock").exists());
}
