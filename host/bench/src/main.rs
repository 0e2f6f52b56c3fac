//! `berth-bench` (run by `cargo xtask bench`): side-by-side measurements against what a user would use
//! instead (GNU tar, the docker CLI), alternating A and B and reporting
//! medians. Benchmarks, not timed tests: nothing here asserts a speed.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth::backend::docker::{DockerOptions, DockerState};
use berth::backend::local::LocalState;
use berth::backend::ExecRequest;
use berth::plugin::{CompileCache, PluginHost};
use berth::sandbox::{
    BackendSpec, BackendState, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SnapshotSpec,
};
use berth::workspace::WorkspaceSpec;
use berth::RemoteSnapshotClient;
use clap::Parser;
use serde_json::json;

/// Berth side by side with GNU tar, the docker CLI and boto3.
#[derive(Parser)]
#[command(name = "berth-bench", about)]
pub struct BenchArgs {
    /// Workspace size (default 1GiB; --quick uses 32MiB).
    #[arg(long, value_parser = parse_size_arg)]
    size: Option<u64>,
    /// A small, fast run (seconds), for CI.
    #[arg(long)]
    quick: bool,
    /// Repetitions per measurement (default 3; --quick 1).
    #[arg(long)]
    runs: Option<usize>,
    /// Run only these groups (repeatable): persist (persist, restore and
    /// memory), dedup, plugins, docker, s3. By default, all.
    #[arg(long)]
    only: Vec<String>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results.json")]
    out: PathBuf,
    /// Internal: measure peak RSS of one persist+restore of this size.
    #[arg(long, hide = true, value_parser = parse_size_arg)]
    rss_probe: Option<u64>,
    /// Internal: the RSS probe uses a deduplicated snapshot.
    #[arg(long, hide = true)]
    rss_dedup: bool,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    berth::plugin::manifest::parse_byte_size(s)
}

