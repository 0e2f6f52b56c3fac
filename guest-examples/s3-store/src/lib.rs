//! `s3-store`: a Berth remote snapshot client over S3-compatible object
//! storage, speaking `wasi:http` with SigV4 presigned requests (rusty-s3).
//!
//! - Archives are objects `<prefix><id>.tar`.
//! - Uploads smaller than one part are a single PUT; larger ones are a
//!   multipart upload, `parallel_parts` parts in flight at once, each
//!   buffered until its answer arrives (constant guest memory). Completing the upload is the commit; any failure aborts
//!   it, so the previous object stays as it was (clauses 2 and 3).
//! - `exists` is a HEAD; missing keys give `not-found`.
//! - 5xx, 429 and connection failures are retried with backoff, then
//!   reported as `unavailable`.
//!
//! Config: `endpoint` (e.g. `http://127.0.0.1:3900`), `region`, `bucket`,
//! `prefix` (optional), `access_key_id`, `secret_access_key`, `part_size`
//! (bytes, default 8 MiB, at least 5 MiB), `parallel_parts` (part requests
//! in flight, default 3; guest memory ≈ (parallel_parts + 1) × part_size),
//! `retries` (default 6: backoff from 0.1 s, doubling, about 6 s in all),
//! `path_style` (default true). Signing needs the time of day: grant
//! `wall_clock = true`, and the endpoint's origin in `http_hosts`.

use std::collections::VecDeque;
use std::time::Duration;

use berth_guest_kit::{validate_id, StreamError as KitStreamError};
use rusty_s3::actions::{CreateMultipartUpload, S3Action};
use rusty_s3::{Bucket, Credentials, UrlStyle};
use wasi::http::outgoing_handler;
use wasi::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

berth_guest_kit::contract_bindings!("berth:snapshot/remote-client-plugin");

use exports::berth::snapshot::remote_client::{
    Client, Config, Guest, GuestClient, InputStream, OutputStream, StorageError,
};

/// Presigned URLs are valid this long.
const SIGN_FOR: Duration = Duration::from_secs(3600);
const MIN_PART: usize = 5 << 20;

struct S3Store {
    bucket: Bucket,
    credentials: Credentials,
    prefix: String,
    part_size: usize,
    parallel_parts: usize,
    retries: u32,
}

/// An answer. Field order matters: the body stream must be dropped before
/// the body it belongs to.
struct Response {
    status: u16,
    etag: Option<String>,
    stream: Option<wasi::io::streams::InputStream>,
    body: Option<wasi::http::types::IncomingBody>,
}

