//! Warm pools through the server: members made and kept open, claims
//! handed over with their workspace applied, refills, members killed
//! behind Berth's back replaced and never claimed, many claims at once
//! (each workspace fresh), a pool kept across a server restart, removal
//! leaving nothing — on the local backend and on Docker.

use std::collections::BTreeSet;

use super::*;

/// The pool's view, from the server.
async fn pool(client: &Client, name: &str) -> serde_json::Value {
    client.get(&format!("/v1/pools/{name}")).await.ok().json()
}

/// Waits until `pool` has `ready` members open in the server.
async fn wait_ready(client: &Client, name: &str, ready: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let view = pool(client, name).await;
        if view["ready"].as_u64() == Some(ready) {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "pool {name} never had {ready} ready: {view:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The members on record: name → their backend instance (container id,
/// or local directory).
fn members(home: &Path, pool: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(home.join("pools").join(pool))
        .into_iter()
        .flatten()
        .flatten()
    {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            let record: berth::sandbox::NamedSandbox =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            out.push((record.name.clone(), instance(&record.state)));
        }
    }
    out.sort();
    out
}

/// A sandbox's instance: its container id on Docker, its workspace
/// directory on the local backend.
fn instance(state: &berth::sandbox::SandboxState) -> String {
    match state.backend.kind.as_str() {
        "docker" => berth_tests::container_id(state),
        _ => berth_tests::local_root(state).display().to_string(),
    }
}

/// The sandbox's state, from the server.
async fn state_of(client: &Client, name: &str) -> berth::sandbox::SandboxState {
    let record = client
        .get(&format!("/v1/sandboxes/{name}"))
        .await
        .ok()
        .json();
    serde_json::from_value(record["state"].clone()).unwrap()
}

/// A collected exec's stdout; it must exit 0.
async fn run(client: &Client, name: &str, command: &str) -> String {
    let reply = client
        .post(
            &format!("/v1/sandboxes/{name}/exec"),
            serde_json::json!({ "command": command }),
        )
        .await
        .ok()
        .json();
    assert_eq!(reply["exit_code"], 0, "{name}: {command}: {reply:#}");
    reply["stdout"].as_str().unwrap_or_default().to_string()
}

/// A claim of `name` from `pool` with one file in its workspace; the
/// reply's `claimed`.
async fn claim(client: &Client, pool: &str, name: &str) -> serde_json::Value {
    let reply = client
        .post(
            "/v1/sandboxes",
            serde_json::json!({
                "name": name,
                "from_pool": pool,
                "workspace": {"entries": {"mine.txt": {"type": "file", "content": name}}},
            }),
        )
        .await
        .ok()
        .json();
    assert_eq!(reply["name"], name, "{reply:#}");
    reply["claimed"].clone()
}

/// The claimed sandbox holds its own file and nothing else: no other
/// task's data.
async fn assert_fresh(client: &Client, name: &str) {
    let listing = run(client, name, "ls -A").await;
    assert_eq!(listing, "mine.txt\n", "{name}'s workspace is not fresh");
    assert_eq!(run(client, name, "cat mine.txt").await, name);
}

/// The pool's backend settings for `kind`.
fn backend(kind: &str) -> serde_json::Value {
    match kind {
        "docker" => serde_json::json!({"type": "docker", "image": test_image()}),
        _ => serde_json::json!({"type": "local"}),
    }
}

/// The promise of a claim: a member that was started before the claim is
/// handed over whole (its instance becomes the claimed sandbox's), with
/// the claim's workspace and nothing else in it; the pool refills to its
/// size with new members; the claimed sandbox is no member any more; a
/// second claim gets another instance; removing the pool removes every
/// member and leaves claimed sandboxes running.
async fn claims_hand_over_warm_members(kind: &str) {
    let served = Served::start(&[]);
    let client = served.client();
    let h = served.home();
    client
        .post(
            "/v1/pools",
            serde_json::json!({"name": "p", "size": 2, "backend": backend(kind)}),
        )
        .await
        .ok();
    wait_ready(&client, "p", 2).await;
    let before = members(h, "p");
    assert_eq!(before.len(), 2, "{before:?}");

    let claimed = claim(&client, "p", "t1").await;
    assert_eq!(claimed["warm"], true, "{claimed:#}");
    let t1 = instance(&state_of(&client, "t1").await);
    assert!(
        before.iter().any(|(_, i)| *i == t1),
        "t1 runs on {t1}, which was no member: {before:?}"
    );
    assert_fresh(&client, "t1").await;

    // Refilled: two members again, none of them t1's instance.
    wait_ready(&client, "p", 2).await;
    let after = members(h, "p");
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|(_, i)| *i != t1), "{after:?}");

    let claimed = claim(&client, "p", "t2").await;
    assert_eq!(claimed["warm"], true, "{claimed:#}");
    let t2 = instance(&state_of(&client, "t2").await);
    assert_ne!(t1, t2);
    assert_fresh(&client, "t2").await;

    // A claim of a name that exists is refused and costs no member.
    let refused = client
        .post(
            "/v1/sandboxes",
            serde_json::json!({"name": "t1", "from_pool": "p"}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    // A claim that gives the template's fields is refused.
    let refused = client
        .post(
            "/v1/sandboxes",
            serde_json::json!({"name": "t9", "from_pool": "p", "image": "x"}),
        )
        .await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{}",
        refused.json()
    );

    wait_ready(&client, "p", 2).await;
    let last = members(h, "p");
    let removed = client
        .send(Method::DELETE, "/v1/pools/p", full(Bytes::new()))
        .await
        .ok()
        .json();
    assert_eq!(removed["members_removed"], 2, "{removed:#}");
    assert!(members(h, "p").is_empty());
    assert!(!h.join("pools").join("p.json").exists());
    for (_, gone) in &last {
        assert_instance_gone(kind, gone).await;
    }
    assert_eq!(
        client.get("/v1/pools/p").await.status,
        StatusCode::NOT_FOUND
    );
    // Claimed sandboxes are not members: they stay.
    assert_fresh(&client, "t1").await;
    for name in ["t1", "t2"] {
        client
            .send(
                Method::DELETE,
                &format!("/v1/sandboxes/{name}"),
                full(Bytes::new()),
            )
            .await
            .ok();
    }
}

