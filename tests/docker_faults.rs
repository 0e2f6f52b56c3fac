//! Docker faults on a real engine: containers killed or paused behind our
//! back, commands that ignore SIGTERM, the OOM killer, and 32 sandboxes at
//! once with no cross-talk.

use std::time::{Duration, Instant};

use berth::backend::ExecRequest;
use berth::sandbox::{
    BackendSpec, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec,
    StartBranch,
};
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;
use berth_tests::{container_id, docker_or_skip, sh, test_image};
use bollard::query_parameters::{KillContainerOptions, RemoveContainerOptionsBuilder};
use futures::future::join_all;

async fn new_sandbox(
    client: &SandboxClient,
    options: DockerOptions,
    snaps: &std::path::Path,
) -> Sandbox {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(snaps.to_path_buf()))
                .backend(BackendSpec::new(options)),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sb
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_and_paused_containers_are_brought_back() {
    let _daemon = berth_tests::DOCKERD.read().await;
    let Some(docker) = docker_or_skip("killed_and_paused_containers_are_brought_back").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = new_sandbox(
        &client,
        DockerOptions::new(test_image()),
        &dir.path().join("s"),
    )
    .await;
    sh(&sb, "echo kept > f").await;
    sb.stop().await.unwrap();
    let state = sb.state();
    let id = container_id(&state);

    docker
        .kill_container(&id, None::<KillContainerOptions>)
        .await
        .unwrap();
    let mut sb = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    assert_eq!(sh(&sb, "cat f").await, "kept\n");

    docker.pause_container(&id).await.unwrap();
    let mut sb = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Reuse);
    assert_eq!(sh(&sb, "cat f").await, "kept\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_ignoring_sigterm_is_still_gone_after_its_timeout() {
    let _daemon = berth_tests::DOCKERD.read().await;
    let Some(_docker) =
        docker_or_skip("a_command_ignoring_sigterm_is_still_gone_after_its_timeout").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = new_sandbox(
        &client,
        DockerOptions::new(test_image()),
        &dir.path().join("s"),
    )
    .await;
    let r = sb
        .exec(ExecRequest::new(
            "trap '' TERM HUP INT; (trap '' TERM HUP INT; sleep 955) & (sleep 954 &) ; sleep 956",
            Duration::from_secs(1),
        ))
        .await
        .unwrap();
    assert!(r.timed_out);
    let ps = sh(&sb, "ps -o args").await;
    assert!(
        !ps.contains("sleep 95"),
        "left running after the timeout:\n{ps}"
    );
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_oom_killer_gives_a_clear_result() {
    let _daemon = berth_tests::DOCKERD.read().await;
    let Some(_docker) = docker_or_skip("the_oom_killer_gives_a_clear_result").await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let mut sb = new_sandbox(
        &client,
        DockerOptions::new(test_image()).memory(32 << 20),
        &dir.path().join("s"),
    )
    .await;
    let r = sb
        .exec(ExecRequest::new(
            "dd if=/dev/zero of=/dev/null bs=200M count=1",
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 137, "{r:?}");
    assert!(r.notes.iter().any(|n| n.contains("out-of-memory")), "{r:?}");
    // The sandbox survives it.
    assert_eq!(sh(&sb, "echo alive").await, "alive\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn thirty_two_sandboxes_at_once_without_cross_talk() {
    let _daemon = berth_tests::DOCKERD.read().await;
    let Some(docker) = docker_or_skip("thirty_two_sandboxes_at_once_without_cross_talk").await
    else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path());
    let snaps = dir.path().join("snaps");
    let t = Instant::now();
    let mut sandboxes =
        join_all((0..32).map(|_| new_sandbox(&client, DockerOptions::new(test_image()), &snaps)))
            .await;
    let created = t.elapsed();
    join_all(sandboxes.iter().enumerate().map(|(i, sb)| async move {
        sh(sb, &format!("echo token-{i} > token && mkdir -p d{i}")).await;
    }))
    .await;
    join_all(sandboxes.iter_mut().map(|sb| sb.stop()))
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    let states: Vec<SandboxState> = sandboxes.iter().map(|s| s.state()).collect();
    // Remove every container so every resume restores from its snapshot.
    join_all(states.iter().map(|s| {
        let id = container_id(s);
        let docker = docker.clone();
        async move {
            docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptionsBuilder::new().force(true).build()),
                )
                .await
                .unwrap()
        }
    }))
    .await;
    let resumed = join_all(states.iter().enumerate().map(|(i, s)| {
        let client = client.clone();
        let s = s.clone();
        async move {
            let mut sb = client
                .resume(s, None, SandboxOptions::default())
                .await
                .unwrap();
            assert_eq!(
                sb.start().await.unwrap(),
                StartBranch::Rebuild { restored: true }
            );
            assert_eq!(
                sh(&sb, "cat token; ls -d d*").await,
                format!("token-{i}\nd{i}\n"),
                "cross-talk in sandbox {i}"
            );
            sb
        }
    }))
    .await;
    println!(
        "32 sandboxes: created and started in {created:?}; whole cycle {:?}",
        t.elapsed()
    );
    join_all(
        resumed
            .into_iter()
            .map(|mut sb| async move { sb.shutdown().await.unwrap() }),
    )
    .await;
}
