//! Shared helpers for Berth's integration tests: where the compiled guest
//! components and the `berth` binary are, and scratch grants for plugins.

pub mod swarm_fixture;
pub mod test_copies_snapshot;
pub mod test_dir_backend;
pub mod workspace_gen;

use std::path::{Path, PathBuf};

use berth::plugin::{CompileCache, DirMode, PluginHost, PluginManifest, World};
use berth::units::parse_size as parse_byte_size;

/// A client for sandboxes under `home` that knows the Docker and swarm
/// kinds too (as the `berth` command's does).
pub fn client(home: impl Into<PathBuf>) -> berth::SandboxClient {
    client_builder(home).build()
}

/// [`client`]'s builder, to set more.
pub fn client_builder(home: impl Into<PathBuf>) -> berth::sandbox::SandboxClientBuilder {
    berth::SandboxClient::builder(home).backend_providers(berth_docker::providers())
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// `python3 -c SCRIPT` with the repository's Python client importable and
/// `env` set (`BERTH_HOME`, `BERTH_SOCKET`, …); what it printed.
pub fn python_client(env: &[(&str, &Path)], script: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new("python3");
    cmd.env("PYTHONPATH", repo_root().join("host/python"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["-c", script])
        .output()
        .expect("running python3 (`cargo xtask setup` installs it)")
}

/// Every guest in `guest-examples/guests.toml`.
pub fn guest_table() -> Vec<guest_table::Guest> {
    guest_table::guests(&repo_root()).expect("guest-examples/guests.toml")
}

/// The compiled component of the guest whose component file is
/// `file.wasm` (e.g. `fs_store`), found through the guest table. Panics
/// with the command to run when it has not been built.
pub fn guest(file: &str) -> PathBuf {
    let root = repo_root();
    let entry = guest_table()
        .into_iter()
        .find(|g| g.component.file_stem().is_some_and(|s| s == file))
        .unwrap_or_else(|| panic!("no guest builds {file}.wasm in guest-examples/guests.toml"));
    let path = guest_table::component_path(&root, &entry);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask build-guests` (or `cargo xtask test`, which does it)",
        path.display()
    );
    path
}

/// The `berth` binary of this build.
pub fn berth_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug").join("berth");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p berth-cli` (cargo xtask test does it)",
        bin.display()
    );
    bin
}

/// Runs `berth ARGS` in a fresh process with `BERTH_HOME=home` and its
/// logs at `info` on stderr, as a user would.
pub fn berth_in(home: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .env("RUST_LOG", "berth=info")
        .args(args)
        .output()
        .unwrap()
}

/// [`berth_in`], which must succeed; its stdout.
pub fn berth_ok(home: &Path, args: &[&str]) -> String {
    let out = berth_in(home, args);
    assert!(
        out.status.success(),
        "berth {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The state of CLI sandbox `name` (`berth inspect`).
pub fn berth_state(home: &Path, name: &str) -> berth::sandbox::SandboxState {
    berth::sandbox::SandboxState::from_json(&berth_ok(home, &["inspect", name])).unwrap()
}

/// Size of the streamed large round trip: `BERTH_CONFORMANCE_LARGE`
/// (e.g. `512MiB`), default 2 GiB.
pub fn large_size() -> u64 {
    std::env::var("BERTH_CONFORMANCE_LARGE")
        .ok()
        .and_then(|s| parse_byte_size(&s).ok())
        .unwrap_or(2 << 30)
}

/// A plugin host with a private compile cache.
pub fn host_with_cache(dir: &Path) -> PluginHost {
    PluginHost::with_cache(CompileCache::at(dir)).expect("plugin host")
}

/// A manifest for guest `file` with a scratch directory granted read-write
/// at `/data` and `root`/`dir` config pointing at it.
pub fn scratch_manifest(file: &str, world: World, scratch: &Path) -> PluginManifest {
    PluginManifest::for_component(guest(file), world)
        .with_dir(scratch, "/data", DirMode::ReadWrite)
        .with_config("root", "/data")
        .with_config("dir", "/data")
}

/// A manifest for the remote-client guest `name` of the guest table built
/// by a non-Rust toolchain (`c-store`, `py-store`, `js-store`), storing in
/// `data` (granted read-write at `/data`). Panics with the command to run
/// when it is not built.
pub fn language_store_manifest(name: &str, data: &Path) -> PluginManifest {
    let root = repo_root();
    let entry = guest_table::guest(&root, name).unwrap();
    let component = guest_table::component_path(&root, &entry);
    assert!(
        component.is_file(),
        "{name} is not built ({}): run `cargo xtask build-guests`",
        component.display()
    );
    PluginManifest::for_component(&component, World::RemoteClient)
        .with_dir(data, "/data", DirMode::ReadWrite)
        .with_config("root", "/data")
}

/// The image Docker tests run (`cargo xtask setup` imports it).
pub fn test_image() -> String {
    std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into())
}

/// Whether Docker tests must run: with `CI` or `BERTH_REQUIRE_DOCKER` set,
/// a missing engine is a failure, never a silent skip.
pub fn docker_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("BERTH_REQUIRE_DOCKER").is_some()
}

/// A Docker client, or `None` (with a message) when no engine answers and
/// Docker is not required. Panics when it is required and missing.
pub async fn docker_or_skip(test: &str) -> Option<bollard::Docker> {
    let probe = berth_docker::DockerOptions::new(test_image());
    let state = probe.into_state_for_probe();
    match berth_docker::check_engine(&state).await {
        Ok(()) => {
            Some(bollard::Docker::connect_with_defaults().expect("the engine answered Berth"))
        }
        Err(e) if docker_required() => {
            panic!("{test}: Docker is required (CI/BERTH_REQUIRE_DOCKER) but: {e}")
        }
        Err(e) => {
            skipped(
                test,
                &format!("no Docker engine ({e}); run `cargo xtask setup` as root"),
            );
            None
        }
    }
}

/// How to reach the test S3 store (Garage), from the environment or from
/// the `s3.env` file `cargo xtask setup` writes.
#[derive(Debug, Clone)]
pub struct S3Env {
    /// `http://127.0.0.1:3900`.
    pub endpoint: String,
    /// Region.
    pub region: String,
    /// Bucket.
    pub bucket: String,
    /// Access key id.
    pub key_id: String,
    /// Secret key.
    pub secret: String,
    /// Garage node pids (for fault tests).
    pub pids: Vec<u32>,
    /// Garage binary and cluster directory.
    pub garage_bin: String,
    /// Cluster directory.
    pub garage_dir: String,
}

/// The S3 environment, or `None` (with a message) when it is not set up and
/// not required. Panics when it is required (CI / BERTH_REQUIRE_DOCKER).
pub fn s3_or_skip(test: &str) -> Option<S3Env> {
    let mut vars = std::collections::HashMap::new();
    if let Ok(text) = std::fs::read_to_string("/tmp/berth-garage/s3.env") {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
    }
    let get = |k: &str| std::env::var(k).ok().or_else(|| vars.get(k).cloned());
    let env = (|| {
        Some(S3Env {
            endpoint: get("BERTH_S3_ENDPOINT")?,
            region: get("BERTH_S3_REGION")?,
            bucket: get("BERTH_S3_BUCKET")?,
            key_id: get("BERTH_S3_ACCESS_KEY_ID")?,
            secret: get("BERTH_S3_SECRET_ACCESS_KEY")?,
            pids: get("BERTH_GARAGE_PIDS")
                .unwrap_or_default()
                .split(',')
                .filter_map(|p| p.parse().ok())
                .collect(),
            garage_bin: get("BERTH_GARAGE_BIN").unwrap_or_else(|| "garage".into()),
            garage_dir: get("BERTH_GARAGE_DIR").unwrap_or_else(|| "/tmp/berth-garage".into()),
        })
    })();
    let reachable = env.as_ref().is_some_and(|e| {
        let addr = e.endpoint.trim_start_matches("http://").to_string();
        std::net::TcpStream::connect(addr).is_ok()
    });
    match (env, reachable) {
        (Some(e), true) => Some(e),
        _ if docker_required() => panic!(
            "{test}: the S3 store (Garage) is required but not reachable; run `cargo xtask setup`"
        ),
        _ => {
            skipped(
                test,
                "no S3 store; run `cargo xtask setup` (installs and starts Garage)",
            );
            None
        }
    }
}

/// Writes an s3-store plugin manifest into `dir` (credentials through
/// `${ENV}` expansion, only the endpoint's origin granted) and exports the
/// credentials for it. Returns the manifest path.
pub fn s3_manifest(dir: &Path, s3: &S3Env, prefix: &str) -> PathBuf {
    // SAFETY of the test harness: every test sets the same values.
    std::env::set_var("BERTH_S3_ACCESS_KEY_ID", &s3.key_id);
    std::env::set_var("BERTH_S3_SECRET_ACCESS_KEY", &s3.secret);
    let component = guest("s3_store");
    assert!(
        component.is_file(),
        "s3-store is not built: run `cargo xtask build-guests`"
    );
    let manifest = dir.join("s3-store.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = \"s3-store\"\ncomponent = {component:?}\nworld = \"remote-client-plugin\"\n\
             [config]\nendpoint = {endpoint:?}\nregion = {region:?}\nbucket = {bucket:?}\nprefix = {prefix:?}\n\
             access_key_id = \"${{BERTH_S3_ACCESS_KEY_ID}}\"\nsecret_access_key = \"${{BERTH_S3_SECRET_ACCESS_KEY}}\"\n\
             part_size = \"8388608\"\n\
             [grants]\nmax_memory = \"64MiB\"\ndeadline_secs = 600\nwall_clock = true\nhttp_hosts = [{endpoint:?}]\n",
            endpoint = s3.endpoint,
            region = s3.region,
            bucket = s3.bucket,
        ),
    )
    .unwrap();
    manifest
}

