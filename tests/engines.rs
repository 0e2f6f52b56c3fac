//! Several engines, for real: the second dockerd `cargo xtask setup`
//! starts (mutual TLS on a loopback port), the local registry holding the
//! test image, and the s3-store on Garage as the shared snapshot store.
//! Everything goes through the CLI in fresh processes, as a user would.
//!
//! The tests share the second engine (one stops its daemon), so they run
//! one at a time.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use berth_tests::{
    berth_bin, berth_ok, berth_state, engine2_or_skip, s3_manifest, s3_or_skip, Engine2,
};

static ENGINE2: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ENGINE2.lock().unwrap_or_else(|p| p.into_inner())
}

/// `berth ARGS` in a fresh process with extra environment.
fn berth_env(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(berth_bin());
    cmd.env("BERTH_HOME", home).env("RUST_LOG", "berth=warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(args).output().unwrap()
}

fn ok(out: Output, what: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{what} failed: {stdout}{stderr}");
    (stdout, stderr)
}

fn failed(out: Output, what: &str) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{what} should have failed: {stderr}");
    stderr
}

/// `docker -H socket ARGS` against the second engine.
fn docker2(e: &Engine2, args: &[&str]) -> Output {
    Command::new("docker")
        .args(["-H", &e.socket])
        .args(args)
        .output()
        .unwrap()
}

fn engine2_answers(e: &Engine2) -> bool {
    docker2(e, &["version"]).status.success()
}

