//! The promise, over generated workspaces: whatever `stop` writes, a resume
//! after a disaster restores identically — through every entry point, on
//! both backends.
//!
//! For each generated workspace (see `workspace_gen`): build it, take its
//! manifest, stop, cause a disaster, resume through one entry point, and
//! compare the manifest of what the backend now really holds (read
//! straight from the host directory or with `docker exec`, never through
//! Berth) with the one before. Entry points: the library (`resume` +
//! `start`, `resume` + `attach`) and the CLI in a fresh process (`exec`,
//! `stop`, `start`, `persist`, `hydrate`). A `stop` entry point is then
//! followed by a second disaster and `start`, proving the snapshot it wrote
//! is good too.
//!
//! Seeds are fixed so CI is replayable; `BERTH_ROUNDTRIP_SEEDS=7,8,9`
//! runs others. A failure names its seed, disaster and entry point.

use std::path::{Path, PathBuf};
use std::process::Command;

use berth::sandbox::{BackendSpec, SandboxSpec, SandboxState, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;
use berth_tests::workspace_gen::{self, MANIFEST};
use berth_tests::{
    berth_bin, berth_ok, berth_state, container_id, docker_or_skip, local_root, resume_from_json,
    sh, test_image,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    LibStart,
    LibAttach,
    CliExec,
    CliStop,
    CliStart,
    CliPersist,
    CliHydrate,
}

const ENTRIES: [Entry; 7] = [
    Entry::LibStart,
    Entry::LibAttach,
    Entry::CliExec,
    Entry::CliStop,
    Entry::CliStart,
    Entry::CliPersist,
    Entry::CliHydrate,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disaster {
    /// Local: the workspace directory is deleted.
    WorkspaceDeleted,
    /// Docker: the container is stopped.
    Stopped,
    /// Docker: the container is paused.
    Paused,
    /// Docker: the container is removed; the image has the workspace root.
    Removed,
    /// Docker: the container is removed; the image lacks the root.
    RemovedNoRootInImage,
}

fn seeds(default: &[u64]) -> Vec<u64> {
    berth_tests::seeds("BERTH_ROUNDTRIP_SEEDS", default)
}

/// Where a sandbox's workspace really is, read without Berth.
#[derive(Debug, Clone)]
enum Raw {
    Dir(PathBuf),
    Container { id: String, root: String },
}

impl Raw {
    fn of(state: &SandboxState) -> Raw {
        if state.backend.kind == berth::backend::local::KIND {
            Raw::Dir(local_root(state))
        } else {
            Raw::Container {
                id: container_id(state),
                root: state.manifest.root.clone(),
            }
        }
    }

    fn run(&self, script: &str) -> String {
        let out = match self {
            Raw::Dir(d) => Command::new("sh")
                .args(["-c", script])
                .current_dir(d)
                .output()
                .unwrap(),
            Raw::Container { id, root } => Command::new("docker")
                .args(["exec", "-w", root, id, "sh", "-c", script])
                .output()
                .unwrap(),
        };
        assert!(
            out.status.success(),
            "{self:?}: {script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn manifest(&self) -> String {
        self.run(MANIFEST)
    }

    fn disaster(&self, disaster: Disaster) {
        let docker = |args: &[&str]| {
            let out = Command::new("docker").args(args).output().unwrap();
            assert!(out.status.success(), "docker {args:?}: {out:?}");
        };
        match (self, disaster) {
            (Raw::Dir(d), Disaster::WorkspaceDeleted) => berth_tests::remove_workspace(d),
            (Raw::Container { id, .. }, Disaster::Stopped) => docker(&["stop", "-t", "1", id]),
            (Raw::Container { id, .. }, Disaster::Paused) => docker(&["pause", id]),
            (Raw::Container { id, .. }, Disaster::Removed | Disaster::RemovedNoRootInImage) => {
                docker(&["rm", "-f", id])
            }
            (raw, d) => panic!("no disaster {d:?} for {raw:?}"),
        }
    }
}

fn workspace_for(disaster: Disaster) -> WorkspaceSpec {
    let root = if disaster == Disaster::RemovedNoRootInImage {
        "/srv/agent-work"
    } else {
        "/workspace"
    };
    serde_json::from_value(serde_json::json!({ "root": root })).unwrap()
}

/// An empty tar (two zero blocks) for the hydrate entry point.
fn one_file_tar(dir: &Path) -> PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(9);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "hydrated.txt", &b"hydrated\n"[..])
        .unwrap();
    let p = dir.join("one.tar");
    std::fs::write(&p, b.into_inner().unwrap()).unwrap();
    p
}

async fn case(docker: bool, seed: u64, disaster: Disaster, entry: Entry) {
    let label = format!("seed {seed}, disaster {disaster:?}, entry {entry:?}");
    println!("round trip: {label}");
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let max_file = if docker { 4 << 20 } else { 64 << 20 };
    let script = workspace_gen::script(seed, max_file);
    let workspace = workspace_for(disaster);
    let lib = matches!(entry, Entry::LibStart | Entry::LibAttach);

    let (before, state) = if lib {
        let client = berth_tests::client(&home);
        let backend = if docker {
            BackendSpec::new(DockerOptions::new(test_image()))
        } else {
            BackendSpec::local()
        };
        let mut sb = client
            .create(
                SandboxSpec::new(workspace)
                    .snapshot(SnapshotSpec::local(home.join("snapshots")))
                    .backend(backend),
            )
            .await
            .unwrap();
        sb.start().await.unwrap();
        sh(&sb, &script).await;
        let raw = Raw::of(&sb.state());
        let before = raw.manifest();
        sb.stop().await.unwrap();
        (before, sb.state())
    } else {
        std::fs::create_dir_all(&home).unwrap();
        let ws = dir.path().join("ws.json");
        std::fs::write(&ws, serde_json::to_string(&workspace).unwrap()).unwrap();
        let ws = ws.to_str().unwrap();
        let image = test_image();
        let mut create = vec!["create", "rt", "--workspace", ws];
        if docker {
            create.extend(["--backend", "docker", "--image", &image]);
        }
        berth_ok(&home, &create);
        berth_ok(&home, &["exec", "rt", "--", &script]);
        let before = Raw::of(&berth_state(&home, "rt")).manifest();
        berth_ok(&home, &["stop", "rt"]);
        (before, berth_state(&home, "rt"))
    };
    assert!(
        !before.is_empty(),
        "{label}: an empty workspace proves nothing"
    );
    Raw::of(&state).disaster(disaster);

    let after_state = match entry {
        Entry::LibStart | Entry::LibAttach => {
            let client = berth_tests::client(&home);
            let mut sb = resume_from_json(&client, &state).await;
            if entry == Entry::LibStart {
                sb.start().await
            } else {
                sb.attach().await
            }
            .unwrap_or_else(|e| panic!("{label}: {e}"));
            sb.state()
        }
        Entry::CliExec => {
            berth_ok(&home, &["exec", "rt", "--", "true"]);
            berth_state(&home, "rt")
        }
        Entry::CliStop => {
            berth_ok(&home, &["stop", "rt"]);
            berth_state(&home, "rt")
        }
        Entry::CliStart => {
            berth_ok(&home, &["start", "rt"]);
            berth_state(&home, "rt")
        }
        Entry::CliPersist => {
            let out = dir.path().join("out.tar");
            berth_ok(&home, &["persist", "rt", "--out", out.to_str().unwrap()]);
            // The persisted archive is the workspace: GNU tar extracts
            // exactly what the manifest lists.
            let extracted = dir.path().join("persisted");
            std::fs::create_dir(&extracted).unwrap();
            let untar = Command::new("tar")
                .arg("-xpf")
                .arg(&out)
                .arg("-C")
                .arg(&extracted)
                .output()
                .unwrap();
            assert!(untar.status.success(), "{label}: {untar:?}");
            assert_eq!(
                before,
                Raw::Dir(extracted).manifest(),
                "{label}: the persisted archive is not the workspace"
            );
            berth_state(&home, "rt")
        }
        Entry::CliHydrate => {
            let tar = one_file_tar(dir.path());
            berth_ok(&home, &["hydrate", "rt", tar.to_str().unwrap()]);
            let state = berth_state(&home, "rt");
            // It landed, merged into the workspace; taken out again so the
            // rest of the workspace can be compared.
            let raw = Raw::of(&state);
            assert_eq!(raw.run("cat hydrated.txt"), "hydrated\n", "{label}");
            raw.run("rm hydrated.txt");
            state
        }
    };
    let after = Raw::of(&after_state).manifest();
    assert_eq!(
        before, after,
        "{label}: the workspace changed across the round trip"
    );

    if entry == Entry::CliStop {
        // The snapshot that stop wrote after the disaster is good too.
        Raw::of(&after_state).disaster(disaster);
        berth_ok(&home, &["start", "rt"]);
        let again = Raw::of(&berth_state(&home, "rt")).manifest();
        assert_eq!(
            before, again,
            "{label}: the snapshot written after the disaster differs"
        );
    }
    // Clean up what we own.
    if lib {
        let client = berth_tests::client(&home);
        let mut sb = resume_from_json(&client, &after_state).await;
        let _ = sb.shutdown().await;
    } else {
        let _ = Command::new(berth_bin())
            .env("BERTH_HOME", &home)
            .args(["rm", "--force", "rt"])
            .output();
    }
    // Local workspaces may hold read-only directories: make them removable.
    let _ = Command::new("chmod")
        .args(["-R", "u+rwx"])
        .arg(dir.path())
        .output();
}

#[tokio::test(flavor = "multi_thread")]
async fn local_round_trip_over_generated_workspaces_and_every_entry_point() {
    let started = std::time::Instant::now();
    let seeds = seeds(&[1, 2, 3, 4, 5, 6]);
    let mut n = 0;
    for seed in &seeds {
        for entry in ENTRIES {
            case(false, *seed, Disaster::WorkspaceDeleted, entry).await;
            n += 1;
        }
    }
    println!(
        "local: {n} round trips ({} workspaces x 1 disaster x {} entry points) in {:?}",
        seeds.len(),
        ENTRIES.len(),
        started.elapsed()
    );
}

async fn docker_disaster(test: &str, disaster: Disaster) {
    if docker_or_skip(test).await.is_none() {
        return;
    }
    let started = std::time::Instant::now();
    let seeds = seeds(&[11, 12, 13]);
    let mut n = 0;
    for seed in &seeds {
        for entry in ENTRIES {
            case(true, *seed, disaster, entry).await;
            n += 1;
        }
    }
    println!(
        "docker {disaster:?}: {n} round trips ({} workspaces x {} entry points) in {:?}",
        seeds.len(),
        ENTRIES.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_round_trip_after_the_container_stopped() {
    docker_disaster(
        "docker_round_trip_after_the_container_stopped",
        Disaster::Stopped,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_round_trip_after_the_container_paused() {
    docker_disaster(
        "docker_round_trip_after_the_container_paused",
        Disaster::Paused,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_round_trip_after_the_container_was_removed() {
    docker_disaster(
        "docker_round_trip_after_the_container_was_removed",
        Disaster::Removed,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn docker_round_trip_after_removal_with_an_image_lacking_the_root() {
    docker_disaster(
        "docker_round_trip_after_removal_with_an_image_lacking_the_root",
        Disaster::RemovedNoRootInImage,
    )
    .await;
}