/// A started sandbox on `backend` with the default manifest and no
/// snapshot.
pub async fn started_sandbox(
    client: &berth::sandbox::SandboxClient,
    backend: berth::sandbox::BackendSpec,
) -> berth::sandbox::Sandbox {
    let spec = berth::sandbox::SandboxSpec::new(berth::workspace::WorkspaceSpec::default())
        .snapshot(berth::sandbox::SnapshotSpec::noop())
        .backend(backend);
    let mut sb = client.create(spec).await.unwrap();
    sb.start().await.unwrap();
    sb
}

/// Runs `cmd` in the sandbox and returns its stdout; panics unless it
/// exits 0.
pub async fn sh(sb: &berth::sandbox::Sandbox, cmd: &str) -> String {
    let r = sb
        .exec(berth::backend::ExecRequest::new(
            cmd,
            std::time::Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{cmd}: {}", r.stderr_text());
    r.stdout_text().into_owned()
}

/// Resumes `state` the way a fresh process would: through its JSON text
/// only, with default options.
pub async fn resume_from_json(
    client: &berth::sandbox::SandboxClient,
    state: &berth::sandbox::SandboxState,
) -> berth::sandbox::Sandbox {
    client
        .resume(
            berth::sandbox::SandboxState::from_json(&state.to_json().unwrap()).unwrap(),
            None,
            berth::sandbox::SandboxOptions::default(),
        )
        .await
        .unwrap()
}

/// The seeds the variable `var` names (comma-separated), else `default`:
/// a seeded test runs these, and prints which, so a failure can be run
/// again with exactly its seed.
pub fn seeds(var: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(var) {
        Ok(s) => s
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{var}: comma-separated numbers, not {s:?}"))
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

/// The seed the variable `var` names, else one new to this run (from the
/// process id), printed with the variable that repeats it.
pub fn seed(var: &str, what: &str) -> u64 {
    let seed = match std::env::var(var) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}: a number, not {s:?}")),
        Err(_) => u64::from(std::process::id()) * 2654435761,
    };
    println!("{what}: seed {seed} ({var} to reproduce)");
    seed
}

/// A loopback TCP port free when asked (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("binding a loopback port")
}

/// The workspace directory of a local sandbox's state.
pub fn local_root(state: &berth::sandbox::SandboxState) -> PathBuf {
    assert_eq!(state.backend.kind, berth::backend::local::KIND);
    let local: berth::backend::local::LocalState = state.backend.decode().unwrap();
    local.root_dir
}

/// The container id of a Docker sandbox's state.
pub fn container_id(state: &berth::sandbox::SandboxState) -> String {
    let docker: berth_docker::DockerState = state.backend.decode().expect("a docker sandbox");
    docker.container_id.expect("container id")
}

/// An error and its sources, joined by ": " (as the CLI prints them).
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The second Docker engine and the registry `cargo xtask setup` starts
/// (read from the file it writes), for the tests of several engines.
#[derive(Debug, Clone)]
pub struct Engine2 {
    /// `tcp://127.0.0.1:PORT`, mutual TLS.
    pub tls: String,
    /// `unix:///...`, the same engine.
    pub socket: String,
    /// `DOCKER_CERT_PATH` for the TLS endpoint.
    pub certs: String,
    /// Client files whose `ca.pem` is another CA's.
    pub wrong_ca: String,
    /// The engine's pid file.
    pub pidfile: String,
    /// A script that starts the engine again.
    pub start: String,
    /// The engine's log.
    pub log: String,
    /// The registry (`127.0.0.1:PORT`).
    pub registry: String,
    /// The test image, in the registry.
    pub image: String,
}

/// The second engine, or `None` (with a message) when it is not set up
/// and Docker is not required. Panics when it is required and missing.
pub fn engine2_or_skip(test: &str) -> Option<Engine2> {
    let mut vars = std::collections::HashMap::new();
    if let Ok(text) = std::fs::read_to_string("/tmp/berth-engine2/engine.env") {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.to_string(), v.to_string());
            }
        }
    }
    let get = |k: &str| vars.get(k).cloned();
    let found = (|| {
        Some(Engine2 {
            tls: get("BERTH_ENGINE2_TLS")?,
            socket: get("BERTH_ENGINE2_SOCKET")?,
            certs: get("BERTH_ENGINE2_CERTS")?,
            wrong_ca: get("BERTH_ENGINE2_WRONG_CA")?,
            pidfile: get("BERTH_ENGINE2_PIDFILE")?,
            start: get("BERTH_ENGINE2_START")?,
            log: get("BERTH_ENGINE2_LOG")?,
            registry: get("BERTH_REGISTRY")?,
            image: get("BERTH_REGISTRY_IMAGE")?,
        })
    })();
    match found {
        Some(e) => Some(e),
        None if docker_required() => panic!(
            "{test}: a second Docker engine and a registry are required (CI/BERTH_REQUIRE_DOCKER) but /tmp/berth-engine2/engine.env is missing: run `cargo xtask setup` as root"
        ),
        None => {
            skipped(test, "no second Docker engine; run `cargo xtask setup` as root");
            None
        }
    }
}