/// Starts the second engine again (as setup did) and waits for it.
fn start_engine2(e: &Engine2) {
    if engine2_answers(e) {
        return;
    }
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&e.log)
        .unwrap();
    berth_tests::start_detached(&e.start, log);
    let t = Instant::now();
    while !engine2_answers(e) {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "the second engine did not come back; see {}",
            e.log
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Stops the second engine's daemon entirely and waits until it is gone.
fn stop_engine2(e: &Engine2) {
    let pid: i32 = std::fs::read_to_string(&e.pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "dockerd {pid} did not stop"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Brings the second engine back when a test stopped it and then failed.
struct EngineBack<'a>(&'a Engine2);

impl Drop for EngineBack<'_> {
    fn drop(&mut self) {
        start_engine2(self.0);
    }
}

/// Every regular file's digest, a line each, sorted (`sha256sum`).
const MANIFEST: &str = "find . -type f | sort | xargs sha256sum; find . | sort; readlink link";

#[test]
fn a_tls_engine_is_reached_by_endpoint_and_by_context_and_a_wrong_ca_is_refused() {
    let Some(e) = engine2_or_skip("a_tls_engine_is_reached_by_endpoint_and_by_context") else {
        return;
    };
    let _serial = serial();
    start_engine2(&e);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let tls = [
        ("DOCKER_TLS_VERIFY", "1"),
        ("DOCKER_CERT_PATH", e.certs.as_str()),
    ];
    ok(
        berth_env(
            &home,
            &[
                "create",
                "t",
                "--backend",
                "docker",
                "--engine",
                &e.tls,
                "--image",
                &e.image,
            ],
            &tls,
        ),
        "create over TLS",
    );
    // A fresh process without the TLS environment reaches the same engine:
    // the state recorded it (the certificate directory, never the keys).
    let (out, _) = ok(
        berth_env(&home, &["exec", "t", "--", "echo hi"], &[]),
        "exec",
    );
    assert_eq!(out, "hi\n");
    let state = berth_state(&home, "t");
    let json = state.to_json().unwrap();
    assert_eq!(state.backend.fields["engine"], e.tls.as_str());
    assert_eq!(state.backend.fields["engine_cert_path"], e.certs.as_str());
    assert!(
        !json.contains("PRIVATE KEY") && !json.contains("BEGIN"),
        "{json}"
    );
    let id = berth_tests::container_id(&state);
    assert!(docker2(&e, &["inspect", &id]).status.success());

    // The same engine as a Docker context.
    let config = dir.path().join("docker-config");
    let name = "berth-remote";
    let hash = Command::new("sh")
        .args([
            "-c",
            &format!("printf %s {name} | sha256sum | cut -d' ' -f1"),
        ])
        .output()
        .unwrap();
    let hash = String::from_utf8(hash.stdout).unwrap().trim().to_string();
    let meta = config.join("contexts/meta").join(&hash);
    let tls_dir = config.join("contexts/tls").join(&hash).join("docker");
    std::fs::create_dir_all(&meta).unwrap();
    std::fs::create_dir_all(&tls_dir).unwrap();
    std::fs::write(
        meta.join("meta.json"),
        format!(
            r#"{{"Name":"{name}","Metadata":{{}},"Endpoints":{{"docker":{{"Host":"{}","SkipTLSVerify":false}}}}}}"#,
            e.tls
        ),
    )
    .unwrap();
    for f in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::copy(Path::new(&e.certs).join(f), tls_dir.join(f)).unwrap();
    }
    let config_env = [("DOCKER_CONFIG", config.to_str().unwrap())];
    ok(
        berth_env(
            &home,
            &[
                "create",
                "c",
                "--backend",
                "docker",
                "--engine",
                name,
                "--image",
                &e.image,
            ],
            &config_env,
        ),
        "create through a context",
    );
    let (out, _) = ok(
        berth_env(&home, &["exec", "c", "--", "echo context"], &config_env),
        "exec through a context",
    );
    assert_eq!(out, "context\n");
    assert_eq!(berth_state(&home, "c").backend.fields["engine"], name);
    // The current context of the config, with no --engine at all.
    std::fs::write(
        config.join("config.json"),
        format!(r#"{{"currentContext":"{name}"}}"#),
    )
    .unwrap();
    ok(
        berth_env(
            &home,
            &["create", "cc", "--backend", "docker", "--image", &e.image],
            &config_env,
        ),
        "create with the current context",
    );
    assert_eq!(berth_state(&home, "cc").backend.fields["engine"], name);

    // A wrong CA, a missing certificate, an unknown context: each names
    // the engine and what to fix, and creates nothing.
    let wrong = [
        ("DOCKER_TLS_VERIFY", "1"),
        ("DOCKER_CERT_PATH", e.wrong_ca.as_str()),
    ];
    let err = failed(
        berth_env(
            &home,
            &[
                "create",
                "w",
                "--backend",
                "docker",
                "--engine",
                &e.tls,
                "--image",
                &e.image,
            ],
            &wrong,
        ),
        "create with a wrong CA",
    );
    assert!(
        err.contains(&format!("engine {}", e.tls)) && err.contains("not signed by the CA"),
        "{err}"
    );
    let missing = [
        ("DOCKER_TLS_VERIFY", "1"),
        ("DOCKER_CERT_PATH", "/nonexistent"),
    ];
    let err = failed(
        berth_env(
            &home,
            &[
                "create",
                "m",
                "--backend",
                "docker",
                "--engine",
                &e.tls,
                "--image",
                &e.image,
            ],
            &missing,
        ),
        "create without certificates",
    );
    assert!(err.contains("/nonexistent/ca.pem is missing"), "{err}");
    let err = failed(
        berth_env(
            &home,
            &[
                "create",
                "u",
                "--backend",
                "docker",
                "--engine",
                "no-such-context",
                "--image",
                &e.image,
            ],
            &config_env,
        ),
        "create with an unknown context",
    );
    assert!(
        err.contains("no Docker context named \"no-such-context\""),
        "{err}"
    );
    for n in ["w", "m", "u"] {
        assert!(!home.join("sandboxes").join(format!("{n}.json")).exists());
    }
    for n in ["t", "c", "cc"] {
        ok(berth_env(&home, &["rm", n], &config_env), "rm");
    }
    berth_tests::assert_gone(&docker2(&e, &["inspect", &id]), "the container");
}

#[test]
fn images_are_pulled_from_the_registry_and_pull_never_refuses() {
    let Some(e) = engine2_or_skip("images_are_pulled_from_the_registry") else {
        return;
    };
    let _serial = serial();
    start_engine2(&e);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A container left by another test would keep the image's layers
    // (rmi would only untag it, and the pull would fetch nothing).
    let users = docker2(
        &e,
        &["ps", "-aq", "--filter", &format!("ancestor={}", e.image)],
    );
    for id in String::from_utf8_lossy(&users.stdout).split_whitespace() {
        let _ = docker2(&e, &["rm", "-f", id]);
    }
    let _ = docker2(&e, &["rmi", "-f", &e.image]);
    berth_tests::assert_gone(&docker2(&e, &["image", "inspect", &e.image]), "the image");
    let create = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "create",
            name,
            "--backend",
            "docker",
            "--engine",
            &e.socket,
            "--image",
            &e.image,
        ];
        args.extend_from_slice(extra);
        berth_env(&home, &args, &[])
    };
    let err = failed(create("never", &["--pull", "never"]), "--pull never");
    assert!(
        err.contains(&format!(
            "image {} is not on the engine {}",
            e.image, e.socket
        )) && err.contains("`never`"),
        "{err}"
    );
    berth_tests::assert_gone(&docker2(&e, &["image", "inspect", &e.image]), "the image");
    // The failed create left no sandbox to remove.
    let (listed, _) = ok(berth_env(&home, &["ls", "--json"], &[]), "ls");
    assert_eq!(listed.trim(), "[]", "{listed}");

    let (_, err) = ok(create("pulled", &[]), "create with a pull");
    assert!(
        err.contains(&format!("pulled {}: 1 layer, ", e.image)),
        "{err}"
    );
    assert!(docker2(&e, &["image", "inspect", &e.image])
        .status
        .success());
    let (out, _) = ok(
        berth_env(&home, &["exec", "pulled", "--", "echo ok"], &[]),
        "exec",
    );
    assert_eq!(out, "ok\n");
    // A removed container is re-created on resume, and its image pulled
    // again when the engine lost it too.
    let id = berth_tests::container_id(&berth_state(&home, "pulled"));
    assert!(docker2(&e, &["rm", "-f", &id]).status.success());
    assert!(docker2(&e, &["rmi", "-f", &e.image]).status.success());
    let out = berth_env(&home, &["exec", "pulled", "--", "echo back"], &[]);
    let (stdout, err) = ok(out, "exec after the container and image were removed");
    assert_eq!(stdout, "back\n");
    assert!(err.contains(&format!("pulled {}", e.image)), "{err}");
    // Present now: `missing` does not pull again, `always` does.
    let (_, err) = ok(create("again", &[]), "create, image present");
    assert!(!err.contains("pulled"), "{err}");
    let (_, err) = ok(create("always", &["--pull", "always"]), "--pull always");
    assert!(err.contains("pulled"), "{err}");

    let missing = format!("{}/berth-test:no-such-tag", e.registry);
    let err = failed(
        berth_env(
            &home,
            &[
                "create",
                "nothing",
                "--backend",
                "docker",
                "--engine",
                &e.socket,
                "--image",
                &missing,
            ],
            &[],
        ),
        "a tag the registry lacks",
    );
    assert!(
        err.contains(&format!(
            "pulling image {missing} from registry {}",
            e.registry
        )) && err.contains("not found"),
        "{err}"
    );
    for n in ["pulled", "again", "always"] {
        ok(berth_env(&home, &["rm", n], &[]), "rm");
    }
}

