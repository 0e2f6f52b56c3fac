//! Bounded by default: a workspace's disk quota (a filesystem image per
//! sandbox), the host's defaults file, and what a full workspace still
//! lets a user do.
//!
//! The promises, for local and Docker sandboxes:
//! - a command that fills the workspace gets `ENOSPC`, and the next
//!   command works;
//! - `stop` of a full workspace succeeds, and what it held comes back
//!   entry by entry after the workspace is lost (seeded files);
//! - shutdown leaves no image and no mount behind;
//! - a defaults file or a quota that cannot be used is refused at create
//!   with one clear message, and nothing is left.

use std::path::Path;
use std::time::Duration;

use berth::backend::limits::Bound;
use berth::backend::local::LocalOptions;
use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, Sandbox, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use rand::{Rng, SeedableRng};

const QUOTA: u64 = 48 << 20;

async fn run(sb: &Sandbox, cmd: &str) -> (i32, String) {
    let r = sb
        .exec(ExecRequest::new(cmd, Duration::from_secs(120)))
        .await
        .unwrap();
    let text = format!("{}{}", r.stdout_text(), r.stderr_text());
    (r.exit_code, text)
}

/// Seeded files (names, sizes, bytes), written by a command, listed back
/// as `sha256sum` lines sorted by name.
fn seeded_script(seed: u64) -> String {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut script = String::from("mkdir -p seeded && cd seeded && ");
    for i in 0..rng.gen_range(3..12) {
        let kib = rng.gen_range(0..512);
        let byte = rng.gen_range(1..255);
        script.push_str(&format!(
            "head -c {} /dev/zero | tr '\\000' '\\{byte:03o}' > f{i}_{seed} && ",
            kib * 1024 + rng.gen_range(0..1000)
        ));
    }
    script.push_str("true");
    script
}

const LISTING: &str = "cd seeded && for f in $(ls | sort); do printf '%s ' \"$f\"; wc -c < \"$f\"; cksum < \"$f\"; done";

/// The promises above on `backend`, in a client whose home is `home`;
/// `lose` destroys the workspace (and its image) while stopped.
async fn full_workspace_promises(
    home: &Path,
    backend: impl Fn() -> BackendSpec,
    lose: impl AsyncFnOnce(&Sandbox),
) {
    let client = berth_tests::client(home);
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(home.join("snaps")))
                .backend(backend()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let seed = rand::random::<u64>() % 1_000_000;
    let (code, out) = run(&sb, &seeded_script(seed)).await;
    assert_eq!(code, 0, "seed {seed}: {out}");
    let (_, before) = run(&sb, LISTING).await;
    assert!(before.contains(&format!("_{seed}")), "{before}");

    // Fill it: ENOSPC inside, and the next command works.
    let (code, out) = run(&sb, "dd if=/dev/zero of=fill bs=1M count=100").await;
    assert_ne!(code, 0, "a write past the quota succeeded: {out}");
    assert!(out.contains("No space left"), "{out}");
    let (code, out) = run(&sb, "df -k . | tail -1; echo still-here").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("still-here"), "{out}");
    let size_kib: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("df: {out}"));
    assert!(
        size_kib * 1024 <= QUOTA,
        "the workspace is {size_kib} KiB, over its quota"
    );

    // A full workspace stops, and comes back entry by entry after it is
    // lost.
    sb.stop().await.unwrap();
    lose(&sb).await;
    let state = sb.state();
    drop(sb);
    let mut sb = berth_tests::resume_from_json(&client, &state).await;
    sb.start().await.unwrap();
    let (_, after) = run(&sb, LISTING).await;
    assert_eq!(after, before, "seed {seed}");
    let (code, out) = run(&sb, "rm fill && echo room > room && cat room").await;
    assert_eq!((code, out.trim()), (0, "room"));
    sb.shutdown().await.unwrap();
}

/// No image and no mount of `home`'s sandboxes is left.
fn assert_nothing_left(home: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let home = home.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&home)),
        "a mount under {home} is left"
    );
    for dir in ["run", "disks"] {
        let images: Vec<_> = walk(&Path::new(&home).join(dir))
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "ext4"))
            .collect();
        assert!(images.is_empty(), "images left: {images:?}");
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_local_workspace_gets_enospc_stops_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    full_workspace_promises(
        &home,
        || BackendSpec::new(LocalOptions::default().disk(Bound::At(QUOTA))),
        async |sb: &Sandbox| {
            // The disaster: the image and its mount are gone (a wiped
            // run directory after a reboot).
            let root = berth_tests::local_root(&sb.state());
            let _ = std::process::Command::new("umount").arg(&root).status();
            let run = home_run_dir(&root, &sb.state());
            std::fs::remove_file(run.join("workspace.ext4")).unwrap();
        },
    )
    .await;
    assert_nothing_left(&home);
}

