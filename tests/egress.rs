//! Egress by policy, tried as a user would: `berth create --allow-host …`
//! in fresh processes, real tools (curl, wget, Python's urllib, openssl)
//! inside a confined local sandbox, and servers this test starts on the
//! host's loopback (test names resolve there through `--test-resolve`;
//! nothing is sent anywhere else: every other address a probe names is
//! refused before any connection is made, or has no route from the
//! sandbox at all).

use std::path::Path;
use std::time::{Duration, Instant};

use berth_tests::{berth_in, berth_ok};

use crate::egress_support::{certificate, log, server, sh, verdict_of};

#[test]
fn a_confined_sandbox_reaches_what_its_policy_allows_and_nothing_else() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let scratch = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(scratch.path());
    let https = server(Some((&cert, &key)));
    let http = server(None);
    let unlisted_port = {
        // A port no rule's CIDR allows: a name resolving to loopback on
        // it is refused (the rebinding guard).
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (hp, sp) = (http.port.to_string(), https.port.to_string());
    let allow = |host: &str, port: &str| format!("{host}:{port}");
    let args: Vec<String> = [
        "create".to_string(),
        "e".into(),
        "--allow-host".into(),
        allow("a.pkg.test", &sp),
        "--allow-host".into(),
        allow("a.pkg.test", &hp),
        "--allow-host".into(),
        allow("lo.pkg.test", &unlisted_port.to_string()),
        "--allow-host".into(),
        "meta.pkg.test".into(),
        "--allow-host".into(),
        allow("*.pkg.test", &sp),
        "--deny-host".into(),
        "denied.pkg.test".into(),
        "--allow-cidr".into(),
        format!("127.0.0.0/8:{sp}"),
        "--allow-cidr".into(),
        format!("127.0.0.0/8:{hp}"),
        "--test-resolve".into(),
        "meta.pkg.test=169.254.169.254".into(),
        "--test-resolve".into(),
        "*.pkg.test=127.0.0.1".into(),
    ]
    .into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    berth_ok(home, &args);
    let ca = std::fs::read_to_string(&cert).unwrap();
    let state = berth_tests::berth_state(home, "e");
    let root = berth_tests::local_root(&state);
    std::fs::write(root.join("ca.pem"), &ca).unwrap();

    // Allowed: curl and Python over HTTPS (CONNECT, SNI checked), wget
    // over plain HTTP, each through the proxy variables Berth set.
    let (code, out) = sh(
        home,
        "e",
        &format!("curl -sS --cacert ca.pem https://a.pkg.test:{sp}/"),
    );
    assert_eq!(
        (code, out.as_str()),
        (0, format!("hello from a.pkg.test:{sp}\n").as_str())
    );
    let (code, out) = sh(
        home,
        "e",
        &format!(
            "python3 -c 'import ssl, urllib.request; print(urllib.request.urlopen(\"https://a.pkg.test:{sp}/\", context=ssl.create_default_context(cafile=\"ca.pem\")).read().decode(), end=\"\")'"
        ),
    );
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from a.pkg.test:{sp}").as_str())
    );
    let (code, out) = sh(
        home,
        "e",
        &format!("wget -t 1 -qO- http://a.pkg.test:{hp}/"),
    );
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from a.pkg.test:{hp}").as_str())
    );

    // A deny rule wins over the wildcard that allows the name.
    let (code, _) = sh(
        home,
        "e",
        &format!("curl -fsS --cacert ca.pem https://denied.pkg.test:{sp}/"),
    );
    assert_ne!(code, 0);
    let (verdict, why) = verdict_of(home, "e", "denied.pkg.test");
    assert_eq!(verdict, "denied");
    assert!(why.contains("--deny-host denied.pkg.test"), "{why}");

    // A name no rule lists.
    let (code, _) = sh(
        home,
        "e",
        &format!("wget -t 1 -qO- http://other.pkg.test:{hp}/"),
    );
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "e", "other.pkg.test").0, "denied");

    // SNI naming another host than the tunnel's.
    let (_, out) = sh(
        home,
        "e",
        &format!(
            "echo | openssl s_client -proxy 127.0.0.1:3128 -connect a.pkg.test:{sp} -servername evil.example.com 2>&1 | head -20"
        ),
    );
    assert!(
        !out.contains("BEGIN CERTIFICATE") && !out.contains("Server certificate"),
        "{out}"
    );
    let (verdict, why) = verdict_of(home, "e", "a.pkg.test");
    assert_eq!(verdict, "denied", "{why}");
    assert!(why.contains("evil.example.com"), "{why}");

    // IP literals no CIDR rule holds, names resolving into loopback on a
    // port no CIDR rule allows, and into the metadata address.
    let (code, _) = sh(
        home,
        "e",
        "curl -fsS -m 5 http://169.254.169.254/latest/meta-data/",
    );
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "e", "169.254.169.254").0, "denied");
    let (code, _) = sh(
        home,
        "e",
        &format!("curl -fsS -m 5 http://lo.pkg.test:{unlisted_port}/"),
    );
    assert_ne!(code, 0);
    let (verdict, why) = verdict_of(home, "e", "lo.pkg.test");
    assert_eq!(verdict, "denied");
    assert!(
        why.contains("127.0.0.1") && why.contains("loopback"),
        "{why}"
    );
    let (code, _) = sh(home, "e", "curl -fsS -m 5 http://meta.pkg.test/");
    assert_ne!(code, 0);
    let (_, why) = verdict_of(home, "e", "meta.pkg.test");
    assert!(why.contains("169.254.169.254"), "{why}");

    // A redirect from an allowed host to a denied one stops there.
    let (code, out) = sh(
        home,
        "e",
        &format!(
            "curl -sS -L -o /dev/null -w '%{{http_code}}' http://a.pkg.test:{hp}/redirect?to=http://denied.pkg.test:{hp}/"
        ),
    );
    assert!(code != 0 || out.contains("403"), "{code} {out}");
    assert_eq!(verdict_of(home, "e", "denied.pkg.test").0, "denied");

    // Tools that ignore the proxy reach nothing, at once: raw TCP to the
    // host's loopback server and to another address, and UDP.
    let started = Instant::now();
    let (code, out) = sh(
        home,
        "e",
        &format!(
            "python3 -c '
import socket
for addr in [(\"127.0.0.1\", {sp}), (\"10.255.255.1\", 443)]:
    try:
        socket.create_connection(addr, timeout=10)
        print(\"CONNECTED\", addr)
    except OSError as e:
        print(\"refused\", addr, e)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b\"x\", (\"10.255.255.1\", 53))
    print(\"SENT-UDP\")
except OSError as e:
    print(\"no udp\", e)
'"
        ),
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        !out.contains("CONNECTED") && !out.contains("SENT-UDP"),
        "{out}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the direct attempts took {:?}: they must fail at once",
        started.elapsed()
    );

    // The policy changed while the sandbox runs: counts from the next
    // connection, and is kept in its state.
    let (code, _) = sh(
        home,
        "e",
        &format!("wget -t 1 -qO- http://b.pkg.test:{hp}/"),
    );
    assert_ne!(code, 0);
    berth_ok(
        home,
        &["egress", "e", "--allow-host", &allow("b.pkg.test", &hp)],
    );
    let (code, out) = sh(
        home,
        "e",
        &format!("wget -t 1 -qO- http://b.pkg.test:{hp}/"),
    );
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from b.pkg.test:{hp}").as_str())
    );
    let state = berth_tests::berth_state(home, "e");
    let kept = serde_json::to_string(&state.egress.as_ref().unwrap().settings.policy).unwrap();
    assert!(kept.contains(&format!("b.pkg.test:{hp}")), "{kept}");

    // The human view names the rules and the log.
    let view = berth_ok(home, &["egress", "e"]);
    assert!(view.contains("deny hosts:  denied.pkg.test"), "{view}");
    assert!(view.contains("--deny-host denied.pkg.test"), "{view}");

    // The daemon killed (a host reboot, an OOM): the next command starts
    // it again with the policy the state keeps, and the log it last saved
    // (every 2 s when it changed: waited for here).
    let dir = state.egress.as_ref().unwrap().dir.clone();
    let logged_before = log(home, "e")["connections"].as_array().unwrap().len();
    let saved = dir.join("connections.json");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(&saved)
        .ok()
        .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
        .map_or(0, |v| v["connections"].as_array().map_or(0, Vec::len))
        < logged_before
    {
        assert!(Instant::now() < deadline, "the log was not saved");
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = daemon_pid(&dir);
    // SAFETY: a signal to the daemon this test's sandbox started.
    unsafe { libc::kill(before, libc::SIGKILL) };
    let (code, out) = sh(
        home,
        "e",
        &format!("wget -t 1 -qO- http://b.pkg.test:{hp}/"),
    );
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from b.pkg.test:{hp}").as_str())
    );
    assert_ne!(daemon_pid(&dir), before);
    let after = log(home, "e");
    assert_eq!(
        after["connections"].as_array().unwrap().len(),
        logged_before + 1,
        "the log did not survive the daemon: {after:#}"
    );

    // Removed with the sandbox: the daemon and its directory go.
    berth_ok(home, &["rm", "e", "--force"]);
    assert!(!dir.exists(), "{dir:?} is left behind");
}

/// The pid of the egress daemon serving `dir` (from its control socket's
/// status, through the library).
fn daemon_pid(dir: &Path) -> i32 {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let state = berth::egress::EgressState {
        settings: Default::default(),
        dir: dir.to_path_buf(),
    };
    runtime.block_on(berth::egress::status(&state)).unwrap().pid as i32
}

#[test]
fn a_policy_is_refused_where_it_cannot_be_enforced() {
    let home = tempfile::tempdir().unwrap();
    let out = berth_in(
        home.path(),
        &[
            "create",
            "open",
            "-o",
            "isolation=none",
            "--allow-host",
            "a.pkg.test",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("isolation none") && err.contains("nothing was created"),
        "{err}"
    );
    assert!(berth_in(home.path(), &["inspect", "open"]).status.code() != Some(0));

    // Test names are for .test only.
    let out = berth_in(
        home.path(),
        &[
            "create",
            "t",
            "--allow-host",
            "example.com",
            "--test-resolve",
            "example.com=127.0.0.1",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not under .test"), "{err}");
}

#[test]
fn a_fork_is_held_to_its_sources_policy_by_a_daemon_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let home = home.as_path();
    let manifest = berth_tests::fs_store_manifest(dir.path(), &dir.path().join("store"));
    let snapshot = format!("remote:{}", manifest.display());
    let http = server(None);
    let hp = http.port.to_string();
    berth_ok(
        home,
        &[
            "create",
            "src",
            "--snapshot",
            &snapshot,
            "--dedup",
            "--allow-host",
            &format!("a.pkg.test:{hp}"),
            "--allow-cidr",
            &format!("127.0.0.0/8:{hp}"),
            "--test-resolve",
            "*.pkg.test=127.0.0.1",
        ],
    );
    berth_ok(home, &["exec", "src", "--", "echo kept > note"]);
    berth_ok(home, &["stop", "src"]);
    berth_ok(home, &["fork", "src", "f"]);
    let (source, fork) = (
        berth_tests::berth_state(home, "src"),
        berth_tests::berth_state(home, "f"),
    );
    let (source, fork) = (source.egress.unwrap(), fork.egress.unwrap());
    assert_eq!(fork.settings, source.settings);
    assert_ne!(fork.dir, source.dir);

    let get = |name: &str, host: &str| {
        sh(
            home,
            name,
            &format!("cat note && wget -t 1 -qO- http://{host}:{hp}/"),
        )
    };
    let (code, out) = get("f", "a.pkg.test");
    assert_eq!(
        (code, out.as_str()),
        (0, format!("kept\nhello from a.pkg.test:{hp}\n").as_str())
    );
    assert_ne!(get("f", "b.pkg.test").0, 0);
    // Each keeps its own policy from here: a change to the source is not
    // the fork's.
    berth_ok(
        home,
        &["egress", "src", "--allow-host", &format!("b.pkg.test:{hp}")],
    );
    assert_eq!(get("src", "b.pkg.test").0, 0);
    assert_ne!(get("f", "b.pkg.test").0, 0);
    assert_eq!(verdict_of(home, "f", "b.pkg.test").0, "denied");
    berth_ok(home, &["rm", "f", "--force"]);
    berth_ok(home, &["rm", "src", "--force"]);
}
