//! What the egress point costs: curl in a confined local sandbox held to
//! a policy, through its egress point (a CONNECT tunnel, as HTTPS takes),
//! against the same curl on the host going straight to the server (what a
//! user would run without a sandbox). The server is this process, on
//! loopback; the name it is reached by resolves through `--test-resolve`.

use std::time::Duration;

use berth::backend::local::LocalOptions;
use berth::backend::ExecRequest;
use berth::egress::{EgressPolicy, EgressSettings};
use berth::sandbox::{BackendSpec, Sandbox, SandboxClient, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A server on loopback answering every request with `bytes` zero bytes
/// (`/small`: 2 bytes); returns its port.
pub(crate) async fn zero_server(bytes: u64) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = vec![0u8; 4096];
                let n = stream.read(&mut head).await.unwrap_or(0);
                let small = String::from_utf8_lossy(&head[..n]).contains("/small");
                let size = if small { 2 } else { bytes };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n"
                );
                if stream.write_all(reply.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![0u8; 256 << 10];
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(port)
}

async fn sandbox(client: &SandboxClient, port: u16) -> anyhow::Result<Sandbox> {
    let policy = EgressPolicy {
        allow_hosts: vec![format!("dl.bench.test:{port}").parse()?],
        deny_hosts: vec![],
        allow_cidrs: vec![format!("127.0.0.0/8:{port}").parse()?],
    };
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(LocalOptions::default()))
                .egress(EgressSettings {
                    policy,
                    test_resolve: vec!["*.bench.test=127.0.0.1".parse()?],
                    ..EgressSettings::default()
                }),
        )
        .await?;
    sb.start().await?;
    Ok(sb)
}

/// curl's `-w` figure (seconds) from inside the sandbox.
async fn curl_in(sb: &Sandbox, args: &str) -> anyhow::Result<f64> {
    let r = sb
        .exec(ExecRequest::new(
            format!("curl -sS --proxytunnel -o /dev/null {args}"),
            Duration::from_secs(600),
        ))
        .await?;
    anyhow::ensure!(r.exit_code == 0, "curl in the sandbox: {}", r.stderr_text());
    Ok(r.stdout_text().trim().parse()?)
}

/// curl's `-w` figure (seconds) on the host, straight to the server.
pub(crate) fn curl_direct(args: &str) -> anyhow::Result<f64> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("curl -sS --noproxy '*' -o /dev/null {args}"))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "curl on the host: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// The download, time-to-first-byte and concurrency rows.
pub(crate) async fn egress_rows(base: &Path, runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        Command::new("curl").arg("--version").output().is_ok(),
        "no curl on this host"
    );
    let bytes: u64 = if quick { 16 << 20 } else { 1 << 30 };
    let port = zero_server(bytes).await?;
    let client = berth_tests::client(base.join("egress-home"));
    let sb = sandbox(&client, port).await?;
    let mut rows = Vec::new();

    let big = |host: &str| format!("-w '%{{time_total}}' http://{host}:{port}/");
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        through.push(curl_in(&sb, &big("dl.bench.test")).await?);
        direct.push(curl_direct(&big("127.0.0.1"))?);
    }
    let (t, d) = (median(through), median(direct));
    let mib = bytes as f64 / (1 << 20) as f64;
    rows.push(Row {
        group: "egress",
        name: format!("download {mib:.0} MiB through the egress point (higher is better)"),
        value: format!("{:.0} MiB/s ({t:.2}s)", mib / t),
        baseline: format!("direct {:.0} MiB/s ({d:.2}s)", mib / d),
        ratio: Some(d / t),
    });

    let small = |host: &str| format!("-w '%{{time_starttransfer}}' http://{host}:{port}/small");
    let n = if quick { 5 } else { 30 };
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..n {
        through.push(curl_in(&sb, &small("dl.bench.test")).await?);
        direct.push(curl_direct(&small("127.0.0.1"))?);
    }
    let (t, d) = (median(through), median(direct));
    rows.push(Row {
        group: "egress",
        name: "time to first byte of a new connection".into(),
        value: format!("{:.2} ms (+{:.2} ms)", t * 1e3, (t - d) * 1e3),
        baseline: format!("direct {:.2} ms", d * 1e3),
        ratio: Some(t / d),
    });

    // 100 connections at once: 10 sandboxes, 10 each.
    let mut boxes = vec![sb];
    for _ in 1..10 {
        boxes.push(sandbox(&client, port).await?);
    }
    let script = format!(
        "for i in 0 1 2 3 4 5 6 7 8 9; do curl -sS --proxytunnel -o /dev/null -w '%{{http_code}}\\n' http://dl.bench.test:{port}/small & done; wait"
    );
    let started = Instant::now();
    let results = futures_join(&boxes, &script).await?;
    let took = started.elapsed().as_secs_f64();
    let ok = results
        .iter()
        .flat_map(|out| out.lines().map(str::to_string).collect::<Vec<_>>())
        .filter(|l| l == "200")
        .count();
    let mut rss = Vec::new();
    for sb in &boxes {
        if let Some(status) = sb.egress_status().await? {
            rss.push(status.rss_bytes);
        }
    }
    let max_rss = rss.iter().copied().max().unwrap_or(0) as f64 / (1 << 20) as f64;
    rows.push(Row::unpaired(
        "egress",
        "100 concurrent connections from 10 sandboxes".into(),
        format!(
            "{ok}/100 completed in {:.2}s; egress point {max_rss:.1} MiB RSS each (max)",
            took
        ),
    ));
    for mut sb in boxes {
        sb.shutdown().await?;
    }
    Ok(rows)
}

async fn futures_join(boxes: &[Sandbox], script: &str) -> anyhow::Result<Vec<String>> {
    let runs = boxes
        .iter()
        .map(|sb| sb.exec(ExecRequest::new(script, Duration::from_secs(120))));
    let mut out = Vec::new();
    for r in futures::future::join_all(runs).await {
        out.push(r?.stdout_text().into_owned());
    }
    Ok(out)
}
