//! Deduplicated snapshots (`--dedup`), through real compiled stores: a stop
//! uploads what changed; every kept generation restores identically; a
//! damaged or missing pack fails the restore before anything is extracted;
//! garbage collection removes what a killed stop left; forks share chunks.
//!
//! The promise over generated workspaces: for seeds (`BERTH_DEDUP_SEEDS`,
//! replayable), build a workspace, stop, change it, stop, change it, stop;
//! then restore each of the three generations, in a fresh resume, with and
//! without the pack cache, and compare the manifest read straight from the
//! host directory with the one taken before that generation's stop.

use std::path::Path;
use std::process::Command;

use berth::plugin::World;
use berth::sandbox::{BackendSpec, SandboxSpec, SandboxState, SnapshotSpec};
use berth::snapshot::DedupRecord;
use berth::workspace::WorkspaceSpec;
use berth_tests::workspace_gen::{self, MANIFEST};
use berth_tests::{
    berth_bin, berth_in, berth_ok, berth_state, docker_or_skip, fs_store_manifest, host_with_cache,
    local_root, s3_manifest, s3_or_skip, scratch_manifest, test_image,
};

/// The seeds `BERTH_DEDUP_SEEDS` names (comma-separated), else `default`.
pub(crate) fn seeds(default: &[u64]) -> Vec<u64> {
    berth_tests::seeds("BERTH_DEDUP_SEEDS", default)
}

fn sh_in(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn record(state: &SandboxState) -> DedupRecord {
    DedupRecord::from_fields(&state.snapshot.fields).expect("a deduplicated snapshot")
}

/// The objects in an fs-store directory (`<id>.tar` files).
fn objects(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".tar"))
                .map(String::from)
        })
        .collect();
    v.sort();
    v
}

fn packs(objects: &[String]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| o.starts_with("pk-"))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kept_generation_restores_identically_over_generated_workspaces() {
    for seed in seeds(&[1, 2, 3]) {
        println!("dedup generations: seed {seed}");
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let host = host_with_cache(&dir.path().join("compiled"));
        let scratch = dir.path().join("store");
        std::fs::create_dir_all(&scratch).unwrap();
        let plugin = host
            .load(scratch_manifest("fs_store", World::RemoteClient, &scratch))
            .await
            .unwrap();
        let spec = SnapshotSpec::loaded_plugin(plugin).deduplicated(3);
        let client = berth_tests::client_builder(&home).plugin_host(host).build();
        let mut sb = client
            .create(
                SandboxSpec::new(WorkspaceSpec::default())
                    .snapshot(spec.clone())
                    .backend(BackendSpec::local()),
            )
            .await
            .unwrap();
        sb.start().await.unwrap();
        let root = local_root(&sb.state());
        let mut manifests = Vec::new();
        for generation in 1..=3u64 {
            match generation {
                1 => {
                    sh_in(&root, &workspace_gen::script(seed, 8 << 20));
                }
                n => {
                    // Change it: top-level files go, a new tree arrives,
                    // and a big file grows if there is one.
                    sh_in(&root, "find . -maxdepth 1 -type f -exec rm -f {} +");
                    sh_in(&root, &format!("mkdir gen{n}"));
                    sh_in(
                        &root.join(format!("gen{n}")),
                        &workspace_gen::script(seed * 100 + n, 4 << 20),
                    );
                }
            }
            manifests.push(sh_in(&root, MANIFEST));
            sb.stop().await.unwrap();
            let r = record(&sb.state());
            assert_eq!(r.current, Some(generation), "seed {seed}");
            assert_eq!(r.last_stop.as_ref().unwrap().generation, generation);
        }
        let state = sb.state();
        assert_eq!(record(&state).generations.len(), 3);
        let mut state = state;
        for (i, generation) in [2u64, 1, 3, 1].into_iter().enumerate() {
            // Half the restores without the pack cache: from the store.
            let client = berth_tests::client_builder(&home)
                .pack_cache(if i % 2 == 0 {
                    None
                } else {
                    Some(berth::snapshot::PackCache::new(home.join("cache"), 1 << 30))
                })
                .build();
            let mut sb = client
                .resume(
                    SandboxState::from_json(&state.to_json().unwrap()).unwrap(),
                    Some(spec.clone()),
                    berth::sandbox::SandboxOptions::default(),
                )
                .await
                .unwrap();
            sb.shutdown().await.unwrap();
            sb.select_generation(generation).unwrap();
            sb.start().await.unwrap();
            let root = local_root(&sb.state());
            assert_eq!(
                sh_in(&root, MANIFEST),
                manifests[generation as usize - 1],
                "seed {seed}: generation {generation} did not come back identically"
            );
            state = sb.state();
        }
        // A generation that is not kept is refused by name.
        let mut sb = client
            .resume(state.clone(), Some(spec.clone()), Default::default())
            .await
            .unwrap();
        sb.shutdown().await.unwrap();
        let e = sb.select_generation(9).unwrap_err().to_string();
        assert!(
            e.contains("generation 9") && e.contains("kept: 1, 2, 3"),
            "{e}"
        );
    }
}

