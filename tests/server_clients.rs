//! The clients of other languages against a real server: the Python client's
//! own tests, and the Agents SDK provider persisting and resuming in a fresh
//! process.

use super::*;

/// The Python client's own tests (`host/python/tests`), against a real
/// server with real Docker sandboxes.
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
    let python = repo_root().join("host/python");
    let out = Command::new("python3")
        .current_dir(&python)
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
