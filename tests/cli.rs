//! `berth` used as a plugin author would.

use std::process::Command;

use berth_tests::{berth_bin, guest, repo_root};

#[test]
fn plugin_check_passes_good_plugins_and_names_broken_clauses() {
    let root = repo_root();
    for manifest in [
        "guest-examples/fs-store/plugin.toml",
        "guest-examples/dir-snapshot/plugin.toml",
        "guest-examples/noop-snapshot/plugin.toml",
    ] {
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