#[test]
fn a_local_directory_snapshot_does_not_move_to_another_engine() {
    let Some(e) = engine2_or_skip("a_local_directory_snapshot_does_not_move") else {
        return;
    };
    let _serial = serial();
    start_engine2(&e);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    berth_ok(
        &home,
        &[
            "create",
            "l",
            "--backend",
            "docker",
            "--engine",
            &e.socket,
            "--image",
            &e.image,
        ],
    );
    berth_ok(&home, &["exec", "l", "--", "echo kept > f"]);
    let before = berth_state(&home, "l");
    let err = failed(
        berth_env(
            &home,
            &["start", "l", "--engine", "unix:///var/run/docker.sock"],
            &[],
        ),
        "moving a local-directory snapshot",
    );
    assert!(
        err.contains("cannot move the sandbox") && err.contains("--snapshot remote:MANIFEST"),
        "{err}"
    );
    // Nothing changed: same engine, same container, same workspace.
    assert_eq!(berth_state(&home, "l"), before);
    assert_eq!(berth_ok(&home, &["exec", "l", "--", "cat f"]), "kept\n");
    berth_ok(&home, &["rm", "l"]);
}

/// The issue's scenario: stop on engine A (the second engine) with the
/// s3-store on Garage, stop A's daemon entirely, resume on engine B (the
/// first), byte-identical; A back, `berth rm` removes the orphan. Then
/// the other way, with A alive: the unsaved work on B is persisted before
/// B's container goes.
#[test]
fn a_sandbox_moves_to_another_engine_when_its_engine_is_gone() {
    let Some(e) = engine2_or_skip("a_sandbox_moves_to_another_engine") else {
        return;
    };
    let Some(s3) = s3_or_skip("a_sandbox_moves_to_another_engine") else {
        return;
    };
    let _serial = serial();
    start_engine2(&e);
    let _back = EngineBack(&e);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let prefix = format!("move-{}-{}/", std::process::id(), rand::random::<u32>());
    let manifest = s3_manifest(dir.path(), &s3, &prefix);
    let snapshot = format!("remote:{}", manifest.display());
    let tls = [
        ("DOCKER_TLS_VERIFY", "1"),
        ("DOCKER_CERT_PATH", e.certs.as_str()),
    ];
    ok(
        berth_env(
            &home,
            &[
                "create",
                "mv",
                "--snapshot",
                &snapshot,
                "--backend",
                "docker",
                "--engine",
                &e.tls,
                "--image",
                &e.image,
            ],
            &tls,
        ),
        "create on A",
    );
    berth_ok(
        &home,
        &[
            "exec",
            "mv",
            "--",
            "mkdir -p d/e && head -c 3000000 /dev/urandom > d/big.bin && printf 'x\\n' > d/e/small \
             && : > empty && ln -s d/e/small link && chmod 751 d/e",
        ],
    );
    let want = berth_ok(&home, &["exec", "mv", "--", MANIFEST]);
    berth_ok(&home, &["stop", "mv"]);
    let on_a = berth_tests::container_id(&berth_state(&home, "mv"));

    stop_engine2(&e);
    let (_, err) = ok(
        berth_env(
            &home,
            &["start", "mv", "--engine", "unix:///var/run/docker.sock"],
            &[],
        ),
        "start on B",
    );
    assert!(err.contains("orphan"), "{err}");
    let state = berth_state(&home, "mv");
    assert_eq!(
        state.backend.fields["engine"],
        "unix:///var/run/docker.sock"
    );
    assert_eq!(state.orphans.len(), 1, "{state:?}");
    assert_eq!(berth_ok(&home, &["exec", "mv", "--", MANIFEST]), want);
    assert_eq!(
        berth_ok(&home, &["exec", "mv", "--", "stat -c %a d/e"]),
        "751\n"
    );
    let ls = berth_ok(&home, &["ls"]);
    assert!(ls.contains(&on_a[..12]) && ls.contains(&e.tls), "{ls}");
    // While A is down, rm keeps the sandbox and says why.
    let err = failed(berth_env(&home, &["rm", "mv"], &[]), "rm with A down");
    assert!(err.contains("still there") && err.contains(&e.tls), "{err}");

    start_engine2(&e);
    assert!(docker2(&e, &["inspect", &on_a]).status.success());
    // Back to A while it answers again: B's unsaved work is persisted
    // first, the orphan on A removed, B's container removed.
    berth_ok(&home, &["exec", "mv", "--", "echo after-move > d/new"]);
    let want = berth_ok(&home, &["exec", "mv", "--", MANIFEST]);
    let on_b = berth_tests::container_id(&berth_state(&home, "mv"));
    ok(
        berth_env(&home, &["start", "mv", "--engine", &e.tls], &tls),
        "start on A again",
    );
    let state = berth_state(&home, "mv");
    assert!(state.orphans.is_empty(), "{state:?}");
    berth_tests::assert_gone(&docker2(&e, &["inspect", &on_a]), "the orphan");
    let b_gone = Command::new("docker")
        .args(["inspect", &on_b])
        .output()
        .unwrap();
    berth_tests::assert_gone(&b_gone, "B's container");
    assert_eq!(berth_ok(&home, &["exec", "mv", "--", MANIFEST]), want);
    berth_ok(&home, &["rm", "mv"]);
}

