//! State written by earlier versions still loads, resumes, restores and
//! stops. The fixtures (`tests/fixtures/state/`) are state files in the
//! shapes Berth has written: local with SHA-256 seals and no lineage (0.1),
//! an interrupted stop (0.2), Docker with `docker_host` (0.1), Docker with
//! an engine, a lineage and orphans (0.3). A deduplicated snapshot as 0.3
//! wrote it (`"type": "remote"` with its record) is made by rewriting a new
//! state into that shape. Placeholders (`{{HOME}}`, digests, sizes, the
//! container name) are filled in per test; the archive each restores is
//! written into the fixture's local snapshot directory first.

use std::path::Path;

use berth::sandbox::{SandboxOptions, SandboxState, StartBranch};
use berth::snapshot::DedupRecord;
use berth_tests::{docker_or_skip, repo_root, sh, test_image};

/// A workspace archive: `hello.txt` and `notes/kept.txt`.
fn archive() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, body) in [
        ("hello.txt", &b"hello\n"[..]),
        ("notes/kept.txt", b"from the old snapshot\n"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, path, body).unwrap();
    }
    b.into_inner().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    format!("sha256:{}", text.split_whitespace().next().unwrap())
}

/// The fixture `name` with its placeholders filled in, the archive it
/// restores stored as its local snapshot `id` under `home`.
fn fixture(name: &str, home: &Path, container: &str) -> SandboxState {
    let tar = archive();
    let text = std::fs::read_to_string(repo_root().join("tests/fixtures/state").join(name))
        .unwrap()
        .replace("{{HOME}}", home.to_str().unwrap())
        .replace("{{SHA256}}", &sha256(&tar))
        .replace(
            "{{BLAKE3}}",
            &format!("blake3:{}", blake3::hash(&tar).to_hex()),
        )
        .replace("{{SIZE}}", &tar.len().to_string())
        .replace("{{CONTAINER}}", container)
        .replace("{{IMAGE}}", &test_image());
    let state = SandboxState::from_json(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let snapshots = home.join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    std::fs::write(snapshots.join(format!("{}.tar", state.snapshot.id)), &tar).unwrap();
    state
}

/// Resumes `state` through its JSON, starts it (expecting `branch`),
/// checks the restored files, stops it, and resumes the new state once
/// more: it must say it is a sandbox of the same kinds, now sealed with
/// BLAKE3.
async fn resumes_restores_and_stops(home: &Path, state: SandboxState, branch: StartBranch) {
    let client = berth_tests::client_builder(home).save_state(false).build();
    let kinds = (state.backend.kind.clone(), state.snapshot.kind.clone());
    let mut sb = client
        .resume(
            SandboxState::from_json(&state.to_json().unwrap()).unwrap(),
            None,
            SandboxOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(sb.start().await.unwrap(), branch);
    assert_eq!(
        sh(&sb, "cat notes/kept.txt").await,
        "from the old snapshot\n"
    );
    sh(&sb, "echo new > notes/new.txt").await;
    sb.stop().await.unwrap();
    let after = sb.state();
    assert_eq!(
        (after.backend.kind.clone(), after.snapshot.kind.clone()),
        kinds
    );
    assert!(
        after
            .snapshot
            .digest
            .as_deref()
            .unwrap()
            .starts_with("blake3:"),
        "{:?}",
        after.snapshot.digest
    );
    assert!(!after.snapshot.persist_pending);
    sb.shutdown().await.unwrap();
    let mut again = client
        .resume(after.clone(), None, SandboxOptions::default())
        .await
        .unwrap();
    again.start().await.unwrap();
    assert_eq!(sh(&again, "cat notes/new.txt").await, "new\n");
    again.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn local_state_with_a_sha256_seal_and_no_lineage_restores() {
    let dir = tempfile::tempdir().unwrap();
    let state = fixture("local-0.1-sha256.json", dir.path(), "");
    assert!(state
        .snapshot
        .digest
        .as_deref()
        .unwrap()
        .starts_with("sha256:"));
    resumes_restores_and_stops(dir.path(), state, StartBranch::Rebuild { restored: true }).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_stop_restores_the_archive_it_committed() {
    let dir = tempfile::tempdir().unwrap();
    let state = fixture("local-0.2-interrupted-stop.json", dir.path(), "");
    assert!(state.snapshot.persist_pending);
    resumes_restores_and_stops(dir.path(), state, StartBranch::Restore).await;
}

fn container_name(test: &str) -> String {
    format!("berth-fixture-{test}-{:08x}", rand::random::<u32>())
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_state_with_docker_host_is_recreated_and_restored() {
    if docker_or_skip("docker_state_with_docker_host_is_recreated_and_restored")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = container_name("host");
    let state = fixture("docker-0.1-docker_host.json", dir.path(), &name);
    resumes_restores_and_stops(dir.path(), state, StartBranch::Rebuild { restored: true }).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_state_with_engine_and_orphans_resumes_and_cleans_up() {
    if docker_or_skip("docker_state_with_engine_and_orphans_resumes_and_cleans_up")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let name = container_name("engine");
    let state = fixture("docker-0.3-engine-orphans.json", dir.path(), &name);
    assert_eq!(state.orphans.len(), 1);
    let client = berth_tests::client_builder(dir.path())
        .save_state(false)
        .build();
    // The orphan's container exists (an old engine's leftover, made here
    // under the fixture's name): removing it removes it, and the state
    // forgets it.
    let orphan = format!("{name}-orphan");
    let made = std::process::Command::new("docker")
        .args([
            "create",
            "--name",
            &orphan,
            &berth_tests::test_image(),
            "true",
        ])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let cleanup = client.remove_orphans(&state).await;
    assert_eq!(cleanup.removed.len(), 1, "{:?}", cleanup.remaining);
    assert!(cleanup.removed[0].contains(&orphan[..12]));
    assert!(cleanup.state.orphans.is_empty());
    berth_tests::assert_gone(
        &std::process::Command::new("docker")
            .args(["inspect", &orphan])
            .output()
            .unwrap(),
        "the orphan's container",
    );
    resumes_restores_and_stops(
        dir.path(),
        cleanup.state,
        StartBranch::Rebuild { restored: true },
    )
    .await;
}

/// A deduplicated snapshot as 0.3 recorded it — `"type": "remote"` with
/// its generations under `dedup` — resumes as a deduplicated snapshot
/// (the next stop writes a new generation, and says its kind is `dedup`).
#[tokio::test(flavor = "multi_thread")]
async fn a_deduplicated_snapshot_recorded_as_remote_resumes_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let store = dir.path().join("store");
    let manifest = berth_tests::fs_store_manifest(dir.path(), &store);
    let client = berth_tests::client_builder(&home).save_state(false).build();
    let spec = berth::sandbox::SnapshotSpec::remote(manifest).deduplicated(2);
    let mut sb = client
        .create(berth::sandbox::SandboxSpec::new(Default::default()).snapshot(spec))
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(
        &sb,
        "mkdir notes && echo 'from the old snapshot' > notes/kept.txt",
    )
    .await;
    sb.stop().await.unwrap();
    sb.shutdown().await.unwrap();
    let new = sb.state();
    assert_eq!(new.snapshot.kind, "dedup");
    // As 0.3 wrote it.
    let mut old: serde_json::Value = serde_json::from_str(&new.to_json().unwrap()).unwrap();
    old["snapshot"]["type"] = "remote".into();
    let old = SandboxState::from_json(&old.to_string()).unwrap();
    assert_eq!(old.snapshot.kind, "remote");
    let mut resumed = client
        .resume(old, None, SandboxOptions::default())
        .await
        .unwrap();
    assert_eq!(resumed.start().await.unwrap(), StartBranch::Restore);
    assert_eq!(
        sh(&resumed, "cat notes/kept.txt").await,
        "from the old snapshot\n"
    );
    sh(&resumed, "echo two > notes/two.txt").await;
    resumed.stop().await.unwrap();
    let after = resumed.state();
    assert_eq!(after.snapshot.kind, "dedup");
    let record = DedupRecord::from_fields(&after.snapshot.fields).unwrap();
    assert_eq!(record.current, Some(2), "{record:?}");
    assert_eq!(record.keep, 2);
    resumed.shutdown().await.unwrap();
}
