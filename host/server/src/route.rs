//! What a route is: the matched request a handler gets, the handler's
//! type, and one endpoint's description. The table (`routes`), the
//! handlers and the OpenAPI document all name these; none of them owns it.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use http::{HeaderMap, Method};
use schemars::{JsonSchema, Schema, SchemaGenerator};

use crate::http::{ApiError, Reply, RequestBody};
use crate::Inner;

/// A matched request.
pub(crate) struct Call {
    /// The path's `{…}` parts, in order.
    pub(crate) params: Vec<String>,
    /// The query string's pairs (percent-decoded).
    pub(crate) query: HashMap<String, String>,
    /// The request's headers.
    pub(crate) headers: HeaderMap,
    /// The request's body.
    pub(crate) body: RequestBody,
}

impl Call {
    /// The `i`th path parameter.
    pub(crate) fn param(&self, i: usize) -> &str {
        self.params.get(i).map(String::as_str).unwrap_or("")
    }

    /// A required query parameter.
    pub(crate) fn query(&self, name: &str) -> Result<&str, ApiError> {
        self.query.get(name).map(String::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("the query parameter {name:?} is missing"))
        })
    }

    /// A yes/no query parameter (`1`, `true`, `yes`); no when absent.
    pub(crate) fn flag(&self, name: &str) -> bool {
        self.query
            .get(name)
            .is_some_and(|v| matches!(v.as_str(), "1" | "true" | "yes"))
    }

    /// A number query parameter.
    pub(crate) fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.query
            .get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::bad_request(format!("the query parameter {name:?} is not a number"))
                })
            })
            .transpose()
    }
}

pub(crate) type Handler = fn(Arc<Inner>, Call) -> BoxFuture<'static, Result<Reply, ApiError>>;

/// What a request or reply body is.
#[derive(Clone, Copy)]
pub(crate) enum Payload {
    /// Nothing.
    Empty,
    /// A JSON document of a schema.
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// Newline-delimited JSON documents of a schema, streamed.
    Lines(fn(&mut SchemaGenerator) -> Schema),
    /// Bytes of a media type, streamed.
    Bytes(&'static str),
}

pub(crate) fn json<T: JsonSchema>() -> Payload {
    Payload::Json(|g| g.subschema_for::<T>())
}

pub(crate) fn lines<T: JsonSchema>() -> Payload {
    Payload::Lines(|g| g.subschema_for::<T>())
}

/// One endpoint.
pub(crate) struct Route {
    pub(crate) method: Method,
    /// The path, with `{name}` parts.
    pub(crate) path: &'static str,
    /// What it does, in one line.
    pub(crate) summary: &'static str,
    /// Its query parameters: name, required, description.
    pub(crate) query: &'static [(&'static str, bool, &'static str)],
    pub(crate) request: Payload,
    pub(crate) reply: Payload,
    pub(crate) handler: Handler,
}
