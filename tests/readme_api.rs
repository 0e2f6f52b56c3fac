//! The README's API section — the server, `curl`, the Python and
//! TypeScript clients and the Agents SDK example — run as printed, in
//! order, in one shell from the repository root, against the real Docker
//! engine.

use std::process::Command;

use berth_tests::{berth_bin, docker_or_skip, docker_required, repo_root, skipped};

/// The section's blocks as one bash script: `sh` blocks as they are,
/// `python` blocks fed to `python3` (or to the interpreter their first
/// line names as a comment), `js` blocks to `node` as an ES module. Two
/// lines are not run as written: the build of the CLI (this test's build
/// did it; running it could rebuild the binary other tests use) and the
/// download of the pinned Agents SDK
/// (`cargo xtask setup` installed the same version into
/// `target/py-agents`): the fresh venv sees that one's packages through a
/// `.pth` file, and the package is installed into it without its
/// dependencies — no SDK download per run.
fn section_script(readme: &str) -> (String, usize) {
    let start = readme.find("## The API").expect("the API section");
    let end = start + readme[start..].find("## Using the CLI\n").expect("its end");
    let agents_venv = repo_root().join("target/py-agents");
    let mut script = String::from(
        "set -euo pipefail\n\
         cargo() { if [ \"$*\" = 'build -p berth-cli' ]; then return 0; fi; command cargo \"$@\"; }\n",
    );
    let mut blocks = 0;
    let mut lines = readme[start..end].lines();
    while let Some(line) = lines.next() {
        let fence = line.trim_start();
        let python = fence == "```python";
        let node = fence == "```js";
        if fence != "```sh" && !python && !node {
            continue;
        }
        blocks += 1;
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| l.trim_start() != "```")
            .collect();
        if node {
            // An ES module from stdin resolves packages from the shell's
            // directory, where the section installed them.
            script.push_str("node --input-type=module - <<'NODE'\n");
            for l in &body {
                script.push_str(l);
                script.push('\n');
            }
            script.push_str("NODE\n");
            continue;
        }
        if python {
            let interpreter = body
                .first()
                .and_then(|l| l.strip_prefix("# "))
                .filter(|l| l.ends_with("python"))
                .unwrap_or("python3");
            script.push_str(&format!("{interpreter} - <<'PYTHON'\n"));
            for l in &body {
                script.push_str(l);
                script.push('\n');
            }
            script.push_str("PYTHON\n");
            continue;
        }
        for l in body {
            if l.starts_with("python3 -m venv agents-venv") {
                let purelib = "-c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'";
                script.push_str(&format!(
                    "python3 -m venv agents-venv\n\
                     {sdk}/bin/python {purelib} > \"$(agents-venv/bin/python {purelib})/berth-test-sdk.pth\"\n\
                     agents-venv/bin/pip install -q --disable-pip-version-check --no-deps \"$BERTH_SRC/host/python\"\n",
                    sdk = agents_venv.display()
                ));
            } else {
                script.push_str(l);
                script.push('\n');
            }
        }
    }
    (script, blocks)
}

#[tokio::test]
async fn readme_api_section_runs_as_printed() {
    let Some(_docker) = docker_or_skip("readme_api").await else {
        return;
    };
    let _daemon = berth_tests::DOCKERD.read().await;
    if !repo_root().join("target/py-agents/bin/python").exists() {
        let why = "target/py-agents is missing: `cargo xtask setup` makes it";
        assert!(!docker_required(), "{why}");
        skipped("readme_api", why);
        return;
    }
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let (script, blocks) = section_script(&readme);
    assert!(blocks >= 8, "{blocks} blocks found:\n{script}");
    assert!(
        script.contains("agents-venv/bin/python - <<'PYTHON'"),
        "{script}"
    );
    let home = tempfile::tempdir().unwrap();
    let bin_dir = berth_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(repo_root())
        .env("BERTH_HOME", home.path())
        .env("PATH", path)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("PYTHONPATH")
        .env_remove("BERTH_SOCKET")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's API section failed as printed:\n{script}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    for expected in [
        "step 3",
        "node step 3",
        "hello\\n",
        "stopped the berth server",
    ] {
        assert!(stdout.contains(expected), "{expected:?} not in:\n{stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(home.path().join("sandboxes"))
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the README's API steps left {left:?}");
}
