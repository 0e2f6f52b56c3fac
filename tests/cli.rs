//! `berth` used as a plugin author would.

use std::process::Command;

use berth_tests::{berth_bin, guest, repo_root};

#[path = "first_hour.rs"]
mod first_hour;

#[test]
fn plugin_check_passes_good_plugins_and_names_broken_clauses() {
    let root = repo_root();
    let examples: Vec<_> = berth_tests::guest_table()
        .into_iter()
        .filter(|g| g.example)
        .map(|g| format!("guest-examples/{}/plugin.toml", g.name))
        .collect();
    assert!(examples.len() >= 6, "{examples:?}");
    for manifest in &examples {
        let out = Command::new(berth_bin())
            .args(["plugin", "check", "--large-size", "0"])
            .arg(root.join(manifest))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{stdout}");
        assert!(
            out.status.success(),
            "{manifest}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(" 0 failed"), "{stdout}");
    }

    let out = Command::new(berth_bin())
        .args(["plugin", "check", "--json", "--large-size", "0"])
        .arg(guest("broken_store"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a broken plugin must fail the check");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&str> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["passed"] == false)
        .map(|r| r["clause"].as_str().unwrap())
        .collect();
    assert!(failed.contains(&"invalid-ids-rejected"), "{failed:?}");
    assert!(
        failed.contains(&"interrupted-upload-keeps-previous"),
        "{failed:?}"
    );
}

#[test]
fn plugin_inspect_lists_world_imports_and_exports() {
    let out = Command::new(berth_bin())
        .args(["plugin", "inspect"])
        .arg(guest("dir_snapshot"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("world:     berth:snapshot/snapshot-plugin@0.1.0"),
        "{stdout}"
    );
    assert!(stdout.contains("wasi:io/streams@0.2.12"), "{stdout}");
    assert!(stdout.contains("berth:snapshot/snapshot@0.1.0"), "{stdout}");
}

#[test]
fn check_of_a_missing_file_says_what_failed() {
    let out = Command::new(berth_bin())
        .args(["plugin", "check", "/nonexistent/plugin.wasm"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/plugin.wasm"), "{stderr}");
}

#[test]
fn sandbox_commands_as_a_new_user_would_use_them() {
    let home = tempfile::tempdir().unwrap();
    let berth = |args: &[&str]| {
        let out = Command::new(berth_bin())
            .env("BERTH_HOME", home.path())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, help, _) = berth(&["--help"]);
    assert_eq!(code, 0);
    for cmd in [
        "create", "exec", "stop", "start", "rm", "ls", "inspect", "persist", "hydrate", "plugin",
    ] {
        assert!(help.contains(cmd), "--help lacks {cmd}: {help}");
    }

    let ws = home.path().join("ws.json");
    std::fs::write(
        &ws,
        r#"{"entries": {"hello.txt": {"type": "file", "content": "hi\n"}}}"#,
    )
    .unwrap();
    let (code, out, err) = berth(&["create", "agent1", "--workspace", ws.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = berth(&["exec", "agent1", "--", "cat", "hello.txt"]);
    assert_eq!((code, out.as_str()), (0, "hi\n"));
    let (code, _, _) = berth(&["exec", "agent1", "--", "echo work > agent.txt; exit 3"]);
    assert_eq!(code, 3, "the exit code is propagated");
    let (code, out, err) = berth(&["stop", "agent1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("blake3:"), "{out}");
    let (code, out, _) = berth(&["ls"]);
    assert_eq!(code, 0);
    assert!(out.contains("agent1"), "{out}");
    let (code, out, _) = berth(&["inspect", "agent1"]);
    assert_eq!(code, 0);
    let state: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(state["type"], "local");

    // Lose the workspace; the next exec restores it from the snapshot.
    let root = state["root_dir"].as_str().unwrap();
    berth_tests::remove_workspace(root);
    let (code, out, err) = berth(&["exec", "agent1", "--", "cat agent.txt"]);
    assert_eq!((code, out.as_str()), (0, "work\n"), "{err}");

    let tar = home.path().join("ws.tar");
    let (code, _, err) = berth(&["persist", "agent1", "--out", tar.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = berth(&["hydrate", "agent1", tar.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");

    // Errors say what failed and what to do.
    let (code, _, err) = berth(&["exec", "nope", "--", "true"]);
    assert_ne!(code, 0);
    assert!(err.contains("berth ls"), "{err}");
    let (code, _, err) = berth(&["create", "../evil"]);
    assert_ne!(code, 0);
    assert!(err.contains("not a valid sandbox name"), "{err}");

    let (code, out, err) = berth(&["rm", "agent1"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!std::path::Path::new(root).exists());
    let (_, out, _) = berth(&["ls"]);
    assert!(!out.contains("agent1"));
}

#[test]
fn quick_benchmark_runs_and_reports_ratios() {
    let out_file = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(berth_bin().with_file_name("berth-bench"))
        .current_dir(repo_root())
        .args(["--quick", "--out"])
        .arg(out_file.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_file.path()).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let has = |group: &str| rows.iter().any(|r| r["group"] == group);
    for group in [
        "persist",
        "restore",
        "memory",
        "plugin",
        "dedup",
        "isolation",
    ] {
        assert!(has(group), "no {group} rows:\n{stdout}");
    }
    if berth_tests::docker_required() {
        assert!(
            has("docker"),
            "no docker rows although Docker is required:\n{stdout}"
        );
    }
    for what in ["wasm fs-store (Rust)", "wasm c-store (C)"] {
        assert!(
            rows.iter()
                .any(|r| r["what"] == what && r["ratio"].as_f64().is_some()),
            "no ratio for {what}:\n{stdout}"
        );
    }
    assert!(
        rows.iter()
            .any(|r| r["what"] == "c-store (C) instance + open + exists"),
        "no per-language plugin rows:\n{stdout}"
    );
}
