//! What the swarm's egress route costs: busybox's wget in a swarm
//! sandbox's container on a fixture node, through the agent's tunnel to
//! the egress point on this host, against curl on the host going straight
//! to the server (what a user would run without a sandbox). The sandbox is
//! held open in this process, as a server holds it, so the tunnel is
//! started once; each figure is a command's time less a `true`'s.

use std::time::Duration;

use berth::backend::ExecRequest;
use berth::egress::{EgressPolicy, EgressSettings};
use berth::sandbox::{BackendSpec, Sandbox, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use berth_docker::swarm::SwarmOptions;
use berth_tests::swarm_fixture::NodeGuard;

use super::egress::{curl_direct, zero_server};
use super::swarm::{off_the_leader, swarm};
use super::*;

/// Seconds `command` takes in `sb`, failing on a non-zero exit.
async fn timed_exec(sb: &Sandbox, command: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let r = sb
        .exec(ExecRequest::new(command, Duration::from_secs(600)))
        .await?;
    anyhow::ensure!(r.exit_code == 0, "{command}: {}", r.stderr_text());
    Ok(t.elapsed().as_secs_f64())
}

/// The swarm tunnel's download and small-request rows.
pub(crate) async fn swarm_tunnel_rows(
    image: &str,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let swarm = swarm()?;
    let _guard = NodeGuard(swarm.clone());
    let base = tempfile::tempdir()?;
    let prefix = format!("bench-swarm-egress-{}/", std::process::id());
    let manifest = s3_manifest(base.path(), &prefix)?;
    let bytes: u64 = if quick { 16 << 20 } else { 256 << 20 };
    let port = zero_server(bytes).await?;
    let client = berth_tests::client(base.path().join("home"));
    let policy = EgressPolicy {
        allow_hosts: vec![format!("dl.bench.test:{port}").parse()?],
        deny_hosts: vec![],
        allow_cidrs: vec![format!("127.0.0.0/8:{port}").parse()?],
    };
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::remote(&manifest))
                .backend(BackendSpec::new(
                    SwarmOptions::new(&swarm.manager, image).constraint(off_the_leader(&swarm)),
                ))
                .egress(EgressSettings {
                    policy,
                    test_resolve: vec!["*.bench.test=127.0.0.1".parse()?],
                    ..EgressSettings::default()
                }),
        )
        .await?;
    sb.start().await?;
    let rows = measure(&sb, port, bytes, runs, quick).await;
    sb.shutdown().await?;
    let _ = s3_clear(&prefix);
    rows
}

async fn measure(
    sb: &Sandbox,
    port: u16,
    bytes: u64,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let n = if quick { 5 } else { 20 };
    let mut nothing = Vec::new();
    for _ in 0..n {
        nothing.push(timed_exec(sb, "true").await?);
    }
    let nothing = median(nothing);

    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = timed_exec(
            sb,
            &format!("wget -qO /dev/null http://dl.bench.test:{port}/"),
        )
        .await?;
        through.push(t - nothing);
        direct.push(curl_direct(&format!(
            "-w '%{{time_total}}' http://127.0.0.1:{port}/"
        ))?);
    }
    let (t, d) = (median(through), median(direct));
    let mib = bytes as f64 / (1 << 20) as f64;
    rows.push(Row {
        group: "egress",
        name: format!("swarm: download {mib:.0} MiB through the tunnel (higher is better)"),
        value: format!("{:.0} MiB/s ({t:.2}s)", mib / t),
        baseline: format!("direct {:.0} MiB/s ({d:.2}s)", mib / d),
        ratio: Some(d / t),
    });

    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = timed_exec(
            sb,
            &format!("wget -qO /dev/null http://dl.bench.test:{port}/small"),
        )
        .await?;
        through.push(t - nothing);
        direct.push(curl_direct(&format!(
            "-w '%{{time_total}}' http://127.0.0.1:{port}/small"
        ))?);
    }
    let (t, d) = (median(through), median(direct));
    rows.push(Row {
        group: "egress",
        name: "swarm: a 2-byte request over a new connection".into(),
        value: format!("{:.2} ms (+{:.2} ms)", t * 1e3, (t - d) * 1e3),
        baseline: format!("direct {:.2} ms", d * 1e3),
        ratio: Some(t / d),
    });
    Ok(rows)
}
