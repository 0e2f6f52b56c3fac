//! The conformance suite against every store: native implementations and
//! compiled guest components, held to one contract. The deliberately broken
//! plugin proves the suite can fail, clause by clause.

use std::sync::Arc;

use berth::conformance::{check_remote_client, check_snapshot, ConformanceOptions, OpenSnapshot};
use berth::plugin::World;
use berth::remote_client::DirRemoteClient;
use berth::snapshot::{LocalSnapshot, NoopSnapshot, RemoteSnapshot};
use berth::{RemoteSnapshotClient, SandboxSnapshot, SnapshotId, StorageError, StoreError};
use berth_tests::{host_with_cache, large_size, scratch_manifest};

fn options() -> ConformanceOptions {
    ConformanceOptions {
        large_size: large_size(),
        ..ConformanceOptions::default()
    }
}

fn parse_id(id: &str) -> Result<SnapshotId, StoreError> {
    SnapshotId::parse(id).map_err(|e| StorageError::InvalidId(e.to_string()).into())
}

fn assert_passes(report: &berth::conformance::Report) {
    println!("{}", report.table());
    assert!(
        report.passed(),
        "failed clauses: {:?}",
        report.failed_clauses()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn native_dir_remote_client_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let client = DirRemoteClient::new(dir.path().join("store")).unwrap();
    assert_passes(&check_remote_client("native dir client", &client, &options()).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn native_local_snapshot_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("snapshots");
    let opener: OpenSnapshot = Box::new(move |id| {
        let base = base.clone();
        Box::pin(async move {
            let snap = LocalSnapshot::new(parse_id(&id)?, base)?;
            Ok(Box::new(snap) as Box<dyn SandboxSnapshot>)
        })
    });
    assert_passes(&check_snapshot("native local snapshot", &opener, &options()).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn native_noop_snapshot_conforms() {
    let opener: OpenSnapshot = Box::new(|id| {
        Box::pin(async move {
            Ok(Box::new(NoopSnapshot::new(parse_id(&id)?)) as Box<dyn SandboxSnapshot>)
        })
    });
    assert_passes(&check_snapshot("native noop snapshot", &opener, &options()).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn native_remote_snapshot_over_wasm_fs_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let plugin = host
        .load(scratch_manifest(
            "fs_store",
            World::RemoteClient,
            &dir.path().join("data"),
        ))
        .await
        .unwrap();
    let client: Arc<dyn RemoteSnapshotClient> = Arc::new(plugin.remote_client().unwrap());
    let opener: OpenSnapshot = Box::new(move |id| {
        let client = client.clone();
        Box::pin(async move {
            Ok(Box::new(RemoteSnapshot::new(parse_id(&id)?, client)) as Box<dyn SandboxSnapshot>)
        })
    });
    let opts = ConformanceOptions {
        large_size: 0,
        ..options()
    };
    assert_passes(&check_snapshot("remote snapshot over fs-store", &opener, &opts).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_fs_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let plugin = host
        .load(scratch_manifest(
            "fs_store",
            World::RemoteClient,
            &dir.path().join("data"),
        ))
        .await
        .unwrap();
    let client = plugin.remote_client().unwrap();
    assert_passes(&check_remote_client("fs-store", &client, &options()).await);
}

fn plugin_opener(plugin: berth::plugin::Plugin) -> OpenSnapshot {
    let plugin = Arc::new(plugin);
    Box::new(move |id| {
        let plugin = plugin.clone();
        Box::pin(async move {
            Ok(Box::new(plugin.open_snapshot(&id).await?) as Box<dyn SandboxSnapshot>)
        })
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_dir_snapshot_conforms() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let plugin = host
        .load(scratch_manifest(
            "dir_snapshot",
            World::Snapshot,
            &dir.path().join("data"),
        ))
        .await
        .unwrap();
    let report = check_snapshot("dir-snapshot", &plugin_opener(plugin), &options()).await;
    assert_passes(&report);
    assert!(report
        .clause("interrupted-persist-keeps-previous")
        .is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_noop_snapshot_conforms_with_no_grants() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let manifest = berth::plugin::PluginManifest::for_component(
        berth_tests::guest("noop_snapshot"),
        World::Snapshot,
    );
    let plugin = host.load(manifest).await.unwrap();
    let report = check_snapshot("noop-snapshot", &plugin_opener(plugin), &options()).await;
    assert_passes(&report);
    assert!(report
        .clause("noop-never-restorable")
        .is_some_and(|c| c.passed));
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_plugin_fails_the_clauses_it_breaks() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let plugin = host
        .load(scratch_manifest(
            "broken_store",
            World::RemoteClient,
            &dir.path().join("data"),
        ))
        .await
        .unwrap();
    let client = plugin.remote_client().unwrap();
    let opts = ConformanceOptions {
        large_size: 0,
        ..options()
    };
    let report = check_remote_client("broken-store", &client, &opts).await;
    println!("{}", report.table());
    let failed = report.failed_clauses();
    for clause in [
        "invalid-ids-rejected",
        "interrupted-upload-keeps-previous",
        "interrupted-first-upload-leaves-nothing",
    ] {
        assert!(
            failed.contains(&clause),
            "{clause} should fail; failed: {failed:?}"
        );
    }
    // What it does right still passes: the suite names the broken clauses,
    // it does not fail wholesale.
    for clause in ["roundtrip-medium", "overwrite-replaces"] {
        assert!(
            !failed.contains(&clause),
            "{clause} should pass; failed: {failed:?}"
        );
    }
}

/// Runs the full suite, multi-GiB clause included, on a guest built by a
/// non-Rust toolchain into `guest-examples/target/<file>`.
async fn language_guest_conforms(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let manifest = berth_tests::language_store_manifest(name, &dir.path().join("data"));
    let plugin = host.load(manifest).await.unwrap();
    let client = plugin.remote_client().unwrap();
    assert_passes(&check_remote_client(name, &client, &options()).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_python_store_conforms() {
    language_guest_conforms("py-store").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_c_store_conforms() {
    language_guest_conforms("c-store").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wasm_javascript_store_conforms() {
    language_guest_conforms("js-store").await;
}
