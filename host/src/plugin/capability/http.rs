//! Outbound HTTP: only to the origins in `grants.http_hosts`, matched on
//! scheme, host and port. Anything else is refused with
//! `HttpRequestDenied` before a connection is attempted, and remembered so
//! the failure is reported as a capability denial.

use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::plugin::manifest::HttpOrigin;

type IoFuture = Box<dyn std::future::Future<Output = Result<(), HttpError>> + Send>;

pub(crate) struct HttpGate {
    allowed: Vec<HttpOrigin>,
    denials: Arc<Mutex<Vec<String>>>,
}

impl HttpGate {
    pub(crate) fn new(allowed: Vec<HttpOrigin>) -> Self {
        HttpGate {
            allowed,
            denials: Arc::default(),
        }
    }

    /// Requests refused so far in this call.
    pub(crate) fn denials(&self) -> Vec<String> {
        self.denials.lock().map(|d| d.clone()).unwrap_or_default()
    }

    fn permits(&self, uri: &http::Uri) -> bool {
        let Some(scheme) = uri.scheme_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        let Some(host) = uri.host().map(str::to_ascii_lowercase) else {
            return false;
        };
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return false,
        };
        let port = uri.port_u16().unwrap_or(default_port);
        self.allowed
            .iter()
            .any(|o| o.scheme == scheme && o.host == host && o.port == port)
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: IoFuture,
    ) -> Box<
        dyn std::future::Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>>
            + Send,
    > {
        if !self.permits(request.uri()) {
            let target = format!("HTTP request to {}", request.uri());
            tracing::warn!(target: "berth::plugin", %target, "refused: origin not in grants.http_hosts");
            if let Ok(mut d) = self.denials.lock() {
                d.push(target);
            }
            return Box::new(async { Err(HttpError::HttpRequestDenied) });
        }
        drop(fut);
        Box::new(async move {
            let (response, io) = wasmtime_wasi_http::default_send_request(request, options).await?;
            Ok((
                response.map(BodyExt::boxed_unsync),
                Box::new(io) as IoFuture,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_scheme_host_and_port() {
        let gate = HttpGate::new(vec![HttpOrigin::parse("http://127.0.0.1:3900").unwrap()]);
        let ok: http::Uri = "http://127.0.0.1:3900/bucket/key".parse().unwrap();
        assert!(gate.permits(&ok));
        for bad in [
            "https://127.0.0.1:3900/",
            "http://127.0.0.1:3901/",
            "http://127.0.0.2:3900/",
            "http://127.0.0.1/",
            "/relative",
        ] {
            let uri: http::Uri = bad.parse().unwrap();
            assert!(!gate.permits(&uri), "{bad}");
        }
    }
}
