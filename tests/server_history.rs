//! Generations through the server: checkpoints after every command on the
//! sandbox the server holds open, history, diff, named checkpoints and
//! rewinds over the API — and a rewind made behind the server's back.

use super::*;
use crate::dedup::random::{manifest_ns, paths_differing, random_edit};
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

/// A collected exec through the API, which must exit 0; its checkpoint's
/// generation (the reply's `checkpoint`).
async fn exec_checkpointed(client: &Client, name: &str, command: &str) -> Option<u64> {
    let reply = client
        .post(
            &format!("/v1/sandboxes/{name}/exec"),
            serde_json::json!({ "command": command }),
        )
        .await
        .ok()
        .json();
    assert_eq!(reply["exit_code"], 0, "{command}: {reply:#}");
    let checkpoint = &reply["checkpoint"];
    assert!(checkpoint["error"].is_null(), "{command}: {reply:#}");
    checkpoint["generation"].as_u64()
}

/// The promise of server-side checkpoints, over seeded random edits: each
/// command of a checkpointing sandbox is followed by a generation written
/// on the server's open sandbox before the reply (collected or streamed),
/// and recorded with its command line; every kept generation rewinds —
/// over the API, or by the CLI in its own process behind the server's open
/// sandbox — to exactly the workspace as it was when that command ended
/// (times to the nanosecond, the root's too); `diff` names the paths two
/// neighbours differ by; a rewind is undone by rewinding to what it
/// saved; a generation not kept is refused and changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_on_the_server_rewind_to_every_step_exactly() {
    use rand::{Rng, SeedableRng};
    for seed in seeds(&[4, 5]) {
        println!("server checkpoints: seed {seed} (BERTH_DEDUP_SEEDS={seed} replays it)");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let served = Served::start(&[]);
        let client = served.client();
        let manifest = berth_tests::fs_store_manifest(served.home(), &served.home().join("store"));
        client
            .post(
                "/v1/sandboxes",
                serde_json::json!({
                    "name": "c",
                    "snapshot": format!("remote:{}", manifest.display()),
                    "checkpoint_each_exec": true,
                }),
            )
            .await
            .ok();
        let record = client.get("/v1/sandboxes/c").await.ok().json();
        assert_eq!(record["checkpoint_each_exec"], true, "{record:#}");
        let root = root_of(&client, "c").await;
        let first = exec_checkpointed(
            &client,
            "c",
            "mkdir -p tree/small tree/d/e && head -c 300000 /dev/urandom > tree/a.bin && printf hello > tree/b.txt \
             && printf in > tree/d/e/f && truncate -s 1M tree/sparse && for i in 1 2 3; do printf $i > tree/small/f$i; done",
        )
        .await;
        let mut steps = vec![(first.unwrap(), manifest_ns(&root))];
        for step in 1..6 {
            let edits: Vec<String> = (0..rng.gen_range(1..4))
                .map(|k| random_edit(&mut rng, step * 10 + k))
                .collect();
            let script = edits.join(" && ");
            let generation = if step % 2 == 0 {
                exec_checkpointed(&client, "c", &script).await
            } else {
                // Streamed: the exit line carries the checkpoint.
                let lines = client.exec_lines("c", &script).await;
                let (_, err, code) = collect(&lines);
                assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&err));
                match lines.last() {
                    Some(ExecLine::Exit {
                        checkpoint: Some(c),
                        ..
                    }) => c.generation,
                    other => panic!("seed {seed}: no checkpoint on the exit line: {other:?}"),
                }
            };
            steps.push((generation.unwrap(), manifest_ns(&root)));
        }
        let numbers: Vec<u64> = steps.iter().map(|(g, _)| *g).collect();
        assert!(
            numbers.windows(2).all(|w| w[1] == w[0] + 1),
            "seed {seed}: {numbers:?}"
        );

        // History: every step, with its command line.
        let history = client.get("/v1/sandboxes/c/history").await.ok().json();
        let listed: Vec<u64> = history["generations"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["note"]["kind"] == "exec")
            .map(|g| g["number"].as_u64().unwrap())
            .collect();
        assert_eq!(listed, numbers, "seed {seed}: {history:#}");
        assert_eq!(history["current"].as_u64(), numbers.last().copied());

        // Each checkpoint's reply went before its tidying; the server does
        // that next (removing the journal each stop with new packs wrote).
        let store = served.home().join("store");
        let journals = || {
            std::fs::read_dir(&store)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(".journal"))
                .count()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while journals() > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(journals(), 0, "seed {seed}: a checkpoint's journal stayed");

        // Diff between neighbours: what their trees differ by (times and
        // link counts aside, as the index records them).
        for pair in steps.windows(2) {
            let expected = paths_differing(&pair[0].1, &pair[1].1);
            let diff = client
                .get(&format!(
                    "/v1/sandboxes/c/diff?from={}&to={}",
                    pair[0].0, pair[1].0
                ))
                .await
                .ok()
                .json();
            let got: Vec<String> = diff["paths"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["path"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(
                got, expected,
                "seed {seed}: diff {} {}",
                pair[0].0, pair[1].0
            );
        }

        // A named checkpoint of a change made through the files API.
        let live_change = client
            .send(
                Method::PUT,
                "/v1/sandboxes/c/files/content?path=named.txt",
                full("named\n"),
            )
            .await
            .ok();
        drop(live_change);
        let named = client
            .post(
                "/v1/sandboxes/c/checkpoint",
                serde_json::json!({"message": "by name"}),
            )
            .await
            .ok()
            .json();
        let named_generation = named["generation"].as_u64().unwrap();
        assert_eq!(named_generation, numbers.last().unwrap() + 1);
        let live = manifest_ns(&root);

        // Rewind over the API to a random step: exactly that workspace.
        let (target, expected) = steps[rng.gen_range(0..steps.len() - 1)].clone();
        let rewound = client
            .post(
                "/v1/sandboxes/c/rewind",
                serde_json::json!({"generation": target}),
            )
            .await
            .ok()
            .json();
        let saved_as = rewound["saved_as"].as_u64().unwrap();
        let root = root_of(&client, "c").await;
        assert_eq!(
            manifest_ns(&root),
            expected,
            "seed {seed}: rewind to {target}"
        );
        // The open sandbox is the rewound one: a command sees it (and,
        // checkpointing, descends from it).
        let seen = client
            .post(
                "/v1/sandboxes/c/exec",
                serde_json::json!({"command": "test -e named.txt && echo yes || echo no", "checkpoint": false}),
            )
            .await
            .ok()
            .json();
        assert_eq!(seen["stdout"], "no\n", "{seen:#}");
        assert!(seen["checkpoint"].is_null(), "{seen:#}");

        // Undone by the CLI in its own process, behind the server's open
        // sandbox: the server sees the state change and opens it afresh.
        let out = Command::new(berth_bin())
            .env("BERTH_HOME", served.home())
            .env("BERTH_NO_SERVER", "1")
            .args(["rewind", "c", &saved_as.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let root = root_of(&client, "c").await;
        assert_eq!(manifest_ns(&root), live, "seed {seed}: undo to {saved_as}");
        let seen = client
            .post(
                "/v1/sandboxes/c/exec",
                serde_json::json!({"command": "cat named.txt", "checkpoint": false}),
            )
            .await
            .ok()
            .json();
        assert_eq!(seen["stdout"], "named\n", "{seen:#}");

        // A generation never written: refused, nothing changed.
        let refused = client
            .post(
                "/v1/sandboxes/c/rewind",
                serde_json::json!({"generation": 999}),
            )
            .await;
        assert_eq!(refused.status, StatusCode::NOT_FOUND);
        assert_eq!(refused.code(), "generation_not_kept");
        assert_eq!(manifest_ns(&root_of(&client, "c").await), live);

        // The history records the named checkpoint and the rewinds.
        let history = client.get("/v1/sandboxes/c/history").await.ok().json();
        let kinds: Vec<String> = history["generations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["note"]["kind"].as_str().unwrap_or("stop").to_string())
            .collect();
        assert!(
            kinds.iter().any(|k| k == "checkpoint") && kinds.iter().any(|k| k == "before-rewind"),
            "seed {seed}: {kinds:?}"
        );
        client
            .send(Method::DELETE, "/v1/sandboxes/c", full(Bytes::new()))
            .await
            .ok();
    }
}

/// A sandbox that does not keep generations: a checkpoint is refused with
/// a clear error (nothing is written), and its commands take none.
#[tokio::test]
async fn a_checkpoint_without_generations_is_refused_clearly() {
    let served = Served::start(&[]);
    let client = served.client();
    client
        .post("/v1/sandboxes", serde_json::json!({"name": "plain"}))
        .await
        .ok();
    let reply = client
        .post("/v1/sandboxes/plain/checkpoint", serde_json::json!({}))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.json());
    let message = reply.json()["error"]["message"].to_string();
    assert!(message.contains("generations"), "{message}");
    let ran = client
        .post(
            "/v1/sandboxes/plain/exec",
            serde_json::json!({"command": "true"}),
        )
        .await
        .ok()
        .json();
    assert!(ran["checkpoint"].is_null(), "{ran:#}");
    let history = client.get("/v1/sandboxes/plain/history").await;
    assert_eq!(history.status, StatusCode::BAD_REQUEST);
}

/// What the workspace holds, as the crash test compares it.
const LISTING: &str = "sha256sum big.bin marker keep/*";

/// A collected exec through the API that must exit 0; its stdout.
async fn exec_ok(client: &Client, name: &str, command: &str) -> String {
    let reply = client
        .post(
            &format!("/v1/sandboxes/{name}/exec"),
            serde_json::json!({ "command": command, "checkpoint": false }),
        )
        .await
        .ok()
        .json();
    assert_eq!(reply["exit_code"], 0, "{command}: {reply:#}");
    reply["stdout"].as_str().unwrap().to_string()
}

/// A trial's change: the marker, 1 MiB of `big.bin` and a new small file.
fn trial_change(trial: u32) -> String {
    format!(
        "echo {trial} > marker && dd if=/dev/urandom of=big.bin bs=1048576 count=1 seek={} conv=notrunc 2>/dev/null \
         && head -c 20000 /dev/urandom > keep/f{trial}",
        trial % 32
    )
}

/// The server SIGKILLed at random points of a checkpoint (seeded;
/// `BERTH_CRASH_SEED` replays): every time, the server that starts next
/// reads the sandbox, its history's newest generation restores whole (a
/// fork of it) to either the workspace of the last checkpoint that
/// answered or that of the one killed — never a mix — and checkpoints go
/// on afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_killed_mid_checkpoint_leaves_the_old_or_the_new_generation_whole() {
    const TRIALS: u32 = 10;
    let seed = berth_tests::seed("BERTH_CRASH_SEED", "server crash mid-checkpoint");
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let mut served = Served::start(&[]);
    let manifest = berth_tests::fs_store_manifest(served.home(), &served.home().join("store"));
    let client = served.client();
    client
        .post(
            "/v1/sandboxes",
            serde_json::json!({
                "name": "k",
                "snapshot": format!("remote:{}", manifest.display()),
                "dedup_keep": 50,
            }),
        )
        .await
        .ok();
    exec_ok(
        &client,
        "k",
        "head -c 33554432 /dev/urandom > big.bin && echo 0 > marker && mkdir keep \
         && for i in $(seq 1 40); do head -c 20000 /dev/urandom > keep/f$i; done",
    )
    .await;
    client
        .post("/v1/sandboxes/k/checkpoint", serde_json::json!({}))
        .await
        .ok();
    // The kills are spread over a checkpoint like the trials' (the first
    // one stores everything, and takes far longer).
    exec_ok(&client, "k", &trial_change(0)).await;
    let started = Instant::now();
    client
        .post("/v1/sandboxes/k/checkpoint", serde_json::json!({}))
        .await
        .ok();
    let checkpoint_time = started.elapsed();
    let mut committed = exec_ok(&client, "k", LISTING).await;
    let (mut killed, mut answered) = (0, 0);
    for trial in 1..=TRIALS {
        exec_ok(&client, "k", &trial_change(trial)).await;
        let attempted = exec_ok(&client, "k", LISTING).await;
        let spread = checkpoint_time.as_micros() as u64 * 3 / 2;
        let delay = Duration::from_micros(rand::Rng::gen_range(&mut rng, 0..=spread));
        let asker = client.clone();
        let checkpoint = tokio::spawn(async move {
            asker
                .send_raw(
                    Method::POST,
                    "/v1/sandboxes/k/checkpoint",
                    &[],
                    full(r#"{"message":"killed?"}"#),
                )
                .await
                .map(|r| r.status())
        });
        tokio::time::sleep(delay).await;
        served.kill_and_restart();
        match checkpoint.await.unwrap() {
            Ok(status) if status.is_success() => answered += 1,
            _ => killed += 1,
        }
        // The next server reads the sandbox and lists its history.
        let history = client.get("/v1/sandboxes/k/history").await.ok().json();
        let newest = history["generations"]
            .as_array()
            .and_then(|g| g.last())
            .and_then(|g| g["number"].as_u64())
            .unwrap_or_else(|| panic!("trial {trial}: no generations: {history:#}"));
        client
            .post(
                "/v1/sandboxes/k/fork",
                serde_json::json!({ "name": "check", "generation": newest }),
            )
            .await
            .ok();
        let restored = exec_ok(&client, "check", LISTING).await;
        client
            .send(Method::DELETE, "/v1/sandboxes/check", full(Bytes::new()))
            .await
            .ok();
        assert!(
            restored == committed || restored == attempted,
            "trial {trial} (delay {delay:?}): generation {newest} is neither the last \
             checkpoint that answered nor the one killed:\n{restored}\ncommitted:\n{committed}\nattempted:\n{attempted}"
        );
        // The live workspace is untouched by the kill.
        assert_eq!(exec_ok(&client, "k", LISTING).await, attempted);
        committed = restored;
    }
    println!(
        "{TRIALS} trials, a checkpoint takes {checkpoint_time:?}: {killed} killed, {answered} answered first"
    );
    assert!(
        killed > 0,
        "no kill landed before a checkpoint answered: nothing here tested a torn checkpoint"
    );
    // Checkpoints go on: a new one restores to the workspace now.
    let now = exec_ok(&client, "k", LISTING).await;
    let after = client
        .post(
            "/v1/sandboxes/k/checkpoint",
            serde_json::json!({ "message": "after the crashes" }),
        )
        .await
        .ok()
        .json();
    let generation = after["generation"].as_u64().unwrap();
    client
        .post(
            "/v1/sandboxes/k/fork",
            serde_json::json!({ "name": "last", "generation": generation }),
        )
        .await
        .ok();
    assert_eq!(exec_ok(&client, "last", LISTING).await, now);
}
