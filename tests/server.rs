//! `berth serve`: the API over its unix socket and loopback TCP, driven as
//! a client in another language would (raw HTTP/1.1), against a real
//! server process and real sandboxes; the CLI through the server and
//! in-process; the server killed mid-way; the Python client.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use berth_server::ExecLine;
use berth_tests::{
    berth_bin, berth_in, berth_ok, docker_or_skip, free_port, repo_root, test_image,
};
use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_util::rt::TokioIo;
use sha2::Digest;

type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

/// A `berth serve` process on a home of its own; killed when dropped.
struct Served {
    home: tempfile::TempDir,
    socket: PathBuf,
    child: Child,
    /// The token file's directory, for a server on TCP.
    _token_dir: Option<tempfile::TempDir>,
    /// The flags it was started with.
    args: Vec<String>,
}

impl Served {
    fn start(extra: &[&str]) -> Served {
        let home = tempfile::tempdir().unwrap();
        let socket = home.path().join("berth.sock");
        let args: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let child = Self::spawn(home.path(), &args);
        wait_for_socket(&socket);
        Served {
            home,
            socket,
            child,
            _token_dir: None,
            args,
        }
    }

    fn spawn(home: &Path, args: &[String]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("serve.log"))
            .unwrap();
        Command::new(berth_bin())
            .env("BERTH_HOME", home)
            .env("RUST_LOG", "berth=info")
            .arg("serve")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    /// SIGKILLs the server wherever it is, then starts another on the same
    /// home with the same flags.
    fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = Self::spawn(self.home.path(), &self.args);
        wait_for_socket(&self.socket);
    }

    /// A server that also listens on loopback TCP, on a free port it
    /// returns, with bearer `token`; `extra` are further flags.
    fn start_on_tcp(token: &str, extra: &[&str]) -> (Served, u16) {
        let port = free_port();
        let token_dir = tempfile::tempdir().unwrap();
        let token_file = token_dir.path().join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let port_text = port.to_string();
        let mut args = vec![
            "--listen",
            port_text.as_str(),
            "--token-file",
            token_file.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut served = Served::start(&args);
        served._token_dir = Some(token_dir);
        (served, port)
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn client(&self) -> Client {
        Client::Unix(self.socket.clone())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "no server on {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Where requests go.
#[derive(Clone)]
enum Client {
    Unix(PathBuf),
    Tcp(std::net::SocketAddr, Option<String>),
}

/// A reply: status and the whole body.
struct Reply {
    status: StatusCode,
    body: Bytes,
}

impl Reply {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn ok(self) -> Reply {
        assert!(
            self.status.is_success(),
            "{}: {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        self
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

impl Client {
    async fn send_raw(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Body,
    ) -> hyper::Result<http::Response<hyper::body::Incoming>> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "berth");
        for (k, v) in headers {
            request = request.header(*k, v);
        }
        if let Client::Tcp(_, Some(token)) = self {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(body).unwrap();
        match self {
            Client::Unix(socket) => {
                let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                sender.send_request(request).await
            }
            Client::Tcp(addr, _) => {
                let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                let (mut sender, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                sender.send_request(request).await
            }
        }
    }

    async fn send(&self, method: Method, path: &str, body: Body) -> Reply {
        let reply = self.send_raw(method, path, &[], body).await.unwrap();
        let status = reply.status();
        let body = reply.into_body().collect().await.unwrap().to_bytes();
        Reply { status, body }
    }

    async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, full(Bytes::new())).await
    }

    async fn post(&self, path: &str, json: serde_json::Value) -> Reply {
        self.send(Method::POST, path, full(json.to_string())).await
    }

    /// A streamed exec's lines, decoded.
    async fn exec_lines(&self, sandbox: &str, command: &str) -> Vec<ExecLine> {
        let reply = self
            .post(
                &format!("/v1/sandboxes/{sandbox}/exec"),
                serde_json::json!({"command": command, "stream": true}),
            )
            .await
            .ok();
        reply
            .body
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Stdout, stderr and the exit code of streamed lines.
fn collect(lines: &[ExecLine]) -> (Vec<u8>, Vec<u8>, Option<i32>) {
    let (mut out, mut err, mut code) = (Vec::new(), Vec::new(), None);
    for line in lines {
        match line {
            ExecLine::Stdout { data } => out.extend(B64.decode(data).unwrap()),
            ExecLine::Stderr { data } => err.extend(B64.decode(data).unwrap()),
            ExecLine::Exit { exit_code, .. } => code = Some(*exit_code),
            ExecLine::Error { error } => panic!("stream failed: {error:?}"),
            ExecLine::Started { .. } => {}
        }
    }
    (out, err, code)
}

/// The socket is 0600; TCP needs the bearer token (none, a wrong one and a
/// same-length wrong one are refused); a local sandbox is created, runs
/// commands and files; paths out of the workspace, oversized JSON and
/// archives over the limit are refused, and a refused archive writes
/// nothing.
#[tokio::test]
async fn api_on_the_socket_and_on_tcp_with_a_token_refuses_what_it_should() {
    let token = "0123456789abcdef0123456789abcdef";
    let (served, port) = Served::start_on_tcp(token, &["--max-archive", "8MiB"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&served.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "socket mode {mode:o}");

    let unix = served.client();
    let version = unix.get("/v1/version").await.ok().json();
    assert_eq!(version["api"], 1);

    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let none = Client::Tcp(addr, None).get("/v1/version").await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.code(), "unauthorized");
    let wrong = Client::Tcp(addr, Some("nope".into()))
        .get("/v1/version")
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let same_length = Client::Tcp(addr, Some(token.replace('0', "1")))
        .get("/v1/version")
        .await;
    assert_eq!(same_length.status, StatusCode::UNAUTHORIZED);
    let tcp = Client::Tcp(addr, Some(token.into()));
    tcp.get("/v1/version").await.ok();

    // A local sandbox, created and used over TCP.
    tcp.post(
        "/v1/sandboxes",
        serde_json::json!({"name": "a", "snapshot": "noop",
            "workspace": {"entries": {"README.md": {"type": "file", "content": "# hi\n"}}}}),
    )
    .await
    .ok();
    let exists = tcp
        .post("/v1/sandboxes", serde_json::json!({"name": "a"}))
        .await;
    assert_eq!(exists.status, StatusCode::CONFLICT);
    assert_eq!(exists.code(), "exists");
    let lines = tcp
        .exec_lines("a", "cat README.md; echo err >&2; exit 3")
        .await;
    let (out, err, code) = collect(&lines);
    assert_eq!(
        (out.as_slice(), err.as_slice(), code),
        (&b"# hi\n"[..], &b"err\n"[..], Some(3))
    );
    let collected = tcp
        .post(
            "/v1/sandboxes/a/exec",
            serde_json::json!({"command": "printf x"}),
        )
        .await
        .ok()
        .json();
    assert_eq!(collected["stdout"], "x");

    // Files: written whole, read back; a path out of the workspace refused.
    tcp.send(
        Method::PUT,
        "/v1/sandboxes/a/files/content?path=dir%2Ff.bin",
        full(vec![7u8; 100_000]),
    )
    .await;
    let wrote = tcp
        .send_raw(
            Method::PUT,
            "/v1/sandboxes/a/files/content?path=f.bin",
            &[("content-length", "100000".into())],
            full(vec![7u8; 100_000]),
        )
        .await
        .unwrap();
    assert!(wrote.status().is_success(), "{}", wrote.status());
    let back = tcp
        .get("/v1/sandboxes/a/files/content?path=f.bin")
        .await
        .ok();
    assert_eq!(back.body.len(), 100_000);
    for path in ["..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd"] {
        let refused = tcp
            .get(&format!("/v1/sandboxes/a/files/content?path={path}"))
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(refused.code(), "path_refused");
    }
    let missing = tcp.get("/v1/sandboxes/nope/files/stat?path=x").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.code(), "not_found");

    // A client that stops reading holds back only its own command: a
    // flood nobody reads, and meanwhile other requests are answered.
    let stalled = tcp
        .send_raw(
            Method::POST,
            "/v1/sandboxes/a/exec",
            &[],
            full(r#"{"command": "yes flood | head -c 1000000000", "stream": true}"#),
        )
        .await
        .unwrap();
    assert!(stalled.status().is_success());
    let started = std::time::Instant::now();
    for _ in 0..5 {
        let lines = tcp.exec_lines("a", "echo quick").await;
        assert_eq!(collect(&lines).0, b"quick\n");
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "other requests waited on a stalled reader: {:?}",
        started.elapsed()
    );
    // The flood is held back, not buffered: the server's memory stays small.
    let pid = unix.get("/v1/version").await.ok().json()["pid"]
        .as_u64()
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        rss_kib < 200 * 1024,
        "server RSS {rss_kib} KiB with a stalled reader"
    );
    drop(stalled);

    // Oversized bodies.
    let huge_json = tcp
        .send(
            Method::POST,
            "/v1/sandboxes/a/exec",
            full(format!("{{\"command\": \"{}\"}}", "x".repeat(2 << 20))),
        )
        .await;
    assert_eq!(huge_json.status, StatusCode::PAYLOAD_TOO_LARGE);
    let before = tcp
        .get("/v1/sandboxes/a/files/list?path=")
        .await
        .ok()
        .json();
    // 10 GB announced: refused before a byte is read.
    let announced = tcp
        .send_raw(
            Method::PUT,
            "/v1/sandboxes/a/archive",
            &[("content-length", "10000000000".into())],
            full(Bytes::new()),
        )
        .await
        .unwrap();
    assert_eq!(announced.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Streamed without a length: a valid tar that goes on past the limit
    // (up to 10 GB if nobody stopped it) is cut off at the limit.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    let chunks = futures::stream::unfold(0u64, move |i| {
        let counter = counter.clone();
        async move {
            if i >= 10_000 {
                return None;
            }
            counter.fetch_add(1 << 20, std::sync::atomic::Ordering::SeqCst);
            let chunk = if i == 0 {
                tar_header("big.bin", 10_000 << 20)
            } else {
                vec![0u8; 1 << 20]
            };
            Some((
                Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from(chunk))),
                i + 1,
            ))
        }
    });
    let streamed = tcp
        .send_raw(
            Method::PUT,
            "/v1/sandboxes/a/archive",
            &[],
            StreamBody::new(chunks).boxed_unsync(),
        )
        .await;
    match streamed {
        Ok(reply) => {
            assert_eq!(reply.status(), StatusCode::PAYLOAD_TOO_LARGE);
        }
        // The server may close the connection while the body is still
        // coming: the refusal then is the broken request.
        Err(e) => eprintln!("archive over the limit: connection closed ({e})"),
    }
    assert!(
        sent.load(std::sync::atomic::Ordering::SeqCst) < 1 << 30,
        "the server read far past its limit"
    );
    let after = tcp
        .get("/v1/sandboxes/a/files/list?path=")
        .await
        .ok()
        .json();
    assert_eq!(before, after, "a refused archive wrote something");

    // The OpenAPI document served is the committed one.
    let served_doc = unix.get("/v1/openapi.json").await.ok().json();
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("host/server/openapi.json")).unwrap(),
    )
    .unwrap();
    assert!(
        served_doc == committed,
        "the served OpenAPI document differs from host/server/openapi.json: `BERTH_BLESS=1 cargo test -p berth-server`"
    );

    tcp.send(Method::DELETE, "/v1/sandboxes/a", full(Bytes::new()))
        .await
        .ok();
    assert_eq!(
        unix.get("/v1/sandboxes").await.ok().json(),
        serde_json::json!([])
    );
}