/// Runs the shell script `script` (a daemon's start script that setup
/// wrote) detached with `setsid -f`, its output to `log`, as setup starts
/// it; the caller waits for the daemon to answer.
pub fn start_detached(script: &str, log: std::fs::File) {
    let status = std::process::Command::new("setsid")
        .args(["-f", "sh", script])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert!(status.success(), "setsid -f sh {script}: {status}");
}

/// Reports that `test` was skipped and why: on stderr (hidden by libtest
/// when the test passes) and as a line in `$BERTH_SKIP_LOG`, which
/// `cargo xtask test` truncates before the run and prints after it, so a
/// plain run's skips are never silent.
pub fn skipped(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    if let Some(log) = std::env::var_os("BERTH_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// Asserts that `docker inspect` (`out`) answered "no such object": the
/// engine was reached and the thing is gone. A down engine fails too, but
/// with another message, so it cannot pass for "gone".
pub fn assert_gone(out: &std::process::Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("No such"),
        "{what} should be gone, with the engine answering; docker said: {stderr} ({})",
        out.status
    );
}

/// Writes an fs-store manifest into `dir` granting `store` (created) as
/// its data directory, read-write; returns the manifest's path.
pub fn fs_store_manifest(dir: &Path, store: &Path) -> PathBuf {
    std::fs::create_dir_all(store).unwrap();
    let manifest = dir.join("fs-store.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = \"fs-store\"\ncomponent = {:?}\nworld = \"remote-client-plugin\"\n\
             [config]\nroot = \"/data\"\n[grants]\nmax_memory = \"64MiB\"\ndeadline_secs = 120\n\
             [[grants.dirs]]\nhost = {:?}\nguest = \"/data\"\nmode = \"rw\"\n",
            guest("fs_store"),
            store
        ),
    )
    .unwrap();
    manifest
}

