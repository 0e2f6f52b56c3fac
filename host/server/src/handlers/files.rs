//! The file API and the workspace as a tar stream, every body streamed.

use std::sync::Arc;

use berth::sandbox::FileInfo;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::StatusCode;

use crate::api;
use crate::http::{body_reader, json_reply, stream_reply, ApiError, BoxError, Reply};
use crate::route::Call;
use crate::Inner;

type Answer = BoxFuture<'static, Result<Reply, ApiError>>;

fn wire(f: FileInfo) -> api::FileEntry {
    api::FileEntry {
        path: f.path,
        kind: serde_json::to_value(f.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        size: f.size,
        mode: f.mode,
        mtime: f.mtime,
        target: f.target,
    }
}

/// The request's Content-Length, refused over `cap`; required.
fn content_length(call: &Call, cap: u64) -> Result<u64, ApiError> {
    let len = call
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::LENGTH_REQUIRED,
                "bad_request",
                "the body needs a Content-Length",
            )
        })?;
    if len > cap {
        return Err(too_large(len, cap));
    }
    Ok(len)
}

fn too_large(len: u64, cap: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("the body is {len} bytes, over this server's limit of {cap}; nothing was written"),
    )
}

pub(crate) fn read(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let reader = open
            .sandbox
            .read()
            .await
            .files()
            .read(call.query("path")?)
            .await?;
        let stream = tokio_util::io::ReaderStream::with_capacity(reader, 64 * 1024);
        let stream = futures::StreamExt::map(stream, |r| r.map_err(BoxError::from));
        Ok(stream_reply(stream, "application/octet-stream"))
    }
    .boxed()
}

pub(crate) fn write(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let len = content_length(&call, inner.limits.file)?;
        let mode = match call.query.get("mode") {
            Some(m) => Some(
                u32::from_str_radix(m, 8)
                    .map_err(|_| ApiError::bad_request(format!("mode {m:?} is not octal")))?,
            ),
            None => None,
        };
        let path = call.query("path")?.to_string();
        let open = inner.open.get(call.param(0)).await?;
        let (reader, _) = body_reader(call.body, len);
        open.sandbox
            .read()
            .await
            .files()
            .write(&path, reader, len, mode)
            .await?;
        Ok(json_reply(&api::Written {
            bytes: len,
            entries: None,
        }))
    }
    .boxed()
}

pub(crate) fn stat(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let info = open
            .sandbox
            .read()
            .await
            .files()
            .stat(call.query("path")?)
            .await?;
        Ok(json_reply(&wire(info)))
    }
    .boxed()
}

pub(crate) fn list(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let list = open
            .sandbox
            .read()
            .await
            .files()
            .list(call.query("path")?)
            .await?;
        Ok(json_reply(&list.into_iter().map(wire).collect::<Vec<_>>()))
    }
    .boxed()
}

pub(crate) fn remove(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        open.sandbox
            .read()
            .await
            .files()
            .remove(call.query("path")?, call.flag("recursive"))
            .await?;
        Ok(json_reply(&api::Done { ok: true }))
    }
    .boxed()
}

pub(crate) fn make_dir(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        open.sandbox
            .read()
            .await
            .files()
            .make_dir(call.query("path")?, call.flag("parents"))
            .await?;
        Ok(json_reply(&api::Done { ok: true }))
    }
    .boxed()
}

pub(crate) fn persist(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let open = inner.open.get(call.param(0)).await?;
        let archive = open.sandbox.read().await.persist_workspace().await?;
        let stream = tokio_util::io::ReaderStream::with_capacity(archive, 64 * 1024);
        let stream = futures::StreamExt::map(stream, |r| r.map_err(BoxError::from));
        Ok(stream_reply(stream, "application/x-tar"))
    }
    .boxed()
}

pub(crate) fn hydrate(inner: Arc<Inner>, call: Call) -> Answer {
    async move {
        let cap = inner.limits.archive;
        if let Some(len) = call
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
        {
            if len > cap {
                return Err(too_large(len, cap));
            }
        }
        let open = inner.open.get(call.param(0)).await?;
        let (mut reader, over) = body_reader(call.body, cap);
        let hydrated = open
            .sandbox
            .read()
            .await
            .hydrate_workspace(&mut reader)
            .await;
        if over.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "the archive is over this server's limit of {cap} bytes; nothing was written"
                ),
            ));
        }
        let stats = hydrated?;
        Ok(json_reply(&api::Written {
            bytes: stats.bytes,
            entries: Some(stats.entries),
        }))
    }
    .boxed()
}
