//! The library's examples, run as their users run them.

use std::process::Command;

use berth_tests::{guest, repo_root};

fn example(name: &str) -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug/examples").join(name);
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test --workspace` builds the examples",
        bin.display()
    );
    bin
}

#[test]
fn the_embedding_example_restores_its_workspace_through_the_plugin() {
    let out = Command::new(example("embed"))
        .arg(guest("fs_store"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fix it\ndone\n");
}

#[test]
fn the_demo_tells_the_whole_story() {
    let out = Command::new(example("demo"))
        .arg(guest("fs_store"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("every file came back byte-identical"),
        "{stdout}"
    );
    assert!(stdout.contains("Demo complete."), "{stdout}");
    // Its Docker half runs wherever an engine must answer.
    if berth_tests::docker_required() {
        assert!(
            !stdout.contains("[docker] skipped"),
            "the demo skipped its Docker half in CI: {stdout}"
        );
    }
}