/// A ustar header for a regular file of `size` bytes.
fn tar_header(name: &str, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut chunk = h.as_bytes().to_vec();
    chunk.resize(1 << 20, 0);
    chunk
}

/// Ten Docker sandboxes, ten streamed commands on each at once, each
/// printing a megabyte of random bytes and their sha256: every stream
/// arrives whole.
#[tokio::test]
async fn ten_sandboxes_ten_concurrent_streams_each_arrive_intact() {
    let Some(_docker) = docker_or_skip("server::ten_sandboxes").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let served = Served::start(&[]);
    let client = served.client();
    let creates = (0..10).map(|i| {
        let client = client.clone();
        async move {
            client
                .post(
                    "/v1/sandboxes",
                    serde_json::json!({"name": format!("s{i}"), "backend": "docker",
                        "image": test_image(), "snapshot": "noop"}),
                )
                .await
                .ok();
        }
    });
    futures::future::join_all(creates).await;
    let command = "f=/tmp/r.$$; head -c 1048576 /dev/urandom > $f; cat $f; sha256sum $f | cut -d' ' -f1 >&2; rm $f";
    let started = Instant::now();
    let runs = (0..100).map(|n| {
        let client = client.clone();
        async move {
            let lines = client.exec_lines(&format!("s{}", n % 10), command).await;
            let (out, err, code) = collect(&lines);
            assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&err));
            assert_eq!(out.len(), 1 << 20);
            assert_eq!(
                hex::encode(sha2::Sha256::digest(&out)),
                String::from_utf8_lossy(&err).trim(),
                "stream {n} arrived changed"
            );
        }
    });
    futures::future::join_all(runs).await;
    eprintln!(
        "100 streamed execs over 10 sandboxes: {:?}",
        started.elapsed()
    );
    for i in 0..10 {
        client
            .send(
                Method::DELETE,
                &format!("/v1/sandboxes/s{i}"),
                full(Bytes::new()),
            )
            .await
            .ok();
    }
}

