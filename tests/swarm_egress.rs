//! Egress by policy and secrets on the swarm (part of the `swarm` test
//! binary), as a user would: the CLI in fresh processes, busybox's wget
//! and nc in the task's container on a fixture node, servers this test
//! starts on the host's loopback (reached only through the egress point on
//! this host, over the tunnel the agent keeps). The policy survives a
//! change, the loss of the sandbox's node and a fork.

use std::time::{Duration, Instant};

use super::*;
use crate::egress_support::{berth, ca_and_certificate, ok, server, verdict_of};

#[test]
fn a_swarm_sandbox_reaches_what_its_policy_allows_across_a_node_loss_and_a_fork() {
    let _serial = serial();
    let Some(s) = setup("a_swarm_sandbox_reaches_what_its_policy_allows_across_a_node_loss") else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let (roots, cert, key) = ca_and_certificate(scratch.path());
    let http = server(None);
    let https = server(Some((&cert, &key)));
    let (hp, tp) = (http.port.to_string(), https.port.to_string());
    let value = format!("sk-swarm-{:016x}", rand::random::<u64>());
    std::fs::write(scratch.path().join("key.txt"), &value).unwrap();
    let api = format!("api.pkg.test:{tp}");

    // Off the leader, so losing its node costs no election.
    let leader = s.swarm.leader();
    let leader_id = s.swarm.ids[s.swarm.nodes.iter().position(|n| *n == leader).unwrap()].clone();
    let snapshot = format!("remote:{}", s.manifest.display());
    let image = test_image();
    let home = s.home();
    let run = |args: &[&str]| berth(home, &roots, args);
    ok(
        run(&[
            "create",
            "e",
            "--backend",
            "swarm",
            "--engine",
            &s.swarm.manager,
            "--image",
            &image,
            "--snapshot",
            &snapshot,
            "--dedup",
            "-o",
            &format!("constraint=node.id!={leader_id}"),
            "--allow-host",
            &format!("a.pkg.test:{hp}"),
            "--allow-host",
            &api,
            "--allow-cidr",
            &format!("127.0.0.0/8:{hp}"),
            "--allow-cidr",
            &format!("127.0.0.0/8:{tp}"),
            "--test-resolve",
            "*.pkg.test=127.0.0.1",
            "--secret",
            &format!("K=@{}", scratch.path().join("key.txt").display()),
            "--secret-hosts",
            &format!("K={api}"),
        ]),
        "create",
    );
    let sh = |name: &str, script: &str| {
        let out = run(&["exec", name, "--", script]);
        (
            out.status.code().unwrap_or(-1),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let get = |name: &str, host: &str| sh(name, &format!("wget -qO- http://{host}:{hp}/"));
    let hello = |host: &str| (0, format!("hello from {host}:{hp}"));
    let trimmed = |(code, out): (i32, String)| (code, out.trim().to_string());

    // What the policy allows, and nothing else.
    assert_eq!(trimmed(get("e", "a.pkg.test")), hello("a.pkg.test"));
    let (code, _) = get("e", "b.pkg.test");
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "e", "b.pkg.test").0, "denied");
    let started = Instant::now();
    let (code, out) = sh(
        "e",
        &format!("nc -w 3 10.255.255.1 80 </dev/null; echo rc=$?; nc -w 3 127.0.0.1 {hp} </dev/null; echo rc=$?"),
    );
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // Connections at once, each carried whole.
    let (code, out) = sh(
        "e",
        &format!("for i in $(seq 24); do wget -qO- http://a.pkg.test:{hp}/ & done; wait"),
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| *l == format!("hello from a.pkg.test:{hp}"))
            .count(),
        24,
        "{out}"
    );

    // The secret reaches its host only, and is nowhere in the container;
    // the sandbox trusts the point's CA through the bundle it was given.
    let auth = |name: &str, host: &str| {
        sh(
            name,
            &format!("wget -qO- --header \"Authorization: Bearer $K\" https://{host}/auth"),
        )
    };
    assert_eq!(
        trimmed(auth("e", &api)),
        (0, format!("auth=Bearer {value}"))
    );
    let (_, other) = auth("e", &format!("a.pkg.test:{tp}"));
    assert!(!other.contains(&value), "{other}");
    let reversed: String = value.chars().rev().collect();
    let (code, out) = sh(
        "e",
        &format!(
            "printf %s '{reversed}' | rev > /tmp/needle; grep -rlsf /tmp/needle --exclude=needle / --exclude-dir=proc --exclude-dir=sys; env | grep -cf /tmp/needle; grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\""
        ),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0, "{out}");
    assert_eq!(lines.first(), Some(&"0"), "the value was found: {out}");
    assert!(
        lines.get(1).and_then(|n| n.parse::<u32>().ok()) >= Some(1),
        "{out}"
    );

    // Changed while it runs, kept in the state: across the node's loss…
    ok(
        run(&["egress", "e", "--allow-host", &format!("b.pkg.test:{hp}")]),
        "egress change",
    );
    assert_eq!(trimmed(get("e", "b.pkg.test")), hello("b.pkg.test"));
    ok(run(&["exec", "e", "--", "echo kept > marker"]), "write");
    ok(run(&["stop", "e"]), "stop");
    let node = s.node_of("e");
    assert_ne!(node, leader);
    s.swarm.kill_daemon(&node);
    // (The first command after the loss also says where it was placed.)
    let (code, out) = sh("e", "cat marker");
    assert_eq!((code, out.lines().next()), (0, Some("kept")), "{out}");
    assert_ne!(s.node_of("e"), node, "the sandbox did not move");
    assert_eq!(trimmed(get("e", "b.pkg.test")), hello("b.pkg.test"));
    let (code, _) = get("e", "c.pkg.test");
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "e", "c.pkg.test").0, "denied");
    assert_eq!(
        trimmed(auth("e", &api)),
        (0, format!("auth=Bearer {value}"))
    );
    s.swarm.start_daemon(&node);

    // …and a fork (of a deduplicated snapshot's generation), which gets a
    // point of its own with the same policy.
    ok(run(&["stop", "e"]), "stop");
    ok(run(&["fork", "e", "f"]), "fork");
    assert_eq!(trimmed(get("f", "b.pkg.test")), hello("b.pkg.test"));
    let (code, _) = get("f", "c.pkg.test");
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "f", "c.pkg.test").0, "denied");

    // A network and a policy together are refused: the policy would bound
    // nothing.
    let out = s.try_create(
        "n",
        &["-o", "network=berth-test", "--allow-host", "a.pkg.test"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("network") && err.contains("nothing was created"),
        "{err}"
    );
    s.swarm.wait_all_ready(Duration::from_secs(120));
    s.remove_all(&["e".to_string(), "f".to_string()]);
}
