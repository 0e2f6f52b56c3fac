//! The Docker backend on a real engine: every resume case, timeouts that
//! kill inside the container, limits and labels, unsupported run arguments,
//! containers we do not own, and a daemon that is not there.

use std::time::{Duration, Instant};

use berth::backend::ExecRequest;
use berth::sandbox::{
    BackendSpec, SandboxError, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec, StartBranch,
};
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;
use berth_tests::{
    container_id, docker_or_skip, resume_from_json, sh, started_sandbox, test_image,
};
use bollard::query_parameters::{
    InspectContainerOptions, RemoveContainerOptionsBuilder, StopContainerOptions,
};

fn workspace() -> WorkspaceSpec {
    serde_json::from_value(serde_json::json!({
        "environment": {"WHO": "agent"},
        "entries": {
            "hello.txt": {"type": "file", "content": "hello docker\n"},
            "src": {"type": "dir", "children": {"run.sh": {"type": "file", "content": "echo run by $WHO\n"}}},
            "tmp": {"type": "dir", "ephemeral": true, "children": {"scratch": {"type": "file", "content": "e"}}}
        }
    }))
    .unwrap()
}

const LISTING: &str = "cd /workspace && find . -path ./tmp -prune -o \\( -type f -o -type l \\) -print | sort | xargs sha256sum";