impl Response {
    /// Reads the whole (small) body, e.g. an XML answer.
    fn text(mut self) -> Result<String, StorageError> {
        let mut out = Vec::new();
        if let Some(stream) = self.stream.take() {
            loop {
                match stream.blocking_read(64 * 1024) {
                    Ok(chunk) => {
                        out.extend_from_slice(&chunk);
                        if out.len() > 4 << 20 {
                            return Err(StorageError::Io("S3 answer too large".into()));
                        }
                    }
                    Err(wasi::io::streams::StreamError::Closed) => break,
                    Err(e) => {
                        return Err(StorageError::Io(format!("reading the S3 answer: {e:?}")))
                    }
                }
            }
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// A part of a multipart upload that was sent (or failed to send) and
/// whose answer has not been read yet.
struct PartInFlight {
    number: u16,
    part: Vec<u8>,
    sent: Option<Sent>,
}

/// Notes a retried request on the plugin's stderr, which the host routes to
/// its log.
fn log_to_host(message: &str) {
    eprintln!("s3-store: {message}");
}

/// A request whose body is sent and whose answer is still to come (or
/// came already, while the body was being sent).
enum Sent {
    Pending {
        future: wasi::http::types::FutureIncomingResponse,
        authority: String,
    },
    Answered(Response),
}

impl Sent {
    fn answered(resp: Response) -> Self {
        Sent::Answered(resp)
    }
}

enum Attempt {
    Done(Response),
    Retry(String),
    Fail(StorageError),
}

fn transient(e: &ErrorCode) -> bool {
    matches!(
        e,
        ErrorCode::ConnectionRefused
            | ErrorCode::ConnectionTerminated
            | ErrorCode::ConnectionTimeout
            | ErrorCode::ConnectionReadTimeout
            | ErrorCode::ConnectionWriteTimeout
            | ErrorCode::ConnectionLimitReached
            | ErrorCode::HttpResponseIncomplete
            | ErrorCode::HttpProtocolError
            | ErrorCode::DestinationUnavailable
    )
}

impl S3Store {
    fn key(&self, id: &str) -> Result<String, StorageError> {
        validate_id(id).map_err(StorageError::InvalidId)?;
        Ok(format!("{}{id}.tar", self.prefix))
    }

    fn send_once(&self, method: &Method, url: &url::Url, body: Option<&[u8]>) -> Attempt {
        match self.start(method, url, body) {
            Ok(sent) => Self::receive(sent),
            Err(attempt) => attempt,
        }
    }

    /// Sends a request with its whole body and returns without waiting for
    /// the answer, so several requests can be in flight at once.
    fn start(&self, method: &Method, url: &url::Url, body: Option<&[u8]>) -> Result<Sent, Attempt> {
        let headers = Fields::new();
        if let Some(b) = body {
            let _ = headers.append("content-length", b.len().to_string().as_bytes());
        }
        let request = OutgoingRequest::new(headers);
        let _ = request.set_method(method);
        let scheme = if url.scheme() == "https" {
            Scheme::Https
        } else {
            Scheme::Http
        };
        let _ = request.set_scheme(Some(&scheme));
        let authority = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or("")),
            None => url.host_str().unwrap_or("").to_string(),
        };
        let _ = request.set_authority(Some(&authority));
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let _ = request.set_path_with_query(Some(&path));
        let Ok(outgoing) = request.body() else {
            return Err(Attempt::Fail(StorageError::Other(
                "cannot open the request body".into(),
            )));
        };
        let future = match outgoing_handler::handle(request, None) {
            Ok(f) => f,
            Err(ErrorCode::HttpRequestDenied) => {
                return Err(Attempt::Fail(StorageError::Denied(format!(
                    "the host refused a request to {authority}; add its origin to grants.http_hosts"
                ))))
            }
            Err(e) if transient(&e) => return Err(Attempt::Retry(format!("{e:?}"))),
            Err(e) => {
                return Err(Attempt::Fail(StorageError::Io(format!(
                    "sending the request: {e:?}"
                ))))
            }
        };
        let sent = Sent::Pending { future, authority };
        if let Some(b) = body {
            if let Err(why) = Self::write_body(&outgoing, b) {
                // The body stream closed under us: the connection broke, or
                // the store had already answered (a small body can be sent
                // whole and answered before the flush returns). The answer
                // is what counts: a success is a success (retrying a
                // completed multipart upload would find it gone), an error
                // is reported or retried on its own terms.
                drop(outgoing);
                return match Self::receive(sent) {
                    Attempt::Done(resp) => Ok(Sent::answered(resp)),
                    Attempt::Retry(cause) => Err(Attempt::Retry(format!("{why}: {cause}"))),
                    Attempt::Fail(e) => Err(Attempt::Fail(e)),
                };
            }
        }
        if let Err(e) = OutgoingBody::finish(outgoing, None) {
            return Err(Attempt::Retry(format!("finishing the request body: {e:?}")));
        }
        Ok(sent)
    }

    /// Writes a whole request body, waiting for the host's permits.
    fn write_body(outgoing: &OutgoingBody, body: &[u8]) -> Result<(), String> {
        let stream = outgoing
            .write()
            .map_err(|()| "cannot write the request body".to_string())?;
        let mut rest = body;
        while !rest.is_empty() {
            let permit = match stream.check_write() {
                Ok(0) => {
                    stream.subscribe().block();
                    continue;
                }
                Ok(n) => n as usize,
                Err(e) => return Err(format!("writing the request body: {e:?}")),
            };
            let (now, later) = rest.split_at(permit.min(rest.len()));
            stream
                .write(now)
                .map_err(|e| format!("writing the request body: {e:?}"))?;
            rest = later;
        }
        stream
            .blocking_flush()
            .map_err(|e| format!("flushing the request body: {e:?}"))
    }

    /// Waits for the answer to a request [`S3Store::start`] sent.
    fn receive(sent: Sent) -> Attempt {
        let (future, authority) = match sent {
            Sent::Pending { future, authority } => (future, authority),
            Sent::Answered(resp) => return Attempt::Done(resp),
        };
        let response = loop {
            match future.get() {
                Some(r) => break r,
                None => future.subscribe().block(),
            }
        };
        let response = match response {
            Ok(Ok(r)) => r,
            Ok(Err(ErrorCode::HttpRequestDenied)) => {
                return Attempt::Fail(StorageError::Denied(format!(
                    "the host refused a request to {authority}; add its origin to grants.http_hosts"
                )))
            }
            Ok(Err(e)) if transient(&e) => return Attempt::Retry(format!("{e:?}")),
            Ok(Err(e)) => {
                return Attempt::Fail(StorageError::Io(format!("S3 request failed: {e:?}")))
            }
            Err(()) => return Attempt::Fail(StorageError::Other("response taken twice".into())),
        };
        let status = response.status();
        let etag = response
            .headers()
            .get("etag")
            .into_iter()
            .next()
            .map(|v| String::from_utf8_lossy(&v).into_owned());
        let body = response.consume().ok();
        let stream = body.as_ref().and_then(|b| b.stream().ok());
        let resp = Response {
            status,
            etag,
            stream,
            body,
        };
        if status >= 500 || status == 429 {
            let text = resp.text().unwrap_or_default();
            return Attempt::Retry(format!(
                "HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        Attempt::Done(resp)
    }

    /// Sends with retries and exponential backoff.
    fn send(
        &self,
        method: Method,
        sign: impl Fn() -> url::Url,
        body: Option<&[u8]>,
    ) -> Result<Response, StorageError> {
        let mut delay = Duration::from_millis(100);
        let mut last = String::new();
        for attempt in 0..=self.retries {
            if attempt > 0 {
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            match self.send_once(&method, &sign(), body) {
                Attempt::Done(r) => return Ok(r),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(why) => last = why,
            }
        }
        Err(StorageError::Unavailable(format!(
            "S3 did not answer successfully after {} attempts: {last}",
            self.retries + 1
        )))
    }

    fn check(resp: Response, what: &str) -> Result<Response, StorageError> {
        match resp.status {
            200..=299 => Ok(resp),
            403 => {
                let t = resp.text().unwrap_or_default();
                Err(StorageError::Denied(format!(
                    "{what}: HTTP 403: {}",
                    t.chars().take(300).collect::<String>()
                )))
            }
            404 => Err(StorageError::NotFound(format!("{what}: HTTP 404"))),
            s => {
                let t = resp.text().unwrap_or_default();
                Err(StorageError::Io(format!(
                    "{what}: HTTP {s}: {}",
                    t.chars().take(300).collect::<String>()
                )))
            }
        }
    }

    /// Reads up to one part from the archive stream; `None` at its end.
    fn fill_part(&self, data: &InputStream, part: &mut Vec<u8>) -> Result<bool, StorageError> {
        part.clear();
        while part.len() < self.part_size {
            let want = (self.part_size - part.len()).min(256 * 1024) as u64;
            match data.blocking_read(want) {
                Ok(chunk) => part.extend_from_slice(&chunk),
                Err(KitStreamError::Closed) => return Ok(true),
                Err(KitStreamError::LastOperationFailed(e)) => {
                    return Err(StorageError::Io(format!(
                        "archive stream failed: {}",
                        e.to_debug_string()
                    )))
                }
            }
        }
        Ok(false)
    }

    fn multipart(&self, key: &str, first: Vec<u8>, data: &InputStream) -> Result<(), StorageError> {
        let create = self.send(
            Method::Post,
            || {
                self.bucket
                    .create_multipart_upload(Some(&self.credentials), key)
                    .sign(SIGN_FOR)
            },
            None,
        )?;
        let xml = Self::check(create, "starting the multipart upload")?.text()?;
        let upload_id = CreateMultipartUpload::parse_response(&xml)
            .map_err(|e| StorageError::Io(format!("unreadable multipart answer: {e}")))?
            .upload_id()
            .to_string();
        let result = self.upload_parts(key, &upload_id, first, data);
        if result.is_err() {
            // Abort so nothing becomes visible and storage is released.
            let _ = self.send(
                Method::Delete,
                || {
                    self.bucket
                        .abort_multipart_upload(Some(&self.credentials), key, &upload_id)
                        .sign(SIGN_FOR)
                },
                None,
            );
        }
        result
    }

    /// Waits for one part's answer (resending it with backoff if the first
    /// attempt failed transiently) and returns its ETag and its buffer.
    fn collect_part(
        &self,
        key: &str,
        upload_id: &str,
        part: PartInFlight,
    ) -> Result<(String, Vec<u8>), StorageError> {
        let first = match part.sent {
            Some(sent) => Self::receive(sent),
            None => Attempt::Retry("the first attempt failed to send".into()),
        };
        let resp = match first {
            Attempt::Done(resp) => resp,
            Attempt::Fail(e) => return Err(e),
            Attempt::Retry(why) => {
                log_to_host(&format!("part {} retried: {why}", part.number));
                self.send(
                    Method::Put,
                    || {
                        self.bucket
                            .upload_part(Some(&self.credentials), key, part.number, upload_id)
                            .sign(SIGN_FOR)
                    },
                    Some(&part.part),
                )?
            }
        };
        let resp = Self::check(resp, "uploading a part")?;
        let etag = resp
            .etag
            .clone()
            .ok_or_else(|| StorageError::Io("part answer without ETag".into()))?;
        Ok((etag, part.part))
    }

    /// Uploads the parts with up to `parallel_parts` requests in flight:
    /// while the store digests one part, the next is read from the archive
    /// and sent. Each in-flight part keeps its buffer until its answer
    /// arrives, so a transient failure can resend it; guest memory stays at
    /// most `(parallel_parts + 1) × part_size`, whatever the archive size.
    fn upload_parts(
        &self,
        key: &str,
        upload_id: &str,
        first: Vec<u8>,
        data: &InputStream,
    ) -> Result<(), StorageError> {
        let mut etags: Vec<String> = Vec::new();
        let mut in_flight: VecDeque<PartInFlight> = VecDeque::new();
        let mut spare: Option<Vec<u8>> = None;
        let mut part = first;
        let mut ended = false;
        let mut number: u16 = 1;
        loop {
            let url = self
                .bucket
                .upload_part(Some(&self.credentials), key, number, upload_id)
                .sign(SIGN_FOR);
            let sent = match self.start(&Method::Put, &url, Some(&part)) {
                Ok(sent) => Some(sent),
                Err(Attempt::Fail(e)) => return Err(e),
                // Resent with backoff when its turn to be collected comes.
                Err(_) => None,
            };
            in_flight.push_back(PartInFlight { number, part, sent });
            if in_flight.len() >= self.parallel_parts {
                if let Some(oldest) = in_flight.pop_front() {
                    let (etag, buffer) = self.collect_part(key, upload_id, oldest)?;
                    etags.push(etag);
                    spare = Some(buffer);
                }
            }
            if ended {
                break;
            }
            part = spare
                .take()
                .unwrap_or_else(|| Vec::with_capacity(self.part_size));
            ended = self.fill_part(data, &mut part)?;
            if part.is_empty() {
                break;
            }
            number = number.checked_add(1).ok_or_else(|| {
                StorageError::Other("more than 65535 parts; raise part_size".into())
            })?;
        }
        while let Some(oldest) = in_flight.pop_front() {
            etags.push(self.collect_part(key, upload_id, oldest)?.0);
        }
        let complete = self.bucket.complete_multipart_upload(
            Some(&self.credentials),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = complete.sign(SIGN_FOR);
        let body = complete.body();
        let resp = self.send(Method::Post, || url.clone(), Some(body.as_bytes()))?;
        let resp = Self::check(resp, "completing the multipart upload")?;
        // S3 may report a failed completion inside a 200 answer.
        let text = resp.text()?;
        if text.contains("<Error>") {
            return Err(StorageError::Io(format!(
                "completing the multipart upload: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        Ok(())
    }
}

impl GuestClient for S3Store {
    fn open(config: Config) -> Result<Client, StorageError> {
        let get = |k: &str| {
            config
                .iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let need =
            |k: &str| get(k).ok_or_else(|| StorageError::Other(format!("config {k} is required")));
        let endpoint: url::Url = need("endpoint")?
            .parse()
            .map_err(|e| StorageError::Other(format!("config endpoint: {e}")))?;
        let style = if get("path_style").as_deref() == Some("false") {
            UrlStyle::VirtualHost
        } else {
            UrlStyle::Path
        };
        let bucket = Bucket::new(
            endpoint,
            style,
            need("bucket")?,
            get("region").unwrap_or_else(|| "us-east-1".into()),
        )
        .map_err(|e| StorageError::Other(format!("config bucket/endpoint: {e}")))?;
        let credentials = Credentials::new(need("access_key_id")?, need("secret_access_key")?);
        let part_size = match get("part_size") {
            Some(s) => s
                .parse::<usize>()
                .map_err(|_| StorageError::Other("config part_size must be bytes".into()))?,
            None => 8 << 20,
        };
        if part_size < MIN_PART {
            return Err(StorageError::Other(format!(
                "config part_size must be at least {MIN_PART} (S3's minimum)"
            )));
        }
        let retries = get("retries").and_then(|r| r.parse().ok()).unwrap_or(6);
        let parallel_parts = match get("parallel_parts") {
            Some(s) => s
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| {
                    StorageError::Other("config parallel_parts must be 1 to 16".into())
                })?,
            None => 3,
        };
        Ok(Client::new(S3Store {
            bucket,
            credentials,
            prefix: get("prefix").unwrap_or_default(),
            part_size,
            parallel_parts,
            retries,
        }))
    }

    fn upload(&self, snapshot_id: String, data: InputStream) -> Result<(), StorageError> {
        let key = self.key(&snapshot_id)?;
        let mut first = Vec::with_capacity(self.part_size);
        let ended = self.fill_part(&data, &mut first)?;
        if ended {
            let resp = self.send(
                Method::Put,
                || {
                    self.bucket
                        .put_object(Some(&self.credentials), &key)
                        .sign(SIGN_FOR)
                },
                Some(&first),
            )?;
            Self::check(resp, "storing the snapshot")?;
            return Ok(());
        }
        self.multipart(&key, first, &data)
    }

    fn download(&self, snapshot_id: String, sink: OutputStream) -> Result<(), StorageError> {
        let key = self.key(&snapshot_id)?;
        let resp = self.send(
            Method::Get,
            || {
                self.bucket
                    .get_object(Some(&self.credentials), &key)
                    .sign(SIGN_FOR)
            },
            None,
        )?;
        let mut resp = Self::check(resp, &format!("fetching snapshot {snapshot_id:?}"))?;
        let stream = resp
            .stream
            .take()
            .ok_or_else(|| StorageError::Io("answer without a body".into()))?;
        loop {
            let permit = sink
                .check_write()
                .map_err(|e| StorageError::Io(format!("writing the archive: {e:?}")))?;
            if permit == 0 {
                sink.subscribe().block();
                continue;
            }
            match stream.blocking_read(permit.min(256 * 1024)) {
                Ok(chunk) => sink
                    .write(&chunk)
                    .map_err(|e| StorageError::Io(format!("writing the archive: {e:?}")))?,
                Err(wasi::io::streams::StreamError::Closed) => break,
                Err(e) => {
                    return Err(StorageError::Unavailable(format!(
                        "the S3 body broke off: {e:?}"
                    )))
                }
            }
        }
        drop(stream);
        drop(resp.body.take());
        sink.blocking_flush()
            .map_err(|e| StorageError::Io(format!("flushing the archive: {e:?}")))?;
        Ok(())
    }

    fn exists(&self, snapshot_id: String) -> Result<bool, StorageError> {
        let key = self.key(&snapshot_id)?;
        let resp = self.send(
            Method::Head,
            || {
                self.bucket
                    .head_object(Some(&self.credentials), &key)
                    .sign(SIGN_FOR)
            },
            None,
        )?;
        match Self::check(resp, "checking the snapshot") {
            Ok(_) => Ok(true),
            Err(StorageError::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn delete(&self, snapshot_id: String) -> Result<(), StorageError> {
        if !self.exists(snapshot_id.clone())? {
            return Err(StorageError::NotFound(format!(
                "no snapshot {snapshot_id:?}"
            )));
        }
        let key = self.key(&snapshot_id)?;
        let resp = self.send(
            Method::Delete,
            || {
                self.bucket
                    .delete_object(Some(&self.credentials), &key)
                    .sign(SIGN_FOR)
            },
            None,
        )?;
        Self::check(resp, "deleting the snapshot")?;
        Ok(())
    }
}

struct Component;

impl Guest for Component {
    type Client = S3Store;
}

export!(Component);
