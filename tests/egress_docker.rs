//! Egress by policy on Docker, as a user would: the CLI in fresh
//! processes, busybox's wget and nc in the container, a server this test
//! starts on the host's loopback (reached only through the egress point,
//! which runs on the host). The policy survives `docker rm -f`.

use std::time::{Duration, Instant};

use berth_tests::{berth_ok, berth_state, container_id, docker_or_skip, test_image};

use crate::egress_support::{server, sh, verdict_of};

#[tokio::test(flavor = "multi_thread")]
async fn a_docker_sandbox_reaches_what_its_policy_allows_across_a_container_loss() {
    if docker_or_skip("a_docker_sandbox_reaches_what_its_policy_allows")
        .await
        .is_none()
    {
        return;
    }
    tokio::task::spawn_blocking(docker_sandbox_with_a_policy)
        .await
        .unwrap();
}

fn docker_sandbox_with_a_policy() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let http = server(None);
    let hp = http.port.to_string();
    let image = test_image();
    berth_ok(
        home,
        &[
            "create",
            "d",
            "--backend",
            "docker",
            "--image",
            &image,
            "--allow-host",
            &format!("a.pkg.test:{hp}"),
            "--allow-cidr",
            &format!("127.0.0.0/8:{hp}"),
            "--test-resolve",
            "*.pkg.test=127.0.0.1",
        ],
    );
    let get = |host: &str| format!("wget -qO- http://{host}:{hp}/");
    let (code, out) = sh(home, "d", &get("a.pkg.test"));
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from a.pkg.test:{hp}").as_str())
    );
    let (code, _) = sh(home, "d", &get("b.pkg.test"));
    assert_ne!(code, 0);
    assert_eq!(verdict_of(home, "d", "b.pkg.test").0, "denied");

    // No route but the egress point: raw TCP fails at once, to the
    // host's server too.
    let started = Instant::now();
    let (code, out) = sh(
        home,
        "d",
        &format!("nc -w 3 10.255.255.1 80 </dev/null; echo rc=$?; nc -w 3 127.0.0.1 {hp} </dev/null; echo rc=$?"),
    );
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // The container lost: the next command makes it again, bridged, and
    // the policy (changed first) holds.
    berth_ok(
        home,
        &["egress", "d", "--allow-host", &format!("b.pkg.test:{hp}")],
    );
    let container = container_id(&berth_state(home, "d"));
    let out = std::process::Command::new("docker")
        .args(["rm", "-f", &container])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, out) = sh(home, "d", &get("b.pkg.test"));
    assert_eq!(
        (code, out.trim()),
        (0, format!("hello from b.pkg.test:{hp}").as_str())
    );
    let (code, _) = sh(home, "d", &get("c.pkg.test"));
    assert_ne!(code, 0);
    assert_ne!(container_id(&berth_state(home, "d")), container);

    // A network and a policy together are refused: the policy would
    // bound nothing.
    let out = berth_tests::berth_in(
        home,
        &[
            "create",
            "n",
            "--backend",
            "docker",
            "--image",
            &image,
            "-o",
            "network=bridge",
            "--allow-host",
            "a.pkg.test",
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("network") && err.contains("nothing was created"),
        "{err}"
    );

    berth_ok(home, &["rm", "d", "--force"]);
}
