//! The ways a workspace was lost, replayed as a user would, plus the guards
//! that make the class impossible: one `ensure_running` per resume, the
//! lineage check before a stop replaces a snapshot, restores capped at what
//! was persisted, a lock per sandbox across processes, and a frozen
//! container while its snapshot is read.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use berth::sandbox::{
    BackendSpec, SandboxError, SandboxOptions, SandboxSpec, SnapshotSpec, StartBranch,
};
use berth::workspace::archive::ArchiveLimits;
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;
use berth_tests::{
    berth_bin, berth_in, berth_ok, berth_state, container_id, docker_or_skip, guest, local_root,
    resume_from_json, sh, test_image,
};

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_removed_container_comes_back_with_its_workspace_and_the_snapshot_survives() {
    let test = "a_removed_container_comes_back_with_its_workspace_and_the_snapshot_survives";
    if docker_or_skip(test).await.is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let image = test_image();
    berth_ok(
        home,
        &["create", "dk", "--backend", "docker", "--image", &image],
    );
    berth_ok(home, &["exec", "dk", "--", "echo one > a.txt"]);
    berth_ok(home, &["stop", "dk"]);
    let size = berth_state(home, "dk").snapshot.size.unwrap();
    docker(&["rm", "-f", &container_id(&berth_state(home, "dk"))]);

    let out = berth_in(home, &["exec", "dk", "--", "cat a.txt"]);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "one\n", "{log}");
    assert!(!log.contains("branch=Reuse"), "{log}");

    berth_ok(home, &["stop", "dk"]);
    assert!(berth_state(home, "dk").snapshot.size.unwrap() >= size);
    docker(&["rm", "-f", &container_id(&berth_state(home, "dk"))]);
    assert_eq!(berth_ok(home, &["exec", "dk", "--", "cat a.txt"]), "one\n");
    berth_ok(home, &["rm", "dk"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn parallel_starts_on_a_removed_container_all_succeed_against_one_container() {
    let test = "parallel_starts_on_a_removed_container_all_succeed_against_one_container";
    if docker_or_skip(test).await.is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().to_path_buf();
    let image = test_image();
    berth_ok(
        &home,
        &["create", "par", "--backend", "docker", "--image", &image],
    );
    berth_ok(&home, &["exec", "par", "--", "echo kept > k.txt"]);
    berth_ok(&home, &["stop", "par"]);
    let session = berth_state(&home, "par").session_id;
    docker(&["rm", "-f", &container_id(&berth_state(&home, "par"))]);

    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(berth_bin())
                .env("BERTH_HOME", &home)
                .args(["start", "par"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a parallel start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let containers = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=berth.session={session}"),
    ]);
    assert_eq!(containers.lines().count(), 1, "{containers}");
    // Parallel commands once it is up.
    let children: Vec<_> = (0..4)
        .map(|i| {
            Command::new(berth_bin())
                .env("BERTH_HOME", &home)
                .args(["exec", "par", "--", &format!("cat k.txt; echo {i} > p{i}")])
                .output()
                .unwrap()
        })
        .collect();
    for out in children {
        assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\n");
    }
    berth_ok(&home, &["rm", "par"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_freezes_the_container_so_the_snapshot_is_one_moment() {
    let test = "stop_freezes_the_container_so_the_snapshot_is_one_moment";
    if docker_or_skip(test).await.is_none() {
        return;
    }
    // A writer keeps replacing a.txt and z.txt (each atomically, by
    // rename) with the same counter, with a large file between them in the
    // archive. Frozen, the two differ by
    // at most the one write in flight; not frozen, by far more.
    async fn gaps(freeze: bool) -> Vec<i64> {
        let dir = tempfile::tempdir().unwrap();
        let client = berth_tests::client(dir.path());
        let snaps = dir.path().join("snaps");
        let options = SandboxOptions {
            freeze_during_stop: freeze,
            ..SandboxOptions::default()
        };
        let mut sb = client
            .create(
                SandboxSpec::new(WorkspaceSpec::default())
                    .snapshot(SnapshotSpec::local(snaps.clone()))
                    .snapshot_id("freeze")
                    .backend(BackendSpec::new(DockerOptions::new(test_image())))
                    .options(options),
            )
            .await
            .unwrap();
        sb.start().await.unwrap();
        sh(
            &sb,
            "head -c 30000000 /dev/urandom > m.bin; echo 0 > a.txt; echo 0 > z.txt",
        )
        .await;
        sh(
            &sb,
            "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > a.tmp; mv a.tmp a.txt; echo $i > z.tmp; mv z.tmp z.txt; done' >/dev/null 2>&1 &",
        )
        .await;
        let mut gaps = Vec::new();
        for _ in 0..(if freeze { 3 } else { 6 }) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Err(e) = sb.stop().await {
                // Unfrozen, the engine can fail to archive files that
                // change under it ("unexpected EOF"): no snapshot at all.
                assert!(!freeze, "a frozen stop failed: {e:?}");
                println!("unfrozen stop failed: {e}");
                gaps.push(i64::MAX);
                sb.attach().await.unwrap();
                continue;
            }
            let file = std::fs::File::open(snaps.join("freeze.tar")).unwrap();
            let mut archive = tar::Archive::new(file);
            let (mut a, mut z) = (None, None);
            for entry in archive.entries().unwrap() {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let mut text = String::new();
                if path.ends_with("a.txt") || path.ends_with("z.txt") {
                    std::io::Read::read_to_string(&mut entry, &mut text).unwrap();
                    let n: i64 = text.trim().parse().unwrap_or(-1);
                    if path.ends_with("a.txt") {
                        a = Some(n)
                    } else {
                        z = Some(n)
                    }
                }
            }
            gaps.push((a.unwrap() - z.unwrap()).abs());
            sb.attach().await.unwrap();
        }
        sb.shutdown().await.unwrap();
        gaps
    }
    let frozen = gaps(true).await;
    println!("frozen gaps: {frozen:?}");
    assert!(frozen.iter().all(|g| *g <= 1), "{frozen:?}");
    let smeared = gaps(false).await;
    println!("unfrozen gaps: {smeared:?}");
    assert!(
        smeared.iter().any(|g| *g > 1),
        "without freezing the writer should have moved on while the archive was read: {smeared:?}"
    );
}

fn faulty_manifest(dir: &Path, fault: &str, deadline: u64) -> PathBuf {
    let path = dir.join(format!("faulty-{fault}.toml"));
    std::fs::write(
        &path,
        format!(
            "name = \"faulty\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n[config]\nfault = {fault:?}\n[grants]\ndeadline_secs = {deadline}\n",
            guest("faulty_store")
        ),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_keeps_sending_is_cut_off_at_the_recorded_size() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = faulty_manifest(dir.path(), "endless-download", 300);
    let client = berth_tests::client(dir.path());
    let sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::remote(manifest))
                .snapshot_id("endless")
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    // As if a 10 000-byte snapshot had been persisted.
    let mut state = sb.state();
    state.snapshot.digest = Some(format!("blake3:{}", "0".repeat(64)));
    state.snapshot.size = Some(10_000);
    let spool = dir.path().join("spool");
    std::fs::create_dir_all(&spool).unwrap();
    let options = SandboxOptions {
        spool_dir: Some(spool.clone()),
        ..SandboxOptions::default()
    };
    let mut sb = client.resume(state.clone(), None, options).await.unwrap();
    let started = Instant::now();
    let err = sb.start().await.unwrap_err();
    println!("{err} after {:?}", started.elapsed());
    assert!(
        matches!(err, SandboxError::SnapshotOverrun { limit: 10_000, .. }),
        "{err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        std::fs::read_dir(&spool).unwrap().count(),
        0,
        "spool left behind"
    );

    // No size recorded (an older state): the archive limit caps it.
    state.snapshot.digest = None;
    state.snapshot.size = None;
    let options = SandboxOptions {
        limits: ArchiveLimits {
            max_bytes: 1 << 20,
            max_entries: 16,
        },
        ..SandboxOptions::default()
    };
    let mut sb = client.resume(state, None, options).await.unwrap();
    let err = sb.start().await.unwrap_err();
    assert!(
        matches!(err, SandboxError::SnapshotOverrun { limit, .. } if limit == ArchiveLimits { max_bytes: 1 << 20, max_entries: 16 }.max_stream_bytes()),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn hydrate_reads_a_users_stream_no_further_than_the_archive_limit() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let limits = ArchiveLimits {
        max_bytes: 1 << 20,
        max_entries: 16,
    };
    let options = SandboxOptions {
        limits,
        ..SandboxOptions::default()
    };
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::local())
                .options(options),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    // An endless stream of zeros.
    let mut endless = tokio::io::repeat(0);
    let err = sb.hydrate_workspace(&mut endless).await.unwrap_err();
    assert!(
        matches!(err, SandboxError::ArchiveTooLarge { limit } if limit == limits.max_stream_bytes()),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_refuses_a_workspace_that_replaced_the_one_it_set_up() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let root = dir.path().join("ws");
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(dir.path().join("snaps")))
                .snapshot_id("guarded")
                .backend(BackendSpec::new(
                    berth::backend::local::LocalOptions::default().root_dir(root.clone()),
                )),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(&sb, "echo precious > work.txt").await;
    sb.stop().await.unwrap();
    let good = std::fs::read(dir.path().join("snaps/guarded.tar")).unwrap();

    // The directory is deleted and something makes a new, empty one.
    berth_tests::remove_workspace(&root);
    std::fs::create_dir(&root).unwrap();
    let err = sb.stop().await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, SandboxError::LineageMismatch { .. }),
        "{err:?}"
    );
    assert!(text.contains("starting the sandbox restores it"), "{text}");
    assert_eq!(
        std::fs::read(dir.path().join("snaps/guarded.tar")).unwrap(),
        good,
        "the snapshot was replaced"
    );
    // A resume sees the workspace is not the one it set up, and restores.
    let mut sb = resume_from_json(&client, &sb.state()).await;
    assert_eq!(
        sb.attach().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    assert_eq!(sh(&sb, "cat work.txt").await, "precious\n");
    sb.stop().await.unwrap();
}

#[test]
fn a_sparse_file_survives_stop_and_start_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    berth_ok(home, &["create", "sp"]);
    berth_ok(
        home,
        &["exec", "sp", "--", "truncate -s 1G sparse.img && printf x | dd of=sparse.img bs=1 seek=4096 conv=notrunc 2>/dev/null && ln sparse.img hard.img"],
    );
    berth_ok(home, &["stop", "sp"]);
    let root = local_root(&berth_state(home, "sp"));
    berth_tests::remove_workspace(&root);
    berth_ok(home, &["start", "sp"]);
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(root.join("sparse.img")).unwrap();
    assert_eq!(meta.len(), 1 << 30);
    assert!(
        meta.blocks() * 512 < 1 << 20,
        "holes kept: {}",
        meta.blocks()
    );
    assert_eq!(meta.nlink(), 2, "the hardlink is kept");
    assert_eq!(
        berth_ok(
            home,
            &[
                "exec",
                "sp",
                "--",
                "dd if=sparse.img bs=1 skip=4096 count=1 2>/dev/null"
            ]
        ),
        "x"
    );
    berth_ok(home, &["rm", "sp"]);
}

/// Counts how often `needle` appears in `hay`.
fn count(hay: &str, needle: &str) -> usize {
    hay.matches(needle).count()
}

#[test]
fn cli_errors_say_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();

    // A store that fails with an empty message.
    let empty = faulty_manifest(home, "empty-message", 30);
    let out = berth_in(
        home,
        &[
            "create",
            "e",
            "--snapshot",
            &format!("remote:{}", empty.display()),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert!(!out.status.success());
    assert!(err.contains("gave no message"), "{err}");
    assert!(!err.contains(": :"), "{err}");
    let error_line = err.lines().find(|l| l.starts_with("error:")).unwrap();

    // A store past its deadline.
    let slow = faulty_manifest(home, "sleep", 2);
    let out = berth_in(
        home,
        &[
            "create",
            "s",
            "--snapshot",
            &format!("remote:{}", slow.display()),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!("{err}");
    assert!(!out.status.success());
    assert_eq!(count(&err, "exceeded its"), 1, "{err}");
    assert!(count(error_line, "gave no message") == 1, "{error_line}");
}