/// Held for writing while a test restarts dockerd, for reading by the
/// Docker tests of the same binary (`faults`), so none of them runs while
/// the daemon is away.
pub static DOCKERD: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Whether process `pid` runs: it exists and is not a zombie (a process
/// whose parent does not reap it, as pid 1 in some containers does not,
/// stays a zombie after it ended).
pub fn process_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// `docker inspect`'s paused flag of `container` (the engine must answer).
pub fn container_paused(container: &str) -> bool {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", "{{.State.Paused}}", container])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker inspect {container}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim() == "true"
}

/// Loses a local sandbox's workspace, as a disaster would: the directory
/// and, for a workspace with a disk quota (an image mounted there), the
/// image it is (unmounted first; a mounted directory cannot be removed).
pub fn remove_workspace(root: impl AsRef<Path>) {
    let root = root.as_ref();
    let canonical = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let device = table.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        (Path::new(left.split(' ').nth(4)?) == canonical)
            .then(|| right.split(' ').nth(1).map(str::to_string))?
    });
    if let Some(device) = device {
        let name = Path::new(&device)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let image = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .expect("a workspace mount is a loop device");
        let status = std::process::Command::new("umount")
            .arg(root)
            .status()
            .unwrap();
        assert!(status.success(), "umount {}", root.display());
        std::fs::remove_file(image.trim()).unwrap();
    }
    std::fs::remove_dir_all(root).unwrap();
}
