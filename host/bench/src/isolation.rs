//! What confinement and bounds cost: a local sandbox's commands and its
//! persist and restore with the defaults (bubblewrap, a control group,
//! a workspace disk image) against a plain directory (`--isolation none`
//! with every bound `unlimited`, what a user would otherwise run).

use std::path::Path;
use std::time::{Duration, Instant};

use berth::backend::limits::Bound;
use berth::backend::local::{Isolation, LocalOptions};
use berth::backend::ExecRequest;
use berth::sandbox::{BackendSpec, Sandbox, SandboxClient, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;

use super::*;

async fn local_sandbox(
    client: &SandboxClient,
    isolation: Isolation,
    manifest: WorkspaceSpec,
    snapshot: SnapshotSpec,
) -> anyhow::Result<Sandbox> {
    let mut sb = client
        .create(
            SandboxSpec::new(manifest)
                .snapshot(snapshot)
                .backend(BackendSpec::new(match isolation {
                    Isolation::None => LocalOptions::default()
                        .isolation(isolation)
                        .memory(Bound::Unlimited)
                        .pids(Bound::Unlimited)
                        .cpus_millis(Bound::Unlimited)
                        .disk(Bound::Unlimited),
                    _ => LocalOptions::default().isolation(isolation),
                })),
        )
        .await?;
    sb.start().await?;
    Ok(sb)
}

/// Median seconds of `n` runs of `true`.
async fn exec_true(sb: &Sandbox, n: usize) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let r = sb
            .exec(ExecRequest::new("true", Duration::from_secs(60)))
            .await?;
        times.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(r.exit_code == 0, "true exited {}", r.exit_code);
    }
    Ok(median(times))
}

/// Seconds of a stop (persist) and of a start after a shutdown (restore)
/// of a workspace holding `src`.
async fn persist_restore(
    client: &SandboxClient,
    isolation: Isolation,
    src: &Path,
    scratch: &Path,
) -> anyhow::Result<(f64, f64)> {
    let manifest: WorkspaceSpec = serde_json::from_value(serde_json::json!({
        "entries": {"data": {"type": "local_dir", "path": src}}
    }))?;
    let snapshots = scratch.join(format!("snapshots-{isolation}"));
    let snapshot = SnapshotSpec::local(snapshots.clone());
    let mut sb = local_sandbox(client, isolation, manifest, snapshot).await?;
    // Changed since the start's copy, so the stop writes it all.
    sh(&sb, "touch data").await?;
    let t = Instant::now();
    sb.stop().await?;
    let persist = t.elapsed().as_secs_f64();
    sb.shutdown().await?;
    let t = Instant::now();
    sb.start().await?;
    let restore = t.elapsed().as_secs_f64();
    sb.shutdown().await?;
    let _ = std::fs::remove_dir_all(&snapshots);
    Ok((persist, restore))
}

pub(super) async fn isolation_rows(
    home: &Path,
    src: &Path,
    bytes: u64,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let client = client_builder(home.join("isolation-home")).build();
    let mut rows = Vec::new();
    let n = if quick { 10 } else { 50 };
    let mut confined = local_sandbox(
        &client,
        Isolation::Confined,
        WorkspaceSpec::default(),
        SnapshotSpec::noop(),
    )
    .await?;
    let mut open = local_sandbox(
        &client,
        Isolation::None,
        WorkspaceSpec::default(),
        SnapshotSpec::noop(),
    )
    .await?;
    exec_true(&confined, 2).await?;
    exec_true(&open, 2).await?;
    let (c, o) = (exec_true(&confined, n).await?, exec_true(&open, n).await?);
    rows.push(Row {
        group: "isolation",
        name: "local exec `true`, confined and bounded (the defaults)".into(),
        value: format!("{:.1} ms (+{:.1} ms)", c * 1e3, (c - o) * 1e3),
        baseline: format!("plain directory {:.1} ms", o * 1e3),
        ratio: Some(c / o),
    });
    confined.shutdown().await?;
    open.shutdown().await?;

    let (mut cp, mut cr, mut op, mut or) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (p, r) = persist_restore(&client, Isolation::Confined, src, home).await?;
        cp.push(p);
        cr.push(r);
        let (p, r) = persist_restore(&client, Isolation::None, src, home).await?;
        op.push(p);
        or.push(r);
    }
    let mib = bytes >> 20;
    for (what, c, o) in [
        ("persist", median(cp), median(op)),
        ("restore", median(cr), median(or)),
    ] {
        rows.push(Row {
            group: "isolation",
            name: format!("local {what} {mib} MiB, confined and bounded"),
            value: format!("{:.2}s", c),
            baseline: format!("plain directory {:.2}s", o),
            ratio: Some(c / o),
        });
    }
    Ok(rows)
}

/// A Docker sandbox under `runtime` (`None`: the engine's runc),
/// started; with the seconds its create and start took.
async fn docker_sandbox(
    client: &SandboxClient,
    image: &str,
    runtime: Option<&str>,
) -> anyhow::Result<(Sandbox, f64)> {
    let mut options = berth_docker::DockerOptions::new(image);
    if let Some(runtime) = runtime {
        options = options.runtime(runtime);
    }
    let t = Instant::now();
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(options)),
        )
        .await?;
    sb.start().await?;
    Ok((sb, t.elapsed().as_secs_f64()))
}

/// What gVisor costs a Docker sandbox against runc: its create and start,
/// and a command's round trip.
pub(super) async fn gvisor_rows(
    home: &Path,
    image: &str,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let client = client_builder(home.join("gvisor-home")).build();
    let n = if quick { 10 } else { 50 };
    let (mut starts_g, mut starts_r, mut exec_g, mut exec_r) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let (mut g, tg) =
            docker_sandbox(&client, image, Some(berth_docker::runtime::GVISOR)).await?;
        let (mut r, tr) = docker_sandbox(&client, image, None).await?;
        starts_g.push(tg);
        starts_r.push(tr);
        exec_true(&g, 2).await?;
        exec_true(&r, 2).await?;
        exec_g.push(exec_true(&g, n).await?);
        exec_r.push(exec_true(&r, n).await?);
        g.shutdown().await?;
        r.shutdown().await?;
    }
    let (sg, sr, eg, er) = (
        median(starts_g),
        median(starts_r),
        median(exec_g),
        median(exec_r),
    );
    Ok(vec![
        Row {
            group: "isolation",
            name: "docker create+start, gVisor (runsc)".into(),
            value: format!("{:.0} ms", sg * 1e3),
            baseline: format!("runc {:.0} ms", sr * 1e3),
            ratio: Some(sg / sr),
        },
        Row {
            group: "isolation",
            name: "docker exec `true`, gVisor (runsc)".into(),
            value: format!("{:.1} ms", eg * 1e3),
            baseline: format!("runc {:.1} ms", er * 1e3),
            ratio: Some(eg / er),
        },
    ])
}
