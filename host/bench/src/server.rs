//! `berth serve` against the docker CLI: a one-shot `berth exec true` from
//! a fresh process with the server warm (and without it), the Python
//! client's round trip and first byte, a GiB of stdout through the API,
//! and the server's memory idle and with ten sandboxes open.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::*;

/// The `berth` binary beside this one.
fn berth_bin() -> anyhow::Result<PathBuf> {
    let bin = std::env::current_exe()?.with_file_name("berth");
    anyhow::ensure!(
        bin.is_file(),
        "{} is missing: cargo build -p berth-cli",
        bin.display()
    );
    Ok(bin)
}

/// `berth` with `BERTH_HOME=home`, through the server (on demand).
pub(super) fn berth(home: &Path) -> anyhow::Result<Command> {
    let mut c = Command::new(berth_bin()?);
    c.env("BERTH_HOME", home).env_remove("BERTH_NO_SERVER");
    Ok(c)
}

/// Runs `cmd`, which must succeed; its stdout.
pub(super) fn ok(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.stderr(Stdio::piped()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Resident and peak resident memory of `pid`, in MiB.
fn rss_mib(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    Ok((field("VmRSS:"), field("VmHWM:")))
}

/// The container of CLI sandbox `name` (from `berth inspect`).
fn container(home: &Path, name: &str) -> anyhow::Result<String> {
    let state: serde_json::Value =
        serde_json::from_str(&ok(berth(home)?.args(["inspect", name]))?)?;
    fn find(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::Object(m) => m
                .get("container_id")
                .and_then(|c| c.as_str().map(str::to_string))
                .or_else(|| m.values().find_map(find)),
            serde_json::Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    find(&state).ok_or_else(|| anyhow::anyhow!("no container id for {name}"))
}

/// Runs a Python snippet with the client importable and the server's
/// socket set; its stdout.
fn python(socket: &Path, script: &str) -> anyhow::Result<String> {
    let root = std::env::current_dir()?;
    ok(Command::new("python3")
        .env("PYTHONPATH", root.join("host/python"))
        .env("BERTH_SOCKET", socket)
        .args(["-c", script]))
}

/// Runs a Node snippet (CommonJS) with the TypeScript client built
/// (`npm ci && npm run build` in `host/typescript` when its `dist` is
/// missing) and the
/// server's socket set; its stdout. The snippet finds the client as
/// `CLIENT`.
fn node(socket: &Path, script: &str) -> anyhow::Result<String> {
    let package = std::env::current_dir()?.join("host/typescript");
    if !package.join("dist/index.js").exists() {
        ok(Command::new("npm").current_dir(&package).args([
            "ci",
            "--no-audit",
            "--no-fund",
            "--prefer-offline",
        ]))?;
        ok(Command::new("npm")
            .current_dir(&package)
            .args(["run", "build"]))?;
    }
    let client = package.join("dist/index.js");
    ok(Command::new("node").env("BERTH_SOCKET", socket).args([
        "-e",
        &format!(
            "const CLIENT = {:?};\n{script}",
            client.display().to_string()
        ),
    ]))
}

pub(super) async fn server_rows(image: &str, quick: bool) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let home_dir = tempfile::Builder::new()
        .prefix("berth-bench-serve-")
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
    let result = measure(home, &socket, server.id(), image, quick, &mut rows).await;
    let _ = server.kill();
    let _ = server.wait();
    // Whatever the run left.
    for i in 0..10 {
        let _ = berth(home)?
            .args(["--no-server", "rm", "--force", &format!("s{i}")])
            .output();
    }
    let _ = berth(home)?
        .args(["--no-server", "rm", "--force", "b"])
        .output();
    result.map(|()| rows)
}

async fn measure(
    home: &Path,
    socket: &Path,
    pid: u32,
    image: &str,
    quick: bool,
    rows: &mut Vec<Row>,
) -> anyhow::Result<()> {
    std::thread::sleep(Duration::from_millis(300));
    let (idle, _) = rss_mib(pid)?;
    rows.push(Row::unpaired(
        "server",
        "berth serve resident memory, idle (target <= 30 MiB)".into(),
        format!("{idle:.1} MiB"),
    ));

    ok(berth(home)?.args([
        "create",
        "b",
        "--backend",
        "docker",
        "--image",
        image,
        "--snapshot",
        "noop",
    ]))?;
    ok(berth(home)?.args(["exec", "b", "--", "true"]))?;
    let id = container(home, "b")?;
    let n = if quick { 5 } else { 15 };

    // One-shot `berth exec true` in a fresh process, three ways, alternating.
    let (mut through, mut docker, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        through.push(time_cmd(berth(home)?.args(["exec", "b", "--", "true"]))?);
        docker.push(time_cmd(
            Command::new("docker").args(["exec", &id, "true"]),
        )?);
        alone.push(time_cmd(berth(home)?.args([
            "--no-server",
            "exec",
            "b",
            "--",
            "true",
        ]))?);
    }
    let (t, d, a) = (median(through), median(docker), median(alone));
    rows.push(Row {
        group: "server",
        name: "berth exec true, fresh process, server warm (target <= 0.5x)".into(),
        value: format!("{:.1} ms", t * 1e3),
        baseline: format!("docker exec {:.1} ms", d * 1e3),
        ratio: Some(t / d),
    });
    rows.push(Row {
        group: "server",
        name: "berth --no-server exec true, fresh process".into(),
        value: format!("{:.1} ms", a * 1e3),
        baseline: format!("docker exec {:.1} ms", d * 1e3),
        ratio: Some(a / d),
    });

    // The Python client: exec round trip and first byte, in one process.
    let script = format!(
        r#"
import statistics, time
from berth_client import Berth
b = Berth().sandbox("b")
b.exec("true")
trips, firsts = [], []
for _ in range({n}):
    t = time.perf_counter(); b.exec("true"); trips.append(time.perf_counter() - t)
    t = time.perf_counter(); first = None
    for e in b.exec_stream("echo x"):
        if e.kind == "stdout" and first is None:
            first = time.perf_counter() - t
    firsts.append(first)
print(statistics.median(trips), statistics.median(firsts))
"#
    );
    let out = python(socket, &script)?;
    let mut parts = out.split_whitespace().map(str::parse::<f64>);
    let (trip, first) = match (parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b))) => (a, b),
        _ => anyhow::bail!("the Python client printed {out:?}"),
    };
    let mut docker_first = Vec::new();
    for _ in 0..n {
        docker_first.push(time_cmd(
            Command::new("docker").args(["exec", &id, "echo", "x"]),
        )?);
    }
    let df = median(docker_first);
    rows.push(Row {
        group: "server",
        name: "Python client exec true round trip (target <= 0.1x)".into(),
        value: format!("{:.2} ms", trip * 1e3),
        baseline: format!("docker exec {:.1} ms", d * 1e3),
        ratio: Some(trip / d),
    });
    rows.push(Row {
        group: "server",
        name: "Python client first byte of a streamed command".into(),
        value: format!("{:.2} ms", first * 1e3),
        baseline: format!("docker exec {:.1} ms", df * 1e3),
        ratio: Some(first / df),
    });

    // A GiB of stdout through the API, read by the Python client.
    let mib: u64 = if quick { 64 } else { 1024 };
    let script = format!(
        r#"
import time
from berth_client import Berth
b = Berth().sandbox("b")
t = time.perf_counter(); n = 0
for e in b.exec_stream("head -c {mib}m /dev/zero"):
    if e.kind == "stdout": n += len(e.data)
print(n, time.perf_counter() - t)
"#
    );
    let out = python(socket, &script)?;
    let mut parts = out.split_whitespace();
    let got: u64 = parts.next().unwrap_or("0").parse()?;
    let secs: f64 = parts.next().unwrap_or("0").parse()?;
    anyhow::ensure!(
        got == mib << 20,
        "the client read {got} of {} bytes",
        mib << 20
    );
    let sink = tempfile::NamedTempFile::new()?;
    let theirs = time_cmd(
        Command::new("docker")
            .args([
                "exec",
                &id,
                "sh",
                "-c",
                &format!("head -c {mib}m /dev/zero"),
            ])
            .stdout(sink.reopen()?),
    )?;
    let (ob, tb) = (mbps(got, secs), mbps(got, theirs));
    rows.push(Row {
        group: "server",
        name: format!("{mib} MiB stdout through the API, Python client (higher is better)"),
        value: format!("{ob:.0} MB/s"),
        baseline: format!("docker exec > file {tb:.0} MB/s"),
        ratio: Some(ob / tb),
    });

    // The same through the TypeScript client, in Node.
    let script = format!(
        r#"
const {{ Berth }} = require(CLIENT);
(async () => {{
  const b = new Berth().sandbox("b");
  await b.exec("true");
  const trips = [];
  for (let i = 0; i < {n}; i++) {{
    const t = performance.now(); await b.exec("true"); trips.push(performance.now() - t);
  }}
  trips.sort((x, y) => x - y);
  let got = 0; const t = performance.now();
  for await (const e of b.execStream("head -c {mib}m /dev/zero")) if (e.type === "stdout") got += e.data.length;
  console.log(trips[Math.floor(trips.length / 2)] / 1e3, got, (performance.now() - t) / 1e3);
}})().catch((e) => {{ console.error(e); process.exit(1); }});
"#
    );
    let out = node(socket, &script)?;
    let parts: Vec<f64> = out
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [trip, got, secs] = parts[..] else {
        anyhow::bail!("the Node client printed {out:?}");
    };
    anyhow::ensure!(
        got as u64 == mib << 20,
        "the Node client read {got} of {} bytes",
        mib << 20
    );
    rows.push(Row {
        group: "server",
        name: "Node client exec true round trip".into(),
        value: format!("{:.2} ms", trip * 1e3),
        baseline: format!("docker exec {:.1} ms", d * 1e3),
        ratio: Some(trip / d),
    });
    let on = mbps(got as u64, secs);
    rows.push(Row {
        group: "server",
        name: format!("{mib} MiB stdout through the API, Node client (higher is better)"),
        value: format!("{on:.0} MB/s"),
        baseline: format!("docker exec > file {tb:.0} MB/s"),
        ratio: Some(on / tb),
    });

    // Ten sandboxes open on the server.
    for i in 0..10 {
        let name = format!("s{i}");
        ok(berth(home)?.args([
            "create",
            &name,
            "--backend",
            "docker",
            "--image",
            image,
            "--snapshot",
            "noop",
        ]))?;
        ok(berth(home)?.args(["exec", &name, "--", "true"]))?;
    }
    let (now, peak) = rss_mib(pid)?;
    rows.push(Row::unpaired(
        "server",
        "berth serve resident memory, 11 sandboxes open (peak over the run)".into(),
        format!("{now:.1} MiB (peak {peak:.1} MiB)"),
    ));
    Ok(())
}
