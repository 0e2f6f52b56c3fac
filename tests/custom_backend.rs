//! A `Backend` written outside the crate, as an embedder would (see
//! `test_dir_backend.rs`), driven by the same lifecycle (start, exec, stop,
//! shutdown, resume from JSON, listed, forked-like), snapshots and lineage
//! guard included; without registration, `resume_with_backend`; and,
//! registered with the `berth` command, through the CLI, the API and the
//! Python client.

use std::time::Duration;

use std::path::PathBuf;

use berth::backend::{BackendProvider, ExecRequest};
use berth::sandbox::{
    BackendSpec, SandboxError, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec, StartBranch,
};
use berth::workspace::WorkspaceSpec;
use berth_tests::test_dir_backend::{DirBackend, DirOptions, DirProvider, DirState, KIND};

/// Starts a resumed sandbox whose workspace is gone: it is rebuilt from
/// the snapshot, both files back; then shuts it down.
async fn restored_both_files(sb: &mut berth::sandbox::Sandbox) {
    assert_eq!(
        sb.start().await.unwrap(),
        StartBranch::Rebuild { restored: true }
    );
    let r = sb
        .exec(ExecRequest::new("cat a.txt b.txt", Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(r.stdout, "a\nb\n");
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backend_written_outside_the_crate_runs_the_whole_lifecycle() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("ws");
    let client = berth_tests::client(home.path());
    let workspace: WorkspaceSpec =
        serde_json::from_str(r#"{"entries": {"a.txt": {"type": "file", "content": "a\n"}}}"#)
            .unwrap();
    let backend = DirBackend {
        state: DirState { dir: dir.clone() },
    };
    let spec = SandboxSpec::new(workspace)
        .snapshot(SnapshotSpec::local(home.path().join("snaps")))
        .backend(BackendSpec::custom(Box::new(backend)));
    let mut sb = client.create(spec).await.unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    let r = sb
        .exec(ExecRequest::new(
            "cat a.txt; echo b > b.txt",
            Duration::from_secs(10),
        ))
        .await
        .unwrap();
    assert_eq!(r.stdout, "a\n");
    sb.stop().await.unwrap();
    let saved = sb.state().to_json().unwrap();
    sb.shutdown().await.unwrap();
    assert!(!dir.exists());

    // Resume from the JSON alone, with the embedder's own constructor.
    let state = SandboxState::from_json(&saved).unwrap();
    assert_eq!(state.backend.kind, KIND);
    let backend = DirBackend {
        state: state.backend.decode().unwrap(),
    };
    // A client without its provider cannot construct it: it says which
    // kinds it knows.
    let err = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .err()
        .unwrap();
    match &err {
        SandboxError::UnknownBackend { kind, known } => {
            assert_eq!(kind, KIND);
            assert!(known.contains(&"local".to_string()), "{known:?}");
        }
        other => panic!("expected UnknownBackend, got {other}"),
    }
    let mut sb = client
        .resume_with_backend(state, None, Box::new(backend), SandboxOptions::default())
        .await
        .unwrap();
    restored_both_files(&mut sb).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_registered_provider_creates_resumes_lists_and_makes_one_like_it() {
    let home = tempfile::tempdir().unwrap();
    let parent = home.path().join("dirs");
    let client = berth_tests::client_builder(home.path())
        .backend_provider(DirProvider)
        .build();
    assert!(client.backend_kinds().contains(&KIND.to_string()));
    let workspace: WorkspaceSpec =
        serde_json::from_str(r#"{"entries": {"a.txt": {"type": "file", "content": "a\n"}}}"#)
            .unwrap();
    let spec = SandboxSpec::new(workspace.clone())
        .snapshot(SnapshotSpec::local(home.path().join("snaps")))
        .backend(BackendSpec::new(DirOptions {
            parent: parent.clone(),
        }));
    let mut sb = client.create(spec).await.unwrap();
    assert_eq!(sb.start().await.unwrap(), StartBranch::Fresh);
    sb.exec(ExecRequest::new("echo b > b.txt", Duration::from_secs(10)))
        .await
        .unwrap();
    sb.stop().await.unwrap();
    let state = SandboxState::from_json(&sb.state().to_json().unwrap()).unwrap();
    let dir: DirState = state.backend.decode().unwrap();
    assert!(dir.dir.starts_with(&parent), "{dir:?}");
    let summary = client.backend_summary(&state.backend).unwrap();
    assert_eq!(summary.instance, Some(dir.dir.display().to_string()));
    sb.shutdown().await.unwrap();

    // Resumed by kind, as the built-in backends are.
    let mut sb = client
        .resume(state.clone(), None, SandboxOptions::default())
        .await
        .unwrap();
    restored_both_files(&mut sb).await;

    // A new sandbox like it: same kind, its own directory.
    let like = client.backend_like(&state.backend).unwrap();
    let mut other = client
        .create(SandboxSpec::new(workspace).backend(like))
        .await
        .unwrap();
    other.start().await.unwrap();
    let other_dir: DirState = other.state().backend.decode().unwrap();
    assert_eq!(other.state().backend.kind, KIND);
    assert_ne!(other_dir.dir, dir.dir);
    assert!(other_dir.dir.starts_with(&parent));
    other.shutdown().await.unwrap();
}

/// The out-of-crate backend passes the backend conformance suite, as the
/// built-in ones do (`lifecycle.rs`).
struct DirUnderTest {
    parent: PathBuf,
}

#[async_trait::async_trait]
impl berth::conformance::BackendUnderTest for DirUnderTest {
    fn name(&self) -> String {
        "test-dir backend (outside the crate)".into()
    }

    fn spec(&self) -> BackendSpec {
        BackendSpec::new(DirOptions {
            parent: self.parent.clone(),
        })
    }

    fn provider(&self) -> Option<std::sync::Arc<dyn BackendProvider>> {
        Some(std::sync::Arc::new(DirProvider))
    }

    fn disasters(&self) -> Vec<berth::conformance::Disaster> {
        vec![berth::conformance::Disaster::WorkspaceDeleted]
    }

    async fn inflict(
        &self,
        disaster: berth::conformance::Disaster,
        state: &SandboxState,
    ) -> Result<(), String> {
        let dir: DirState = state.backend.decode().map_err(|e| e.to_string())?;
        match disaster {
            berth::conformance::Disaster::WorkspaceDeleted => {
                std::fs::remove_dir_all(dir.dir).map_err(|e| e.to_string())
            }
            other => Err(format!("cannot inflict {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_out_of_crate_backend_passes_the_backend_conformance_suite() {
    let home = tempfile::tempdir().unwrap();
    let backend = DirUnderTest {
        parent: home.path().join("dirs"),
    };
    let report = berth::conformance::check_backend(&backend, home.path()).await;
    assert!(report.passed(), "{}", report.table());
    // It has no file API (no helper in the sandbox): that clause is
    // reported as not run, not counted as passed.
    assert!(
        report
            .not_run
            .iter()
            .any(|n| n.starts_with("files: not provided"))
            && report.results.iter().all(|r| r.clause != "files"),
        "{}",
        report.table()
    );
}

/// A kind from outside the library, registered with the `berth` command
/// (`berth_cli::Berth`, as the `berth-test-dir` binary does), reaches
/// every front end with no front-end code: its settings are `create`'s
/// flags and help, the API lists and takes them (`GET /v1/backends`,
/// `POST /v1/sandboxes`), and so does the Python client; a key it lacks
/// is refused naming the keys it has, everywhere, and creates nothing.
#[test]
fn a_kind_from_outside_reaches_the_cli_the_api_and_python() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let parent = home.join("dirs");
    let parent_text = parent.display().to_string();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_berth-test-dir"))
            .env("BERTH_HOME", home)
            .env_remove("RUST_LOG")
            .args(args)
            .output()
            .unwrap()
    };
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let ok = |args: &[&str]| {
        let out = run(args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };

    let help = ok(&["create", "--help"]);
    assert!(
        help.contains("--backend test-dir") && help.contains("parent=PATH (required)"),
        "{help}"
    );
    // The kind's setting as a flag, and as -o.
    ok(&[
        "create",
        "a",
        "--backend",
        "test-dir",
        "--parent",
        &parent_text,
    ]);
    ok(&[
        "create",
        "b",
        "--backend",
        "test-dir",
        "-o",
        &format!("parent={parent_text}"),
    ]);
    assert_eq!(ok(&["exec", "a", "--", "echo hi > f; cat f"]), "hi\n");
    let dirs: Vec<_> = std::fs::read_dir(&parent).unwrap().flatten().collect();
    assert!(
        dirs.iter().any(|d| d.path().join("f").is_file()),
        "the workspace is not under the kind's parent: {dirs:?}"
    );
    ok(&["stop", "a"]);
    let listed: serde_json::Value = serde_json::from_str(&ok(&["ls", "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert!(listed.to_string().contains(KIND), "{listed}");
    // Keys the kind lacks, and a required one left out: refused, nothing made.
    for (args, says) in [
        (
            vec!["--image", "alpine"],
            vec!["no setting \"image\"", "docker", "parent"],
        ),
        (vec![], vec!["parent is required"]),
        (vec!["-o", "oops"], vec!["is not KEY=VALUE"]),
    ] {
        let mut line = vec!["create", "c", "--backend", "test-dir"];
        line.extend(args.iter().copied());
        let out = run(&line);
        let said = text(&out);
        assert!(!out.status.success(), "{line:?} succeeded");
        for s in says {
            assert!(said.contains(s), "{line:?}: {said}");
        }
        assert_eq!(said.matches("error").count(), 1, "{said}");
    }
    for name in ["a", "b"] {
        ok(&["rm", name]);
    }

    // The API and Python, from the same binary's server.
    ok(&["server", "start"]);
    let script = format!(
        r#"
import sys
from berth_client import Berth, BerthError
b = Berth()
kinds = {{k["kind"]: k["settings"] for k in b.backends()}}
assert set(kinds) >= {{"local", "docker", "swarm", "test-dir"}}, kinds
assert [s["key"] for s in kinds["test-dir"]] == ["parent"], kinds["test-dir"]
assert kinds["test-dir"][0]["required"] is True
flat = b.create("flat", backend="test-dir", parent={parent:?})
assert flat.exec("echo flat").stdout == "flat\n"
nested = b.create("nested", backend={{"type": "test-dir", "parent": {parent:?}}})
assert nested.exec("pwd").stdout.startswith({parent:?})
try:
    b.create("bad", backend="test-dir", parent={parent:?}, memory="1GiB")
    sys.exit("a key the kind lacks was accepted")
except BerthError as e:
    assert e.status == 400 and 'no setting "memory"' in e.message, (e.status, e.message)
assert sorted(s["name"] for s in b.sandboxes()) == ["flat", "nested"], b.sandboxes()
flat.remove()
nested.remove()
print("done")
"#,
        parent = parent_text
    );
    let out = berth_tests::python_client(&[("BERTH_HOME", home)], &script);
    let said = text(&out);
    ok(&["server", "stop"]);
    assert!(out.status.success() && said.contains("done"), "{said}");
}

/// `berth-test-dir` in `home` with `args`.
fn test_dir_cli(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_berth-test-dir"))
        .env("BERTH_HOME", home)
        .env_remove("RUST_LOG")
        .args(args)
        .output()
        .unwrap()
}

/// Its stdout and stderr.
fn said(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A snapshot kind written outside the library (`test-copies:DIR`,
/// registered by `berth-test-dir`) reaches every front end with no
/// front-end code: `create --snapshot` and its help, resume from the state
/// in later processes, `rm` (which deletes what the kind says) and `gc
/// --orphans` (which lists what the kind says); the API and the Python
/// client the same; a bad argument is refused with the kind's usage, once,
/// and creates nothing.
#[test]
fn a_snapshot_kind_from_outside_reaches_the_cli_the_api_and_python() {
    use berth_tests::test_copies_snapshot::KIND as COPIES;
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let copies = home.join("copies");
    let choice = format!("{COPIES}:{}", copies.display());
    let ok = |args: &[&str]| {
        let out = test_dir_cli(home, args);
        assert!(out.status.success(), "{args:?}: {}", said(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let copies_now = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&copies)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };

    assert!(ok(&["create", "--help"]).contains("test-copies:DIR"));
    ok(&["create", "s", "--snapshot", &choice, "--snapshot-id", "s-1"]);
    ok(&["exec", "s", "--", "echo kept > f"]);
    ok(&["stop", "s"]);
    assert_eq!(copies_now(), ["s-1.copy"]);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(home.join("sandboxes/s.json")).unwrap())
            .unwrap();
    let state = &state["state"];
    assert_eq!(state["snapshot"]["type"], COPIES, "{state}");
    assert_eq!(state["snapshot"]["dir"], copies.display().to_string());
    // A later process resumes it through the kind's provider, and a
    // rebuild restores the copy.
    ok(&["shutdown", "s"]);
    assert_eq!(ok(&["exec", "s", "--", "cat f"]), "kept\n");
    // A copy no sandbox uses is the kind's orphan.
    std::fs::write(copies.join("stray.copy"), b"x").unwrap();
    let orphans = ok(&["gc", "--orphans"]);
    assert!(
        orphans.contains("stray.copy") && !orphans.contains("s-1.copy"),
        "{orphans}"
    );
    ok(&["gc", "--orphans", "--yes"]);
    assert_eq!(copies_now(), ["s-1.copy"]);
    ok(&["rm", "s"]);
    assert!(copies_now().is_empty(), "rm left the kind's copy");

    // A choice the kind refuses: its usage, one error, nothing made.
    let out = test_dir_cli(home, &["create", "bad", "--snapshot", COPIES]);
    let text = said(&out);
    assert!(
        !out.status.success() && text.contains("test-copies:DIR"),
        "{text}"
    );
    assert_eq!(text.matches("error").count(), 1, "{text}");
    assert!(!home.join("sandboxes/bad.json").exists());

    ok(&["server", "start"]);
    let script = format!(
        r#"
import os
from berth_client import Berth, BerthError
b = Berth()
p = b.create("p", snapshot={choice:?})
p.exec("echo api > g")
p.stop()
[copy] = os.listdir({dir:?})
assert copy.endswith(".copy"), copy
listed = [s for s in b.sandboxes() if s["name"] == "p"][0]
assert listed["snapshot"] == {kind:?}, listed
try:
    b.create("q", snapshot="test-copies")
    raise SystemExit("a bad choice was accepted")
except BerthError as e:
    assert e.status == 400 and "test-copies:DIR" in e.message, (e.status, e.message)
p.remove()
assert os.listdir({dir:?}) == [], os.listdir({dir:?})
print("done")
"#,
        dir = copies.display().to_string(),
        kind = COPIES,
    );
    let out = berth_tests::python_client(&[("BERTH_HOME", home)], &script);
    let text = said(&out);
    ok(&["server", "stop"]);
    assert!(out.status.success() && text.contains("done"), "{text}");
}
