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

/// A server on loopback TCP with a token and a small file limit (for the
/// clients' `Unauthorized` and `TooLarge`: a limit far above what their
/// other tests write, and far enough that the refusal comes mid-body),
/// with an fs-store for their history tests.
struct ClientServer {
    served: Served,
    port: u16,
    store: PathBuf,
    _dir: tempfile::TempDir,
}

impl ClientServer {
    const TOKEN: &'static str = "fedcba9876543210fedcba9876543210";
    const MAX_FILE: u64 = 8 << 20;

    fn start() -> ClientServer {
        let (served, port) = Served::start_on_tcp(Self::TOKEN, &["--max-file", "8MiB"]);
        let dir = tempfile::tempdir().unwrap();
        let store = berth_tests::fs_store_manifest(dir.path(), &dir.path().join("store"));
        ClientServer {
            served,
            port,
            store,
            _dir: dir,
        }
    }

    /// `command` with the variables the clients' tests read.
    fn env<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command
            .env("BERTH_TEST_STORE_MANIFEST", &self.store)
            .env("BERTH_SOCKET", &self.served.socket)
            .env("BERTH_TCP_URL", format!("http://127.0.0.1:{}", self.port))
            .env("BERTH_TOKEN", Self::TOKEN)
            .env("BERTH_MAX_FILE", Self::MAX_FILE.to_string())
            .env("BERTH_TEST_IMAGE", test_image())
            .env("BERTH_HOME", self.served.home())
    }
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
    let server = ClientServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (python, run) = installed_client(dir.path());
    let out = server
        .env(Command::new(&python).current_dir(&run))
        .env_remove("PYTHONPATH")
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

/// Runs `program` with `args` in `dir`; its stdout, or the test fails with
/// what it printed.
fn run_in(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (Node.js and npm are needed)"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {}: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh Node project in `dir/run` with the TypeScript client installed
/// as a user installs it: built and packed from (a copy of) the tree
/// (`npm ci && npm pack` in `host/typescript`), the tarball installed
/// beside TypeScript, and the client's tests compiled there against the
/// installed package's types. Returns the project and its compiled tests.
fn installed_ts_client(dir: &Path) -> (PathBuf, PathBuf) {
    const NPM_QUIET: [&str; 3] = ["--no-audit", "--no-fund", "--prefer-offline"];
    let source = dir.join("src");
    let from = repo_root().join("host/typescript");
    std::fs::create_dir_all(&source).unwrap();
    for name in [
        "package.json",
        "package-lock.json",
        "tsconfig.json",
        "README.md",
    ] {
        std::fs::copy(from.join(name), source.join(name)).unwrap();
    }
    copy_tree(&from.join("src"), &source.join("src"));
    run_in(&source, "npm", &[&["ci"][..], &NPM_QUIET].concat());
    // `npm pack` runs the package's `prepack`: tsc, strict.
    let packed = run_in(
        &source,
        "npm",
        &[
            "pack",
            "--silent",
            "--pack-destination",
            dir.to_str().unwrap(),
        ],
    );
    let tarball = dir.join(packed.lines().last().unwrap().trim());
    assert!(tarball.exists(), "npm pack made no {}", tarball.display());

    let run = dir.join("run");
    std::fs::create_dir_all(run.join("test")).unwrap();
    std::fs::write(
        run.join("package.json"),
        r#"{ "name": "berth-client-user", "private": true }"#,
    )
    .unwrap();
    std::fs::write(
        run.join("tsconfig.json"),
        r#"{ "compilerOptions": { "target": "ES2022", "lib": ["ES2022"], "module": "commonjs",
             "types": ["node"], "strict": true, "esModuleInterop": true,
             "rootDir": "test", "outDir": "out" }, "include": ["test"] }"#,
    )
    .unwrap();
    std::fs::copy(
        from.join("test/client.test.ts"),
        run.join("test/client.test.ts"),
    )
    .unwrap();
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(from.join("package-lock.json")).unwrap()).unwrap();
    let pinned = |name: &str| {
        let version = lock["packages"][format!("node_modules/{name}")]["version"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} is not in host/typescript/package-lock.json"))
            .to_string();
        format!("{name}@{version}")
    };
    let (typescript, node_types) = (pinned("typescript"), pinned("@types/node"));
    let mut install = vec![
        "install",
        tarball.to_str().unwrap(),
        &typescript,
        &node_types,
    ];
    install.extend(NPM_QUIET);
    run_in(&run, "npm", &install);
    run_in(
        &run,
        "node",
        &["node_modules/typescript/bin/tsc", "-p", "."],
    );
    let found = run_in(
        &run,
        "node",
        &["-e", "console.log(require.resolve('berth-client'))"],
    );
    assert!(
        found.contains("run/node_modules/berth-client/dist/"),
        "resolved {found}"
    );
    (run.clone(), run.join("out/client.test.js"))
}

/// The TypeScript client's tests (`host/typescript/test`): the Python
/// client's scenarios against a real server with real Docker sandboxes,
/// from a fresh Node project that installed the packed package.
#[tokio::test]
async fn the_typescript_client_works_against_a_real_server() {
    let Some(_docker) = docker_or_skip("server::typescript_client").await else {
        return;
    };
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        let why = "Node.js is missing: the TypeScript client needs Node 18 or newer and npm";
        assert!(!berth_tests::docker_required(), "{why}");
        berth_tests::skipped("server::typescript_client", why);
        return;
    }
    let _shared = berth_tests::DOCKERD.read().await;
    let server = ClientServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (run, tests) = installed_ts_client(dir.path());
    let out = server
        .env(Command::new("node").current_dir(&run))
        .args(["--test", "--test-reporter=spec"])
        .arg(&tests)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every suite ran: none skipped for want of the TCP server or store
    // (the spec reporter marks a skipped suite or test with `﹣`; its
    // `skipped` count leaves suites out).
    assert!(stdout.contains("ℹ fail 0"), "{stdout}");
    assert!(!stdout.contains('﹣'), "{stdout}");
    assert!(!stdout.contains("ℹ tests 0"), "{stdout}");
}
