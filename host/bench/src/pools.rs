//! Warm pools on Docker: a claim through the API until the first output
//! of `true` in the claimed sandbox, against what a user would do instead
//! (`docker run -d` then `docker exec true`) and Berth's own cold create
//! through the same API.
//!
//! The requests are plain HTTP/1.1 over the server's Unix socket, one
//! connection each, as an agent framework's client sends them. Before each
//! claim the bench waits (untimed) until the pool is full again, and
//! removes each claimed sandbox (untimed): the figure is a claim from a
//! pool kept at its size, and the rows say how many claims were cold.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::server::berth;
use super::*;

/// One request over the server's socket; the status and the JSON reply.
async fn request(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, serde_json::Value)> {
    let mut stream = tokio::net::UnixStream::connect(socket).await?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: berth\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{method} {path}: no reply"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{method} {path}: no status in {head:?}"))?;
    let json = serde_json::from_str(body).unwrap_or(serde_json::Value::Null);
    anyhow::ensure!(status < 300, "{method} {path}: {status} {json}");
    Ok((status, json))
}

/// `true` in `name`, which must exit 0.
async fn exec_true(socket: &Path, name: &str) -> anyhow::Result<()> {
    let (_, reply) = request(
        socket,
        "POST",
        &format!("/v1/sandboxes/{name}/exec"),
        Some(&serde_json::json!({"command": "true"})),
    )
    .await?;
    anyhow::ensure!(reply["exit_code"] == 0, "true in {name}: {reply}");
    Ok(())
}

/// Waits until `pool` has `ready` members open.
async fn wait_full(socket: &Path, pool: &str, ready: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, view) = request(socket, "GET", &format!("/v1/pools/{pool}"), None).await?;
        if view["ready"].as_u64() >= Some(ready) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "pool {pool} never filled: {view}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where a pool's sandboxes run: a label for the rows, the template's
/// backend and snapshot, and whether the docker CLI baseline applies.
pub(super) struct Place {
    pub(super) label: &'static str,
    pub(super) backend: serde_json::Value,
    pub(super) snapshot: Option<String>,
    pub(super) docker_baseline: bool,
}

/// The swarm fixture as a pool's place (its first manager, an S3 store
/// shared by its nodes), with the guard that brings its nodes back.
pub(super) fn swarm_place(
    base: &Path,
    image: &str,
) -> anyhow::Result<(Place, berth_tests::swarm_fixture::NodeGuard)> {
    let swarm = super::swarm::swarm()?;
    let guard = berth_tests::swarm_fixture::NodeGuard(swarm.clone());
    let prefix = format!("bench-swarm-pool-{}/", std::process::id());
    let manifest = super::s3::s3_manifest(base, &prefix)?;
    Ok((
        Place {
            label: "swarm",
            backend: serde_json::json!({"type": "swarm", "engine": swarm.manager, "image": image}),
            snapshot: Some(format!("remote:{}", manifest.display())),
            docker_baseline: false,
        },
        guard,
    ))
}

