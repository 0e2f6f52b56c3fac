//! Replies, request bodies and how errors become statuses.

use std::error::Error as StdError;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{header, Response, StatusCode};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};

use crate::api::{ErrorDetail, ErrorReply};

/// An error a body stream may carry.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A request body, whatever the server under the API reads it from.
pub type RequestBody = UnsyncBoxBody<Bytes, BoxError>;

/// A reply body: whole, or streamed.
pub type ReplyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A reply.
pub type Reply = Response<ReplyBody>;

/// Why a request failed: its status, code and message.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code.to_string(),
            message: self.message.clone(),
        }
    }

    pub(crate) fn into_reply(self) -> Reply {
        let body = ErrorReply {
            error: self.detail(),
        };
        let mut reply = json_reply(&body);
        *reply.status_mut() = self.status;
        reply
    }
}

/// The cause chain, outermost first, joined by `: ` (as `{:#}` of anyhow
/// prints it, so the CLI says the same through the server as without it).
pub(crate) fn chain(e: &(dyn StdError + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

impl From<berth::SandboxError> for ApiError {
    fn from(e: berth::SandboxError) -> Self {
        use berth::SandboxError as E;
        let (status, code) = match &e {
            E::PathRefused { .. } => (StatusCode::FORBIDDEN, "path_refused"),
            E::NotFound { .. } => (StatusCode::NOT_FOUND, "file_not_found"),
            E::ProcessRunning { .. } => (StatusCode::CONFLICT, "process_running"),
            E::ProcessExited { .. } => (StatusCode::CONFLICT, "process_exited"),
            E::LineageMismatch { .. } => (StatusCode::CONFLICT, "lineage_mismatch"),
            E::NotStarted => (StatusCode::CONFLICT, "not_started"),
            E::Backend(berth::BackendError::Unsupported { .. }) => {
                (StatusCode::NOT_IMPLEMENTED, "unsupported")
            }
            E::Backend(berth::BackendError::Placement { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "placement")
            }
            E::Backend(berth::BackendError::Stale { .. }) => (StatusCode::CONFLICT, "stale"),
            E::Backend(berth::BackendError::Unconfined { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unconfined")
            }
            E::Backend(berth::BackendError::Unbounded { .. }) => {
                (StatusCode::SERVICE_UNAVAILABLE, "unbounded")
            }
            E::Backend(
                berth::BackendError::Settings(_)
                | berth::BackendError::Config { .. }
                | berth::BackendError::Request(_),
            ) => (StatusCode::BAD_REQUEST, "bad_request"),
            E::Backend(_) => (StatusCode::BAD_GATEWAY, "backend"),
            E::GenerationNotKept { .. } => (StatusCode::NOT_FOUND, "generation_not_kept"),
            E::Spec(_) | E::UnknownBackend { .. } | E::NoGenerations { .. } => {
                (StatusCode::BAD_REQUEST, "bad_request")
            }
            E::Archive(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad_archive"),
            E::HostDefaults(_) => (StatusCode::SERVICE_UNAVAILABLE, "host_defaults"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, chain(&e))
    }
}

impl From<berth::sandbox::RemoveError> for ApiError {
    fn from(e: berth::sandbox::RemoveError) -> Self {
        use berth::sandbox::RemoveError as E;
        let message = chain(&e);
        match e {
            E::Named(e) => e.into(),
            E::OrphansRemain { .. } => {
                ApiError::new(StatusCode::CONFLICT, "orphans_remain", message)
            }
            E::Shutdown { source, .. } | E::DeleteSnapshot { source, .. } => {
                let mut api = ApiError::from(source);
                api.message = message;
                api
            }
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message),
        }
    }
}

impl From<berth::sandbox::NamedSandboxError> for ApiError {
    fn from(e: berth::sandbox::NamedSandboxError) -> Self {
        use berth::sandbox::NamedSandboxError as E;
        match e {
            E::Sandbox(e) => e.into(),
            E::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, "not_found", chain(&e)),
            E::InvalidName { .. } => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_name", chain(&e))
            }
            E::Exists { .. } => ApiError::new(StatusCode::CONFLICT, "exists", chain(&e)),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", chain(&other)),
        }
    }
}

impl From<berth::sandbox::ForkError> for ApiError {
    fn from(e: berth::sandbox::ForkError) -> Self {
        use berth::sandbox::ForkError as E;
        match e {
            E::Named(e) => e.into(),
            E::Count(_) => ApiError::bad_request(chain(&e)),
            E::Child { name, source } => {
                let mut api = ApiError::from(*source);
                api.message = format!("fork {name} failed ({}); no fork was kept", api.message);
                api
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", chain(&other)),
        }
    }
}

impl From<berth::sandbox::PoolError> for ApiError {
    fn from(e: berth::sandbox::PoolError) -> Self {
        use berth::sandbox::PoolError as E;
        match e {
            E::Named(e) => e.into(),
            E::Create(e) => (*e).into(),
            E::Sandbox(e) => e.into(),
            E::Remove { source, .. } => (*source).into(),
            E::NotFound { .. } => ApiError::new(StatusCode::NOT_FOUND, "not_found", chain(&e)),
            E::Exists { .. } => ApiError::new(StatusCode::CONFLICT, "exists", chain(&e)),
            E::Template { .. } => ApiError::bad_request(chain(&e)),
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", chain(&other)),
        }
    }
}

impl From<berth::sandbox::CreateError> for ApiError {
    fn from(e: berth::sandbox::CreateError) -> Self {
        use berth::sandbox::CreateError as E;
        match e {
            E::Named(e) => e.into(),
            E::Sandbox(e) => e.into(),
            E::Snapshot(_) | E::DedupNeedsRemote { .. } => ApiError::bad_request(chain(&e)),
            E::NotStarted { name, source } => {
                let mut api = ApiError::from(source);
                api.message = format!(
                    "{name} was not created: it did not start ({}), and what it had made was removed",
                    api.message
                );
                api
            }
            E::NotStartedKept {
                name,
                source,
                cleanup,
            } => {
                let mut api = ApiError::from(source);
                api.message = format!(
                    "{name} did not start ({}), and removing what it had made failed too ({}); it is kept: remove it (DELETE /v1/sandboxes/{name})",
                    api.message,
                    chain(&cleanup)
                );
                api
            }
            other => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", chain(&other)),
        }
    }
}

/// A JSON reply, status 200.
pub(crate) fn json_reply<T: serde::Serialize>(value: &T) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => bytes_reply(Bytes::from(body), "application/json"),
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("encoding the reply: {e}"),
        )
        .into_reply(),
    }
}

