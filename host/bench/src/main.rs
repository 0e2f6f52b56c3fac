//! `berth-bench` (run by `cargo xtask bench`): side-by-side measurements against what a user would use
//! instead (GNU tar, the docker CLI), alternating A and B and reporting
//! medians. Benchmarks, not timed tests: nothing here asserts a speed.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

mod checkpoint;
mod commands;
mod dedup;
mod docker;
mod egress;
mod egress_swarm;
mod egress_tls;
mod isolation;
mod plugins;
mod pools;
mod s3;
mod server;
mod swarm;

use commands::*;
use dedup::*;
use docker::*;
use plugins::*;
use s3::*;

/// A client builder for sandboxes under `home` that knows the Docker and
/// swarm kinds too.
pub(crate) fn client_builder(home: impl Into<PathBuf>) -> berth::sandbox::SandboxClientBuilder {
    SandboxClient::builder(home).backend_providers(berth_docker::providers())
}

use anyhow::bail;
use berth::sandbox::{SandboxClient, SnapshotSpec};
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
    /// Run only these groups (repeatable): checkpoint, persist (persist, restore and
    /// memory), dedup, plugins, docker, commands, server, pools, swarm, s3,
    /// isolation, egress. By default, all.
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
    berth::units::parse_size(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // As the `berth` binary does: the probes measure what it would use.
    berth::allocator::bound_allocator_retention();
    let args = BenchArgs::parse();
    // Before any thread exists: it sets SSL_CERT_FILE for the egress
    // daemons the secrets rows start.
    if let Err(e) = egress_tls::prepare() {
        eprintln!("bench: no TLS fixture for the secrets rows: {e:#}");
    }
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
    let client = client_builder(base.path().join("home")).build();
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
                    // Into a directory whose previous tree was just
                    // deleted, as Berth's restores are: ext4 takes much
                    // longer to find inodes where thousands were freed a
                    // moment ago (seen here: 1.6 s into a fresh directory,
                    // 9-14 s into a churned one, tar and Berth alike).
                    let out = base.path().join("gnu-out");
                    drop_dir(&out);
                    std::fs::create_dir_all(&out)?;
                    time_cmd(
                        Command::new("tar")
                            .arg("-xf")
                            .arg(&tarball)
                            .arg("-C")
                            .arg(&out),
                    )?;
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
                        SnapshotSpec::local(base.path().join("snaps")),
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
        let store = SnapshotSpec::remote(manifest.clone());
        rows.append(&mut dedup_rows(base.path(), &src, "fs-store", store, runs, args.quick).await?);
    }
    match s3_manifest(base.path(), "bench-dedup/") {
        _ if !want("dedup") => {}
        Ok(manifest) => {
            let store = SnapshotSpec::remote(manifest);
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

    // What a checkpoint after every command adds, through the server.
    if let Some((_, manifest)) = plugins
        .iter()
        .find(|(p, _)| want("checkpoint") && p.manifest == "fs-store.toml")
    {
        rows.append(
            &mut checkpoint::checkpoint_rows(
                base.path(),
                &src,
                "fs-store",
                manifest,
                runs,
                &checkpoint::Placement::Local,
            )
            .await?,
        );
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match checkpoint::checkpoint_rows(
            base.path(),
            &src,
            "fs-store on Docker",
            manifest,
            runs,
            &checkpoint::Placement::Docker(image),
        )
        .await
        {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: Docker checkpoint rows skipped: {e:#}"),
        }
    }
    match s3_manifest(base.path(), "bench-checkpoint/") {
        _ if !want("checkpoint") => {}
        Ok(manifest) => {
            match checkpoint::checkpoint_rows(
                base.path(),
                &src,
                "s3-store",
                &manifest,
                runs,
                &checkpoint::Placement::Local,
            )
            .await
            {
                Ok(mut r) => rows.append(&mut r),
                Err(e) => eprintln!("bench: S3 checkpoint rows skipped: {e:#}"),
            }
            if let Err(e) = s3_clear("bench-checkpoint/") {
                eprintln!("bench: could not remove the bench's objects from the bucket: {e:#}");
            }
        }
        Err(e) => eprintln!("bench: S3 checkpoint rows skipped: {e:#}"),
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
    if want("commands") {
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match command_rows(&client, &image, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: command rows skipped: {e:#}"),
        }
    }
    if want("server") {
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match server::server_rows(&image, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: server rows skipped: {e:#}"),
        }
    }
    if want("pools") {
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        let docker = pools::Place {
            label: "Docker",
            backend: serde_json::json!({"type": "docker", "image": image}),
            snapshot: None,
            docker_baseline: true,
        };
        match pools::pool_rows(&docker, &image, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: pool rows skipped: {e:#}"),
        }
        match pools::swarm_place(base.path(), &image) {
            Ok((swarm, _fixture)) => match pools::pool_rows(&swarm, &image, args.quick).await {
                Ok(mut r) => rows.append(&mut r),
                Err(e) => eprintln!("bench: swarm pool rows skipped: {e:#}"),
            },
            Err(e) => eprintln!("bench: swarm pool rows skipped: {e:#}"),
        }
        let mib = if args.quick { 32 } else { 256 };
        match pools::fork_rows(&image, mib).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: live fork rows skipped: {e:#}"),
        }
    }
    if want("swarm") {
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match swarm::swarm_rows(&image, runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: swarm rows skipped: {e:#}"),
        }
    }
    if want("isolation") {
        match isolation::isolation_rows(base.path(), &src, bytes, runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: isolation rows skipped: {e:#}"),
        }
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match isolation::gvisor_rows(base.path(), &image, runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: gVisor rows skipped: {e:#}"),
        }
    }
    if want("egress") {
        match egress::egress_rows(base.path(), runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: egress rows skipped: {e:#}"),
        }
        match egress_tls::secret_rows(base.path(), runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: secrets rows skipped: {e:#}"),
        }
        let image =
            std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
        match egress_swarm::swarm_tunnel_rows(&image, runs, args.quick).await {
            Ok(mut r) => rows.append(&mut r),
            Err(e) => eprintln!("bench: swarm egress rows skipped: {e:#}"),
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