pub(super) async fn pool_rows(place: &Place, image: &str, quick: bool) -> anyhow::Result<Vec<Row>> {
    let home_dir = tempfile::Builder::new()
        .prefix("berth-bench-pools-")
        .tempdir()?;
    let home = home_dir.path();
    let socket = home.join("berth.sock");
    let mut server = berth(home)?
        .args(["serve", "--idle-exit", "10m"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(home.join("serve.log"))?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "berth serve did not answer");
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = measure(&socket, place, image, quick).await;
    let _ = request(&socket, "DELETE", "/v1/pools/bench", None).await;
    let _ = server.kill();
    let _ = server.wait();
    // Whatever the run left.
    let (sandboxes, _) = berth::sandbox::NamedSandboxes::new(client_builder(home).build()).list();
    for s in sandboxes {
        let _ = berth(home)?
            .args(["--no-server", "rm", "--force", &s.name])
            .output();
    }
    let _ = berth(home)?
        .args(["--no-server", "pool", "rm", "bench"])
        .output();
    result
}

async fn measure(
    socket: &Path,
    place: &Place,
    image: &str,
    quick: bool,
) -> anyhow::Result<Vec<Row>> {
    const SIZE: u64 = 8;
    let claims = match (quick, place.docker_baseline) {
        (true, _) => 10,
        (false, true) => 100,
        (false, false) => 40,
    };
    let others = if quick { 3 } else { 20 };
    let backend = &place.backend;
    let mut template = serde_json::json!({"name": "bench", "size": SIZE, "backend": backend});
    let mut cold_body = serde_json::json!({"backend": backend});
    if let Some(snapshot) = &place.snapshot {
        template["snapshot"] = snapshot.clone().into();
        cold_body["snapshot"] = snapshot.clone().into();
    }
    request(socket, "POST", "/v1/pools", Some(&template)).await?;
    let (mut warm, mut cold) = (Vec::new(), 0);
    for i in 0..claims {
        wait_full(socket, "bench", SIZE).await?;
        let name = format!("claim{i}");
        let started = Instant::now();
        let (_, reply) = request(
            socket,
            "POST",
            "/v1/sandboxes",
            Some(&serde_json::json!({"name": name, "from_pool": "bench"})),
        )
        .await?;
        exec_true(socket, &name).await?;
        let secs = started.elapsed().as_secs_f64();
        match reply["claimed"]["warm"] == true {
            true => warm.push(secs),
            false => cold += 1,
        }
        request(socket, "DELETE", &format!("/v1/sandboxes/{name}"), None).await?;
    }

    // What a user would do instead, and Berth's own cold create, taking
    // turns.
    let (mut docker, mut berth_cold) = (Vec::new(), Vec::new());
    for i in 0..others {
        if place.docker_baseline {
            let name = format!("berth-bench-pool-{i}");
            let started = Instant::now();
            let run = docker_run_detached(&name, image)
                .stdout(Stdio::null())
                .status()?;
            let exec = Command::new("docker")
                .args(["exec", &name, "true"])
                .status()?;
            docker.push(started.elapsed().as_secs_f64());
            docker_rm(&name);
            anyhow::ensure!(run.success() && exec.success(), "docker run/exec failed");
        }

        let name = format!("cold{i}");
        let mut body = cold_body.clone();
        body["name"] = name.clone().into();
        let started = Instant::now();
        request(socket, "POST", "/v1/sandboxes", Some(&body)).await?;
        exec_true(socket, &name).await?;
        berth_cold.push(started.elapsed().as_secs_f64());
        request(socket, "DELETE", &format!("/v1/sandboxes/{name}"), None).await?;
    }
    let (c50, c99) = (
        percentile(berth_cold.clone(), 0.5),
        percentile(berth_cold, 0.99),
    );
    let (w50, w99) = (
        percentile(warm.clone(), 0.5),
        percentile(warm.clone(), 0.99),
    );
    let ms = |s: f64| format!("{:.1} ms", s * 1e3);
    let label = place.label;
    let claim_name = format!(
        "{label}: claim from a warm pool of {SIZE} -> first `true` output, p50 of {} claims ({cold} cold; target <= 30 ms)",
        warm.len()
    );
    let claim_p99 = format!("{label}: the same, p99 (target <= 100 ms)");
    if !place.docker_baseline {
        // Against Berth's own cold create on the same backend.
        let base = |s: f64| format!("Berth cold create -> first `true` output {}", ms(s));
        return Ok(vec![
            Row {
                group: "pools",
                name: claim_name,
                value: ms(w50),
                baseline: base(c50),
                ratio: Some(w50 / c50),
            },
            Row {
                group: "pools",
                name: claim_p99,
                value: ms(w99),
                baseline: base(c99),
                ratio: Some(w99 / c99),
            },
        ]);
    }
    let (d50, d99) = (percentile(docker.clone(), 0.5), percentile(docker, 0.99));
    let base = |s: f64| format!("docker run -d + docker exec true {}", ms(s));
    Ok(vec![
        Row {
            group: "pools",
            name: claim_name,
            value: ms(w50),
            baseline: base(d50),
            ratio: Some(w50 / d50),
        },
        Row {
            group: "pools",
            name: claim_p99,
            value: ms(w99),
            baseline: base(d99),
            ratio: Some(w99 / d99),
        },
        Row {
            group: "pools",
            name: format!("{label}: Berth cold create -> first `true` output, p50 of {others}"),
            value: ms(c50),
            baseline: base(d50),
            ratio: Some(c50 / d50),
        },
        Row {
            group: "pools",
            name: format!("{label}: Berth cold create, p99"),
            value: ms(c99),
            baseline: base(d99),
            ratio: Some(c99 / d99),
        },
    ])
}

/// A live fork of a running Docker sandbox's `mib` MiB workspace into 10
/// children ready to run a command, against what a user would do without
/// one: the whole workspace as an archive, then 10 new sandboxes each
/// given it (in parallel too).
pub(super) async fn fork_rows(image: &str, mib: u64) -> anyhow::Result<Vec<Row>> {
    let home_dir = tempfile::Builder::new()
        .prefix("berth-bench-forks-")
        .tempdir()?;
    let home = home_dir.path();
    let socket = home.join("berth.sock");
    let mut server = berth(home)?
        .args(["serve", "--idle-exit", "10m"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(home.join("serve.log"))?)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "berth serve did not answer");
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = measure_forks(home, &socket, image, mib).await;
    let _ = server.kill();
    let _ = server.wait();
    let (sandboxes, _) = berth::sandbox::NamedSandboxes::new(client_builder(home).build()).list();
    for s in sandboxes {
        let _ = berth(home)?
            .args(["--no-server", "rm", "--force", &s.name])
            .output();
    }
    result
}

async fn measure_forks(
    home: &Path,
    socket: &Path,
    image: &str,
    mib: u64,
) -> anyhow::Result<Vec<Row>> {
    const CHILDREN: u32 = 10;
    let manifest = berth_tests::fs_store_manifest(home, &home.join("store"));
    let fill = format!(
        "dd if=/dev/urandom of=big.bin bs=1048576 count={} 2>/dev/null && mkdir -p src && i=0; while [ $i -lt 2000 ]; do echo $i > src/f$i; i=$((i+1)); done",
        mib.saturating_sub(8).max(1)
    );
    let backend = serde_json::json!({"type": "docker", "image": image});
    // The parent: deduplicated generations, stopped once, then changed.
    request(
        socket,
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({
            "name": "p", "backend": backend,
            "snapshot": format!("remote:{}", manifest.display()), "dedup_keep": 2,
        })),
    )
    .await?;
    run_in(socket, "p", &fill).await?;
    // A file changed within the racy window before a walk is read again by
    // the next one (its time cannot tell it from a write during the walk):
    // the stop comes after it, as an agent's next stop would.
    tokio::time::sleep(berth::workspace::tree::RACY_WINDOW).await;
    request(socket, "POST", "/v1/sandboxes/p/stop", None).await?;
    run_in(
        socket,
        "p",
        "dd if=/dev/urandom of=changed.bin bs=1024 count=1024 2>/dev/null",
    )
    .await?;
    let started = Instant::now();
    let (_, forked) = request(
        socket,
        "POST",
        "/v1/sandboxes/p/forks",
        Some(&serde_json::json!({"count": CHILDREN, "prefix": "f"})),
    )
    .await?;
    let names: Vec<String> = (1..=CHILDREN).map(|i| format!("f{i}")).collect();
    futures::future::try_join_all(names.iter().map(|n| exec_true(socket, n))).await?;
    let fork = started.elapsed().as_secs_f64();

    // Without: the workspace as one archive, then ten sandboxes given it.
    request(
        socket,
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::json!({"name": "b", "backend": backend})),
    )
    .await?;
    run_in(socket, "b", &fill).await?;
    run_in(
        socket,
        "b",
        "dd if=/dev/urandom of=changed.bin bs=1024 count=1024 2>/dev/null",
    )
    .await?;
    let tar = home.join("b.tar");
    let started = Instant::now();
    super::server::ok(berth(home)?.arg("persist").arg("b").arg("--out").arg(&tar))?;
    let made: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let tasks: Vec<_> = (0..CHILDREN)
            .map(|i| {
                let tar = &tar;
                let image = image.to_string();
                scope.spawn(move || -> anyhow::Result<()> {
                    let name = format!("w{i}");
                    super::server::ok(berth(home)?.args([
                        "create",
                        &name,
                        "--backend",
                        "docker",
                        "--image",
                        &image,
                    ]))?;
                    super::server::ok(berth(home)?.arg("hydrate").arg(&name).arg(tar))?;
                    super::server::ok(berth(home)?.args(["exec", &name, "--", "true"]))?;
                    Ok(())
                })
            })
            .collect();
        tasks
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a thread panicked")))
            })
            .collect()
    });
    made.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    let whole = started.elapsed().as_secs_f64();
    Ok(vec![Row {
        group: "pools",
        name: format!(
            "Docker: live fork of a {mib} MiB workspace into {CHILDREN}, ready to exec (checkpoint {} ms, children made and started {} ms; target <= 0.5x)",
            forked["checkpoint_ms"], forked["forks_ms"]
        ),
        value: format!("{fork:.2}s"),
        baseline: format!("whole archive + {CHILDREN} sandboxes given it {whole:.2}s"),
        ratio: Some(fork / whole),
    }])
}

/// `command` in `name`, which must exit 0.
async fn run_in(socket: &Path, name: &str, command: &str) -> anyhow::Result<()> {
    let (_, reply) = request(
        socket,
        "POST",
        &format!("/v1/sandboxes/{name}/exec"),
        Some(&serde_json::json!({"command": command})),
    )
    .await?;
    anyhow::ensure!(reply["exit_code"] == 0, "{command} in {name}: {reply}");
    Ok(())
}