/// A whole reply of `content_type`.
pub(crate) fn bytes_reply(body: Bytes, content_type: &'static str) -> Reply {
    let mut reply = Response::new(Full::new(body).map_err(|e| match e {}).boxed_unsync());
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    reply
}

/// A streamed reply of `content_type`.
pub(crate) fn stream_reply<S>(stream: S, content_type: &'static str) -> Reply
where
    S: Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
{
    let frames = stream.map(|r| r.map(http_body::Frame::data));
    let mut reply = Response::new(BodyExt::boxed_unsync(StreamBody::new(frames)));
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    reply
}

/// Reads a whole JSON body of at most `cap` bytes.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    body: RequestBody,
    cap: usize,
) -> Result<T, ApiError> {
    let bytes = read_capped(body, cap).await?;
    if bytes.is_empty() {
        return serde_json::from_slice(b"{}")
            .map_err(|e| ApiError::bad_request(format!("the request needs a JSON body: {e}")));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!("the request body is not what it should be: {e}"))
    })
}

/// Reads a whole body of at most `cap` bytes.
pub(crate) async fn read_capped(mut body: RequestBody, cap: usize) -> Result<Bytes, ApiError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > cap {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("the request body is over {cap} bytes"),
                ));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(Bytes::from(out))
}

/// A request body as an `AsyncRead`, failing once more than `cap` bytes
/// came; the flag says whether that is why it failed.
pub(crate) fn body_reader(
    body: RequestBody,
    cap: u64,
) -> (
    impl tokio::io::AsyncRead + Send + Unpin,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = over.clone();
    let mut seen = 0u64;
    let stream = body.into_data_stream().map(move |r| match r {
        Ok(b) => {
            seen += b.len() as u64;
            if seen > cap {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(std::io::Error::other(format!(
                    "the request body is over {cap} bytes"
                )))
            } else {
                Ok(b)
            }
        }
        Err(e) => Err(std::io::Error::other(e)),
    });
    (tokio_util::io::StreamReader::new(stream), over)
}
