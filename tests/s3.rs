//! The s3-store plugin on a real 3-node Garage cluster (replication 3):
//! conformance, a node killed mid-way, a sandbox resumed "on another host",
//! and objects read back by a stock S3 client (boto3).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use berth::backend::ExecRequest;
use berth::conformance::pattern::{DigestWriter, PatternReader};
use berth::conformance::{check_remote_client, ConformanceOptions};
use berth::plugin::PluginHost;
use berth::sandbox::{BackendSpec, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use berth::RemoteSnapshotClient;
use berth_tests::{host_with_cache, s3_manifest, s3_or_skip};

/// The node-kill test takes this exclusively; the others share it, so no
/// test sees a node die that it did not expect.
static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn unique(tag: &str) -> String {
    format!(
        "{tag}-{}-{}/",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    )
}

async fn client(
    host: &PluginHost,
    dir: &std::path::Path,
    s3: &berth_tests::S3Env,
    prefix: &str,
) -> berth::plugin::WasmRemoteClient {
    let manifest = s3_manifest(dir, s3, prefix);
    host.load_file(&manifest)
        .await
        .unwrap()
        .remote_client()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_conforms_on_garage() {
    let Some(s3) = s3_or_skip("s3_store_conforms_on_garage") else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let c = client(&host, dir.path(), &s3, &unique("conf")).await;
    let large = std::env::var("BERTH_S3_LARGE")
        .ok()
        .and_then(|s| berth::units::parse_size(&s).ok())
        .unwrap_or(256 << 20);
    let opts = ConformanceOptions {
        large_size: large,
        concurrency: 4,
        ..ConformanceOptions::default()
    };
    let report = check_remote_client("s3-store on Garage", &c, &opts).await;
    println!("{}", report.table());
    assert!(
        report.passed(),
        "failed clauses: {:?}",
        report.failed_clauses()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_killed_mid_upload_keeps_the_previous_snapshot() {
    let Some(s3) = s3_or_skip("a_node_killed_mid_upload_keeps_the_previous_snapshot") else {
        return;
    };
    let _exclusive = CLUSTER.write().await;
    let victim = *s3.pids.last().expect("garage pids in s3.env");
    let dir = tempfile::tempdir().unwrap();
    let host = host_with_cache(&dir.path().join("cache"));
    let c = Arc::new(client(&host, dir.path(), &s3, &unique("kill")).await);
    c.upload("snap", &mut PatternReader::new(1, 12 << 20))
        .await
        .unwrap();

    let read = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let uploader = {
        let c = c.clone();
        let read = read.clone();
        tokio::spawn(async move {
            let mut counted = Counting {
                inner: PatternReader::new(2, 96 << 20),
                read,
            };
            c.upload("snap", &mut counted).await
        })
    };
    // Kill the node once the upload is well under way (8 MiB read by the
    // store), and while it still runs: the fault lands mid-upload.
    let t = std::time::Instant::now();
    while read.load(std::sync::atomic::Ordering::Relaxed) < 8 << 20 {
        assert!(
            !uploader.is_finished(),
            "the upload ended before 8 MiB were read"
        );
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the upload did not start"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !uploader.is_finished(),
        "the upload finished before the node could be killed"
    );
    kill_node(victim);
    println!(
        "killed node {victim} with {} MiB of 96 read",
        read.load(std::sync::atomic::Ordering::Relaxed) >> 20
    );
    let outcome = uploader.await.unwrap();
    let expected = match &outcome {
        Ok(()) => (2u64, 96u64 << 20),
        Err(e) => {
            println!("upload with a node down failed clearly: {e}");
            (1, 12 << 20)
        }
    };
    let mut sink = DigestWriter::default();
    c.download("snap", &mut sink).await.unwrap();
    assert_eq!(
        sink.finish(),
        (PatternReader::digest_of(expected.0, expected.1), expected.1)
    );
    println!(
        "with node {victim} killed: upload {}",
        if outcome.is_ok() {
            "succeeded on quorum"
        } else {
            "failed; previous intact"
        }
    );
    restart_node(&s3, 2);
}

/// SIGKILLs a Garage node and waits until it is gone (or a zombie), so
/// what follows really runs without it.
fn kill_node(pid: u32) {
    let killed = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    assert!(killed.is_ok_and(|s| s.success()), "kill -9 {pid} failed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let dead = !berth_tests::process_running(pid);
        if dead {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Garage node {pid} still runs after SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Starts node `n` again so later tests have the full cluster. The node is
/// a daemon (own session) meant to outlive this test process.
#[allow(clippy::zombie_processes)]
fn restart_node(s3: &berth_tests::S3Env, n: usize) {
    let config = format!("{}/n{n}/garage.toml", s3.garage_dir);
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(format!("{}/n{n}/garage.log", s3.garage_dir))
        .unwrap();
    let child = Command::new("setsid")
        .arg(&s3.garage_bin)
        .arg("-c")
        .arg(&config)
        .arg("server")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    // Record the new pid for the next run's fault test.
    let env_path = format!("{}/s3.env", s3.garage_dir);
    if let Ok(text) = std::fs::read_to_string(&env_path) {
        let mut pids = s3.pids.clone();
        if let Some(p) = pids.get_mut(n) {
            *p = child.id();
        }
        let joined = pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("BERTH_GARAGE_PIDS=") {
                    format!("BERTH_GARAGE_PIDS={joined}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let _ = std::fs::write(&env_path, text);
    }
    let port = 3900 + 10 * n as u16;
    for _ in 0..300 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("garage node {n} did not come back on port {port} within 30 s; later S3 tests would run on a degraded cluster");
}

/// An archive stream that counts what the store has read of it.
struct Counting<R> {
    inner: R,
    read: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Counting<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        polled
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_stopped_into_s3_resumes_from_a_fresh_state_directory() {
    let Some(s3) = s3_or_skip("a_sandbox_stopped_into_s3_resumes_from_a_fresh_state_directory")
    else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let dir = tempfile::tempdir().unwrap();
    let manifest = s3_manifest(dir.path(), &s3, &unique("sandbox"));
    let host_a = berth_tests::client(dir.path().join("host-a"));
    let mut sb = host_a
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::remote(manifest))
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let run = |cmd: &'static str| ExecRequest::new(cmd, Duration::from_secs(60));
    sb.exec(run(
        "mkdir -p src && seq 1 300000 > src/n && head -c 3000000 /dev/urandom > r.bin",
    ))
    .await
    .unwrap();
    let before = sb
        .exec(run("find . -type f | sort | xargs sha256sum"))
        .await
        .unwrap()
        .stdout;
    sb.stop().await.unwrap();
    let json = sb.state().to_json().unwrap();
    sb.shutdown().await.unwrap();

    // "Another host": a different home, nothing but the state JSON.
    let host_b = berth_tests::client(dir.path().join("host-b"));
    let mut sb = host_b
        .resume(
            SandboxState::from_json(&json).unwrap(),
            None,
            SandboxOptions::default(),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    let after = sb
        .exec(run("find . -type f | sort | xargs sha256sum"))
        .await
        .unwrap()
        .stdout;
    assert_eq!(after, before);
    sb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn boto3_reads_what_the_plugin_wrote_as_a_valid_tar() {
    let Some(s3) = s3_or_skip("boto3_reads_what_the_plugin_wrote_as_a_valid_tar") else {
        return;
    };
    let _shared = CLUSTER.read().await;
    let dir = tempfile::tempdir().unwrap();
    let prefix = unique("boto3");
    let manifest = s3_manifest(dir.path(), &s3, &prefix);
    let client = berth_tests::client(dir.path().join("home"));
    let mut sb = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::remote(manifest))
                .snapshot_id("boto3-check")
                .backend(BackendSpec::local()),
        )
        .await
        .unwrap();
    sb.start().await.unwrap();
    sb.exec(ExecRequest::new(
        "echo one > a.txt && mkdir d && echo two > d/b.txt",
        Duration::from_secs(30),
    ))
    .await
    .unwrap();
    sb.stop().await.unwrap();
    let script = format!(
        r#"
import boto3, io, tarfile
s3 = boto3.client("s3", endpoint_url="{endpoint}", region_name="{region}",
                  aws_access_key_id="{key}", aws_secret_access_key="{secret}")
body = s3.get_object(Bucket="{bucket}", Key="{prefix}boto3-check.tar")["Body"].read()
names = sorted(m.name for m in tarfile.open(fileobj=io.BytesIO(body)).getmembers())
print(",".join(names))
"#,
        endpoint = s3.endpoint,
        region = s3.region,
        key = s3.key_id,
        secret = s3.secret,
        bucket = s3.bucket,
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "boto3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(
        names.contains("a.txt") && names.contains("d/b.txt"),
        "{names}"
    );
    sb.shutdown().await.unwrap();
}
