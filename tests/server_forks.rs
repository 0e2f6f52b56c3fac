//! Live forks through the server: a checkpoint of the running workspace,
//! then many children made and started from it at once.

use berth_tests::workspace_gen;

use super::*;
use crate::dedup::random::manifest_ns;
use crate::dedup::seeds;

/// The sandbox's workspace directory on this host (local backend).
async fn root_of(client: &Client, name: &str) -> PathBuf {
    let record = client
        .get(&format!("/v1/sandboxes/{name}"))
        .await
        .ok()
        .json();
    let state: berth::sandbox::SandboxState =
        serde_json::from_value(record["state"].clone()).unwrap();
    berth_tests::local_root(&state)
}

/// A collected exec through the API, which must exit 0; its stdout.
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

/// The promise of a live fork: while the parent keeps running, every
/// child starts with the parent's workspace as it was at the fork, entry
/// by entry (contents, modes, links, times to the nanosecond, the root's
/// too); what the parent writes next is not seen by any child, nor one
/// child's writes by the parent or another child; collecting the parent's
/// garbage keeps what the children need (a child re-created from its
/// store afterwards is still the fork point); a fork whose name is taken
/// is refused whole, before any checkpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_fork_gives_every_child_the_parents_workspace_now() {
    const CHILDREN: u32 = 10;
    let mib: u64 = std::env::var("BERTH_FORK_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    for seed in seeds(&[11]) {
        println!("live fork: seed {seed}, {mib} MiB (BERTH_DEDUP_SEEDS={seed} replays it)");
        let served = Served::start(&[]);
        let client = served.client();
        let store = served.home().join("store");
        let manifest = berth_tests::fs_store_manifest(served.home(), &store);
        client
            .post(
                "/v1/sandboxes",
                serde_json::json!({
                    "name": "p",
                    "snapshot": format!("remote:{}", manifest.display()),
                    "dedup_keep": 1,
                }),
            )
            .await
            .ok();
        run(&client, "p", &workspace_gen::script(seed, 4 << 20)).await;
        run(
            &client,
            "p",
            &format!(
                "head -c {}M /dev/urandom > big.bin && mkdir -p deep/er && echo x > deep/er/f",
                mib.saturating_sub(8).max(1)
            ),
        )
        .await;
        // A stop first: the fork's checkpoint then stores only what
        // changed since.
        client
            .post("/v1/sandboxes/p/stop", serde_json::json!({}))
            .await
            .ok();
        run(&client, "p", "echo changed-after-the-stop > after-stop.txt").await;
        let parent_root = root_of(&client, "p").await;
        let at_fork = manifest_ns(&parent_root);

        // A taken name refuses the whole fork, before a checkpoint.
        client
            .post(
                "/v1/sandboxes",
                serde_json::json!({"name": "c3", "start": false}),
            )
            .await
            .ok();
        let history = client.get("/v1/sandboxes/p/history").await.ok().json();
        let refused = client
            .post(
                "/v1/sandboxes/p/forks",
                serde_json::json!({"count": CHILDREN, "prefix": "c"}),
            )
            .await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.json());
        assert_eq!(
            client.get("/v1/sandboxes/p/history").await.ok().json(),
            history
        );
        client
            .send(Method::DELETE, "/v1/sandboxes/c3", full(Bytes::new()))
            .await
            .ok();

        let forked = client
            .post(
                "/v1/sandboxes/p/forks",
                serde_json::json!({"count": CHILDREN, "prefix": "c"}),
            )
            .await
            .ok()
            .json();
        println!(
            "live fork of {mib} MiB into {CHILDREN}: checkpoint {} ms, children {} ms",
            forked["checkpoint_ms"], forked["forks_ms"]
        );
        let names: Vec<String> = forked["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            (1..=CHILDREN).map(|i| format!("c{i}")).collect::<Vec<_>>()
        );

        // The parent keeps running, and writes on.
        run(&client, "p", "echo later > later.txt && rm -f big.bin").await;
        for name in &names {
            assert_eq!(
                manifest_ns(&root_of(&client, name).await),
                at_fork,
                "seed {seed}: {name} is not the parent at the fork"
            );
        }
        run(&client, "c1", "echo mine > mine.txt").await;
        assert_eq!(
            run(&client, "c2", "ls mine.txt later.txt 2>/dev/null || true").await,
            ""
        );
        assert_eq!(
            run(&client, "p", "ls mine.txt 2>/dev/null || true").await,
            ""
        );

        // The parent's garbage collected (its fork-point generation is
        // dropped by its next stop): a child re-created from its store
        // still comes back as the fork point.
        client
            .post("/v1/sandboxes/p/stop", serde_json::json!({}))
            .await
            .ok();
        berth_ok(served.home(), &["--no-server", "gc", "p"]);
        client
            .post("/v1/sandboxes/c5/shutdown", serde_json::json!({}))
            .await
            .ok();
        client
            .post("/v1/sandboxes/c5/start", serde_json::json!({}))
            .await
            .ok();
        assert_eq!(manifest_ns(&root_of(&client, "c5").await), at_fork);

        for name in names.iter().chain(["p".to_string()].iter()) {
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
}

/// The CLI's live fork, in its own process: `berth fork NAME --live
/// --count N --prefix P` (all children the workspace as it is now), and a
/// single live fork by name.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_forks_a_running_sandbox_live() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let store = h.join("store");
    let manifest = berth_tests::fs_store_manifest(h, &store);
    let here = |args: &[&str]| {
        let mut all = vec!["--no-server"];
        all.extend_from_slice(args);
        berth_ok(h, &all)
    };
    let snapshot = format!("remote:{}", manifest.display());
    here(&["create", "src", "--snapshot", &snapshot, "--dedup"]);
    here(&["exec", "src", "--", "echo now > now.txt"]);
    let out = here(&["fork", "src", "--live", "--count", "3", "--prefix", "k"]);
    assert!(out.contains("into 3") && out.contains("k1 k2 k3"), "{out}");
    for k in ["k1", "k2", "k3"] {
        assert_eq!(here(&["exec", k, "--", "cat now.txt"]), "now\n");
    }
    here(&["exec", "src", "--", "echo later > later.txt"]);
    here(&["fork", "src", "one", "--live"]);
    assert_eq!(here(&["exec", "one", "--", "cat later.txt"]), "later\n");
    let refused = berth_in(
        h,
        &[
            "--no-server",
            "fork",
            "src",
            "--count",
            "2",
            "--prefix",
            "k",
        ],
    );
    assert!(!refused.status.success());
    for name in ["k1", "k2", "k3", "one", "src"] {
        here(&["rm", name]);
    }
}
