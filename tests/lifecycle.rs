//! The lifecycle engine on the local backend: the four start branches, stop
//! and resume through state JSON, digests, exec timeouts and caps, close.

use std::path::Path;
use std::time::Duration;

use berth::backend::ExecRequest;
use berth::sandbox::{
    BackendSpec, Sandbox, SandboxError, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec,
    StartBranch,
};
use berth::workspace::WorkspaceSpec;
use berth_tests::resume_from_json;

#[path = "state_fixtures.rs"]
mod state_fixtures;

#[path = "backend_conformance.rs"]
mod backend_conformance;

fn manifest(local_file: &Path) -> WorkspaceSpec {
    serde_json::from_value(serde_json::json!({
        "environment": {"GREETING": "ahoy"},
        "entries": {
            "hello.txt": {"type": "file", "content": "hello\n"},
            "bin.dat": {"type": "file", "content": "AAEC/w==", "encoding": "base64"},
            "src": {"type": "dir", "children": {"main.py": {"type": "file", "content": "print('hi')\n"}}},
            "notes.md": {"type": "local_file", "path": local_file},
            "cache": {"type": "dir", "ephemeral": true, "children": {"token": {"type": "file", "content": "secret"}}}
        }
    }))
    .unwrap()
}

async fn run(sandbox: &Sandbox, cmd: &str) -> String {
    let r = sandbox
        .exec(ExecRequest::new(cmd, Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {}", r.stderr_text());
    r.stdout_text().into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn four_start_branches_stop_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes.md");
    std::fs::write(&notes, "# notes\n").unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let snapshots = dir.path().join("snapshots");
    let mut sb = client
        .create(
            SandboxSpec::new(manifest(&notes))
                .snapshot(SnapshotSpec::local(snapshots.clone()))
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    assert!(!sb.is_running());

    // D: fresh.
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    assert_eq!(run(&sb, "cat hello.txt").await, "hello\n");
    assert_eq!(
        run(&sb, "od -An -tx1 bin.dat | tr -d ' \\n'").await,
        "000102ff"
    );
    assert_eq!(
        run(&sb, "cat notes.md src/main.py cache/token").await,
        "# notes\nprint('hi')\nsecret"
    );
    assert_eq!(run(&sb, "echo $GREETING").await, "ahoy\n");
    run(
        &sb,
        "echo agent-work > agent.txt && ln -s /usr/bin venv-link && echo changed > cache/token",
    )
    .await;
    sb.stop().await.unwrap();
    let state = sb.state();
    assert!(state
        .snapshot
        .digest
        .as_deref()
        .unwrap()
        .starts_with("blake3:"));
    let root = berth_tests::local_root(&state);
    // Stop destroys nothing.
    assert!(root.join("agent.txt").is_file());

    // A: root ready and present → reuse; only ephemeral entries re-applied.
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    assert_eq!(
        run(&sb, "cat agent.txt cache/token").await,
        "agent-work\nsecret"
    );

    // B: root ready but gone → rebuilt from the snapshot.
    berth_tests::remove_workspace(&root);
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    assert_eq!(
        run(&sb, "cat agent.txt hello.txt").await,
        "agent-work\nhello\n"
    );
    assert_eq!(run(&sb, "readlink venv-link").await, "/usr/bin\n");
    // The ephemeral entry came from the manifest, not from the snapshot.
    assert_eq!(run(&sb, "cat cache/token").await, "secret");

    // The ephemeral directory was never in the snapshot.
    let listing = std::process::Command::new("tar")
        .arg("-tf")
        .arg(snapshots.join(format!("{}.tar", state.snapshot.id)))
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("agent.txt"), "{listing}");
    assert!(
        !listing.contains("cache"),
        "ephemeral entry persisted: {listing}"
    );

    // C: not ready, snapshot restorable → restore (e.g. state was reset).
    let mut lost = state.clone();
    lost.workspace_root_ready = false;
    berth_tests::remove_workspace(&root);
    let mut sb = resume_from_json(&client, &lost).await;
    assert_eq!(sb.start().await.unwrap(), StartBranch::Restore);
    assert_eq!(run(&sb, "cat agent.txt").await, "agent-work\n");

    // Shutdown removes the workspace we own; the snapshot stays.
    sb.shutdown().await.unwrap();
    assert!(!root.exists());
    assert!(snapshots
        .join(format!("{}.tar", state.snapshot.id))
        .is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_id_is_stable_and_failed_start_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let source = dir.path().join("missing");
    std::fs::write(&source, "here at create").unwrap();
    let spec: WorkspaceSpec = serde_json::from_value(serde_json::json!({
        "entries": {"x": {"type": "local_file", "path": source}}
    }))
    .unwrap();
    let mut sb = client
        .create(
            SandboxSpec::new(spec)
                .snapshot(SnapshotSpec::noop())
                .snapshot_id("my-stable-id")
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    assert_eq!(sb.state().snapshot.id.as_str(), "my-stable-id");
    // The file goes between create and start: start refuses by name.
    std::fs::remove_file(&source).unwrap();
    let err = sb.start().await.unwrap_err();
    assert!(
        matches!(
            &err,
            berth::SandboxError::Spec(berth::workspace::spec::SpecError::HostPath { key, .. }) if key == "x"
        ),
        "{err:?}"
    );
    assert!(!sb.state().workspace_root_ready);
    assert!(!sb.is_running());

    let mut derived = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    let state = derived.state();
    assert_eq!(
        state.snapshot.id.as_str(),
        format!("berth-{}", state.session_id)
    );
    derived.start().await.unwrap();
    derived.stop().await.unwrap();
    let resumed = resume_from_json(&client, &derived.state()).await;
    assert_eq!(resumed.state().snapshot.id, state.snapshot.id);

    // Invalid keys are refused with a clear error.
    let bad: WorkspaceSpec = serde_json::from_value(
        serde_json::json!({"entries": {"/etc/x": {"type": "file", "content": ""}}}),
    )
    .unwrap();
    let err = client
        .create(
            SandboxSpec::new(bad)
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::local()),
        )
        .await
        .err()
        .unwrap();
    assert!(matches!(err, SandboxError::Spec(_)), "{err:?}");
    assert!(err.to_string().contains("absolute"), "{err}");
}

/// State written by an earlier version: fewer fields, plus one we do not
/// know. It must keep loading.
const OLD_STATE: &str = r#"{
  "type": "local",
  "root_dir": "/tmp/berth-old/ws",
  "session_id": "0123456789abcdef",
  "manifest": {"entries": {"a.txt": {"type": "file", "content": "a"}}},
  "snapshot": {"type": "local", "id": "berth-0123456789abcdef", "base_dir": "/tmp/berth-old/snaps"},
  "workspace_root_ready": true,
  "legacy_field_from_v0": {"anything": [1, 2, 3]}
}"#;

#[test]
fn state_json_round_trips_and_old_samples_load() {
    let old = SandboxState::from_json(OLD_STATE).unwrap();
    assert_eq!(old.session_id, "0123456789abcdef");
    assert_eq!(old.manifest.root, "/workspace");
    assert!(old.snapshot.digest.is_none());
    assert_eq!(old.backend.kind, berth::backend::local::KIND);
    let local: berth::backend::local::LocalState = old.backend.decode().unwrap();
    assert!(local.owned);
    let again = SandboxState::from_json(&old.to_json().unwrap()).unwrap();
    assert_eq!(again, old);
}

#[tokio::test(flavor = "multi_thread")]
async fn digest_mismatch_is_refused_and_nothing_is_extracted() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let snapshots = dir.path().join("snaps");
    let spec: WorkspaceSpec = serde_json::from_value(
        serde_json::json!({"entries": {"a.txt": {"type": "file", "content": "original"}}}),
    )
    .unwrap();
    let mut sb = client
        .create(
            SandboxSpec::new(spec)
                .snapshot(SnapshotSpec::local(snapshots.clone()))
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sb.stop().await.unwrap();
    let state = sb.state();
    let root = berth_tests::local_root(&state);
    let archive = snapshots.join(format!("{}.tar", state.snapshot.id));
    let stored = std::fs::read(&archive).unwrap();
    assert_eq!(Some(stored.len() as u64), state.snapshot.size);
    // The same size, still a valid tar, other content: only the digest
    // can tell.
    let at = stored
        .windows(8)
        .position(|w| w == b"original")
        .expect("the file's bytes in the archive");
    let mut changed = stored.clone();
    changed[at..at + 8].copy_from_slice(b"ORIGINAL");
    std::fs::write(&archive, &changed).unwrap();
    berth_tests::remove_workspace(&root);
    let mut sb = resume_from_json(&client, &state).await;
    match sb.start().await {
        Err(SandboxError::DigestMismatch {
            expected, actual, ..
        }) => assert_ne!(expected, actual),
        other => panic!("expected a digest mismatch, got {other:?}"),
    }
    assert!(
        !root.join("a.txt").exists(),
        "a mismatched archive was extracted"
    );
    assert!(!sb.state().workspace_root_ready);

    // Longer than recorded: reading stops at the recorded size.
    let mut longer = stored.clone();
    longer.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&archive, &longer).unwrap();
    let mut sb = resume_from_json(&client, &state).await;
    match sb.start().await {
        Err(SandboxError::SnapshotOverrun { limit, .. }) => {
            assert_eq!(Some(limit), state.snapshot.size)
        }
        other => panic!("expected an overrun, got {other:?}"),
    }
    assert!(!root.join("a.txt").exists());
    assert!(!sb.state().workspace_root_ready);
}

#[tokio::test(flavor = "multi_thread")]
async fn compressed_snapshots_round_trip_through_a_wasm_snapshot_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).unwrap();
    let manifest_path = dir.path().join("dir-snapshot.toml");
    std::fs::write(
        &manifest_path,
        format!(
            "component = {:?}\nworld = \"snapshot-plugin\"\n[config]\ndir = \"/data\"\n[[grants.dirs]]\nhost = {:?}\nguest = \"/data\"\nmode = \"rw\"\n",
            berth_tests::guest("dir_snapshot"),
            store
        ),
    )
    .unwrap();
    let options = || SandboxOptions {
        compression: true,
        ..SandboxOptions::default()
    };
    let client = berth_tests::client(dir.path().join("home"));
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::plugin(manifest_path.clone()))
                .backend(BackendSpec::local())
                .options(options()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    run(&sb, "mkdir -p deep/er && seq 1 200000 > deep/er/numbers && head -c 100000 /dev/urandom > rand.bin").await;
    let before = run(&sb, "find . -type f | sort | xargs sha256sum").await;
    sb.stop().await.unwrap();
    let state = sb.state();
    assert_eq!(state.snapshot.kind, "plugin");
    assert_eq!(state.snapshot.compression.as_deref(), Some("zstd"));
    assert!(state.snapshot.fields.contains_key("plugin"));
    sb.shutdown().await.unwrap();

    // As if on another host: a fresh client home, only the state JSON saved
    // at stop (root marked ready, but not there) → rebuilt from the snapshot.
    let other = berth_tests::client(dir.path().join("other-home"));
    let mut sb = other
        .resume(
            SandboxState::from_json(&state.to_json().unwrap()).unwrap(),
            None,
            options(),
        )
        .await
        .unwrap();
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    assert_eq!(
        run(&sb, "find . -type f | sort | xargs sha256sum").await,
        before
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_timeout_kills_the_process_group_and_caps_count_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let marker = format!("{}.{}", 40 + std::process::id() % 50, std::process::id());
    let started = std::time::Instant::now();
    let r = sb
        .exec(ExecRequest::new(
            format!("echo begun; sleep {marker} & sleep {marker}; echo never"),
            Duration::from_secs(1),
        ))
        .await
        .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert!(started.elapsed() < Duration::from_secs(6));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ps = std::process::Command::new("pgrep")
        .arg("-f")
        .arg(format!("sleep {marker}"))
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "processes survived the timeout: {}",
        String::from_utf8_lossy(&ps.stdout)
    );

    let mut req = ExecRequest::new(
        "head -c 1000000 /dev/zero | tr '\\0' 'x'; echo err >&2",
        Duration::from_secs(10),
    );
    req.stdout_cap = 1000;
    let r = sb.exec(req).await.unwrap();
    assert!(r.truncated);
    assert_eq!(r.stdout.len(), 1000);
    assert_eq!(r.stdout_dropped, 999_000);
    assert_eq!(r.stderr, "err\n");

    let r = sb
        .exec(ExecRequest::new("exit 7", Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 7);
    assert!(!r.timed_out);
}

#[tokio::test(flavor = "multi_thread")]
async fn close_runs_shutdown_even_when_stop_fails() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(dir.path().join("snaps")))
                .backend(BackendSpec::new(
                    berth::backend::local::LocalOptions::default().root_dir(dir.path().join("ws")),
                )),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    // Make persist fail: the snapshot directory becomes a file.
    std::fs::remove_dir_all(dir.path().join("snaps")).unwrap();
    std::fs::write(dir.path().join("snaps"), "not a dir").unwrap();
    let err = sb.close().await.unwrap_err();
    assert!(matches!(err, SandboxError::Close { .. }), "{err}");
    assert!(!dir.path().join("ws").exists(), "shutdown did not run");
}
