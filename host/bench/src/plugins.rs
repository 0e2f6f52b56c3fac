//! Plugin stores side by side: round trips through each guest language, peak memory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth::backend::ExecRequest;
use berth::plugin::{CompileCache, PluginHost};
use berth::sandbox::{
    BackendSpec, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SnapshotSpec,
};
use berth::workspace::WorkspaceSpec;
use berth::RemoteSnapshotClient;

/// Berth side by side with GNU tar, the docker CLI and boto3.
use super::*;

pub(super) struct BenchPlugin {
    /// Label in the table, with the language.
    pub(super) label: String,
    /// File name of the manifest written for it in the bench directory.
    pub(super) manifest: String,
    /// Component path.
    pub(super) component: PathBuf,
    /// A `snapshot-plugin` (one sandbox's snapshot) rather than a remote client.
    pub(super) snapshot_world: bool,
    /// Big interpreters (Python, JavaScript) compile for ~10 s: left out of
    /// `--quick` so the test suite's run stays in seconds.
    pub(super) heavy: bool,
}

/// The guests `guest-examples/guests.toml` marks for benchmarking.
pub(super) fn bench_plugins() -> anyhow::Result<Vec<BenchPlugin>> {
    let root = std::env::current_dir()?;
    Ok(guest_table::guests(&root)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .filter(|g| g.bench)
        .map(|g| BenchPlugin {
            label: g.label(),
            manifest: format!("{}.toml", g.name),
            component: guest_table::component_path(&root, &g),
            snapshot_world: g.is_snapshot_plugin(),
            heavy: g.heavy,
        })
        .collect())
}

/// Writes a manifest for every built example plugin (all sharing one store
/// directory) and returns the ones written. Plugins that are not built are
/// reported and left out, so a partial checkout still benchmarks the rest.
pub(super) fn write_manifests(
    base: &Path,
    quick: bool,
) -> anyhow::Result<Vec<(BenchPlugin, PathBuf)>> {
    let store = base.join("store");
    std::fs::create_dir_all(&store)?;
    let mut written = Vec::new();
    for plugin in bench_plugins()? {
        if quick && plugin.heavy {
            continue;
        }
        let component = plugin.component.clone();
        if !component.is_file() {
            eprintln!(
                "bench: {} is not built ({}); run cargo xtask build-guests",
                plugin.label,
                plugin.component.display()
            );
            continue;
        }
        let (world, key) = if plugin.snapshot_world {
            ("snapshot-plugin", "dir")
        } else {
            ("remote-client-plugin", "root")
        };
        let manifest = base.join(&plugin.manifest);
        std::fs::write(
            &manifest,
            format!(
                "name={:?}\ncomponent={:?}\nworld='{world}'\n[config]\n{key}='/data'\n[grants]\nmax_memory='256MiB'\ndeadline_secs=3600\n[[grants.dirs]]\nhost={store:?}\nguest='/data'\nmode='rw'\n",
                plugin.label,
                std::path::absolute(&component)?
            ),
        )?;
        written.push((plugin, manifest));
    }
    Ok(written)
}

pub(super) fn snapshot_spec(plugin: &BenchPlugin, manifest: &Path) -> SnapshotSpec {
    if plugin.snapshot_world {
        SnapshotSpec::plugin(manifest.to_path_buf())
    } else {
        SnapshotSpec::remote(manifest.to_path_buf())
    }
}