/// The four stops, on a smaller workspace, through the CLI and the
/// Wasm fs-store; what reached the store is counted in its directory.
#[test]
fn stops_upload_what_changed_and_restore_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    berth_ok(&home, &["create", "d", "--snapshot", &snapshot, "--dedup"]);
    berth_ok(
        &home,
        &[
            "exec",
            "d",
            "--",
            "head -c 24000000 /dev/urandom > big.bin && mkdir small && for i in $(seq 1 60); do head -c 20000 /dev/urandom > small/f$i; done",
        ],
    );
    berth_ok(&home, &["stop", "d"]);
    let first = record(&berth_state(&home, "d")).last_stop.unwrap();
    assert_eq!(first.new_chunks, first.chunks);
    let mib = 1u64 << 20;
    let scenarios: [(&str, &str, u64, u64); 4] = [
        ("no change", "true", 64 * 1024, 1),
        (
            "1 MiB appended to a large file",
            "head -c 1048576 /dev/urandom >> big.bin",
            4 * mib,
            4,
        ),
        (
            "1 MiB over 50 small files",
            "for i in $(seq 1 50); do head -c 20971 /dev/urandom > small/f$i; done",
            4 * mib,
            4,
        ),
        (
            "a new 10 MiB file",
            "head -c 10485760 /dev/urandom > new.bin",
            12 * mib,
            4,
        ),
    ];
    for (what, change, max_bytes, max_calls) in scenarios {
        berth_ok(&home, &["exec", "d", "--", change]);
        let before = objects(&store);
        berth_ok(&home, &["stop", "d"]);
        let after = objects(&store);
        let stats = record(&berth_state(&home, "d")).last_stop.unwrap();
        println!("{what}: {stats:?}");
        assert!(
            stats.uploaded_bytes <= max_bytes && stats.upload_calls <= max_calls,
            "{what}: uploaded {} bytes in {} calls",
            stats.uploaded_bytes,
            stats.upload_calls
        );
        let new: Vec<_> = after.iter().filter(|o| !before.contains(o)).collect();
        assert_eq!(
            new.len() as u64,
            stats.packs + 1,
            "{what}: new objects {new:?}"
        );
        // Keep 1: the previous index is gone, the journal too.
        assert_eq!(
            after.iter().filter(|o| o.ends_with(".idx")).count(),
            1,
            "{what}: {after:?}"
        );
        assert!(!after.iter().any(|o| o.ends_with(".journal")));
    }
    assert!(berth_ok(&home, &["gc", "d", "--dry-run"]).contains("would delete 0 packs"));

    // Restore from the store alone: workspace and cache gone.
    let want = berth_ok(&home, &["exec", "d", "--", MANIFEST]);
    berth_tests::remove_workspace(local_root(&berth_state(&home, "d")));
    std::fs::remove_dir_all(home.join("cache")).unwrap();
    let out = Command::new(berth_bin())
        .env("BERTH_HOME", &home)
        .env("BERTH_CACHE_MAX_BYTES", "0")
        .args(["exec", "d", "--", MANIFEST])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
    assert!(!home.join("cache").exists(), "the cache was off");
}