/// Runs `berth ARGS` with `BERTH_HOME=home`, through the server unless
/// `in_process`; stdout, stderr and the exit code, with the home's path
/// replaced by `$HOME`.
fn cli(home: &Path, in_process: bool, args: &[&str], stdin: &[u8]) -> (String, String, i32) {
    let mut command = Command::new(berth_bin());
    command
        .env("BERTH_HOME", home)
        .env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if in_process {
        command.env("BERTH_NO_SERVER", "1");
    } else {
        command.env_remove("BERTH_NO_SERVER");
    }
    let mut child = command.spawn().unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().unwrap();
    let home = home.to_string_lossy().to_string();
    let clean = |b: &[u8]| snapshot_ids(&String::from_utf8_lossy(b).replace(&home, "$HOME"));
    (
        clean(&out.stdout),
        clean(&out.stderr),
        out.status.code().unwrap_or(-1),
    )
}

/// `text` with every `berth-` followed by 16 hex digits (a session's
/// snapshot id) as `berth-ID`.
fn snapshot_ids(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("berth-") {
        out.push_str(&rest[..at + 6]);
        rest = &rest[at + 6..];
        let hex = rest.chars().take_while(char::is_ascii_hexdigit).count();
        if hex == 16 {
            out.push_str("ID");
            rest = &rest[16..];
        }
    }
    out.push_str(rest);
    out
}

