//! The swarm backend against the bare swarm (the docker CLI), on the
//! three-node fixture: create + start of a sandbox against `docker service
//! create` + waiting for its task, and from a node's loss to the sandbox
//! usable again (its workspace restored on another node) against the
//! swarm alone rescheduling a plain service.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_tests::swarm_fixture::{NodeGuard, Swarm};

use super::server::{berth, ok};
use super::*;

pub(super) fn swarm() -> anyhow::Result<Swarm> {
    anyhow::ensure!(
        Path::new("/tmp/berth-swarm/swarm.env").is_file(),
        "no swarm fixture (/tmp/berth-swarm/swarm.env); cargo xtask setup starts one"
    );
    berth_tests::swarm_fixture::swarm_or_skip("bench swarm")
        .ok_or_else(|| anyhow::anyhow!("the swarm fixture does not answer"))
}

/// The id of `service`'s running task (other than `not`), polled until
/// there is one, as a user's script would.
fn wait_running(swarm: &Swarm, service: &str, not: Option<&str>) -> anyhow::Result<String> {
    let started = Instant::now();
    loop {
        if let Some((id, _)) = swarm
            .wanted_tasks(service)
            .into_iter()
            .find(|(id, state)| state.starts_with("Running") && not != Some(id.as_str()))
        {
            return Ok(id);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "{service} not running after 120 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub(super) async fn swarm_rows(image: &str, runs: usize, quick: bool) -> anyhow::Result<Vec<Row>> {
    let swarm = swarm()?;
    let _guard = NodeGuard(swarm.clone());
    let base = tempfile::tempdir()?;
    let home = base.path().join("home");
    let prefix = format!("bench-swarm-{}/", std::process::id());
    let manifest = s3_manifest(base.path(), &prefix)?;
    let snapshot = format!("remote:{}", manifest.display());
    let mut rows = Vec::new();

    // Create + start.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..runs.max(3) {
        let name = format!("c{i}");
        let t = Instant::now();
        ok(berth(&home)?.args([
            "create",
            &name,
            "--backend",
            "swarm",
            "--engine",
            &swarm.manager,
            "--image",
            image,
            "--snapshot",
            &snapshot,
        ]))?;
        ours.push(t.elapsed().as_secs_f64());
        ok(berth(&home)?.args(["rm", &name]))?;
        let service = format!("bench-plain-{i}");
        let t = Instant::now();
        swarm
            .docker(
                "n1",
                &[
                    "service",
                    "create",
                    "--detach",
                    "--quiet",
                    "--name",
                    &service,
                    "--init",
                    "--cap-drop",
                    "ALL",
                    image,
                    "sleep",
                    "600",
                ],
            )
            .map_err(anyhow::Error::msg)?;
        wait_running(&swarm, &service, None)?;
        theirs.push(t.elapsed().as_secs_f64());
        let _ = swarm.docker("n1", &["service", "rm", &service]);
    }
    let (a, b) = (median(ours), median(theirs));
    rows.push(Row {
        group: "swarm",
        name: "create + start (fresh CLI)".into(),
        value: format!("{:.0} ms", a * 1e3),
        baseline: format!("{:.0} ms service create+run", b * 1e3),
        ratio: Some(a / b),
    });

    // Node loss → usable again, with a workspace of `size`, alternating
    // with the bare swarm rescheduling a plain service.
    let size: u64 = if quick { 16 << 20 } else { 256 << 20 };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..runs {
        ours.push(berth_loss(&swarm, &home, &snapshot, image, size, i)?);
        theirs.push(plain_loss(&swarm, image, i)?);
    }
    let _ = s3_clear(&prefix);
    let (usable, rescheduled) = (median(ours), median(theirs));
    rows.push(Row {
        group: "swarm",
        name: format!("node loss → usable ({} MiB workspace)", size >> 20),
        value: format!("{usable:.1} s"),
        baseline: format!("{rescheduled:.1} s swarm reschedule"),
        ratio: Some(usable / rescheduled),
    });
    Ok(rows)
}

/// A constraint keeping tasks off the current leader (losing the leader
/// costs an election besides).
pub(super) fn off_the_leader(swarm: &Swarm) -> String {
    let leader = swarm.leader();
    let at = swarm.nodes.iter().position(|n| *n == leader).unwrap_or(0);
    format!("node.id!={}", swarm.ids[at])
}

/// Seconds from a node's dockerd killed to a sandbox that was on it
/// answering a command, its workspace (`size` bytes) restored elsewhere.
fn berth_loss(
    swarm: &Swarm,
    home: &Path,
    snapshot: &str,
    image: &str,
    size: u64,
    run: usize,
) -> anyhow::Result<f64> {
    let name = format!("loss{run}");
    let constraint = off_the_leader(swarm);
    ok(berth(home)?.args([
        "create",
        &name,
        "--backend",
        "swarm",
        "--engine",
        &swarm.manager,
        "--image",
        image,
        "--snapshot",
        snapshot,
        "--constraint",
        &constraint,
    ]))?;
    ok(berth(home)?.args([
        "exec",
        &name,
        "--",
        &format!("head -c {size} /dev/urandom > big && echo kept > small"),
    ]))?;
    ok(berth(home)?.args(["stop", &name]))?;
    let state =
        berth::sandbox::SandboxState::from_json(&ok(berth(home)?.args(["inspect", &name]))?)?;
    let swarm_state: berth_docker::swarm::SwarmState = state.backend.decode()?;
    let node = swarm.node_named(&swarm_state.current.map(|t| t.node).unwrap_or_default());
    swarm.kill_daemon(&node);
    let t = Instant::now();
    let out = ok(berth(home)?.args(["exec", &name, "--", "cat small; wc -c < big"]));
    let usable = t.elapsed().as_secs_f64();
    swarm.start_daemon(&node);
    swarm.wait_all_ready(Duration::from_secs(120));
    let out = out?;
    anyhow::ensure!(
        out.split_whitespace().collect::<Vec<_>>() == ["kept", &size.to_string()],
        "the restored workspace differs: {out}"
    );
    ok(berth(home)?.args(["rm", &name]))?;
    Ok(usable)
}

/// Seconds from a node's dockerd killed to the swarm running a plain
/// service's replacement task (what a user scripting the swarm gets).
fn plain_loss(swarm: &Swarm, image: &str, run: usize) -> anyhow::Result<f64> {
    let service = format!("bench-loss-{run}");
    let constraint = off_the_leader(swarm);
    swarm
        .docker(
            &swarm.any_manager(),
            &[
                "service",
                "create",
                "--detach",
                "--quiet",
                "--name",
                &service,
                "--constraint",
                &constraint,
                // As Berth's services: replaced at once (the default
                // waits 5 s).
                "--restart-delay",
                "0s",
                image,
                "sleep",
                "600",
            ],
        )
        .map_err(anyhow::Error::msg)?;
    let task = wait_running(swarm, &service, None)?;
    let id = swarm
        .docker(
            &swarm.any_manager(),
            &["inspect", "--format", "{{.NodeID}}", &task],
        )
        .map_err(anyhow::Error::msg)?;
    let node = swarm.node_named(id.trim());
    swarm.kill_daemon(&node);
    let t = Instant::now();
    let replaced = wait_running(swarm, &service, Some(&task));
    let rescheduled = t.elapsed().as_secs_f64();
    swarm.start_daemon(&node);
    swarm.wait_all_ready(Duration::from_secs(120));
    let _ = swarm.docker(&swarm.any_manager(), &["service", "rm", &service]);
    replaced?;
    Ok(rescheduled)
}
