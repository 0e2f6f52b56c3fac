//! `berth serve`, and the CLI's way to the server: commands that attach to
//! a sandbox go through the server on `$BERTH_HOME/berth.sock` when one
//! answers, starting it on demand when none does. `BERTH_NO_SERVER=1` (or
//! `--no-server`) runs everything in-process instead.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Args;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};
use hyper_util::rt::TokioIo;

use berth_server::{BoxError, ErrorReply};

/// The socket under a home.
pub fn socket_path(home: &Path) -> PathBuf {
    home.join("berth.sock")
}

/// `berth serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// The unix socket. By default, $BERTH_HOME/berth.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Also listen on TCP: `PORT` (on 127.0.0.1) or `ADDR:PORT` (an address
    /// beyond loopback only when named here). Needs --token-file.
    #[arg(long, requires = "token_file")]
    listen: Option<String>,
    /// The bearer token TCP clients must send (the file's first line).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Exit after this long with no connection open (`10m`, `30s`, `0`
    /// for never). By default, never in the foreground.
    #[arg(long)]
    idle_exit: Option<String>,
    /// The largest archive a hydrate may send (`16GiB`, `512MiB`). By
    /// default, 16 GiB.
    #[arg(long)]
    max_archive: Option<String>,
    /// The largest file a write may send. By default, 16 GiB.
    #[arg(long)]
    max_file: Option<String>,
}

/// Parses `10m`, `30s`, `1h`, `500ms`; `0` is `None` (never).
pub fn parse_duration(s: &str) -> anyhow::Result<Option<Duration>> {
    let d = berth::units::parse_duration(s)?;
    Ok((!d.is_zero()).then_some(d))
}

/// [`parse_duration`] for clap: a positive duration.
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    match parse_duration(s) {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(format!("{s:?} is zero; give a positive duration (30s, 2m)")),
        Err(e) => Err(e.to_string()),
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    crate::notice::serving();
    let home = crate::home::berth_home()?;
    let socket = args.socket.clone().unwrap_or_else(|| socket_path(&home));
    if let Some(version) = Remote::at(&socket).version().await {
        bail!(
            "a berth server (pid {}) already answers on {}; `berth server stop` stops it",
            version.pid,
            socket.display()
        );
    }
    let mut limits = berth_server::Limits::default();
    let size = |flag: &str, s: &str| {
        berth::units::parse_size(s).map_err(|e| anyhow::anyhow!("{flag} {s:?}: {e}"))
    };
    if let Some(s) = &args.max_archive {
        limits.archive = size("--max-archive", s)?;
    }
    if let Some(s) = &args.max_file {
        limits.file = size("--max-file", s)?;
    }
    let api = berth_server::Api::with_limits(crate::home::named(&home), limits);
    let mut server = berth_server::Server::new(api).unix_socket(&socket);
    if let Some(idle) = &args.idle_exit {
        server = server.idle_exit(parse_duration(idle)?);
    }
    let mut beyond = false;
    if let Some(listen) = &args.listen {
        let addr: std::net::SocketAddr = match listen.parse::<u16>() {
            Ok(port) => std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            Err(_) => {
                beyond = true;
                listen
                    .parse()
                    .with_context(|| format!("--listen {listen:?}: use PORT or ADDR:PORT"))?
            }
        };
        let file = args
            .token_file
            .as_ref()
            .context("--listen needs --token-file")?;
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("reading the token file {}", file.display()))?;
        let token = token.lines().next().unwrap_or("").trim().to_string();
        if token.len() < 16 {
            bail!(
                "the token in {} is {} characters; use at least 16 (e.g. `openssl rand -hex 32 > {}`)",
                file.display(),
                token.len(),
                file.display()
            );
        }
        server = server.tcp(addr, token);
    }
    eprintln!("berth: serving on {}", socket.display());
    server.run_with(beyond).await?;
    Ok(ExitCode::SUCCESS)
}

/// `berth server …`.
#[derive(clap::Subcommand)]
pub enum ServerCommand {
    /// Start a server in the background (as the CLI does on demand) and
    /// wait until it answers. Its log is $BERTH_HOME/server.log.
    Start {
        /// Exit after this long with no connection open (`10m`, `1h`, `0`
        /// for never). By default $BERTH_SERVER_IDLE_EXIT, else 10m.
        #[arg(long)]
        idle_exit: Option<String>,
    },
    /// Whether a server answers on $BERTH_HOME/berth.sock: its pid, its
    /// version, whether this berth uses it. Exits 1 when none answers.
    Status,
    /// Stop the server (SIGTERM: it finishes what it is doing for its
    /// clients, then exits) and wait until it has gone.
    Stop,
}

