//! The egress point: an HTTP proxy on the host that a sandbox reaches
//! instead of the network. It takes `CONNECT host:port` (any protocol in
//! a tunnel) and plain HTTP requests in absolute form (`GET
//! http://host/…`), decides each against the sandbox's policy, resolves
//! names itself, refuses addresses the rebinding guard refuses, checks a
//! TLS ClientHello's server name against the host it was allowed for, and
//! logs every connection. One request per plain-HTTP connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::intercept::Interception;
use crate::log::{Connection, ConnectionLog, Verdict};
use crate::policy::{Denial, EgressPolicy};
use crate::resolve::TestResolve;
use crate::rules::normalize_name;
use crate::sni::{client_hello_sni, Sni};
use crate::streams::{Counted, Counts};

/// The most bytes of a request's head (request line and headers) read.
pub const MAX_REQUEST_HEAD: usize = 16 << 10;
/// The buffer each direction of a connection is copied through.
const COPY_BUFFER: usize = 256 << 10;
/// How long a client has to send its request head, and its ClientHello.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(10);
/// How long a connection to an allowed host may take to open.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(10);

/// How the egress point turns names into addresses.
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    /// The host's resolver.
    #[default]
    System,
    /// Names under `.test` that a [`TestResolve`] entry matches resolve to
    /// its addresses; other `.test` names resolve to nothing (they are
    /// never asked of the host's resolver); every other name goes to the
    /// host's resolver. For tests, whose servers listen on loopback or in
    /// namespaces they make.
    Test(Vec<TestResolve>),
}

impl Resolver {
    /// The resolver for a sandbox's test names (the host's when none).
    pub fn with_test_names(table: Vec<TestResolve>) -> Self {
        if table.is_empty() {
            Resolver::System
        } else {
            Resolver::Test(table)
        }
    }

    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        if let Resolver::Test(table) = self {
            if let Some(entry) = table.iter().find(|entry| entry.names.names(host)) {
                return Ok(entry
                    .addresses
                    .iter()
                    .map(|ip| SocketAddr::new(*ip, port))
                    .collect());
            }
        }
        if host == "test" || host.ends_with(".test") {
            return Ok(Vec::new());
        }
        Ok(tokio::net::lookup_host((host, port)).await?.collect())
    }
}

/// One sandbox's egress point: its policy (changeable while it runs; a
/// change counts from the next connection) and its connection log.
#[derive(Debug, Clone)]
pub struct EgressPoint {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    policy: RwLock<EgressPolicy>,
    log: Mutex<ConnectionLog>,
    resolver: Resolver,
    open: AtomicU64,
    /// The byte counts of the connections open now, by log sequence.
    live: Mutex<std::collections::HashMap<u64, Arc<Counts>>>,
    /// How the point opens TLS for a plain `https://` request (the host's
    /// roots); `None`: it does not.
    upstream_tls: Option<Arc<rustls::ClientConfig>>,
    /// The sandbox's secrets and CA; `None`: it has no secrets, and the
    /// point reads inside no TLS connection.
    interception: Option<Interception>,
}

/// Counts a connection as open until dropped (however serving ends).
struct OpenGuard<'a>(&'a AtomicU64);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An open connection's counts, shown live while it lasts and written to
/// its log entry when it ends (dropped).
struct Live<'a> {
    shared: &'a Shared,
    sequence: u64,
    counts: Arc<Counts>,
}

impl<'a> Live<'a> {
    fn new(shared: &'a Shared, sequence: u64, counts: Arc<Counts>) -> Self {
        lock(&shared.live).insert(sequence, counts.clone());
        Live {
            shared,
            sequence,
            counts,
        }
    }
}

impl Drop for Live<'_> {
    fn drop(&mut self) {
        // Both under the log's lock, which a status holds to read both:
        // it sees the bytes once, live or logged.
        let mut log = lock(&self.shared.log);
        lock(&self.shared.live).remove(&self.sequence);
        log.update(
            self.sequence,
            self.counts.written.load(Ordering::Relaxed),
            self.counts.read.load(Ordering::Relaxed),
        );
    }
}

/// A refusal on the way to a decision, or after it.
enum Refusal {
    /// The client did not speak the protocol (400).
    BadRequest(String),
    /// The policy refused the connection (403).
    Denied(String),
    /// The allowed host could not be reached (502).
    Unreachable(String),
}

