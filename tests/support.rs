//! Shared helpers for Berth's integration tests: where the compiled guest
//! components and the `berth` binary are, and scratch grants for plugins.

use std::path::{Path, PathBuf};

use berth::plugin::manifest::parse_byte_size;
use berth::plugin::{CompileCache, DirMode, PluginHost, PluginManifest, World};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The compiled component of guest example `file` (e.g. `fs_store`).
/// Panics with the command to run when it has not been built.
pub fn guest(file: &str) -> PathBuf {
    let path = repo_root()
        .join("guest-examples/target/wasm32-wasip2/release")
        .join(format!("{file}.wasm"));
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
        "{} is missing: run `cargo build -p berth` (cargo xtask test does it)",
        bin.display()
    );
    bin
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
    let probe = berth::backend::docker::DockerOptions::new(test_image());
    let state = probe.into_state_for_probe();
    match berth::backend::docker::connect(&state).await {
        Ok(d) => Some(d),
        Err(e) if docker_required() => {
            panic!("{test}: Docker is required (CI/BERTH_REQUIRE_DOCKER) but: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED {test}: no Docker engine ({e}); run `cargo xtask setup` as root");
            None
        }
    }
}