/// How long `berth server stop` waits for the server to go.
const STOP_WAIT: Duration = Duration::from_secs(60);

/// `berth server status|stop`.
pub async fn manage(command: ServerCommand) -> anyhow::Result<ExitCode> {
    let home = crate::home::berth_home()?;
    let socket = socket_path(&home);
    let remote = Remote::at(&socket);
    if let ServerCommand::Start { idle_exit } = &command {
        if let Some(version) = remote.version().await {
            println!(
                "a berth server (pid {}) already answers on {}",
                version.pid,
                socket.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let idle = idle_exit.clone().unwrap_or_else(default_idle_exit);
        parse_duration(&idle)?;
        start_server(&home, &socket, &idle).await?;
        let pid = remote
            .version()
            .await
            .map_or_else(|| "?".to_string(), |v| v.pid.to_string());
        let until = match parse_duration(&idle)? {
            Some(_) => format!("it exits after {idle} with nothing open"),
            None => "it runs until stopped".to_string(),
        };
        println!(
            "started a berth server (pid {pid}) on {}; {until}; `berth server stop` stops it",
            socket.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(version) = remote.version().await else {
        println!("no berth server answers on {}", socket.display());
        return Ok(match command {
            ServerCommand::Status => ExitCode::FAILURE,
            _ => ExitCode::SUCCESS,
        });
    };
    match command {
        ServerCommand::Start { .. } => Ok(ExitCode::SUCCESS),
        ServerCommand::Status => {
            let same = version.environment == berth_server::environment_fingerprint()
                && version.build == berth_server::build_identity();
            println!(
                "a berth server answers on {}: pid {}, berth {}, API v{}",
                socket.display(),
                version.pid,
                version.berth,
                version.api
            );
            if same {
                println!("this berth sends its commands through it; `berth server stop` stops it");
            } else {
                println!("it runs another build of berth, or its BERTH_*/DOCKER_* environment differs: this berth runs its commands in-process");
            }
            Ok(ExitCode::SUCCESS)
        }
        ServerCommand::Stop => {
            let pid = i32::try_from(version.pid).context("the server's pid is out of range")?;
            // SAFETY: kill sends a signal; no memory is involved.
            if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
                let e = std::io::Error::last_os_error();
                bail!("cannot signal the server (pid {pid}): {e}");
            }
            let deadline = std::time::Instant::now() + STOP_WAIT;
            while remote.version().await.is_some() || process_exists(pid) {
                if std::time::Instant::now() > deadline {
                    bail!(
                        "the server (pid {pid}) is still there after {} s; see {}",
                        STOP_WAIT.as_secs(),
                        home.join("server.log").display()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!("stopped the berth server (pid {pid})");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Whether a process `pid` exists (and is not a zombie of ours).
fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 checks existence; nothing is sent.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    alive
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
}

static FORBIDDEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--no-server`: this process runs everything itself.
pub fn forbid() {
    FORBIDDEN.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Whether this CLI may use a server (not `--no-server`, not
/// `BERTH_NO_SERVER=1`).
pub fn allowed() -> bool {
    !FORBIDDEN.load(std::sync::atomic::Ordering::SeqCst)
        && !std::env::var_os("BERTH_NO_SERVER").is_some_and(|v| !v.is_empty() && v != "0")
}

type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A connection to the server.
#[derive(Clone)]
pub struct Remote {
    socket: PathBuf,
}

/// A reply whose status was OK.
pub struct Answer {
    pub body: hyper::body::Incoming,
}

impl Remote {
    /// The server at `socket`, whether or not one answers there.
    pub fn at(socket: &Path) -> Remote {
        Remote {
            socket: socket.to_path_buf(),
        }
    }

    /// What the server answering says of itself; `None` when none answers.
    pub async fn version(&self) -> Option<berth_server::Version> {
        tokio::net::UnixStream::connect(&self.socket).await.ok()?;
        self.json(http::Method::GET, "/v1/version", None).await.ok()
    }

    /// The server for `home`: the one answering, else one started now.
    /// `None` when servers are not allowed or one cannot be started (the
    /// caller runs the command in-process).
    pub async fn for_home(home: &Path) -> Option<Remote> {
        if !allowed() {
            return None;
        }
        let socket = socket_path(home);
        let remote = Remote { socket };
        if tokio::net::UnixStream::connect(&remote.socket)
            .await
            .is_err()
        {
            if let Err(e) = start_server(home, &remote.socket, &default_idle_exit()).await {
                eprintln!("berth: no server ({e:#}); running in this process");
                return None;
            }
        }
        match remote
            .json::<berth_server::Version>(http::Method::GET, "/v1/version", None)
            .await
        {
            Ok(v)
                if v.environment == berth_server::environment_fingerprint()
                    && v.build == berth_server::build_identity() =>
            {
                Some(remote)
            }
            Ok(v) => {
                tracing::info!(
                    server_pid = v.pid,
                    "the server runs another build of berth, or its BERTH_*/DOCKER_* environment differs from this command's: running in this process"
                );
                None
            }
            Err(e) => {
                eprintln!("berth: the server does not answer ({e:#}); running in this process");
                None
            }
        }
    }

    /// Sends one request; an error reply becomes an error with the
    /// server's message.
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Body>,
    ) -> anyhow::Result<Answer> {
        let json = body
            .is_some()
            .then_some((http::header::CONTENT_TYPE, "application/json".to_string()));
        self.send_with(method, path, body, json.into_iter().collect())
            .await
    }

    /// [`Remote::send`] with these headers.
    pub async fn send_with(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Body>,
        headers: Vec<(http::header::HeaderName, String)>,
    ) -> anyhow::Result<Answer> {
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to the server at {}", self.socket.display()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("talking to the server")?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "berth");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request.body(body.unwrap_or_else(|| {
            Full::new(Bytes::new())
                .map_err(|e| match e {})
                .boxed_unsync()
        }))?;
        let reply = sender
            .send_request(request)
            .await
            .context("the server did not answer")?;
        relay_warnings(reply.headers());
        let status = reply.status();
        if status.is_success() {
            return Ok(Answer {
                body: reply.into_body(),
            });
        }
        let bytes = reply.into_body().collect().await?.to_bytes();
        match serde_json::from_slice::<ErrorReply>(&bytes) {
            Ok(e) => Err(ServerError {
                code: e.error.code,
                message: e.error.message,
            }
            .into()),
            Err(_) => bail!(
                "the server answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ),
        }
    }

    /// A JSON request and its JSON reply.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<T> {
        let body = body.map(|v| {
            Full::new(Bytes::from(v.to_string()))
                .map_err(|e| match e {})
                .boxed_unsync()
        });
        let answer = self.send(method, path, body).await?;
        let bytes = answer.body.collect().await?.to_bytes();
        serde_json::from_slice(&bytes).context("the server's reply is not what this berth expects")
    }
}

/// Logs here the warnings the server logged while it handled a request,
/// as the same command run in-process would have.
fn relay_warnings(headers: &http::HeaderMap) {
    use base64::Engine;
    let lines = |header: &str| -> Vec<String> {
        headers
            .get(header)
            .and_then(|v| {
                base64::engine::general_purpose::STANDARD
                    .decode(v.as_bytes())
                    .ok()
            })
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    };
    for line in lines(berth_server::NOTICES_HEADER) {
        eprintln!("{line}");
    }
    for line in lines(berth_server::WARNINGS_HEADER) {
        tracing::warn!(target: "berth", "{line}");
    }
}

/// An error the server replied with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ServerError {
    /// Its code (`not_found`, `lineage_mismatch`, …).
    pub code: String,
    /// What failed.
    pub message: String,
}

/// `s` percent-encoded for a path segment or query value.
pub fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How long a server started in the background lives with nothing open:
/// `$BERTH_SERVER_IDLE_EXIT`, else 10 minutes.
fn default_idle_exit() -> String {
    std::env::var("BERTH_SERVER_IDLE_EXIT").unwrap_or_else(|_| "10m".into())
}

/// Starts `berth serve` for `home` in the background (its own session,
/// its log in `home/server.log`), exiting when idle; waits until it
/// answers. One CLI at a time starts it (a lock in `home`).
async fn start_server(home: &Path, socket: &Path, idle: &str) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    std::fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    let lock_path = home.join("server.lock");
    let _lock = tokio::task::spawn_blocking(move || berth::sandbox::StateLock::acquire(&lock_path))
        .await??;
    if tokio::net::UnixStream::connect(socket).await.is_ok() {
        return Ok(());
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("server.log"))
        .context("opening server.log")?;
    let exe = std::env::current_exe().context("finding this berth")?;
    let mut command = std::process::Command::new(exe);
    command
        .args(["serve", "--idle-exit", idle])
        .env("BERTH_HOME", home)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the server leaves this CLI's
    // session so a Ctrl-C here does not reach it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command.spawn().context("starting `berth serve`")?;
    // A cold start of a large binary on a loaded machine can take a while.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if tokio::net::UnixStream::connect(socket).await.is_ok() {
            // Reaped by nobody: it outlives this process.
            std::mem::forget(child);
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            bail!(
                "`berth serve` exited ({status}); see {}",
                home.join("server.log").display()
            );
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "`berth serve` did not answer within 30 s; see {}",
                home.join("server.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