/// The server pid a home's CLI uses (started on demand; on a loaded
/// machine it may still be coming up).
async fn server_pid(home: &Path) -> i32 {
    let socket = home.join("berth.sock");
    // The CLI waits 30 s for a server it starts; this waits longer, so a
    // server the CLI gave up on (and ran in-process instead) is still seen.
    let deadline = Instant::now() + Duration::from_secs(90);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "no server answers on {}; its log:\n{}",
            socket.display(),
            std::fs::read_to_string(home.join("server.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = Client::Unix(socket).get("/v1/version").await.ok().json();
    v["pid"].as_i64().unwrap() as i32
}

/// What the library logs while the server handles a command (here: the
/// agent cannot run, so commands fall back to plain execs) reaches the
/// CLI's stderr, as it would in-process.
#[tokio::test]
async fn warnings_logged_in_the_server_reach_the_cli() {
    let Some(_docker) = docker_or_skip("server::warnings").await else {
        return;
    };
    let _shared = berth_tests::DOCKERD.read().await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    berth_ok(
        h,
        &[
            "create",
            "ro",
            "--backend",
            "docker",
            "--image",
            &test_image(),
            "--snapshot",
            "noop",
            "--run-arg=--tmpfs",
            "--run-arg=/.berth:noexec",
        ],
    );
    let (out, err, code) = cli(h, false, &["exec", "ro", "--", "echo via exec"], b"");
    assert_eq!((out.as_str(), code), ("via exec\n", 0), "{err}");
    assert_eq!(err.matches("agent cannot run").count(), 1, "{err}");
    assert!(
        h.join("server.log").exists(),
        "the command did not go through a server"
    );
    berth_ok(h, &["rm", "ro"]);
}

/// Fork over the API: a deduplicated sandbox on the fs-store plugin,
/// stopped twice; a fork from the newest and one from the first
/// generation each see their generation's workspace.
#[tokio::test]
async fn fork_through_the_api_starts_from_a_kept_generation() {
    let served = Served::start(&[]);
    let client = served.client();
    let store = served.home().join("store");
    let manifest = berth_tests::fs_store_manifest(served.home(), &store);
    client
        .post(
            "/v1/sandboxes",
            serde_json::json!({"name": "src", "snapshot": format!("remote:{}", manifest.display()),
                "dedup_keep": 3}),
        )
        .await
        .ok();
    let write = |text: &'static str| {
        let client = client.clone();
        async move {
            client
                .send(
                    Method::PUT,
                    "/v1/sandboxes/src/files/content?path=gen.txt",
                    full(text),
                )
                .await
                .ok();
            client
                .post("/v1/sandboxes/src/stop", serde_json::json!({}))
                .await
                .ok();
        }
    };
    write("one").await;
    write("two").await;
    for (name, generation, want) in [("newest", None, "two"), ("first", Some(1), "one")] {
        let mut body = serde_json::json!({"name": name});
        if let Some(g) = generation {
            body["generation"] = g.into();
        }
        let forked = client
            .post("/v1/sandboxes/src/fork", body)
            .await
            .ok()
            .json();
        assert_eq!(forked["name"], name);
        let got = client
            .get(&format!("/v1/sandboxes/{name}/files/content?path=gen.txt"))
            .await
            .ok();
        assert_eq!(got.body, want, "fork {name}");
    }
    let again = client
        .post(
            "/v1/sandboxes/src/fork",
            serde_json::json!({"name": "first"}),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let refused = client
        .post(
            "/v1/sandboxes",
            serde_json::json!({"name": "x", "snapshot": "local", "dedup_keep": 2}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
}

/// The server the CLI starts on demand exits once idle for
/// `BERTH_SERVER_IDLE_EXIT`, removing its socket; the next command starts
/// another.
#[tokio::test]
async fn an_idle_server_exits_and_the_next_command_starts_another() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let run = |args: &[&str]| {
        let out = Command::new(berth_bin())
            .env("BERTH_HOME", h)
            // Long enough that the server is still there when this test
            // asks its pid right after a command, on a loaded machine.
            .env("BERTH_SERVER_IDLE_EXIT", "4s")
            .env_remove("BERTH_NO_SERVER")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["create", "l", "--snapshot", "noop"]);
    assert_eq!(run(&["exec", "l", "--", "echo one"]), "one\n");
    let first = server_pid(h).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while h.join("berth.sock").exists() {
        assert!(Instant::now() < deadline, "the idle server did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Gone, or a zombie nobody reaped yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{first}/stat")).unwrap_or_default();
        let running = state
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z");
        if !running {
            break;
        }
        assert!(Instant::now() < deadline, "the idle server still runs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(run(&["exec", "l", "--", "echo two"]), "two\n");
    assert_ne!(server_pid(h).await, first);
}

// The rest of the server's tests, by what they touch.
#[path = "server_cli.rs"]
mod cli_through_server;
#[path = "server_clients.rs"]
mod clients;
#[path = "server_files.rs"]
mod files;
#[path = "server_forks.rs"]
mod forks;
#[path = "server_history.rs"]
mod history;
#[path = "server_pools.rs"]
mod pools;