impl EgressPoint {
    /// An egress point applying `policy`, resolving with `resolver`.
    pub fn new(policy: EgressPolicy, resolver: Resolver) -> Self {
        Self::with_interception(policy, resolver, None, None)
    }

    pub(crate) fn with_interception(
        policy: EgressPolicy,
        resolver: Resolver,
        interception: Option<Interception>,
        upstream_tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Self {
        EgressPoint {
            shared: Arc::new(Shared {
                policy: RwLock::new(policy),
                log: Mutex::new(ConnectionLog::default()),
                resolver,
                open: AtomicU64::new(0),
                live: Mutex::new(std::collections::HashMap::new()),
                upstream_tls,
                interception,
            }),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> EgressPolicy {
        read(&self.shared.policy).clone()
    }

    /// Replaces the policy; connections open now keep going.
    pub fn set_policy(&self, policy: EgressPolicy) {
        *self
            .shared
            .policy
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = policy;
    }

    /// The connections logged, oldest first, and how many older ones the
    /// bounded log dropped.
    pub fn connections(&self) -> (Vec<Connection>, u64) {
        let log = lock(&self.shared.log);
        let mut entries: Vec<Connection> = log.entries().cloned().collect();
        let dropped = log.dropped();
        // Open connections: their bytes so far.
        for (sequence, counts) in lock(&self.shared.live).iter() {
            let index = sequence
                .checked_sub(dropped)
                .and_then(|i| usize::try_from(i).ok());
            if let Some(entry) = index.and_then(|i| entries.get_mut(i)) {
                entry.bytes_out += counts.written.load(Ordering::Relaxed);
                entry.bytes_in += counts.read.load(Ordering::Relaxed);
            }
        }
        (entries, dropped)
    }

    /// Puts back a log saved by an earlier daemon (its connections, oldest
    /// first, and how many it had dropped).
    pub(crate) fn restore_log(&self, connections: Vec<Connection>, dropped: u64) {
        let mut log = lock(&self.shared.log);
        *log = ConnectionLog::restored(connections, dropped);
    }

    /// How many client connections are being served now.
    pub fn open_connections(&self) -> u64 {
        self.shared.open.load(Ordering::Relaxed)
    }

    /// Serves one client connection to its end.
    pub async fn serve<S>(&self, mut client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        self.shared.open.fetch_add(1, Ordering::Relaxed);
        let _open = OpenGuard(&self.shared.open);
        if let Err(refusal) = self.handle(&mut client).await {
            let (status, text) = match refusal {
                Refusal::BadRequest(t) => ("400 Bad Request", t),
                Refusal::Denied(t) => ("403 Forbidden", t),
                Refusal::Unreachable(t) => ("502 Bad Gateway", t),
            };
            let body = format!("berth egress: {text}\n");
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            // The client may be gone: nothing more to tell it.
            let _ = client.write_all(reply.as_bytes()).await;
            let _ = client.shutdown().await;
        }
    }

    async fn handle<S>(&self, client: &mut S) -> Result<(), Refusal>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (head, extra) = tokio::time::timeout(CLIENT_DEADLINE, read_head(client))
            .await
            .map_err(|_| Refusal::BadRequest("no request head in time".into()))??;
        let request = Request::parse(&head)?;
        let sequence = self.decide(&request.host, request.port)?;
        let upstream = self.open(&request.host, request.port, sequence).await?;
        // Counted as it goes (a status shows an open connection's bytes),
        // and into the log however the connection ends.
        let counts = Arc::new(Counts::default());
        let _live = Live::new(&self.shared, sequence, counts.clone());
        let mut first = extra;
        if request.tunnel {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .map_err(|e| Refusal::Unreachable(format!("client gone: {e}")))?;
            first = self
                .check_server_name(client, &request.host, request.port, first, sequence)
                .await?;
            if let Some(interception) = &self.shared.interception {
                if !interception.bound(&request.host, request.port).is_empty() {
                    let used = interception
                        .serve(
                            &mut *client,
                            first,
                            &request.host,
                            request.port,
                            upstream,
                            counts,
                        )
                        .await
                        .map_err(Refusal::Unreachable)?;
                    lock(&self.shared.log).note_secrets(sequence, used);
                    return Ok(());
                }
            }
        }
        let upstream = Counted::new(upstream, counts);
        if request.tls {
            let mut upstream = self.open_tls(&request.host, upstream).await?;
            let mut head = request.forwarded_head().into_bytes();
            if let Some(interception) = &self.shared.interception {
                let (replaced, used) =
                    interception.substitute_head(&request.host, request.port, &head);
                head = replaced;
                lock(&self.shared.log).note_secrets(sequence, used);
            }
            head.extend_from_slice(&first);
            upstream
                .write_all(&head)
                .await
                .map_err(|e| Refusal::Unreachable(format!("writing to {}: {e}", request.host)))?;
            let _ = tokio::io::copy_bidirectional_with_sizes(
                client,
                &mut upstream,
                COPY_BUFFER,
                COPY_BUFFER,
            )
            .await;
            return Ok(());
        }
        let mut upstream = upstream;
        if !request.tunnel {
            let head = request.forwarded_head();
            upstream
                .write_all(head.as_bytes())
                .await
                .map_err(|e| Refusal::Unreachable(format!("writing to {}: {e}", request.host)))?;
        }
        upstream
            .write_all(&first)
            .await
            .map_err(|e| Refusal::Unreachable(format!("writing to {}: {e}", request.host)))?;
        // 256 KiB each way: tokio's default 8 KiB halves a download's rate.
        // However it ends, the bytes that passed are counted.
        let _ = tokio::io::copy_bidirectional_with_sizes(
            client,
            &mut upstream,
            COPY_BUFFER,
            COPY_BUFFER,
        )
        .await;
        Ok(())
    }

    /// TLS to `host` over `upstream`, verified against the host's roots,
    /// for a plain request whose URL is `https://`.
    async fn open_tls(
        &self,
        host: &str,
        upstream: Counted<TcpStream>,
    ) -> Result<tokio_rustls::client::TlsStream<Counted<TcpStream>>, Refusal> {
        let Some(config) = &self.shared.upstream_tls else {
            return Err(Refusal::BadRequest(
                "this egress point does not open TLS for a client: use CONNECT".into(),
            ));
        };
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(literal.to_string())
            .map_err(|e| Refusal::BadRequest(format!("{host} is not a TLS server name: {e}")))?;
        tokio_rustls::TlsConnector::from(config.clone())
            .connect(name, upstream)
            .await
            .map_err(|e| Refusal::Unreachable(format!("TLS to {host}: {e}")))
    }

    /// The policy's decision, logged either way.
    fn decide(&self, host: &str, port: u16) -> Result<u64, Refusal> {
        let decision = read(&self.shared.policy).decide(host, port);
        let verdict = match &decision {
            Ok(allowed) => Verdict::Allowed {
                rule: allowed.rule.clone(),
            },
            Err(denial) => Verdict::Denied {
                reason: denial.to_string(),
            },
        };
        let sequence = self.log(host, port, verdict);
        match decision {
            Ok(_) => Ok(sequence),
            Err(denial) => {
                tracing::info!(host, port, reason = %denial, "egress denied");
                Err(Refusal::Denied(denial.to_string()))
            }
        }
    }

    fn log(&self, host: &str, port: u16, verdict: Verdict) -> u64 {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        lock(&self.shared.log).record(Connection {
            at_ms,
            host: host.to_string(),
            port,
            bytes_out: 0,
            bytes_in: 0,
            secrets: Vec::new(),
            verdict,
        })
    }

    /// Turns an allowed decision into a denial in the log (a check after
    /// the policy's: the rebinding guard, the server name).
    fn deny_after(&self, sequence: u64, host: &str, port: u16, reason: String) -> Refusal {
        tracing::info!(host, port, reason = %reason, "egress denied");
        lock(&self.shared.log).deny(sequence, reason.clone());
        Refusal::Denied(reason)
    }

    /// Resolves `host` (an allowed name or IP literal) on the host and
    /// connects to its first address the rebinding guard lets through.
    async fn open(&self, host: &str, port: u16, sequence: u64) -> Result<TcpStream, Refusal> {
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        let addresses = match literal.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => self
                .shared
                .resolver
                .resolve(host, port)
                .await
                .map_err(|e| Refusal::Unreachable(format!("cannot resolve {host}: {e}")))?,
        };
        let policy = self.policy();
        let mut refused: Option<Denial> = None;
        let mut last_error = None;
        for address in &addresses {
            if literal.parse::<IpAddr>().is_err() {
                if let Err(denial) = policy.check_address(host, address.ip(), port) {
                    refused.get_or_insert(denial);
                    continue;
                }
            }
            match tokio::time::timeout(CONNECT_DEADLINE, TcpStream::connect(address)).await {
                Ok(Ok(stream)) => {
                    // A proxy relays what it is given at once: with Nagle's
                    // delay, a TLS handshake's small records wait on
                    // delayed ACKs (tens of ms per connection).
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => last_error = Some(format!("{address}: {e}")),
                Err(_) => last_error = Some(format!("{address}: no answer in time")),
            }
        }
        match (last_error, refused) {
            (Some(e), _) => Err(Refusal::Unreachable(format!(
                "cannot connect to {host}: {e}"
            ))),
            (None, Some(denial)) => Err(self.deny_after(sequence, host, port, denial.to_string())),
            (None, None) => Err(Refusal::Unreachable(format!("{host} has no address"))),
        }
    }

    /// Reads the tunnel's first bytes until they say whether they are a
    /// TLS ClientHello; one must name `host`. Returns the bytes read.
    async fn check_server_name<S>(
        &self,
        client: &mut S,
        host: &str,
        port: u16,
        mut first: Vec<u8>,
        sequence: u64,
    ) -> Result<Vec<u8>, Refusal>
    where
        S: AsyncRead + Unpin,
    {
        let deadline = tokio::time::Instant::now() + CLIENT_DEADLINE;
        let mut chunk = vec![0u8; 4096];
        loop {
            let verdict = match client_hello_sni(&first) {
                Sni::Incomplete => None,
                Sni::NotTls if http_head_pending(&first) => None,
                Sni::NotTls => match tunneled_host(&first) {
                    // Plain HTTP in a tunnel: its first request's Host
                    // header may not pick another site on the server.
                    Some(named) if named != host => Some(format!(
                        "the Host header {named:?} in the tunnel is not {host}, the host the tunnel was allowed for"
                    )),
                    _ => return Ok(first),
                },
                Sni::Missing if is_ip_literal(host) => return Ok(first),
                Sni::Missing => Some(format!("a TLS ClientHello to {host} names no server")),
                Sni::Name(name) if normalize_name(&name).ok().as_deref() == Some(host) => {
                    return Ok(first)
                }
                Sni::Name(name) => Some(format!(
                    "the TLS server name {name:?} is not {host}, the host the tunnel was allowed for"
                )),
            };
            if let Some(reason) = verdict {
                return Err(self.deny_after(sequence, host, port, reason));
            }
            let n = match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
                // The client closed its side: nothing more can follow.
                Ok(Ok(0)) => return Ok(first),
                Ok(Ok(n)) => n,
                Ok(Err(e)) => return Err(Refusal::BadRequest(format!("reading: {e}"))),
                // Half a ClientHello, then the rest later, would pass
                // unchecked: refused instead.
                Err(_) => {
                    let reason = format!(
                        "the tunnel's first bytes (a TLS ClientHello or an HTTP request head) did not arrive whole within {} s",
                        CLIENT_DEADLINE.as_secs()
                    );
                    return Err(self.deny_after(sequence, host, port, reason));
                }
            };
            first.extend_from_slice(&chunk[..n]);
        }
    }
}

fn is_ip_literal(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
}

/// Whether `bytes` begin like an HTTP request (a method in capitals)
/// whose head has not ended yet, and is still under the head's cap.
fn http_head_pending(bytes: &[u8]) -> bool {
    let method: Vec<&u8> = bytes.iter().take_while(|b| **b != b' ').collect();
    !bytes.is_empty()
        && method.len() <= 16
        && method.iter().all(|b| b.is_ascii_uppercase())
        && !bytes.windows(4).any(|w| w == b"\r\n\r\n")
        && bytes.len() < MAX_REQUEST_HEAD
}

/// The host a plain HTTP request at the start of `bytes` names in its
/// Host header (normalized, port dropped), once its head is in.
fn tunneled_host(bytes: &[u8]) -> Option<String> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&bytes[..end]).ok()?;
    let (first, rest) = head.split_once("\r\n")?;
    if !first.ends_with("HTTP/1.1") && !first.ends_with("HTTP/1.0") {
        return None;
    }
    let value = rest.split("\r\n").find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim())
    })?;
    split_authority(value, Some(80)).map(|(h, _)| normalize_host(h))
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads up to the end of the request head; returns the head and the
/// bytes read past it.
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(String, Vec<u8>), Refusal> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let extra = buf.split_off(end + 4);
            let head = String::from_utf8(buf)
                .map_err(|_| Refusal::BadRequest("the request head is not UTF-8".into()))?;
            return Ok((head, extra));
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Err(Refusal::BadRequest(format!(
                "the request head is longer than {MAX_REQUEST_HEAD} bytes"
            )));
        }
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| Refusal::BadRequest(format!("reading the request: {e}")))?;
        if n == 0 {
            return Err(Refusal::BadRequest("the request ended early".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A proxy request: a tunnel, or one plain HTTP request (which the point
/// sends on over TLS when its URL is `https://`, as busybox's wget asks).
struct Request {
    tunnel: bool,
    tls: bool,
    /// Normalized name, or IP literal (IPv6 in brackets).
    host: String,
    port: u16,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
}

impl Request {
    fn parse(head: &str) -> Result<Request, Refusal> {
        let bad = |why: &str| Refusal::BadRequest(why.to_string());
        let mut lines = head.split("\r\n");
        let first = lines.next().unwrap_or_default();
        let mut parts = first.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad("a request line is METHOD TARGET VERSION"));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(bad("only HTTP/1.x requests are proxied"));
        }
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let tunnel = method.eq_ignore_ascii_case("CONNECT");
        let mut tls = false;
        let (authority, path, default_port) = if tunnel {
            (target, "", None)
        } else {
            let (rest, port) = match (target.strip_prefix("http://"), target.strip_prefix("https://")) {
                (Some(rest), _) => (rest, 80),
                (None, Some(rest)) => {
                    tls = true;
                    (rest, 443)
                }
                (None, None) => return Err(bad(
                    "a plain request names its URL in full (http://host/path or https://host/path); use CONNECT for anything else",
                )),
            };
            match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..], Some(port)),
                None => (rest, "/", Some(port)),
            }
        };
        let (host, port) = split_authority(authority, default_port)
            .ok_or_else(|| bad("the target is host:port"))?;
        let request = Request {
            tunnel,
            tls,
            host: normalize_host(host),
            port,
            method: method.to_string(),
            path: path.to_string(),
            headers,
        };
        if !tunnel {
            // The Host header names the same host, or there is no way to
            // tell which one the server will serve.
            if let Some((_, value)) = request
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            {
                let named =
                    split_authority(value, Some(request.port)).map(|(h, _)| normalize_host(h));
                if named.as_deref() != Some(request.host.as_str()) {
                    return Err(Refusal::Denied(format!(
                        "the Host header {value:?} does not name {}, the host of the request's URL",
                        request.host
                    )));
                }
            }
        }
        Ok(request)
    }

    /// The head sent on: origin form, no proxy headers, one request.
    fn forwarded_head(&self) -> String {
        let mut head = format!("{} {} HTTP/1.1\r\n", self.method, self.path);
        let mut has_host = false;
        for (k, v) in &self.headers {
            let lower = k.to_ascii_lowercase();
            if lower.starts_with("proxy-") || lower == "connection" || lower == "keep-alive" {
                continue;
            }
            has_host |= lower == "host";
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !has_host {
            head.push_str(&format!("Host: {}\r\n", self.host));
        }
        head.push_str("Connection: close\r\n\r\n");
        head
    }
}

fn normalize_host(host: &str) -> String {
    normalize_name(host).unwrap_or_else(|_| host.to_string())
}

/// `host:port`, `[v6]:port`, or without the port where there is a default.
fn split_authority(text: &str, default_port: Option<u16>) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        (&text[..end + 2], after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0)?,
        None => default_port?,
    };
    (!host.is_empty()).then_some((host, port))
}