#[test]
fn rm_removes_the_orphan_once_its_engine_is_back() {
    let Some(e) = engine2_or_skip("rm_removes_the_orphan_once_its_engine_is_back") else {
        return;
    };
    let Some(s3) = s3_or_skip("rm_removes_the_orphan_once_its_engine_is_back") else {
        return;
    };
    let _serial = serial();
    start_engine2(&e);
    let _back = EngineBack(&e);
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let prefix = format!("orphan-{}-{}/", std::process::id(), rand::random::<u32>());
    let manifest = s3_manifest(dir.path(), &s3, &prefix);
    let snapshot = format!("remote:{}", manifest.display());
    berth_ok(
        &home,
        &[
            "create",
            "o",
            "--snapshot",
            &snapshot,
            "--backend",
            "docker",
            "--engine",
            &e.socket,
            "--image",
            &e.image,
        ],
    );
    berth_ok(&home, &["exec", "o", "--", "echo saved > f"]);
    berth_ok(&home, &["stop", "o"]);
    let on_a = berth_tests::container_id(&berth_state(&home, "o"));
    stop_engine2(&e);
    ok(
        berth_env(
            &home,
            &["start", "o", "--engine", "unix:///var/run/docker.sock"],
            &[],
        ),
        "start on B",
    );
    assert_eq!(berth_ok(&home, &["exec", "o", "--", "cat f"]), "saved\n");
    start_engine2(&e);
    assert!(docker2(&e, &["inspect", &on_a]).status.success());
    let out = berth_ok(&home, &["rm", "o"]);
    assert!(out.contains("removed orphan"), "{out}");
    berth_tests::assert_gone(&docker2(&e, &["inspect", &on_a]), "the orphan");
    assert!(!home.join("sandboxes/o.json").exists());
}