/// Runs `berth` with the pack cache off.
fn berth_uncached(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .env("BERTH_CACHE_MAX_BYTES", "0")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_missing_or_damaged_pack_fails_the_restore_and_extracts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    let ok = |args: &[&str]| {
        let out = berth_uncached(&home, args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    ok(&["create", "p", "--snapshot", &snapshot, "--dedup"]);
    ok(&[
        "exec",
        "p",
        "--",
        "head -c 70000000 /dev/urandom > a.bin && echo hi > b.txt",
    ]);
    ok(&["stop", "p"]);
    let all = packs(&objects(&store));
    assert!(all.len() >= 3, "{all:?}");
    let root = local_root(&berth_state(&home, "p"));

    // Delete one pack (not the first: the first ones may be fetched fine).
    let victim = store.join(format!("{}.tar", all[all.len() - 1]));
    let saved = std::fs::read(&victim).unwrap();
    std::fs::remove_file(&victim).unwrap();
    berth_tests::remove_workspace(&root);
    let out = berth_uncached(&home, &["start", "p"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("missing from the store") && err.contains(&all[all.len() - 1]),
        "{err}"
    );
    assert!(
        !root.exists() || std::fs::read_dir(&root).unwrap().next().is_none(),
        "a failed restore extracted something"
    );

    // Damage it instead: one flipped byte.
    let mut damaged = saved.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 1;
    std::fs::write(&victim, &damaged).unwrap();
    let out = berth_uncached(&home, &["start", "p"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("does not match its checksum"), "{err}");
    assert!(!root.exists() || std::fs::read_dir(&root).unwrap().next().is_none());

    // Put it back: the restore succeeds.
    std::fs::write(&victim, &saved).unwrap();
    ok(&["start", "p"]);
    assert_eq!(std::fs::read_to_string(root.join("b.txt")).unwrap(), "hi\n");
}

#[test]
fn forks_start_from_the_source_and_share_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    berth_ok(
        &home,
        &["create", "src", "--snapshot", &snapshot, "--dedup"],
    );
    berth_ok(
        &home,
        &[
            "exec",
            "src",
            "--",
            "head -c 30000000 /dev/urandom > data.bin && echo prepared > README",
        ],
    );
    // Forking before the first stop is refused with what to do.
    let out = berth_in(&home, &["fork", "src", "early"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stop it once before forking"));
    berth_ok(&home, &["stop", "src"]);
    let want = berth_ok(&home, &["exec", "src", "--", "sha256sum data.bin README"]);
    let packs_before = packs(&objects(&store)).len();
    for i in 0..3 {
        let name = format!("agent{i}");
        berth_ok(&home, &["fork", "src", &name]);
        assert_eq!(
            berth_ok(&home, &["exec", &name, "--", "sha256sum data.bin README"]),
            want
        );
        berth_ok(
            &home,
            &["exec", &name, "--", &format!("echo {i} > mine.txt")],
        );
        berth_ok(&home, &["stop", &name]);
        let stats = record(&berth_state(&home, &name)).last_stop.unwrap();
        assert!(
            stats.uploaded_bytes < 4 << 20,
            "a fork's first stop uploaded {} bytes",
            stats.uploaded_bytes
        );
    }
    // Each fork's stop added its new chunks' pack and the tree pack of
    // its one changed block of members.
    assert!(packs(&objects(&store)).len() <= packs_before + 6);
    // The source moves on and collects its garbage; the forked generation
    // is pinned, so the forks still restore.
    berth_ok(&home, &["exec", "src", "--", "rm data.bin"]);
    berth_ok(&home, &["stop", "src"]);
    berth_ok(&home, &["stop", "src"]);
    berth_ok(&home, &["gc"]);
    let root = local_root(&berth_state(&home, "agent1"));
    berth_tests::remove_workspace(&root);
    std::fs::remove_dir_all(home.join("cache")).unwrap();
    assert_eq!(
        berth_ok(
            &home,
            &[
                "exec",
                "agent1",
                "--",
                "sha256sum data.bin README; cat mine.txt"
            ]
        ),
        format!("{want}1\n")
    );
}

/// The same store contract, other languages: a stop, a deduplicated stop
/// and a restore through the C, Python and JavaScript example stores.
#[tokio::test(flavor = "multi_thread")]
async fn language_stores_hold_deduplicated_snapshots_unchanged() {
    for name in ["c-store", "py-store", "js-store"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let host = host_with_cache(&dir.path().join("compiled"));
        let manifest = berth_tests::language_store_manifest(name, &dir.path().join("data"));
        let plugin = host.load(manifest).await.unwrap();
        let spec = SnapshotSpec::loaded_plugin(plugin).deduplicated(1);
        let home = dir.path().join("home");
        let client = berth_tests::client_builder(&home)
            .plugin_host(host)
            .pack_cache(None)
            .build();
        let mut sb = client
            .create(SandboxSpec::new(WorkspaceSpec::default()).snapshot(spec.clone()))
            .await
            .unwrap();
        sb.start().await.unwrap();
        let ws = local_root(&sb.state());
        sh_in(&ws, "head -c 3000000 /dev/urandom > a.bin && echo x > b");
        sb.stop().await.unwrap();
        sh_in(&ws, "echo y >> b");
        sb.stop().await.unwrap();
        let stats = record(&sb.state()).last_stop.unwrap();
        assert!(stats.new_bytes < 1 << 20, "{name}: {stats:?}");
        let want = sh_in(&ws, MANIFEST);
        berth_tests::remove_workspace(&ws);
        let mut sb = client
            .resume(sb.state(), Some(spec), Default::default())
            .await
            .unwrap();
        sb.start().await.unwrap();
        assert_eq!(sh_in(&ws, MANIFEST), want, "{name}");
    }
}

/// The scenario (b) on the s3-store and a real 3-node Garage
/// cluster, with what reached the bucket counted by boto3.
#[test]
fn s3_store_on_garage_receives_only_what_changed() {
    let Some(s3) = s3_or_skip("s3_store_on_garage_receives_only_what_changed") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let prefix = format!("dedup-{}-{}/", std::process::id(), rand::random::<u32>());
    let manifest = s3_manifest(dir.path(), &s3, &prefix);
    let snapshot = format!("remote:{}", manifest.display());
    let count = || -> (u64, u64) {
        let script = format!(
            "import boto3\nc = boto3.client('s3', endpoint_url={:?}, region_name={:?}, aws_access_key_id={:?}, aws_secret_access_key={:?})\n\
             n = b = 0\nfor page in c.get_paginator('list_objects_v2').paginate(Bucket={:?}, Prefix={:?}):\n    for o in page.get('Contents', []):\n        n += 1; b += o['Size']\nprint(n, b)\n",
            s3.endpoint, s3.region, s3.key_id, s3.secret, s3.bucket, prefix
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(out.status.success(), "boto3: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let mut it = text.split_whitespace().map(|x| x.parse::<u64>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    berth_ok(&home, &["create", "g", "--snapshot", &snapshot, "--dedup"]);
    berth_ok(
        &home,
        &["exec", "g", "--", "head -c 40000000 /dev/urandom > big.bin"],
    );
    berth_ok(&home, &["stop", "g"]);
    let (objects1, bytes1) = count();
    berth_ok(
        &home,
        &["exec", "g", "--", "head -c 1048576 /dev/urandom >> big.bin"],
    );
    berth_ok(&home, &["stop", "g"]);
    let (objects2, bytes2) = count();
    let stats = record(&berth_state(&home, "g")).last_stop.unwrap();
    println!("garage: {objects1} objects {bytes1} bytes, then {objects2} objects {bytes2} bytes; {stats:?}");
    assert!(
        stats.uploaded_bytes <= 4 << 20 && stats.upload_calls <= 4,
        "{stats:?}"
    );
    // One new pack, the new index in place of the old one.
    assert_eq!(objects2, objects1 + 1);
    assert!(bytes2 <= bytes1 + (4 << 20), "{bytes1} -> {bytes2}");
    let want = berth_ok(&home, &["exec", "g", "--", "sha256sum big.bin"]);
    berth_tests::remove_workspace(local_root(&berth_state(&home, "g")));
    let out = berth_uncached(&home, &["exec", "g", "--", "sha256sum big.bin"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
}

/// Docker: a removed container comes back from a deduplicated snapshot.
#[tokio::test(flavor = "multi_thread")]
async fn docker_sandbox_resumes_from_deduplicated_generations() {
    if docker_or_skip("docker_sandbox_resumes_from_deduplicated_generations")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = fs_store_manifest(dir.path(), &store);
    let snapshot = format!("remote:{}", manifest.display());
    let image = test_image();
    berth_ok(
        &home,
        &[
            "create",
            "dk",
            "--snapshot",
            &snapshot,
            "--dedup",
            "--backend",
            "docker",
            "--image",
            &image,
        ],
    );
    berth_ok(
        &home,
        &[
            "exec",
            "dk",
            "--",
            "head -c 5000000 /dev/urandom > a.bin && echo 1 > n",
        ],
    );
    berth_ok(&home, &["stop", "dk"]);
    berth_ok(&home, &["exec", "dk", "--", "echo 2 > n"]);
    berth_ok(&home, &["stop", "dk"]);
    let stats = record(&berth_state(&home, "dk")).last_stop.unwrap();
    assert!(stats.new_bytes < 1 << 20, "{stats:?}");
    let want = berth_ok(&home, &["exec", "dk", "--", "sha256sum a.bin; cat n"]);
    let id = berth_tests::container_id(&berth_state(&home, "dk"));
    assert!(Command::new("docker")
        .args(["rm", "-f", &id])
        .status()
        .unwrap()
        .success());
    assert_eq!(
        berth_ok(&home, &["exec", "dk", "--", "sha256sum a.bin; cat n"]),
        want
    );
    berth_ok(&home, &["rm", "dk"]);
}

/// A store that turns into one answering every download with an endless
/// stream (and claiming to hold everything) is cut off at the index cap;
/// nothing is extracted and the error says which object and why.
#[test]
fn a_store_that_streams_forever_is_cut_off_at_the_index_cap() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let manifest = fs_store_manifest(dir.path(), &dir.path().join("store"));
    let snapshot = format!("remote:{}", manifest.display());
    berth_ok(&home, &["create", "f", "--snapshot", &snapshot, "--dedup"]);
    berth_ok(&home, &["exec", "f", "--", "echo hi > a.txt"]);
    berth_ok(&home, &["stop", "f"]);
    // The manifest the state names now loads the faulty store.
    std::fs::write(
        &manifest,
        format!(
            "name = \"faulty\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n[config]\nfault = \"endless-download\"\n[grants]\ndeadline_secs = 300\n",
            berth_tests::guest("faulty_store")
        ),
    )
    .unwrap();
    let root = local_root(&berth_state(&home, "f"));
    berth_tests::remove_workspace(&root);
    let started = std::time::Instant::now();
    let out = berth_uncached(&home, &["start", "f"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(".g1.idx") && err.contains("larger than the 134217728 bytes an index may be"),
        "{err}"
    );
    assert!(!root.exists() || std::fs::read_dir(&root).unwrap().next().is_none());
    println!("cut off after {:?}", started.elapsed());
}

#[path = "dedup_random.rs"]
pub(crate) mod random;

#[path = "dedup_killed_stop.rs"]
mod killed_stop;

/// A sandbox that checkpoints every command keeps a history to go back
/// through without being told to (its newest 50 generations), says so at
/// create and in `inspect`, and rewinds to any step of it.
#[test]
fn a_checkpointing_sandbox_keeps_a_history_by_default_and_rewinds_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let manifest = berth_tests::fs_store_manifest(dir.path(), &dir.path().join("store"));
    let snapshot = format!("remote:{}", manifest.display());
    let out = berth_tests::berth_in(
        &home,
        &[
            "create",
            "c",
            "--snapshot",
            &snapshot,
            "--dedup",
            "--checkpoint",
            "each-exec",
        ],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("keeps its newest 50 generations"), "{said}");
    for step in 1..=3 {
        berth_tests::berth_ok(
            &home,
            &[
                "exec",
                "c",
                "--",
                &format!("echo step{step} > step; echo {step} >> log"),
            ],
        );
    }
    let history: serde_json::Value =
        serde_json::from_str(&berth_tests::berth_ok(&home, &["history", "c", "--json"])).unwrap();
    let steps: Vec<(u64, String)> = history["generations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| {
            Some((
                g["number"].as_u64()?,
                g["note"]["command"].as_str()?.to_string(),
            ))
        })
        .collect();
    assert_eq!(steps.len(), 3, "{history:#}");
    let inspect: serde_json::Value =
        serde_json::from_str(&berth_tests::berth_ok(&home, &["inspect", "c"])).unwrap();
    assert!(inspect.to_string().contains("\"keep\":50"), "{inspect:#}");
    let first = steps.iter().find(|(_, c)| c.contains("step1")).unwrap().0;
    berth_tests::berth_ok(&home, &["rewind", "c", &first.to_string()]);
    assert_eq!(
        berth_tests::berth_ok(&home, &["exec", "c", "--", "cat step log"]),
        "step1\n1\n"
    );
    berth_tests::berth_ok(&home, &["rm", "c", "--force"]);
}