#[tokio::test(flavor = "multi_thread")]
async fn resume_in_every_case_restores_byte_identical() {
    let Some(docker) = docker_or_skip("resume_in_every_case_restores_byte_identical").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let snaps = dir.path().join("snaps");
    let mut sb = client
        .create(
            SandboxSpec::new(workspace())
                .snapshot(SnapshotSpec::local(snaps))
                .backend(BackendSpec::new(DockerOptions::new(test_image()))),
        )
        .await
        .unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    assert_eq!(sh(&sb, "sh src/run.sh").await, "run by agent\n");
    sh(&sb, "mkdir -p data && seq 1 50000 > data/n.txt && head -c 300000 /dev/urandom > data/r.bin && ln -s data/n.txt link && chmod 640 data/r.bin").await;
    let before = sh(&sb, LISTING).await;
    sb.stop().await.unwrap();
    let state = sb.state();
    let id = container_id(&state);

    // Alive: reconnect, nothing re-created.
    let t = Instant::now();
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    println!("resume of a running container: {:?}", t.elapsed());
    assert_eq!(container_id(&sb.state()), id);
    assert_eq!(sh(&sb, LISTING).await, before);

    // Stopped behind our back: restarted, same container.
    docker
        .stop_container(&id, None::<StopContainerOptions>)
        .await
        .unwrap();
    let t = Instant::now();
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    println!("resume of a stopped container: {:?}", t.elapsed());
    assert_eq!(container_id(&sb.state()), id);
    assert_eq!(sh(&sb, LISTING).await, before);

    // Removed behind our back: re-created and restored from the snapshot.
    docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .unwrap();
    let t = Instant::now();
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    println!(
        "resume of a removed container (re-create + restore): {:?}",
        t.elapsed()
    );
    let new_id = container_id(&sb.state());
    assert_ne!(new_id, id);
    assert_eq!(
        sh(&sb, LISTING).await,
        before,
        "workspace differs after restore"
    );
    assert_eq!(sh(&sb, "stat -c %a data/r.bin").await, "640\n");
    assert_eq!(
        sh(&sb, "cat tmp/scratch").await,
        "e",
        "ephemeral entries re-applied"
    );
    assert_eq!(
        state.snapshot.id,
        sb.state().snapshot.id,
        "snapshot id is stable across re-creation"
    );

    sb.shutdown().await.unwrap();
    // Gone, with the engine answering 404 (a down engine is another error).
    match docker
        .inspect_container(&new_id, None::<InspectContainerOptions>)
        .await
    {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {}
        other => panic!("the container should be gone (404), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn timeout_kills_the_process_inside_the_container() {
    let Some(_docker) = docker_or_skip("timeout_kills_the_process_inside_the_container").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = started_sandbox(&client, BackendSpec::new(DockerOptions::new(test_image()))).await;
    let t = Instant::now();
    let r = sb
        .exec(ExecRequest::new(
            "echo started; sleep 987 & sleep 986; echo never",
            Duration::from_secs(2),
        ))
        .await
        .unwrap();
    assert!(r.timed_out);
    assert_eq!(r.exit_code, 124);
    assert!(
        r.stdout_text().contains("started"),
        "output before the timeout is kept: {r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    let ps = sh(&sb, "ps -o pid,args").await;
    assert!(
        !ps.contains("sleep 98"),
        "processes survived the timeout:\n{ps}"
    );

    let mut req = ExecRequest::new(
        "head -c 200000 /dev/zero; echo e >&2; exit 3",
        Duration::from_secs(20),
    );
    req.stdout_cap = 1000;
    let r = sb.exec(req).await.unwrap();
    assert_eq!(
        (
            r.exit_code,
            r.stdout.len(),
            r.stdout_dropped,
            r.stderr_text().as_ref()
        ),
        (3, 1000, 199_000, "e\n")
    );
    assert_eq!(sh(&sb, "pwd").await, "/workspace\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_labels_and_secure_defaults_are_on_the_container() {
    let Some(docker) =
        docker_or_skip("limits_labels_and_secure_defaults_are_on_the_container").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let options = DockerOptions::new(test_image())
        .memory(256 << 20)
        .cpus(1.5)
        .run_args(vec![
            "--pids-limit".into(),
            "77".into(),
            "--label".into(),
            "team=agents".into(),
        ]);
    let mut sb = started_sandbox(&client, BackendSpec::new(options)).await;
    let state = sb.state();
    let info = docker
        .inspect_container(&container_id(&state), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let hc = info.host_config.unwrap();
    assert_eq!(hc.memory, Some(256 << 20));
    assert_eq!(hc.nano_cpus, Some(1_500_000_000));
    assert_eq!(hc.pids_limit, Some(77));
    assert_eq!(hc.network_mode.as_deref(), Some("none"));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(hc
        .security_opt
        .unwrap()
        .contains(&"no-new-privileges".to_string()));
    assert_eq!(hc.init, Some(true));
    let labels = info.config.unwrap().labels.unwrap();
    assert_eq!(labels.get("berth.session"), Some(&state.session_id));
    assert_eq!(labels.get("berth.owned").map(String::as_str), Some("true"));
    assert_eq!(labels.get("team").map(String::as_str), Some("agents"));
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_run_arguments_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let options = DockerOptions::new(test_image()).run_args(vec!["--privileged".into()]);
    let err = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(options)),
        )
        .await
        .err()
        .expect("--privileged must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("--privileged") && msg.contains("supported"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_we_do_not_own_is_left_alone() {
    let Some(docker) = docker_or_skip("a_container_we_do_not_own_is_left_alone").await else {
        return;
    };
    let name = format!("berth-foreign-{}", std::process::id());
    let body = bollard::models::ContainerCreateBody {
        image: Some(test_image()),
        cmd: Some(vec![
            "sh".into(),
            "-c".into(),
            "mkdir -p /workspace; sleep 3600".into(),
        ]),
        host_config: Some(bollard::models::HostConfig {
            network_mode: Some("none".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    docker
        .create_container(
            Some(
                bollard::query_parameters::CreateContainerOptionsBuilder::new()
                    .name(&name)
                    .build(),
            ),
            body,
        )
        .await
        .unwrap();
    docker
        .start_container(
            &name,
            None::<bollard::query_parameters::StartContainerOptions>,
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(dir.path().join("snaps")))
                .backend(BackendSpec::new(
                    DockerOptions::new(test_image()).existing_container(&name),
                )),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(&sb, "echo mine > f").await;
    sb.close().await.unwrap();
    let info = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(
        info.state.and_then(|s| s.running),
        Some(true),
        "shutdown touched a container we do not own"
    );
    docker
        .remove_container(
            &name,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_daemon_is_a_clear_error_without_hang_or_recreate() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let t = Instant::now();
    let options = DockerOptions::new(test_image()).engine("unix:///nonexistent/berth-docker.sock");
    let err = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(options)),
        )
        .await
        .err()
        .expect("must fail");
    assert!(t.elapsed() < Duration::from_secs(15));
    let msg = err.to_string();
    assert!(matches!(err, SandboxError::Backend(_)), "{msg}");
    assert!(
        msg.contains("cannot reach the Docker engine unix:///nonexistent/berth-docker.sock")
            && msg.contains("dockerd"),
        "{msg}"
    );

    // Resuming saved state against a dead daemon fails the same way; it
    // never decides the container is gone. (State from before engines
    // named it `docker_host`.)
    let saved = serde_json::json!({
        "type": "docker", "container_id": "0123abcd", "container_name": "berth-x", "image": test_image(),
        "docker_host": "unix:///nonexistent/berth-docker.sock",
        "session_id": "x", "manifest": {}, "snapshot": {"type": "noop", "id": "berth-x"},
        "workspace_root_ready": true
    });
    let state = SandboxState::from_json(&saved.to_string()).unwrap();
    let err = client
        .resume(state, None, SandboxOptions::default())
        .await
        .err()
        .expect("must fail");
    match &err {
        berth::sandbox::SandboxError::Backend(berth::backend::BackendError::Unreachable {
            ..
        }) => {}
        other => panic!("expected an unreachable engine, got {other:?}"),
    }
    assert!(
        err.to_string().contains("cannot reach the Docker engine"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_error_keeps_its_status_for_callers_to_match() {
    let Some(docker) = docker_or_skip("a_daemon_error_keeps_its_status_for_callers_to_match").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let sb = started_sandbox(&client, BackendSpec::new(DockerOptions::new(test_image()))).await;
    // The container goes away under a sandbox that is still held.
    docker
        .remove_container(
            &container_id(&sb.state()),
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .unwrap();
    let err = sb
        .exec(ExecRequest::new("true", Duration::from_secs(10)))
        .await
        .unwrap_err();
    match &err {
        SandboxError::Backend(e) => assert_eq!(e.service_status(), Some(404), "{err:?}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
    // The daemon's own words are in the error's source chain.
    let source = std::error::Error::source(&err).map(|s| s.to_string());
    assert!(source.is_some_and(|s| s.contains("404")), "{err:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_container_of_another_sandbox_is_never_adopted_by_name() {
    if docker_or_skip("a_container_of_another_sandbox_is_never_adopted_by_name")
        .await
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let name = format!("berth-shared-name-{}", std::process::id());
    let spec = || {
        SandboxSpec::new(WorkspaceSpec::default())
            .snapshot(SnapshotSpec::noop())
            .backend(BackendSpec::new(
                DockerOptions::new(test_image()).name(name.clone()),
            ))
    };
    let mut first = client.create(spec()).await.unwrap();
    first.start().await.unwrap();
    let mut second = client.create(spec()).await.unwrap();
    let err = second.start().await.unwrap_err().to_string();
    assert!(err.contains("belongs to Berth session"), "{err}");
    first.shutdown().await.unwrap();
}

/// A restore streams in one pass, extracting while it validates: an
/// archive whose last entry the hydrate policy refuses (after good ones)
/// must leave the workspace as it was (the container is gone, its disk
/// image on the host is not: the workspace it held), with nothing of the
/// refused archive and no staging left over.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_refused_at_its_last_entry_leaves_nothing_behind() {
    let Some(docker) =
        docker_or_skip("a_restore_refused_at_its_last_entry_leaves_nothing_behind").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let snaps = dir.path().join("snaps");
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(snaps.clone()))
                .backend(BackendSpec::new(DockerOptions::new(test_image()))),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(&sb, "echo good > a.txt").await;
    sb.stop().await.unwrap();
    let mut state = sb.state();
    // The stored archive replaced by one with good entries first and a
    // fifo last, sealed as if a stop had written it.
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, path, data).unwrap();
    };
    add("a.txt", tar::EntryType::Regular, b"bad\n");
    add("dir/", tar::EntryType::Directory, b"");
    add("dir/big.bin", tar::EntryType::Regular, &vec![7u8; 3 << 20]);
    add("dir/fifo", tar::EntryType::Fifo, b"");
    let bytes = tar.into_inner().unwrap();
    let stored = std::fs::read_dir(&snaps)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "tar"))
        .expect("the snapshot file");
    std::fs::write(&stored, &bytes).unwrap();
    state.snapshot.digest = Some(format!("blake3:{}", blake3::hash(&bytes).to_hex()));
    state.snapshot.size = Some(bytes.len() as u64);
    let id = container_id(&state);
    docker
        .remove_container(
            &id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .unwrap();
    let mut sb = resume_from_json(&client, &state).await;
    let err = sb.start().await.unwrap_err();
    let text = berth_tests::chain(&err);
    assert!(text.contains("fifo"), "{text}");
    let new_id = container_id(&sb.state());
    assert_ne!(new_id, id);
    let ls = std::process::Command::new("docker")
        .args(["exec", &new_id, "ls", "-A", "/workspace"])
        .output()
        .unwrap();
    assert!(ls.status.success(), "{ls:?}");
    assert_eq!(
        String::from_utf8_lossy(&ls.stdout),
        "a.txt\n",
        "left behind"
    );
    let cat = std::process::Command::new("docker")
        .args(["exec", &new_id, "cat", "/workspace/a.txt"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&cat.stdout), "good\n", "{cat:?}");
    assert!(!sb.state().workspace_root_ready);

    // A well-formed archive that is not the one persisted: refused by its
    // digest, checked as it streams, before anything is moved into place.
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(6);
    h.set_mode(0o644);
    tar.append_data(&mut h, "other.txt", &b"other\n"[..])
        .unwrap();
    let other = tar.into_inner().unwrap();
    std::fs::write(&stored, &other).unwrap();
    let mut sb = resume_from_json(&client, &sb.state()).await;
    let err = sb.start().await.unwrap_err();
    assert!(matches!(err, SandboxError::DigestMismatch { .. }), "{err}");
    let ls = std::process::Command::new("docker")
        .args(["exec", &container_id(&sb.state()), "ls", "-A", "/workspace"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ls.stdout),
        "a.txt\n",
        "left behind"
    );
    sb.shutdown().await.unwrap();
}

/// No change, no new content: after a restore into a new container and a
/// command that changes nothing, a stop records the seal the stop before
/// the restore did, whole archives and deduplicated generations alike;
/// a deduplicated restore puts back the workspace root's own time, to the
/// nanosecond (a whole archive read through Docker's archive API has no
/// entry for the root, so no time to put back).
#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_workspace_keeps_its_seal_across_a_restore() {
    let Some(docker) =
        docker_or_skip("an_unchanged_workspace_keeps_its_seal_across_a_restore").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let manifest = berth_tests::fs_store_manifest(dir.path(), &dir.path().join("store"));
    for (snapshot, root_time_kept) in [
        (SnapshotSpec::local(dir.path().join("snaps")), false),
        (SnapshotSpec::remote(&manifest).deduplicated(1), true),
    ] {
        keeps_its_seal(&docker, dir.path(), snapshot, root_time_kept).await;
    }
}

async fn keeps_its_seal(
    docker: &bollard::Docker,
    dir: &std::path::Path,
    snapshot: SnapshotSpec,
    root_time_kept: bool,
) {
    let client = berth_tests::client(dir.join(format!("home-{}", rand::random::<u32>())));
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(snapshot)
                .backend(BackendSpec::new(DockerOptions::new(test_image()))),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sh(
        &sb,
        "mkdir -p d/e && echo one > d/e/f && echo two > g && touch -d @1000000000 d",
    )
    .await;
    let root_time = sh(&sb, "stat -c %y .").await;
    sb.stop().await.unwrap();
    let sealed = sb.state().snapshot.digest.clone();
    assert!(sealed.is_some());
    docker
        .remove_container(
            &container_id(&sb.state()),
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .unwrap();
    let state = sb.state();
    let mut sb = resume_from_json(&client, &state).await;
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    if root_time_kept {
        assert_eq!(sh(&sb, "stat -c %y .").await, root_time, "the root's time");
    }
    assert_eq!(sh(&sb, "cat g d/e/f").await, "two\none\n");
    sb.stop().await.unwrap();
    assert_eq!(
        sb.state().snapshot.digest,
        sealed,
        "an unchanged workspace was sealed anew after its restore"
    );
    sb.shutdown().await.unwrap();
}
