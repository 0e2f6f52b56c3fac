//! Commands as agents use them, against the docker CLI: time to the first
//! byte of a streamed command, stdout throughput, one file read, and a
//! shell keystroke's round trip.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use berth::backend::{ExecEvent, ExecRequest, PtySize};
use berth::sandbox::{BackendSpec, Sandbox, SandboxClient, SandboxSpec, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use berth_docker::DockerOptions;

use super::*;

/// Seconds until the first byte on a pipe's stdout from a fresh `cmd`.
fn first_byte(cmd: &mut Command) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut one = [0u8; 1];
    let mut out = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    out.read_exact(&mut one)?;
    let secs = t.elapsed().as_secs_f64();
    let mut rest = Vec::new();
    let _ = out.read_to_end(&mut rest);
    child.wait()?;
    Ok(secs)
}

/// Seconds until the first stdout event of a command through Berth.
async fn berth_first_byte(sb: &Sandbox, command: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut p = sb
        .exec_stream(ExecRequest::new(command, Duration::from_secs(60)))
        .await?;
    let mut first = None;
    while let Some(e) = p.next_event().await {
        match e? {
            ExecEvent::Stdout(_) => {
                first.get_or_insert(t.elapsed().as_secs_f64());
            }
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit(_) => break,
        }
    }
    first.ok_or_else(|| anyhow::anyhow!("{command}: no output"))
}

pub(super) async fn command_rows(
    client: &SandboxClient,
    image: &str,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
                .backend(BackendSpec::new(DockerOptions::new(image.to_string()))),
        )
        .await?;
    sb.start().await?;
    let id = container_of(&sb)?;
    let n = if quick { 5 } else { 30 };
    // The agent starts with the first command; time the ones after.
    berth_first_byte(&sb, "echo warm").await?;

    // Time to first byte.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..n {
        ours.push(berth_first_byte(&sb, "echo x").await?);
        theirs.push(first_byte(
            Command::new("docker").args(["exec", &id, "echo", "x"]),
        )?);
    }
    let (o, t) = (median(ours), median(theirs));
    rows.push(Row {
        group: "commands",
        name: "time to first byte of a streamed command".into(),
        value: format!("{:.1} ms", o * 1e3),
        baseline: format!("docker exec {:.1} ms", t * 1e3),
        ratio: Some(o / t),
    });

    // Stdout throughput.
    let mib: u64 = if quick { 64 } else { 1024 };
    let produce = format!("head -c {}m /dev/zero", mib);
    let t0 = Instant::now();
    let mut p = sb
        .exec_stream(ExecRequest::new(produce.clone(), Duration::from_secs(600)))
        .await?;
    let mut got = 0u64;
    while let Some(e) = p.next_event().await {
        match e? {
            ExecEvent::Stdout(b) => got += b.len() as u64,
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit(_) => break,
        }
    }
    let ours = t0.elapsed().as_secs_f64();
    anyhow::ensure!(got == mib << 20, "read {got} of {} bytes", mib << 20);
    let sink = tempfile::NamedTempFile::new()?;
    let theirs = time_cmd(
        Command::new("docker")
            .args(["exec", &id, "sh", "-c", &produce])
            .stdout(sink.reopen()?),
    )?;
    let (ob, tb) = (mbps(got, ours), mbps(got, theirs));
    rows.push(Row {
        group: "commands",
        name: format!("stdout throughput, {mib} MiB (higher is better)"),
        value: format!("{ob:.0} MB/s"),
        baseline: format!("docker exec > file {tb:.0} MB/s"),
        ratio: Some(ob / tb),
    });

    // One 1 MiB file read.
    sh(&sb, "head -c 1048576 /dev/urandom > one.bin").await?;
    let dir = tempfile::tempdir()?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..n {
        let t = Instant::now();
        let bytes = sb.files().read_to_bytes("one.bin").await?;
        ours.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(bytes.len() == 1 << 20);
        let to = dir.path().join(format!("c{i}"));
        theirs.push(time_cmd(Command::new("docker").args([
            "cp",
            &format!("{id}:/workspace/one.bin"),
            &to.display().to_string(),
        ]))?);
    }
    let (o, t) = (median(ours), median(theirs));
    rows.push(Row {
        group: "commands",
        name: "read one 1 MiB file".into(),
        value: format!("{:.1} ms", o * 1e3),
        baseline: format!("docker cp {:.1} ms", t * 1e3),
        ratio: Some(o / t),
    });

    // A shell keystroke's round trip: a key in, its echo out.
    let mut shell = sb.shell(Some("exec sh"), PtySize::default()).await?;
    let mut trips = Vec::new();
    let mut seen = Vec::new();
    // Let the prompt arrive first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(Some(Ok(ExecEvent::Stdout(_)))) =
        tokio::time::timeout(Duration::from_millis(50), shell.next_event()).await
    {}
    for i in 0..n {
        let key = b"abcdefghijklmnopqrstuvwxyz"[i % 26];
        let t = Instant::now();
        shell.write_stdin(vec![key]).await?;
        loop {
            match shell.next_event().await {
                Some(Ok(ExecEvent::Stdout(b))) => {
                    seen.extend_from_slice(&b);
                    if b.contains(&key) {
                        break;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => anyhow::bail!("the shell ended"),
            }
        }
        trips.push(t.elapsed().as_secs_f64());
    }
    drop(shell);
    let (m, p99) = (median(trips.clone()), percentile(trips, 0.99));
    rows.push(Row::unpaired(
        "commands",
        "berth shell keystroke round trip (key in, echo out)".into(),
        format!("{:.2} ms (p99 {:.2} ms)", m * 1e3, p99 * 1e3),
    ));
    sb.shutdown().await?;
    Ok(rows)
}