/// Persist + restore of `src` through a local sandbox with `snapshot`.
pub(super) async fn berth_roundtrip(
    client: &SandboxClient,
    src: &Path,
    snapshot: SnapshotSpec,
) -> anyhow::Result<(f64, f64)> {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(snapshot)
                .backend(BackendSpec::new(
                    // Over a directory that holds the workspace already:
                    // no disk image can be mounted there.
                    berth::backend::local::LocalOptions::default()
                        .root_dir(src.to_path_buf())
                        .disk(berth::backend::limits::Bound::Unlimited),
                )),
        )
        .await?;
    sb.start().await?;
    let t = Instant::now();
    sb.stop().await?;
    let persist = t.elapsed().as_secs_f64();
    let state = sb.state();
    let restore_root = src.with_extension("restored");
    drop_dir(&restore_root);
    let mut rb = client
        .resume(
            moved_to(&state, &restore_root)?,
            None,
            SandboxOptions::default(),
        )
        .await?;
    let t = Instant::now();
    rb.start().await?;
    let restore = t.elapsed().as_secs_f64();
    rb.shutdown().await?;
    // Each round trip stores a whole workspace: kept, a full run's
    // 3 runs × 6 stores held about 20 GiB until the end.
    rb.delete_snapshot().await?;
    drop_dir(&restore_root);
    Ok((persist, restore))
}

pub(super) fn rss_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

pub(super) async fn rss_probe(size: u64, dedup: bool) -> anyhow::Result<ExitCode> {
    let base = tempfile::Builder::new().prefix("berth-rss-").tempdir()?;
    let src = base.path().join("ws");
    make_workspace(&src, size)?;
    let plugins = write_manifests(base.path(), true)?;
    let (plugin, manifest) = plugins
        .first()
        .filter(|(p, _)| p.manifest == "fs-store.toml")
        .context("fs-store not built: cargo xtask build-guests")?;
    let client = crate::client_builder(base.path().join("home"))
        .pack_cache(None)
        .build();
    let spec = snapshot_spec(plugin, manifest);
    let spec = if dedup { spec.deduplicated(1) } else { spec };
    berth_roundtrip(&client, &src, spec).await?;
    println!("{}", rss_peak_kib());
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn sh(sb: &Sandbox, cmd: &str) -> anyhow::Result<()> {
    let r = sb
        .exec(ExecRequest::new(cmd, Duration::from_secs(120)))
        .await?;
    if r.exit_code != 0 {
        bail!("{cmd}: {}", r.stderr_text());
    }
    Ok(())
}

/// Load and call latency of one remote-client plugin: a cold load with no
/// compile cache, loads from the cache (median), and fresh instance +
/// `open` + `exists` round trips (median and p99).
pub(super) async fn plugin_rows(
    plugin: &BenchPlugin,
    manifest: &Path,
    base: &Path,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let manifest = berth::plugin::PluginManifest::from_file(manifest)?;
    let cold_host = PluginHost::with_cache(CompileCache::disabled())?;
    let t = Instant::now();
    cold_host.load(manifest.clone()).await?;
    let cold = t.elapsed().as_secs_f64();
    let cache = CompileCache::at(base.join("cc"));
    PluginHost::with_cache(cache.clone())?
        .load(manifest.clone())
        .await?;
    let mut cached = Vec::new();
    for _ in 0..(if quick { 5 } else { 20 }) {
        let t = Instant::now();
        PluginHost::with_cache(cache.clone())?
            .load(manifest.clone())
            .await?;
        cached.push(t.elapsed().as_secs_f64());
    }
    let loaded = PluginHost::with_cache(cache)?.load(manifest).await?;
    let client = loaded.remote_client()?;
    let mut calls = Vec::new();
    for _ in 0..(if quick { 200 } else { 2000 }) {
        let t = Instant::now();
        client.exists("bench-probe").await?;
        calls.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let row = |name: String, value: String| Row::unpaired("plugin", name, value);
    Ok(vec![
        row(
            format!("{} cold load, no cache", plugin.label),
            format!("{:.1} ms", cold * 1e3),
        ),
        row(
            format!("{} load from compile cache", plugin.label),
            format!("{:.2} ms", median(cached) * 1e3),
        ),
        row(
            format!("{} instance + open + exists", plugin.label),
            format!(
                "median {:.0} µs, p99 {:.0} µs",
                median(calls.clone()),
                percentile(calls, 0.99)
            ),
        ),
    ])
}
