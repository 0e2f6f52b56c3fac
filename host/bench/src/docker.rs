//! Berth on Docker against the docker CLI: exec, persist, restore, resume.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::bail;
use berth::backend::ExecRequest;
use berth::sandbox::{
    BackendSpec, BackendState, SandboxClient, SandboxOptions, SandboxSpec, SnapshotSpec,
};
use berth::workspace::WorkspaceSpec;
use berth_docker::{DockerOptions, DockerState};

/// Berth side by side with GNU tar, the docker CLI and boto3.
use super::*;

/// The id of the container holding a Docker sandbox.
pub(super) fn container_of(sb: &berth::sandbox::Sandbox) -> anyhow::Result<String> {
    Ok(sb
        .state()
        .backend
        .decode::<DockerState>()?
        .container_id
        .unwrap_or_default())
}

pub(super) async fn docker_rows(
    client: &SandboxClient,
    base: &Path,
    runs: usize,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    let image = std::env::var("BERTH_TEST_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
    let probe = DockerOptions::new(image.clone()).into_state_for_probe();
    if !berth_docker::image_present(&probe).await? {
        bail!("test image {image} missing (`cargo xtask setup` imports it)");
    }
    let mut rows = Vec::new();
    let opts = || SandboxOptions::default();
    let snaps = base.join("docker-snaps");
    let new_sandbox = || {
        client.create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::local(snaps.clone()))
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
    let id = container_of(&sb)?;
    let n = if quick { 10 } else { 50 };
    // The agent starts with the first command; time the ones after.
    sb.exec(ExecRequest::new("true", Duration::from_secs(30)))
        .await?;
    let mut plain = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::noop())
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
        fresh.backend = BackendState::encode(berth_docker::KIND, &d)?;
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
