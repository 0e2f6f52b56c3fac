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