fn main() -> ExitCode {
    let args = BenchArgs::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

struct Row {
    group: &'static str,
    name: String,
    value: String,
    baseline: String,
    ratio: Option<f64>,
}

impl Row {
    /// A figure with no side-by-side baseline (memory, load times, resume).
    fn unpaired(group: &'static str, name: String, value: String) -> Self {
        Row {
            group,
            name,
            value,
            baseline: "-".into(),
            ratio: None,
        }
    }
}

/// The docker CLI baseline's container: what `docker run -d` a user would
/// type for an idle sandbox.
fn docker_run_detached(name: &str, image: &str) -> Command {
    let mut cmd = Command::new("docker");
    cmd.args([
        "run",
        "-d",
        "--network",
        "none",
        "--name",
        name,
        image,
        "sleep",
        "600",
    ]);
    cmd
}

/// Removes a baseline container, best effort.
fn docker_rm(name: &str) {
    let _ = Command::new("docker")
        .args(["rm", "-f", name])
        .stdout(Stdio::null())
        .status();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// Deterministic content: half compressible text, half pseudo-random.
fn fill(buf: &mut [u8], seed: u64) {
    let mut s = seed | 1;
    let half = buf.len() / 2;
    for (i, b) in buf.iter_mut().enumerate() {
        if i < half {
            *b = b"berth workspace line of text\n"[i % 29];
        } else {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            *b = s as u8;
        }
    }
}

/// ~20k small files of 1–64 KiB per GiB plus a few large files.
fn make_workspace(dir: &Path, size: u64) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let small_budget = size * 6 / 10;
    let mut written = 0u64;
    let mut i = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while written < small_budget {
        let len = 1024 + (i * 7919 % (63 * 1024));
        let sub = dir.join(format!("src/d{:03}", i % 200));
        std::fs::create_dir_all(&sub)?;
        fill(&mut buf[..len as usize], i);
        std::fs::write(sub.join(format!("f{i}.txt")), &buf[..len as usize])?;
        written += len;
        i += 1;
    }
    let large = (size - written) / 3;
    for n in 0..3 {
        let mut f = std::fs::File::create(dir.join(format!("large{n}.bin")))?;
        let mut left = large;
        let mut chunk = vec![0u8; 1 << 20];
        while left > 0 {
            let take = left.min(chunk.len() as u64) as usize;
            fill(&mut chunk[..take], n + left);
            std::io::Write::write_all(&mut f, &chunk[..take])?;
            left -= take as u64;
        }
        written += large;
    }
    Ok(written)
}

fn drop_dir(p: &Path) {
    let _ = std::fs::remove_dir_all(p);
}

fn time_cmd(cmd: &mut Command) -> anyhow::Result<f64> {
    let t = Instant::now();
    let st = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    if !st.success() {
        bail!("{cmd:?} failed");
    }
    Ok(t.elapsed().as_secs_f64())
}

struct BenchPlugin {
    /// Label in the table, with the language.
    label: String,
    /// File name of the manifest written for it in the bench directory.
    manifest: String,
    /// Component path.
    component: PathBuf,
    /// A `snapshot-plugin` (one sandbox's snapshot) rather than a remote client.
    snapshot_world: bool,
    /// Big interpreters (Python, JavaScript) compile for ~10 s: left out of
    /// `--quick` so the test suite's run stays in seconds.
    heavy: bool,
}

/// The guests `guest-examples/guests.toml` marks for benchmarking.
fn bench_plugins() -> anyhow::Result<Vec<BenchPlugin>> {
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
fn write_manifests(base: &Path, quick: bool) -> anyhow::Result<Vec<(BenchPlugin, PathBuf)>> {
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

fn snapshot_spec(plugin: &BenchPlugin, manifest: &Path) -> SnapshotSpec {
    if plugin.snapshot_world {
        SnapshotSpec::Plugin {
            plugin: manifest.to_path_buf(),
        }
    } else {
        SnapshotSpec::Remote {
            plugin: manifest.to_path_buf(),
        }
    }
}

/// Persist + restore of `src` through a local sandbox with `snapshot`.
async fn berth_roundtrip(
    client: &SandboxClient,
    src: &Path,
    snapshot: SnapshotSpec,
) -> anyhow::Result<(f64, f64)> {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(snapshot)
                .backend(BackendSpec::new(
                    berth::backend::local::LocalOptions::default().root_dir(src.to_path_buf()),
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
    Ok((persist, restore))
}

fn rss_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

async fn rss_probe(size: u64, dedup: bool) -> anyhow::Result<ExitCode> {
    let base = tempfile::Builder::new().prefix("berth-rss-").tempdir()?;
    let src = base.path().join("ws");
    make_workspace(&src, size)?;
    let plugins = write_manifests(base.path(), true)?;
    let (plugin, manifest) = plugins
        .first()
        .filter(|(p, _)| p.manifest == "fs-store.toml")
        .context("fs-store not built: cargo xtask build-guests")?;
    let client = SandboxClient::builder(base.path().join("home"))
        .pack_cache(None)
        .build();
    let spec = snapshot_spec(plugin, manifest);
    let spec = if dedup { spec.deduplicated(1) } else { spec };
    berth_roundtrip(&client, &src, spec).await?;
    println!("{}", rss_peak_kib());
    Ok(ExitCode::SUCCESS)
}

async fn sh(sb: &Sandbox, cmd: &str) -> anyhow::Result<()> {
    let r = sb
        .exec(ExecRequest::new(cmd, Duration::from_secs(120)))
        .await?;
    if r.exit_code != 0 {
        bail!("{cmd}: {}", r.stderr);
    }
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(size) = args.rss_probe {
        return rss_probe(size, args.rss_dedup).await;
    }
    let size = args
        .size
        .unwrap_or(if args.quick { 32 << 20 } else { 1 << 30 });
    let runs = args.runs.unwrap_or(if args.quick { 1 } else { 3 });
    let want = |group: &str| args.only.is_empty() || args.only.iter().any(|g| g == group);
    let base = tempfile::Builder::new().prefix("berth-bench-").tempdir()?;
    let src = base.path().join("ws");
    let bytes = make_workspace(&src, size)?;
    let mut rows: Vec<Row> = Vec::new();
    let plugins = write_manifests(base.path(), args.quick)?;
    let client = SandboxClient::new(base.path().join("home"));
    eprintln!(
        "bench: workspace {} MiB, {runs} run(s) each, alternating",
        bytes >> 20
    );

    // Persist and restore: GNU tar vs Berth's stores, alternating. Series 0
    // is GNU tar, 1 the native local snapshot, then one per plugin.
    let mut series: Vec<(String, Vec<f64>, Vec<f64>)> = vec![
        ("GNU tar".into(), vec![], vec![]),
        ("native local snapshot".into(), vec![], vec![]),
    ];
    for (plugin, _) in &plugins {
        series.push((format!("wasm {}", plugin.label), vec![], vec![]));
    }
    for _ in 0..if want("persist") { runs } else { 0 } {
        for (i, s) in series.iter_mut().enumerate() {
            let (p, r) = match i {
                0 => {
                    let tarball = base.path().join("gnu.tar");
                    let p = time_cmd(
                        Command::new("tar")
                            .arg("-cf")
                            .arg(&tarball)
                            .arg("-C")
                            .arg(&src)
                            .arg("."),
                    )?;
                    let out = base.path().join("gnu-out");
                    drop_dir(&out);
                    std::fs::create_dir_all(&out)?;
                    let r = time_cmd(
                        Command::new("tar")
                            .arg("-xf")
                            .arg(&tarball)
                            .arg("-C")
                            .arg(&out),
                    )?;
                    drop_dir(&out);
                    let _ = std::fs::remove_file(&tarball);
                    (p, r)
                }
                1 => {
                    berth_roundtrip(
                        &client,
                        &src,
                        SnapshotSpec::Local {
                            base_dir: base.path().join("snaps"),
                        },
                    )
                    .await?
                }
                _ => {
                    let (plugin, manifest) = &plugins[i - 2];
                    berth_roundtrip(&client, &src, snapshot_spec(plugin, manifest)).await?
                }
            };
            s.1.push(p);
            s.2.push(r);
        }
    }
    let tar_p = median(series[0].1.clone());
    let tar_r = median(series[0].2.clone());
    for (name, p, r) in series.iter().filter(|_| want("persist")) {
        let (mp, mr) = (median(p.clone()), median(r.clone()));
        rows.push(Row {
            group: "persist",
            name: name.to_string(),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(bytes, mp), mp),
            baseline: format!("tar -cf {:.2}s", tar_p),
            ratio: Some(mp / tar_p),
        });
        rows.push(Row {
            group: "restore",
            name: name.to_string(),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(bytes, mr), mr),
            baseline: format!("tar -xf {:.2}s", tar_r),
            ratio: Some(mr / tar_r),
        });
    }

    // Peak RSS of a whole persist+restore through the fs-store plugin.
    if want("persist") && plugins.iter().any(|(p, _)| p.manifest == "fs-store.toml") {
        let sizes: Vec<u64> = if args.quick {
            vec![16 << 20, 64 << 20]
        } else {
            vec![1 << 30, 4 << 30]
        };
        for s in sizes {
            for dedup in [false, true] {
                let exe = std::env::current_exe()?;
                let mut probe = Command::new(exe);
                probe.args(["--rss-probe", &s.to_string()]);
                if dedup {
                    probe.arg("--rss-dedup");
                }
                let out = probe.stderr(Stdio::null()).output()?;
                let kib: u64 = String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse()
                    .unwrap_or(0);
                rows.push(Row::unpaired(
                    "memory",
                    format!(
                        "peak RSS, {} MiB workspace via fs-store{}",
                        s >> 20,
                        if dedup { ", deduplicated" } else { "" }
                    ),
                    format!("{:.1} MiB", kib as f64 / 1024.0),
                ));
            }
        }
    }

    // Deduplicated snapshots against whole-tar ones, through the fs-store
    // and (when the Garage cluster is up) the s3-store.
    if let Some((_, manifest)) = plugins
        .iter()
        .find(|(p, _)| want("dedup") && p.manifest == "fs-store.toml")
    {
        let store = SnapshotSpec::Remote {
            plugin: manifest.clone(),
        };
        rows.append(&mut dedup_rows(base.path(), &src, "fs-store", store, runs, args.quick).await?);
    }
    match s3_manifest(base.path(), "bench-dedup/") {
        _ if !want("dedup") => {}
        Ok(manifest) => {
            let store = SnapshotSpec::Remote { plugin: manifest };
            match dedup_rows(base.path(), &src, "s3-store", store, runs, args.quick).await {
                Ok(mut r) => rows.append(&mut r),
                Err(e) => eprintln!("bench: S3 dedup rows skipped: {e:#}"),
            }
            if let Err(e) = s3_clear("bench-dedup/") {
                eprintln!("bench: could not remove the bench's objects from the bucket: {e:#}");
            }
        }
        Err(e) => eprintln!("bench: S3 dedup rows skipped: {e:#}"),
    }

    // Plugins, per language: cold load, cached load, instantiate + call.
    for (plugin, manifest) in plugins
        .iter()
        .filter(|(p, _)| want("plugins") && !p.snapshot_world)
    {
        rows.append(&mut plugin_rows(plugin, manifest, base.path(), args.quick).await?);
    }

    // Docker: Berth over the API vs the docker CLI.
    if want("docker") {
        match docker_rows(&client, base.path(), runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: Docker rows skipped: {e:#}"),
        }
    }
    if want("s3") {
        match s3_rows(base.path(), runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: S3 rows skipped: {e:#}"),
        }
    }

    println!(
        "{:<9} {:<48} {:<32} {:<22} RATIO",
        "GROUP", "WHAT", "BERTH", "BASELINE"
    );
    for r in &rows {
        println!(
            "{:<9} {:<48} {:<32} {:<22} {}",
            r.group,
            r.name,
            r.value,
            r.baseline,
            r.ratio
                .map(|x| format!("{x:.2}×"))
                .unwrap_or_else(|| "-".into())
        );
    }
    let json = json!({
        "workspace_bytes": bytes,
        "runs": runs,
        "rows": rows.iter().map(|r| json!({"group": r.group, "what": r.name, "berth": r.value, "baseline": r.baseline, "ratio": r.ratio})).collect::<Vec<_>>(),
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&json)?)?;
    eprintln!("bench: wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}

/// Load and call latency of one remote-client plugin: a cold load with no
/// compile cache, loads from the cache (median), and fresh instance +
/// `open` + `exists` round trips (median and p99).
async fn plugin_rows(
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

async fn docker_rows(
    client: &SandboxClient,
    base: &Path,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let image = std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
    let probe = DockerOptions::new(image.clone()).into_state_for_probe();
    let docker = berth::backend::docker::connect(&probe).await?;
    docker
        .inspect_image(&image)
        .await
        .context("test image missing")?;
    let mut rows = Vec::new();
    let opts = || SandboxOptions::default();
    let snaps = base.join("docker-snaps");
    let new_sandbox = || {
        client.create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::Local {
                    base_dir: snaps.clone(),
                })
                .backend(BackendSpec::new(DockerOptions::new(image.clone())))
                .options(opts()),
        )
    };

    // create+start vs docker run -d
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..runs.max(3) {
        let t = Instant::now();
        let mut sb = new_sandbox().await?;
        sb.start().await?;
        ours.push(t.elapsed().as_secs_f64());
        sb.shutdown().await?;
        let name = format!("berth-bench-cli-{}-{i}", std::process::id());
        theirs.push(time_cmd(&mut docker_run_detached(&name, &image))?);
        docker_rm(&name);
    }
    let (o, t) = (median(ours), median(theirs));
    rows.push(Row {
        group: "docker",
        name: "create + start (+ workspace setup)".into(),
        value: format!("{:.0} ms", o * 1e3),
        baseline: format!("docker run -d {:.0} ms", t * 1e3),
        ratio: Some(o / t),
    });

    // exec round trip vs docker exec
    let mut sb = new_sandbox().await?;
    sb.start().await?;
    let id = sb
        .state()
        .backend
        .decode::<DockerState>()?
        .container_id
        .unwrap_or_default();
    let n = if quick { 10 } else { 50 };
    // The agent starts with the first command; time the ones after.
    sb.exec(ExecRequest::new("true", Duration::from_secs(30)))
        .await?;
    let mut plain = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::Noop)
                .backend(BackendSpec::new(
                    DockerOptions::new(image.clone()).agent(false),
                ))
                .options(opts()),
        )
        .await?;
    plain.start().await?;
    let (mut ours, mut session, mut execs, mut theirs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        sb.exec(ExecRequest::new("true", Duration::from_secs(30)))
            .await?;
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        sb.exec(ExecRequest::new("true", Duration::from_secs(30)).in_session("bench"))
            .await?;
        session.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        plain
            .exec(ExecRequest::new("true", Duration::from_secs(30)))
            .await?;
        execs.push(t.elapsed().as_secs_f64());
        theirs.push(time_cmd(
            Command::new("docker").args(["exec", &id, "true"]),
        )?);
    }
    plain.shutdown().await?;
    let t = median(theirs.clone());
    let t99 = percentile(theirs, 0.99);
    for (name, samples) in [
        ("exec `true` round trip (agent)", ours),
        ("exec `true` in a shell session (agent)", session),
        ("exec `true` round trip (one exec each, no agent)", execs),
    ] {
        let (o, o99) = (median(samples.clone()), percentile(samples, 0.99));
        rows.push(Row {
            group: "docker",
            name: name.into(),
            value: format!("{:.1} ms (p99 {:.1} ms)", o * 1e3, o99 * 1e3),
            baseline: format!("docker exec {:.1} ms (p99 {:.1} ms)", t * 1e3, t99 * 1e3),
            ratio: Some(o / t),
        });
    }

    // persist / restore through the archive API vs docker cp
    let data_mib = if quick { 16 } else { 256 };
    sh(
        &sb,
        &format!(
            "mkdir -p data && head -c {}m /dev/urandom > data/blob && seq 1 200000 > data/n",
            data_mib
        ),
    )
    .await?;
    let (mut p_ours, mut p_cp, mut r_ours, mut r_cp) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        // Every timed step starts with the disk settled: what the step
        // before wrote is not flushed on its time.
        settle();
        let t = Instant::now();
        sb.stop().await?;
        p_ours.push(t.elapsed().as_secs_f64());
        let out = base.join(format!("cp-out-{i}"));
        drop_dir(&out);
        settle();
        p_cp.push(time_cmd(
            Command::new("docker")
                .arg("cp")
                .arg(format!("{id}:/workspace"))
                .arg(&out),
        )?);
        // Restore into a brand-new container: Berth creates it and restores
        // the snapshot; the CLI baseline is `docker run -d` + `docker cp` in.
        let mut fresh = sb.state();
        let mut d: DockerState = fresh.backend.decode()?;
        d.container_id = None;
        d.container_name = format!("{}-r{i}", d.container_name);
        fresh.backend = BackendState::encode(berth::backend::docker::KIND, &d)?;
        settle();
        let t = Instant::now();
        let mut rb = client.resume(fresh, None, opts()).await?;
        rb.start().await?;
        r_ours.push(t.elapsed().as_secs_f64());
        rb.shutdown().await?;
        let target = format!("berth-bench-cp-{}-{i}", std::process::id());
        settle();
        let t = Instant::now();
        let started = docker_run_detached(&target, &image)
            .stdout(Stdio::null())
            .status()?;
        if !started.success() {
            bail!("docker run failed");
        }
        time_cmd(
            Command::new("docker")
                .arg("cp")
                .arg(&out)
                .arg(format!("{target}:/workspace")),
        )?;
        r_cp.push(t.elapsed().as_secs_f64());
        docker_rm(&target);
        drop_dir(&out);
    }
    let (po, pc, ro, rc) = (median(p_ours), median(p_cp), median(r_ours), median(r_cp));
    rows.push(Row {
        group: "docker",
        name: format!("persist {data_mib} MiB (archive API → local snapshot)"),
        value: format!("{:.2}s", po),
        baseline: format!("docker cp out {:.2}s", pc),
        ratio: Some(po / pc),
    });
    rows.push(Row {
        group: "docker",
        name: format!("restore {data_mib} MiB into a new container"),
        value: format!("{:.2}s", ro),
        baseline: format!("run -d + cp in {:.2}s", rc),
        ratio: Some(ro / rc),
    });

    // Resume: running, stopped behind our back, removed behind our back.
    let state = sb.state();
    let mut running = Vec::new();
    let mut stopped = Vec::new();
    for _ in 0..runs.max(3) {
        let t = Instant::now();
        let mut rb = client.resume(state.clone(), None, opts()).await?;
        rb.attach().await?;
        running.push(t.elapsed().as_secs_f64());
        let _ = Command::new("docker")
            .args(["stop", "-t", "0", &id])
            .stdout(Stdio::null())
            .status();
        let t = Instant::now();
        let mut rb = client.resume(state.clone(), None, opts()).await?;
        rb.attach().await?;
        stopped.push(t.elapsed().as_secs_f64());
    }
    rows.push(Row::unpaired(
        "docker",
        "resume a running container".into(),
        format!("{:.0} ms", median(running) * 1e3),
    ));
    rows.push(Row::unpaired(
        "docker",
        "resume a stopped container".into(),
        format!("{:.0} ms", median(stopped) * 1e3),
    ));
    // The restore runs above resumed a state whose container was gone:
    // the same path as a container removed behind Berth's back, so the
    // same measurement.
    rows.push(Row::unpaired(
        "docker",
        format!("resume a removed container ({data_mib} MiB restored)"),
        format!("{:.0} ms", ro * 1e3),
    ));
    sb.shutdown().await?;
    Ok(rows)
}

/// s3-store against boto3 on the same S3 store (the Garage cluster that
/// `cargo xtask setup` starts, described by /tmp/berth-garage/s3.env).
/// The Garage test cluster's credentials (from `cargo xtask setup`).
struct S3Creds {
    endpoint: String,
    region: String,
    bucket: String,
    key: String,
    secret: String,
}

fn s3_creds() -> anyhow::Result<S3Creds> {
    let text = std::fs::read_to_string("/tmp/berth-garage/s3.env")
        .context("no /tmp/berth-garage/s3.env")?;
    let env: std::collections::HashMap<&str, &str> =
        text.lines().filter_map(|l| l.split_once('=')).collect();
    let get = |k: &str| {
        env.get(k)
            .map(|v| v.to_string())
            .with_context(|| format!("{k} missing"))
    };
    Ok(S3Creds {
        endpoint: get("BERTH_S3_ENDPOINT")?,
        region: get("BERTH_S3_REGION")?,
        bucket: get("BERTH_S3_BUCKET")?,
        key: get("BERTH_S3_ACCESS_KEY_ID")?,
        secret: get("BERTH_S3_SECRET_ACCESS_KEY")?,
    })
}

/// Writes an s3-store manifest for the Garage cluster, objects under
/// `prefix`.
fn s3_manifest(base: &Path, prefix: &str) -> anyhow::Result<PathBuf> {
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let component = std::path::absolute(guest_table::component_path(
        &std::env::current_dir()?,
        &guest_table::guest(&std::env::current_dir()?, "s3-store").map_err(anyhow::Error::msg)?,
    ))?;
    if !component.is_file() {
        bail!("s3-store is not built");
    }
    let manifest = base.join(format!("s3-store-{}.toml", prefix.trim_end_matches('/')));
    std::fs::write(
        &manifest,
        format!(
            "component = {component:?}\nworld = 'remote-client-plugin'\n[config]\nendpoint = {endpoint:?}\nregion = {region:?}\n\
             bucket = {bucket:?}\nprefix = {prefix:?}\naccess_key_id = {key:?}\nsecret_access_key = {secret:?}\n\
             [grants]\nmax_memory = '64MiB'\ndeadline_secs = 1800\nwall_clock = true\nhttp_hosts = [{endpoint:?}]\n"
        ),
    )?;
    Ok(manifest)
}

/// Deletes every object under `prefix` in the Garage bucket (boto3), so
/// benchmark runs do not fill the disk.
fn s3_clear(prefix: &str) -> anyhow::Result<()> {
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let script = format!(
        r#"
import boto3
s3 = boto3.client("s3", endpoint_url="{endpoint}", region_name="{region}",
                  aws_access_key_id="{key}", aws_secret_access_key="{secret}")
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="{bucket}", Prefix="{prefix}"):
    objs = page.get("Contents", [])
    if objs:
        s3.delete_objects(Bucket="{bucket}", Delete={{"Objects": [{{"Key": o["Key"]}} for o in objs]}})
"#
    );
    let out = Command::new("python3").arg("-c").arg(&script).output()?;
    if !out.status.success() {
        bail!("boto3: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

async fn s3_rows(base: &Path, runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    let manifest = s3_manifest(base, "bench/")?;
    let S3Creds {
        endpoint,
        region,
        bucket,
        key,
        secret,
    } = s3_creds()?;
    let client = PluginHost::new()?
        .load_file(&manifest)
        .await?
        .remote_client()?;
    let size: u64 = if quick { 16 << 20 } else { 256 << 20 };
    let data = base.join("s3-blob");
    {
        let mut f = std::fs::File::create(&data)?;
        let mut chunk = vec![0u8; 1 << 20];
        for i in 0..(size >> 20) {
            fill(&mut chunk, i);
            std::io::Write::write_all(&mut f, &chunk)?;
        }
    }
    let script = format!(
        r#"
import boto3, sys, time
s3 = boto3.client("s3", endpoint_url="{endpoint}", region_name="{region}",
                  aws_access_key_id="{key}", aws_secret_access_key="{secret}")
t = time.time(); s3.upload_file(sys.argv[1], "{bucket}", "bench/boto3.tar"); up = time.time() - t
t = time.time(); s3.download_file("{bucket}", "bench/boto3.tar", sys.argv[1] + ".down"); down = time.time() - t
print(up, down)
"#
    );
    let (mut ours_up, mut ours_down, mut boto_up, mut boto_down) = (vec![], vec![], vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        let mut f = tokio::fs::File::open(&data).await?;
        client.upload("bench-s3", &mut f).await?;
        ours_up.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut out = tokio::fs::File::create(base.join("s3-down")).await?;
        client.download("bench-s3", &mut out).await?;
        ours_down.push(t.elapsed().as_secs_f64());
        let out = Command::new("python3")
            .arg("-c")
            .arg(&script)
            .arg(&data)
            .output()?;
        if !out.status.success() {
            bail!("boto3 failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text
            .split_whitespace()
            .filter_map(|v| v.parse::<f64>().ok());
        boto_up.push(it.next().unwrap_or(f64::NAN));
        boto_down.push(it.next().unwrap_or(f64::NAN));
    }
    let (ou, od, bu, bd) = (
        median(ours_up),
        median(ours_down),
        median(boto_up),
        median(boto_down),
    );
    Ok(vec![
        Row {
            group: "s3",
            name: format!(
                "upload {} MiB (s3-store, multipart 8 MiB parts)",
                size >> 20
            ),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(size, ou), ou),
            baseline: format!("boto3 {:.2}s", bu),
            ratio: Some(ou / bu),
        },
        Row {
            group: "s3",
            name: format!("download {} MiB (s3-store)", size >> 20),
            value: format!("{:.0} MB/s ({:.2}s)", mbps(size, od), od),
            baseline: format!("boto3 {:.2}s", bd),
            ratio: Some(od / bd),
        },
    ])
}

/// The state of a sandbox whose workspace is `src`, moved to a fresh root
/// (where a restore goes).
fn moved_to(
    state: &berth::sandbox::SandboxState,
    root: &Path,
) -> anyhow::Result<berth::sandbox::SandboxState> {
    let mut moved = state.clone();
    let mut local: LocalState = moved.backend.decode()?;
    local.root_dir = root.to_path_buf();
    local.owned = true;
    moved.backend = BackendState::encode(berth::backend::local::KIND, &local)?;
    Ok(moved)
}

/// Writes dirty pages out, so one measurement does not pay for the
/// previous one's writeback (on this VM's disk that swings a 1 GiB
/// restore between 4 and 15 s).
fn settle() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Times a restore of `state`'s snapshot into a fresh root.
async fn timed_restore(
    client: &SandboxClient,
    state: &berth::sandbox::SandboxState,
    root: &Path,
) -> anyhow::Result<f64> {
    drop_dir(root);
    let mut sb = client
        .resume(moved_to(state, root)?, None, SandboxOptions::default())
        .await?;
    settle();
    let t = Instant::now();
    sb.start().await?;
    let secs = t.elapsed().as_secs_f64();
    sb.shutdown().await?;
    Ok(secs)
}

/// A local sandbox over the workspace `src` (never shut down: `src` stays).
async fn sandbox_over(
    client: &SandboxClient,
    src: &Path,
    snapshot: SnapshotSpec,
) -> anyhow::Result<Sandbox> {
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(snapshot)
                .backend(BackendSpec::new(
                    berth::backend::local::LocalOptions::default().root_dir(src.to_path_buf()),
                )),
        )
        .await?;
    sb.start().await?;
    Ok(sb)
}

/// A seed no earlier mutation of this bench used, so a change is never
/// content the workspace already held (which would deduplicate).
fn fresh_seed() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(2, std::sync::atomic::Ordering::Relaxed) * 1_000_003
}

/// Rewrites `n` small files with new content (`total` bytes in all).
fn touch_small_files(src: &Path, n: u64, total: u64, seed: u64) -> anyhow::Result<()> {
    let each = (total / n) as usize;
    let mut buf = vec![0u8; each];
    for i in 0..n {
        fill(&mut buf, seed + i);
        std::fs::write(src.join(format!("src/d{:03}/f{i}.txt", i % 200)), &buf)?;
    }
    Ok(())
}

/// Deduplicated stops against whole-tar stops through the same store, on
/// the bench workspace: the first (full) stop, then (a) no change, (b)
/// 1 MiB appended to a large file, (c) 1 MiB over 50 small files, (d) a
/// new 100 MiB file; and restores, without and with the host's pack cache.
async fn dedup_rows(
    base: &Path,
    src: &Path,
    label: &str,
    store: SnapshotSpec,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let new_file_mib = if quick { 4 } else { 100 };
    let home = base.join(format!("dedup-home-{label}"));
    let uncached = SandboxClient::builder(&home).pack_cache(None).build();
    let cached = SandboxClient::builder(&home)
        .pack_cache(Some(berth::snapshot::PackCache::new(
            base.join(format!("pack-cache-{label}")),
            8 << 30,
        )))
        .build();
    let restore_root = base.join("dedup-restored");
    let scenarios = [
        "first full stop",
        "(a) no change",
        "(b) 1 MiB appended to a large file",
        "(c) 1 MiB over 50 small files",
        if quick {
            "(d) a new 4 MiB file"
        } else {
            "(d) a new 100 MiB file"
        },
    ];
    let mut whole_stop = vec![];
    let mut whole_restore = vec![];
    let mut stops: Vec<Vec<(f64, u64, u64)>> = vec![vec![]; scenarios.len()];
    let mut restores = vec![];
    let mut cached_restores = vec![];
    for run in 0..runs {
        // A: today's whole-tar snapshot through the same store.
        let mut whole = sandbox_over(&uncached, src, store.clone()).await?;
        settle();
        let t = Instant::now();
        whole.stop().await?;
        whole_stop.push(t.elapsed().as_secs_f64());
        whole_restore.push(timed_restore(&uncached, &whole.state(), &restore_root).await?);

        // B: the deduplicated one, new each run (so its first stop is full).
        let client = if run == 0 { &cached } else { &uncached };
        let mut dedup = sandbox_over(client, src, store.clone().deduplicated(1)).await?;
        for (i, _) in scenarios.iter().enumerate() {
            match i {
                2 => {
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .open(src.join("large0.bin"))?;
                    let mut chunk = vec![0u8; 1 << 20];
                    fill(&mut chunk, fresh_seed());
                    std::io::Write::write_all(&mut f, &chunk)?;
                }
                3 => touch_small_files(src, 50, 1 << 20, fresh_seed())?,
                4 => {
                    let mut f = std::fs::File::create(src.join("new100.bin"))?;
                    let mut chunk = vec![0u8; 1 << 20];
                    for n in 0..new_file_mib {
                        fill(&mut chunk, fresh_seed() + n);
                        std::io::Write::write_all(&mut f, &chunk)?;
                    }
                }
                _ => {}
            }
            settle();
            let t = Instant::now();
            dedup.stop().await?;
            let secs = t.elapsed().as_secs_f64();
            let stats = berth::snapshot::DedupRecord::from_fields(&dedup.state().snapshot.fields)
                .and_then(|d| d.last_stop)
                .context("a deduplicated stop records its stats")?;
            stops[i].push((secs, stats.uploaded_bytes, stats.upload_calls));
        }
        if run == 0 {
            // Same host, packs in the cache since the stops.
            cached_restores.push(timed_restore(&cached, &dedup.state(), &restore_root).await?);
        }
        restores.push(timed_restore(&uncached, &dedup.state(), &restore_root).await?);
        let _ = std::fs::remove_file(src.join("new100.bin"));
    }
    let ws = median(whole_stop);
    let wr = median(whole_restore);
    let mut rows = Vec::new();
    for (i, name) in scenarios.iter().enumerate() {
        let secs = median(stops[i].iter().map(|s| s.0).collect());
        let bytes = median(stops[i].iter().map(|s| s.1 as f64).collect());
        let calls = median(stops[i].iter().map(|s| s.2 as f64).collect());
        rows.push(Row {
            group: "dedup",
            name: format!("{label}: stop, {name}"),
            value: format!(
                "{secs:.2}s, {:.2} MiB in {calls:.0} uploads",
                bytes / (1 << 20) as f64
            ),
            baseline: format!("whole tar {ws:.2}s"),
            ratio: Some(secs / ws),
        });
    }
    let r = median(restores);
    rows.push(Row {
        group: "dedup",
        name: format!("{label}: restore (no pack cache)"),
        value: format!("{r:.2}s"),
        baseline: format!("whole tar {wr:.2}s"),
        ratio: Some(r / wr),
    });
    let c = median(cached_restores);
    rows.push(Row {
        group: "dedup",
        name: format!("{label}: restore from this host's pack cache"),
        value: format!("{c:.2}s"),
        baseline: format!("whole tar {wr:.2}s"),
        ratio: Some(c / wr),
    });
    Ok(rows)
}