fn home_run_dir(_root: &Path, state: &berth::sandbox::SandboxState) -> std::path::PathBuf {
    let local: berth::backend::local::LocalState = state.backend.decode().unwrap();
    local.run_dir.expect("a run directory")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_docker_workspace_gets_enospc_stops_and_comes_back() {
    let Some(docker) = berth_tests::docker_or_skip("bounds::a_full_docker_workspace").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    full_workspace_promises(
        &home,
        || {
            BackendSpec::new(
                berth_docker::DockerOptions::new(berth_tests::test_image())
                    .user("1000:1000")
                    .disk(Bound::At(QUOTA)),
            )
        },
        async |sb: &Sandbox| {
            // The disaster: the container and the image are gone.
            let state: berth_docker::DockerState = sb.state().backend.decode().unwrap();
            docker
                .remove_container(
                    &state.container_name,
                    Some(bollard::query_parameters::RemoveContainerOptions {
                        force: true,
                        ..Default::default()
                    }),
                )
                .await
                .unwrap();
            let disk = state.disk.expect("a disk image");
            let _ = std::process::Command::new("umount")
                .arg(&disk.mount_point)
                .status();
            std::fs::remove_file(&disk.image).unwrap();
        },
    )
    .await;
    assert_nothing_left(&home);
}

#[tokio::test(flavor = "multi_thread")]
async fn what_cannot_bound_a_workspace_is_refused_at_create_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let client = berth_tests::client(&home);
    let create = |backend: BackendSpec| {
        let client = client.clone();
        async move {
            client
                .create(
                    SandboxSpec::new(WorkspaceSpec::default())
                        .snapshot(SnapshotSpec::noop())
                        .backend(backend),
                )
                .await
                .map(|_| ())
                .map_err(|e| berth_tests::chain(&e))
        }
    };
    // A workspace directory that holds files: the image would hide them.
    let busy = dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("mine.txt"), "mine").unwrap();
    let e = create(BackendSpec::new(LocalOptions::default().root_dir(&busy)))
        .await
        .unwrap_err();
    assert!(
        e.contains("already holds files") && e.contains("disk=unlimited"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(busy.join("mine.txt")).unwrap(),
        "mine"
    );
    // Too small for a filesystem.
    let e = create(BackendSpec::new(
        LocalOptions::default().disk(Bound::At(1 << 20)),
    ))
    .await
    .unwrap_err();
    assert!(e.contains("too small") && e.contains("16MiB"), "{e}");
    // A defaults file with a typo: named, with its key.
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("config.toml"), "[sandbox]\nmemroy = \"1GiB\"\n").unwrap();
    let e = create(BackendSpec::local()).await.unwrap_err();
    assert!(e.contains("config.toml") && e.contains("memroy"), "{e}");
    // And a good one counts from the next create, without a restart.
    std::fs::write(
        home.join("config.toml"),
        "[sandbox]\ndisk = \"20MiB\"\ncpus = 0.5\n",
    )
    .unwrap();
    let mut sb = client
        .create(SandboxSpec::new(WorkspaceSpec::default()).snapshot(SnapshotSpec::noop()))
        .await
        .unwrap();
    sb.start().await.unwrap();
    let local: berth::backend::local::LocalState = sb.state().backend.decode().unwrap();
    assert_eq!(
        (local.disk_bytes, local.cpus_millis),
        (Some(20 << 20), Some(500))
    );
    let (code, out) = run(&sb, "df -k . | tail -1").await;
    assert_eq!(code, 0, "{out}");
    sb.shutdown().await.unwrap();
    std::fs::remove_file(home.join("config.toml")).unwrap();
    assert_nothing_left(&home);
}

/// Two busy loops for two seconds under a half-CPU bound: the CPU time
/// they got, in clock ticks (user and system, from `/proc/PID/stat`).
const CPU_BOMB: &str =
    "p=; for i in 1 2; do ( while :; do :; done ) & p=\"$p $!\"; done; sleep 2; t=0; \
     for x in $p; do set -- $(cat /proc/$x/stat); t=$((t + ${14} + ${15})); done; kill $p; echo $t";

fn cpu_seconds(ticks: &str) -> f64 {
    // USER_HZ is 100 on Linux.
    ticks.trim().parse::<f64>().unwrap_or(-1.0) / 100.0
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cpu_bomb_gets_no_more_than_its_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let client = berth_tests::client(dir.path().join("home"));
    let mut specs = vec![(
        "local",
        BackendSpec::new(LocalOptions::default().cpus_millis(Bound::At(500))),
    )];
    let docker = berth_tests::docker_or_skip("bounds::a_cpu_bomb").await;
    if docker.is_some() {
        specs.push((
            "docker",
            BackendSpec::new(berth_docker::DockerOptions::new(berth_tests::test_image()).cpus(0.5)),
        ));
    }
    let _shared = berth_tests::DOCKERD.read().await;
    for (kind, spec) in specs {
        let mut sb = berth_tests::started_sandbox(&client, spec).await;
        let (code, out) = run(&sb, CPU_BOMB).await;
        assert_eq!(code, 0, "{kind}: {out}");
        let used = cpu_seconds(out.lines().last().unwrap_or(""));
        // Unbounded, two loops on this two-CPU machine take about 4 s of
        // CPU in 2 s; a half CPU gives them about 1 s.
        assert!(
            used > 0.3 && used < 1.5,
            "{kind}: {used:.2} s of CPU in 2 s under a 0.5 CPU bound ({out})"
        );
        sb.shutdown().await.unwrap();
    }
}
