//! What an interrupted or failed command leaves behind, through the CLI in
//! fresh processes, in-process and through the server: a stop cut by
//! Ctrl-C keeps the previous snapshot, leaves no unfinished archive and no
//! paused container; a stop killed outright leaves an archive that `berth
//! gc --orphans` finds and deletes; a create whose start fails is not
//! registered (CLI, API, Python) and can simply be run again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_tests::{berth_bin, berth_in, berth_ok, berth_state, docker_or_skip, test_image};

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill sends a signal; no memory is involved.
    unsafe { libc::kill(child.id() as i32, signal) };
}

/// `berth ARGS` started in the background with `BERTH_HOME=home`.
fn spawn_berth(home: &Path, args: &[&str]) -> Child {
    Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .env_remove("RUST_LOG")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The files in `dir/.partial` (unfinished archives).
fn partials(snapshots: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(snapshots.join(".partial"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.sort();
    found
}

/// Waits until `ready` holds, or panics naming `what` after `limit`.
fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The exit of `child` and its stderr, waiting at most a minute.
fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (status, String::from_utf8_lossy(&out.stderr).into_owned());
        }
        assert!(Instant::now() < deadline, "the command did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A local sandbox with `mib` MiB of incompressible data, stopped once
/// (so it has a snapshot to keep).
fn local_box_with_data(home: &Path, name: &str, mib: u32) {
    berth_ok(home, &["create", name, "--compress"]);
    berth_ok(
        home,
        &[
            "exec",
            name,
            "--",
            &format!("head -c {mib}M /dev/urandom > data.bin && sha256sum data.bin > data.sum"),
        ],
    );
    berth_ok(home, &["stop", name]);
}

/// Ctrl-C (and SIGTERM) during a stop — in-process and through the server
/// — cancels it: exit 130 with one line saying so, no unfinished archive
/// left, the snapshot the previous stop wrote untouched. A stop killed
/// outright leaves its unfinished archive, which `gc --orphans` lists and
/// deletes, and which `rm` would have swept. The workspace is whole after
/// all of it.
#[test]
fn an_interrupted_stop_keeps_the_previous_snapshot_and_leaves_no_archive() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let snapshots = home.join("snapshots");
    local_box_with_data(home, "box", 384);
    let before = berth_state(home, "box").snapshot;
    let archive = snapshots.join(format!("{}.tar", before.id));
    let archive_bytes = std::fs::metadata(&archive).unwrap().len();
    for (how, args, sig) in [
        (
            "in-process, Ctrl-C",
            &["--no-server", "stop", "box"][..],
            libc::SIGINT,
        ),
        (
            "in-process, SIGTERM",
            &["--no-server", "stop", "box"][..],
            libc::SIGTERM,
        ),
        (
            "through the server, Ctrl-C",
            &["stop", "box"][..],
            libc::SIGINT,
        ),
    ] {
        berth_ok(home, &["exec", "box", "--", "echo changed >> notes.txt"]);
        let stop = spawn_berth(home, args);
        // Interrupted only once its archive is being written: mid-stop.
        wait_until(
            &format!("{how}: the stop writing"),
            Duration::from_secs(60),
            || !partials(&snapshots).is_empty(),
        );
        signal(&stop, sig);
        let (status, stderr) = finish(stop);
        assert_eq!(status.code(), Some(130), "{how}: {stderr}");
        assert!(stderr.contains("interrupted"), "{how}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{how}: one line: {stderr}");
        // Through the server the cancellation reaches it as the client
        // goes away: its archive goes a moment later.
        wait_until(
            &format!("{how}: no unfinished archive"),
            Duration::from_secs(20),
            || partials(&snapshots).is_empty(),
        );
        let after = berth_state(home, "box").snapshot;
        assert_eq!(after.digest, before.digest, "{how}: the snapshot changed");
        assert_eq!(
            std::fs::metadata(&archive).unwrap().len(),
            archive_bytes,
            "{how}"
        );
    }
    berth_ok(home, &["server", "stop"]);

    // SIGKILL: nothing can clean up, so the archive stays, unlocked, for
    // `gc --orphans` (which leaves the live one alone).
    let stop = spawn_berth(home, &["--no-server", "stop", "box"]);
    wait_until("the stop writing", Duration::from_secs(60), || {
        !partials(&snapshots).is_empty()
    });
    signal(&stop, libc::SIGKILL);
    let _ = finish(stop);
    let left = partials(&snapshots);
    assert_eq!(left.len(), 1, "{left:?}");
    let listed = berth_ok(home, &["gc", "--orphans"]);
    assert!(
        listed.contains(&left[0].display().to_string()) && listed.contains("killed"),
        "{listed}"
    );
    assert_eq!(partials(&snapshots), left, "a dry run deleted");
    let deleted = berth_ok(home, &["gc", "--orphans", "--yes"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    assert!(partials(&snapshots).is_empty());
    assert_eq!(
        berth_state(home, "box").snapshot.digest,
        before.digest,
        "a killed stop committed"
    );

    // Whole: a stop now succeeds, and a restore from it has everything.
    berth_ok(home, &["stop", "box"]);
    let root = berth_tests::local_root(&berth_state(home, "box"));
    berth_tests::remove_workspace(&root);
    let check = berth_ok(
        home,
        &[
            "exec",
            "box",
            "--",
            "sha256sum -c data.sum && cat notes.txt",
        ],
    );
    assert!(check.contains("data.bin: OK"), "{check}");
    assert_eq!(check.matches("changed").count(), 3, "{check}");
    berth_ok(home, &["server", "stop"]);
    berth_ok(home, &["rm", "box"]);
}

/// A Docker sandbox's stop (which pauses the container while it reads the
/// workspace) interrupted while the container is paused, in-process and
/// through the server: the container runs again, the previous snapshot
/// stands, and the next stop works.
#[tokio::test]
async fn an_interrupted_docker_stop_leaves_the_container_running() {
    let Some(_docker) = docker_or_skip("interruptions::docker_stop").await else {
        return;
    };
    let _daemon = berth_tests::DOCKERD.read().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let image = test_image();
    berth_ok(
        home,
        &[
            "create",
            "box",
            "--backend",
            "docker",
            "--image",
            &image,
            "--compress",
        ],
    );
    berth_ok(
        home,
        &[
            "exec",
            "box",
            "--",
            "dd if=/dev/urandom of=data.bin bs=1048576 count=300 2>/dev/null && sha256sum data.bin > data.sum",
        ],
    );
    berth_ok(home, &["stop", "box"]);
    let before = berth_state(home, "box").snapshot;
    let container = berth_tests::container_id(&berth_state(home, "box"));
    for (how, args) in [
        ("in-process", &["--no-server", "stop", "box"][..]),
        ("through the server", &["stop", "box"][..]),
    ] {
        let stop = spawn_berth(home, args);
        wait_until(
            &format!("{how}: the container paused"),
            Duration::from_secs(60),
            || berth_tests::container_paused(&container),
        );
        signal(&stop, libc::SIGINT);
        let (status, stderr) = finish(stop);
        assert_eq!(status.code(), Some(130), "{how}: {stderr}");
        wait_until(
            &format!("{how}: the container running again"),
            Duration::from_secs(20),
            || !berth_tests::container_paused(&container),
        );
        assert_eq!(
            berth_state(home, "box").snapshot.digest,
            before.digest,
            "{how}"
        );
        let echo = berth_ok(home, &["exec", "box", "--", "echo alive"]);
        assert_eq!(echo, "alive\n", "{how}");
    }
    berth_ok(home, &["stop", "box"]);
    let check = berth_ok(home, &["exec", "box", "--", "sha256sum -c data.sum"]);
    assert!(check.contains("OK"), "{check}");

    // The README's recovery: the container removed or stopped behind
    // Berth's back, then a command: it works, with no false warning about
    // the agent.
    for how in [["rm", "-f"], ["stop", "-t"]] {
        let container = berth_tests::container_id(&berth_state(home, "box"));
        let mut args = vec![how[0], how[1]];
        if how[0] == "stop" {
            args.push("1");
        }
        args.push(&container);
        assert!(Command::new("docker")
            .args(&args)
            .output()
            .unwrap()
            .status
            .success());
        let out = berth_in(home, &["exec", "box", "--", "sha256sum -c data.sum"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "docker {how:?}: {stderr}");
        assert!(
            !stderr.contains("agent cannot run"),
            "docker {how:?}: {stderr}"
        );
    }

    // `berth rm` while a command runs: the command's error says so.
    let running = spawn_berth(home, &["exec", "box", "--", "sleep 60"]);
    std::thread::sleep(Duration::from_secs(2));
    berth_ok(home, &["rm", "box"]);
    let (status, stderr) = finish(running);
    assert!(!status.success());
    assert!(
        stderr.contains("box was removed while the command ran"),
        "{stderr}"
    );
    berth_ok(home, &["server", "stop"]);
}

/// A create whose start fails (an image the engine lacks, pulls refused)
/// is not registered, through the CLI, the API and the Python client; the
/// same create then works with an image that is there. No lock file stays
/// for the names.
#[tokio::test]
async fn a_failed_create_is_not_registered_anywhere() {
    let Some(_docker) = docker_or_skip("interruptions::failed_create").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let missing = "berth-missing:never-there";
    let out = berth_in(
        home,
        &[
            "create",
            "box",
            "--backend",
            "docker",
            "--image",
            missing,
            "--pull",
            "never",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("box was not created"), "{stderr}");
    assert!(stderr.contains(missing), "{stderr}");
    // A name the engine cannot parse is said as such, not as a status code.
    let out = berth_in(
        home,
        &["create", "img", "--backend", "docker", "--image", "NoSuch"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("\"NoSuch\" is not an image reference") && !stderr.contains("status code"),
        "{stderr}"
    );
    let listed = berth_ok(home, &["ls", "--json"]);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&listed).unwrap(),
        serde_json::json!([])
    );
    berth_ok(
        home,
        &[
            "create",
            "box",
            "--backend",
            "docker",
            "--image",
            &test_image(),
        ],
    );
    berth_ok(home, &["rm", "box"]);

    // The API and the Python client: the same, and the retry works.
    berth_ok(home, &["server", "start"]);
    let script = format!(
        r#"
import sys
from berth_client import Berth, BerthError
b = Berth()
try:
    b.create("py", backend="docker", image={missing:?}, pull="never")
    sys.exit("the create succeeded")
except BerthError as e:
    assert "py was not created" in e.message, e.message
assert b.sandboxes() == [], b.sandboxes()
box = b.create("py", backend="docker", image={image:?})
assert box.exec("echo ok").stdout == "ok\n"
box.remove()
print("done")
"#,
        image = test_image()
    );
    let out = berth_tests::python_client(&[("BERTH_HOME", home)], &script);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("done"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    berth_ok(home, &["server", "stop"]);
    let left: Vec<_> = std::fs::read_dir(home.join("sandboxes"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in sandboxes/: {left:?}");
}
