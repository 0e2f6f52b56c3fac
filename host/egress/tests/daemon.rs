//! The egress daemon as Berth runs it: the `berth-egress` binary in its
//! own process, a directory per sandbox, the point on a Unix socket, the
//! host's requests on a control socket. Traffic goes only to a server this
//! test starts on loopback.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth_egress::{call, ControlReply, ControlRequest, EgressDir, EgressPolicy, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

fn daemon(dir: &EgressDir) -> Child {
    Command::new(env!("CARGO_BIN_EXE_berth-egress"))
        .arg("serve")
        .arg(dir.root())
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{path:?} never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn exited_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

async fn hello_server() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
                    )
                    .await;
            });
        }
    });
    port
}

async fn get_through(point: &Path, host: &str, port: u16) -> String {
    let mut stream = UnixStream::connect(point).await.unwrap();
    let request = format!("GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out))
        .await
        .expect("the point answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

async fn status(dir: &EgressDir) -> berth_egress::EgressStatus {
    match call(&dir.control_socket(), &ControlRequest::Status)
        .await
        .unwrap()
    {
        ControlReply::Status(status) => *status,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_its_policy_changes_it_keeps_it_and_goes_when_its_directory_goes() {
    let port = hello_server().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = EgressDir::new(tmp.path().join("sandbox-a"));
    let policy = |hosts: &[&str]| EgressPolicy {
        allow_hosts: hosts
            .iter()
            .map(|h| format!("{h}:{port}").parse().unwrap())
            .collect(),
        deny_hosts: vec![],
        allow_cidrs: vec![format!("127.0.0.0/8:{port}").parse().unwrap()],
    };
    dir.write_settings(
        &policy(&["a.pkg.test"]),
        &["*.pkg.test=127.0.0.1".parse().unwrap()],
    )
    .unwrap();
    let mut first = daemon(&dir);
    wait_for(&dir.control_socket());
    wait_for(&dir.point_socket());

    // One daemon per directory: a second start leaves at once, quietly.
    let mut second = daemon(&dir);
    let status_of_second = exited_within(&mut second, Duration::from_secs(10));
    assert!(
        status_of_second.is_some_and(|s| s.success()),
        "{status_of_second:?}"
    );

    // The sandbox's side is the point's socket (anyone may connect: the
    // sandbox's user is not the host's); the host's side is not.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.point_socket()), 0o666);
    assert_eq!(mode(&dir.control_socket()), 0o600);
    assert_eq!(mode(dir.root()), 0o700);

    let reply = get_through(&dir.point_socket(), "a.pkg.test", port).await;
    assert!(reply.ends_with("hello\n"), "{reply}");
    let reply = get_through(&dir.point_socket(), "b.pkg.test", port).await;
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");

    // A change counts from the next connection, and is kept on disk.
    call(
        &dir.control_socket(),
        &ControlRequest::SetPolicy {
            policy: policy(&["b.pkg.test"]),
        },
    )
    .await
    .unwrap();
    let reply = get_through(&dir.point_socket(), "b.pkg.test", port).await;
    assert!(reply.ends_with("hello\n"), "{reply}");
    let kept: EgressPolicy =
        serde_json::from_slice(&std::fs::read(dir.policy_file()).unwrap()).unwrap();
    assert_eq!(kept, policy(&["b.pkg.test"]));

    let status = status(&dir).await;
    assert_eq!(status.pid, first.id());
    assert!(status.rss_bytes > 0);
    let verdicts: Vec<(String, bool)> = status
        .connections
        .iter()
        .map(|c| (c.host.clone(), matches!(c.verdict, Verdict::Allowed { .. })))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("a.pkg.test".to_string(), true),
            ("b.pkg.test".to_string(), false),
            ("b.pkg.test".to_string(), true),
        ]
    );

    // A bad request is refused with a reason, and the daemon keeps going.
    let mut raw = UnixStream::connect(dir.control_socket()).await.unwrap();
    raw.write_all(b"{\"op\":\"reboot\"}\n").await.unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).await.unwrap();
    assert!(answer.contains("not a control request"), "{answer}");

    // Its directory removed (the sandbox destroyed), the daemon goes.
    std::fs::remove_dir_all(dir.root()).unwrap();
    let exit = exited_within(&mut first, Duration::from_secs(10));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_stops_the_daemon_and_a_restart_keeps_the_changed_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = EgressDir::new(tmp.path().join("b"));
    dir.write_settings(&EgressPolicy::default(), &[]).unwrap();
    let mut child = daemon(&dir);
    wait_for(&dir.control_socket());
    let changed = EgressPolicy {
        allow_hosts: vec!["only.pkg.test".parse().unwrap()],
        ..EgressPolicy::default()
    };
    call(
        &dir.control_socket(),
        &ControlRequest::SetPolicy {
            policy: changed.clone(),
        },
    )
    .await
    .unwrap();
    call(&dir.control_socket(), &ControlRequest::Shutdown)
        .await
        .unwrap();
    let exit = exited_within(&mut child, Duration::from_secs(10));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
    assert!(!dir.control_socket().exists());

    let mut again = daemon(&dir);
    wait_for(&dir.control_socket());
    assert_eq!(status(&dir).await.policy, changed);
    call(&dir.control_socket(), &ControlRequest::Shutdown)
        .await
        .unwrap();
    assert!(exited_within(&mut again, Duration::from_secs(10)).is_some());
}
