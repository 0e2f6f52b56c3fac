//! The plugin host against real compiled components: the compile cache,
//! capability grants, contract checks at load, and every fault the
//! `faulty-store` guest can throw — each a typed error within the deadline,
//! with the host healthy afterwards.

use std::time::{Duration, Instant};

use berth::conformance::pattern::PatternReader;
use berth::plugin::{CacheOutcome, PluginError, PluginHost, PluginManifest, World};
use berth::{RemoteSnapshotClient, StorageError, StoreError};
use berth_tests::{guest, host_with_cache, scratch_manifest};

#[tokio::test(flavor = "multi_thread")]
async fn second_load_comes_from_the_compile_cache_and_corruption_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let manifest = scratch_manifest("fs_store", World::RemoteClient, &data);

    let first = host_with_cache(&cache)
        .load(manifest.clone())
        .await
        .unwrap();
    assert_eq!(first.cache_outcome(), &CacheOutcome::Miss);
    let second = host_with_cache(&cache)
        .load(manifest.clone())
        .await
        .unwrap();
    assert_eq!(second.cache_outcome(), &CacheOutcome::Hit);
    println!(
        "fs-store load: cold {:?}, from cache {:?}",
        first.load_time(),
        second.load_time()
    );

    // Flip one byte in the middle of the entry: it must be detected.
    let entry = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("a cache entry");
    let mut bytes = std::fs::read(&entry).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&entry, &bytes).unwrap();
    let third = host_with_cache(&cache)
        .load(manifest.clone())
        .await
        .unwrap();
    match third.cache_outcome() {
        CacheOutcome::Rebuilt(reason) => assert!(reason.contains("digest"), "{reason}"),
        other => panic!("corrupt entry was not rebuilt: {other:?}"),
    }
    // Truncated entry: also rebuilt, and the plugin still works.
    std::fs::write(&entry, &bytes[..100]).unwrap();
    let fourth = host_with_cache(&cache)
        .load(manifest.clone())
        .await
        .unwrap();
    assert!(matches!(fourth.cache_outcome(), CacheOutcome::Rebuilt(_)));
    // An entry whose recorded digest is gone is not trusted either.
    let mut sidecar = entry.clone().into_os_string();
    sidecar.push(".blake3");
    std::fs::remove_file(&sidecar).unwrap();
    match host_with_cache(&cache)
        .load(manifest)
        .await
        .unwrap()
        .cache_outcome()
    {
        CacheOutcome::Rebuilt(reason) => assert!(reason.contains("digest"), "{reason}"),
        other => panic!("an entry without its digest was trusted: {other:?}"),
    }
    let client = fourth.remote_client().unwrap();
    assert!(!client.exists("after-rebuild").await.unwrap());
    assert_eq!(
        host_with_cache(&cache)
            .load(scratch_manifest("fs_store", World::RemoteClient, &data))
            .await
            .unwrap()
            .cache_outcome(),
        &CacheOutcome::Hit
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn no_directory_grant_means_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(dir.path());
    let manifest = PluginManifest::for_component(guest("fs_store"), World::RemoteClient)
        .with_config("root", "/data");
    let client = host.load(manifest).await.unwrap().remote_client().unwrap();
    match client.exists("x").await {
        Err(StoreError::Storage(StorageError::Denied(m))) => {
            assert!(
                m.contains("grant"),
                "the error should say how to fix it: {m}"
            )
        }
        other => panic!("expected denied, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn load_refuses_what_does_not_implement_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    // A snapshot plugin loaded as a remote client.
    let wrong_world = PluginManifest::for_component(guest("noop_snapshot"), World::RemoteClient);
    match host.load(wrong_world).await {
        Err(PluginError::ContractViolation { message, .. }) => {
            assert!(
                message.contains("berth:snapshot/remote-client@0.1.0"),
                "{message}"
            )
        }
        Err(e) => panic!("expected a contract violation, got {e}"),
        Ok(_) => panic!("a snapshot plugin loaded as a remote client"),
    }
    // A core module, not a component.
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    match host
        .load(PluginManifest::for_component(&core, World::RemoteClient))
        .await
    {
        Err(PluginError::Load { message, .. }) => {
            assert!(message.contains("core module"), "{message}")
        }
        other => panic!("expected a load error, got {:?}", other.err()),
    }
    // Not wasm at all, and a missing file.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"#!/bin/sh\n").unwrap();
    assert!(matches!(
        host.load(PluginManifest::for_component(&junk, World::RemoteClient))
            .await,
        Err(PluginError::Load { .. })
    ));
    assert!(matches!(
        host.load(PluginManifest::for_component(
            dir.path().join("nope.wasm"),
            World::RemoteClient
        ))
        .await,
        Err(PluginError::Load { .. })
    ));
}

async fn faulty(
    host: &PluginHost,
    fault: &str,
    deadline: Duration,
) -> berth::plugin::WasmRemoteClient {
    let mut manifest = PluginManifest::for_component(guest("faulty_store"), World::RemoteClient)
        .with_config("fault", fault);
    manifest.grants.deadline = deadline;
    manifest.grants.max_memory = 64 << 20;
    host.load(manifest).await.unwrap().remote_client().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_fault_is_a_typed_error_within_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let deadline = Duration::from_secs(2);
    let bound = deadline + Duration::from_secs(3);
    // A snapshot stored before any fault; it must come through untouched.
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let fs = host
        .load(scratch_manifest("fs_store", World::RemoteClient, &data_dir))
        .await
        .unwrap()
        .remote_client()
        .unwrap();
    fs.upload("precious", &mut PatternReader::new(77, 3 << 20))
        .await
        .unwrap();

    for (fault, check) in [
        ("trap", "trap"),
        ("panic", "trap"),
        ("recursion", "trap"),
        ("loop", "deadline"),
        ("sleep", "deadline"),
        ("memory-bomb", "memory"),
    ] {
        let client = faulty(&host, fault, deadline).await;
        let started = Instant::now();
        let err = client.exists("id").await.expect_err(fault);
        let took = started.elapsed();
        assert!(took < bound, "{fault} took {took:?}");
        let ok = match (&err, check) {
            (StoreError::Plugin(PluginError::Trap { backtrace, .. }), "trap") => {
                assert!(!backtrace.is_empty());
                true
            }
            (StoreError::Plugin(PluginError::DeadlineExceeded { .. }), "deadline") => true,
            (StoreError::Plugin(PluginError::MemoryLimit { limit, .. }), "memory") => {
                assert_eq!(*limit, 64 << 20);
                true
            }
            _ => false,
        };
        assert!(ok, "{fault}: expected {check}, got {err}");
        println!(
            "{fault}: {took:?}: {}",
            err.to_string().lines().next().unwrap_or("")
        );
    }

    // A huge error message is bounded.
    let err = faulty(&host, "huge-error", deadline)
        .await
        .exists("id")
        .await
        .unwrap_err();
    assert!(
        err.to_string().len() < 8192,
        "{} bytes",
        err.to_string().len()
    );

    // Reaching outside the grant fails inside the guest; nothing leaks.
    let err = faulty(&host, "escape", deadline)
        .await
        .exists("id")
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("ESCAPED"), "{err}");

    // Flooding stdout neither fails nor hangs the host. (Writing the flood
    // takes a debug build on a loaded 2-core machine more than the short
    // deadline above; what is checked is that the flood ends the call with
    // the guest's own error, not a deadline.)
    let err = faulty(&host, "flood-stdout", deadline * 10)
        .await
        .exists("id")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("flooded"), "{err}");

    // Upload that returns without reading: a contract violation.
    let mut data = PatternReader::new(1, 4 << 20);
    match faulty(&host, "no-read", deadline)
        .await
        .upload("id", &mut data)
        .await
    {
        Err(StoreError::Plugin(PluginError::ContractViolation { message, .. })) => {
            assert!(message.contains("clause 5"), "{message}")
        }
        other => panic!("no-read: {other:?}"),
    }
    // Upload that swallows a broken stream and claims success: violation.
    let mut broken = PatternReader::failing(1, 4 << 20, 1 << 20);
    match faulty(&host, "ignore-stream-error", deadline)
        .await
        .upload("id", &mut broken)
        .await
    {
        Err(StoreError::Plugin(PluginError::ContractViolation { message, .. })) => {
            assert!(message.contains("clause 2"), "{message}")
        }
        other => panic!("ignore-stream-error: {other:?}"),
    }
    // Upload that gives up half-way: the guest's own error.
    let mut data = PatternReader::new(1, 4 << 20);
    assert!(matches!(
        faulty(&host, "half-read-error", deadline)
            .await
            .upload("id", &mut data)
            .await,
        Err(StoreError::Storage(StorageError::Io(_)))
    ));

    // The host is healthy: the same plugin without a fault, and a real store.
    assert!(!faulty(&host, "none", deadline)
        .await
        .exists("id")
        .await
        .unwrap());
    let mut data = PatternReader::new(2, 1 << 20);
    fs.upload("after-faults", &mut data).await.unwrap();
    assert!(fs.exists("after-faults").await.unwrap());

    // A stream that stalls (the producer never sends) hits the deadline too,
    // with the guest blocked inside a stream read.
    let mut manifest = scratch_manifest("fs_store", World::RemoteClient, &data_dir);
    manifest.grants.deadline = Duration::from_secs(1);
    let slow = host.load(manifest).await.unwrap().remote_client().unwrap();
    let (_keep_open, mut stalled) = tokio::io::duplex(64);
    let started = Instant::now();
    match slow.upload("stalled", &mut stalled).await {
        Err(StoreError::Plugin(PluginError::DeadlineExceeded { .. })) => {}
        other => panic!("stalled stream: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4));
    assert!(
        !slow.exists("stalled").await.unwrap(),
        "a stalled upload became visible"
    );

    // No fault damaged the snapshot stored before them.
    let mut sink = berth::conformance::pattern::DigestWriter::default();
    fs.download("precious", &mut sink).await.unwrap();
    assert_eq!(
        sink.finish(),
        (PatternReader::digest_of(77, 3 << 20), 3 << 20)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_request_outside_the_grant_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(dir.path());
    let mut manifest = PluginManifest::for_component(guest("s3_store"), World::RemoteClient)
        .with_config("endpoint", "http://127.0.0.1:9")
        .with_config("bucket", "b")
        .with_config("access_key_id", "k")
        .with_config("secret_access_key", "s");
    manifest.grants.wall_clock = true;
    // Granted a different origin only.
    manifest.grants.http = vec![berth::plugin::HttpOrigin::parse("http://127.0.0.1:10").unwrap()];
    let client = host.load(manifest).await.unwrap().remote_client().unwrap();
    match client.exists("x").await {
        Err(StoreError::Plugin(PluginError::CapabilityDenied { what, .. })) => {
            assert!(what.contains("127.0.0.1:9"), "{what}")
        }
        other => panic!("expected a capability denial, got {other:?}"),
    }
}

/// A component built against another version of the contract, made with
/// `wasm-tools component embed --dummy` from `wit/` with the version bumped.
fn misversioned_component(dir: &std::path::Path) -> std::path::PathBuf {
    let wit = dir.join("wit");
    std::fs::create_dir_all(wit.join("deps/io")).unwrap();
    let root = berth_tests::repo_root();
    let contract = std::fs::read_to_string(root.join("wit/snapshot.wit")).unwrap();
    assert!(contract.contains("berth:snapshot@0.1.0"));
    std::fs::write(
        wit.join("snapshot.wit"),
        contract.replace("berth:snapshot@0.1.0", "berth:snapshot@0.2.0"),
    )
    .unwrap();
    std::fs::copy(root.join("wit/deps/io/io.wit"), wit.join("deps/io/io.wit")).unwrap();
    let core = dir.join("core.wasm");
    let component = dir.join("v0_2.wasm");
    for args in [
        vec![
            "component".into(),
            "embed".into(),
            "--dummy".into(),
            wit.display().to_string(),
            "-w".into(),
            "remote-client-plugin".into(),
            "-o".into(),
            core.display().to_string(),
        ],
        vec![
            "component".into(),
            "new".into(),
            core.display().to_string(),
            "-o".into(),
            component.display().to_string(),
        ],
    ] {
        let status = std::process::Command::new("wasm-tools")
            .args(&args)
            .status()
            .expect("wasm-tools is installed by `cargo xtask build-guests`");
        assert!(status.success(), "wasm-tools {args:?} failed");
    }
    component
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plugin_built_against_another_contract_version_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let component = misversioned_component(dir.path());
    let host = host_with_cache(&dir.path().join("cache"));
    let err = host
        .load(PluginManifest::for_component(
            &component,
            World::RemoteClient,
        ))
        .await
        .err()
        .expect("a 0.2.0 plugin must not load into a 0.1.0 host");
    match &err {
        PluginError::ContractViolation { message, .. } => {
            assert!(
                message.contains("berth:snapshot/remote-client@0.2.0")
                    && message.contains("@0.1.0")
                    && message.contains("rebuild the plugin"),
                "{message}"
            );
        }
        other => panic!("expected a contract violation, got {other:?}"),
    }
    // The CLI says the same for a bare component, and fails.
    let out = std::process::Command::new(berth_tests::berth_bin())
        .args(["plugin", "check"])
        .arg(&component)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("berth:snapshot@0.2.0") && stderr.contains("rebuild the plugin"),
        "{stderr}"
    );
}
