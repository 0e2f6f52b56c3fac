//! The clients of other languages against a real server: the Python client's
//! own tests, and the Agents SDK provider persisting and resuming in a fresh
//! process.

use super::*;

/// A copy of the directory tree `from` at `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "__pycache__" || name == "build" || name.to_string_lossy().ends_with(".egg-info")
        {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// A fresh venv in `dir` with the client package installed from (a copy
/// of) the tree, as a user installs it (`pip install ./host/python`; its
/// build backend comes from PyPI); its python, and a directory holding
/// only the client's tests (so `import berth_client` finds the installed
/// package, not the sources).
fn installed_client(dir: &Path) -> (PathBuf, PathBuf) {
    let source = dir.join("src");
    copy_tree(&repo_root().join("host/python"), &source);
    let venv = dir.join("venv");
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success(), "python3 -m venv failed");
    let python = venv.join("bin/python");
    let out = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pip install {}: {}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = dir.join("run");
    copy_tree(&source.join("tests"), &run.join("tests"));
    let found = Command::new(&python)
        .current_dir(&run)
        .args(["-c", "import berth_client; print(berth_client.__file__)"])
        .output()
        .unwrap();
    let found = String::from_utf8_lossy(&found.stdout);
    assert!(found.contains("site-packages"), "imported from {found}");
    (python, run)
}

/// The Python client's own tests (`host/python/tests`), against a real
/// server with real Docker sandboxes, the client installed as a package
/// into a fresh venv.
#[tokio::test]
async fn the_python_client_works_against_a_real_server() {
    let Some(_docker) = docker_or_skip("server::python_client").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    // Also on loopback TCP with a token and a small file limit, for the
    // client's Unauthorized and TooLarge (a limit far above what the other
    // tests write, and far enough that the refusal comes mid-body).
    let token = "fedcba9876543210fedcba9876543210";
    let (served, port) = Served::start_on_tcp(token, &["--max-file", "8MiB"]);
    let dir = tempfile::tempdir().unwrap();
    let (python, run) = installed_client(dir.path());
    let store = berth_tests::fs_store_manifest(dir.path(), &dir.path().join("store"));
    let out = Command::new(&python)
        .current_dir(&run)
        .env_remove("PYTHONPATH")
        .env("BERTH_TEST_STORE_MANIFEST", &store)
        .env("BERTH_SOCKET", &served.socket)
        .env("BERTH_TCP_URL", format!("http://127.0.0.1:{port}"))
        .env("BERTH_TOKEN", token)
        .env("BERTH_MAX_FILE", (8 << 20).to_string())
        .env("BERTH_TEST_IMAGE", test_image())
        .env("BERTH_HOME", served.home())
        .args(["-m", "unittest", "-v", "tests.test_client"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("OK"), "{stderr}");
    // Every class ran: none skipped for want of the TCP server.
    assert!(!stderr.contains("skipped"), "{stderr}");
}

/// The OpenAI Agents SDK provider (`host/python/berth_agents`), driven
/// through the SDK's own session and tools (shell, PTY, apply_patch,
/// reads and writes, escapes refused), persisted, its container removed,
/// and resumed from the SDK's serialised state in a fresh Python process.
/// Runs in the venv `cargo xtask setup` makes with the pinned SDK.
#[tokio::test]
async fn the_agents_sdk_provider_persists_and_resumes_in_a_fresh_process() {
    let Some(_docker) = docker_or_skip("server::agents_sdk").await else {
        return;
    };
    let python = repo_root().join("target/py-agents/bin/python");
    if !python.exists() {
        let why = format!(
            "{} is missing: `cargo xtask setup` makes it (openai-agents, pinned in host/python/requirements-agents.txt)",
            python.display()
        );
        assert!(!berth_tests::docker_required(), "{why}");
        berth_tests::skipped("server::agents_sdk", &why);
        return;
    }
    let _shared = berth_tests::DOCKERD.read().await;
    let served = Served::start(&[]);
    let out = Command::new(&python)
        .current_dir(repo_root().join("host/python"))
        .env("BERTH_SOCKET", &served.socket)
        .env("BERTH_TEST_IMAGE", test_image())
        .args(["-m", "unittest", "-v", "tests.test_agents_provider"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}