/// A removed member's instance is gone: its container, or its directory.
async fn assert_instance_gone(kind: &str, instance: &str) {
    match kind {
        "docker" => {
            let docker = bollard::Docker::connect_with_defaults().unwrap();
            let found = docker
                .inspect_container(
                    instance,
                    None::<bollard::query_parameters::InspectContainerOptions>,
                )
                .await;
            assert!(found.is_err(), "container {instance} outlived its pool");
        }
        _ => assert!(
            !Path::new(instance).exists(),
            "{instance} outlived its pool"
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_hand_over_warm_members_on_local() {
    claims_hand_over_warm_members("local").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_hand_over_warm_members_on_docker() {
    if docker_or_skip("claims_hand_over_warm_members_on_docker")
        .await
        .is_none()
    {
        return;
    }
    claims_hand_over_warm_members("docker").await;
}

/// A member whose container is killed and removed behind Berth's back is
/// never claimed: claims made at once all get working sandboxes, none on
/// the killed container; the pool replaces it and is full again.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_killed_behind_berths_back_is_replaced_and_never_claimed() {
    let Some(docker) =
        docker_or_skip("a_member_killed_behind_berths_back_is_replaced_and_never_claimed").await
    else {
        return;
    };
    let served = Served::start(&[]);
    let client = served.client();
    let h = served.home();
    client
        .post(
            "/v1/pools",
            serde_json::json!({"name": "k", "size": 2, "backend": backend("docker")}),
        )
        .await
        .ok();
    wait_ready(&client, "k", 2).await;
    let (_, killed) = members(h, "k").remove(0);
    docker
        .remove_container(
            &killed,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    for name in ["a", "b"] {
        claim(&client, "k", name).await;
        assert_ne!(instance(&state_of(&client, name).await), killed);
        assert_fresh(&client, name).await;
    }
    wait_ready(&client, "k", 2).await;
    assert!(members(h, "k").iter().all(|(_, i)| *i != killed));
    client
        .send(Method::DELETE, "/v1/pools/k", full(Bytes::new()))
        .await
        .ok();
    for name in ["a", "b"] {
        client
            .send(
                Method::DELETE,
                &format!("/v1/sandboxes/{name}"),
                full(Bytes::new()),
            )
            .await
            .ok();
    }
}

/// Many claims at once from a small pool all succeed: warm members while
/// they last, then cold creates from the template (the reply says which);
/// no two claims share an instance and every workspace is fresh.
#[tokio::test(flavor = "multi_thread")]
async fn many_claims_at_once_all_succeed_each_fresh() {
    let served = Served::start(&[]);
    let client = served.client();
    client
        .post(
            "/v1/pools",
            serde_json::json!({"name": "m", "size": 8, "backend": backend("local")}),
        )
        .await
        .ok();
    wait_ready(&client, "m", 8).await;
    let names: Vec<String> = (0..50).map(|i| format!("c{i}")).collect();
    let claims = futures::future::join_all(names.iter().map(|name| {
        let client = client.clone();
        async move { claim(&client, "m", name).await }
    }))
    .await;
    let warm = claims.iter().filter(|c| c["warm"] == true).count();
    assert!(warm >= 8, "only {warm} of 50 claims got a warm sandbox");
    assert!(
        claims
            .iter()
            .filter(|c| c["warm"] == false)
            .all(|c| c["reason"].as_str().is_some_and(|r| !r.is_empty())),
        "{claims:#?}"
    );
    let mut instances = BTreeSet::new();
    for name in &names {
        assert!(instances.insert(instance(&state_of(&client, name).await)));
    }
    futures::future::join_all(names.iter().map(|name| {
        let client = client.clone();
        async move { assert_fresh(&client, name).await }
    }))
    .await;
    client
        .send(Method::DELETE, "/v1/pools/m", full(Bytes::new()))
        .await
        .ok();
}

/// A pool outlives its server: a server killed with SIGKILL and started
/// again opens the same members (none made anew) and claims from them.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_survives_a_server_restart() {
    let mut served = Served::start(&[]);
    let client = served.client();
    client
        .post(
            "/v1/pools",
            serde_json::json!({"name": "r", "size": 2, "backend": backend("local")}),
        )
        .await
        .ok();
    wait_ready(&client, "r", 2).await;
    let before = members(served.home(), "r");
    served.kill_and_restart();
    wait_ready(&client, "r", 2).await;
    assert_eq!(members(served.home(), "r"), before);
    let claimed = claim(&client, "r", "after").await;
    assert_eq!(claimed["warm"], true, "{claimed:#}");
    assert_fresh(&client, "after").await;
    client
        .send(Method::DELETE, "/v1/pools/r", full(Bytes::new()))
        .await
        .ok();
}

/// The CLI: `pool create` (settings as `create` takes them), `pool ls`,
/// `create --from-pool`, `pool rm` — through the server, and in its own
/// process with `--no-server` (the pool made full by its create and
/// refilled by each claim).
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_makes_claims_from_and_removes_pools() {
    // In-process.
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let here = |args: &[&str]| {
        let mut all = vec!["--no-server"];
        all.extend_from_slice(args);
        berth_ok(h, &all)
    };
    let made = here(&["pool", "create", "q", "--size", "2"]);
    assert!(made.contains("with 2 sandboxes started"), "{made}");
    let listed = here(&["pool", "ls"]);
    assert!(listed.contains("q") && listed.contains("local"), "{listed}");
    let claimed = here(&["create", "mine", "--from-pool", "q"]);
    assert!(
        claimed.contains("from pool q (a warm sandbox)"),
        "{claimed}"
    );
    assert_eq!(here(&["exec", "mine", "--", "ls -A | wc -l"]).trim(), "0");
    assert_eq!(members(h, "q").len(), 2, "the claim refilled the pool");
    let removed = here(&["pool", "rm", "q"]);
    assert!(removed.contains("2 sandboxes removed"), "{removed}");
    assert_eq!(here(&["exec", "mine", "--", "echo still"]), "still\n");
    here(&["rm", "mine"]);

    // Through a server the CLI starts.
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let made = berth_ok(h, &["pool", "create", "s", "--size", "1"]);
    assert!(made.contains("created pool s"), "{made}");
    let socket = h.join("berth.sock");
    let client = Client::Unix(socket);
    wait_ready(&client, "s", 1).await;
    let claimed = berth_ok(h, &["create", "x", "--from-pool", "s"]);
    assert!(
        claimed.contains("from pool s (a warm sandbox)"),
        "{claimed}"
    );
    assert_eq!(berth_ok(h, &["exec", "x", "--", "echo hi"]), "hi\n");
    let refused = berth_in(
        h,
        &["create", "y", "--from-pool", "s", "--backend", "docker"],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("takes the pool's template"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    berth_ok(h, &["pool", "rm", "s"]);
    berth_ok(h, &["rm", "x"]);
    berth_ok(h, &["server", "stop"]);
}
