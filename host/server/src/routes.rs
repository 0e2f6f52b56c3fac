//! The route table: every endpoint of API v1 once, with what it takes and
//! returns. The router dispatches from it and the OpenAPI document is
//! generated from it, so the two cannot differ.

use std::collections::HashMap;

use http::{Method, StatusCode};

use crate::api;
use crate::api_egress;
use crate::api_history;
use crate::api_pools;
use crate::handlers::{egress, exec, files, forks, history, pools, processes, sandboxes};
use crate::http::ApiError;
use crate::route::{json, lines};
pub(crate) use crate::route::{Call, Handler, Payload, Route};

/// Every endpoint of API v1.
pub(crate) fn table() -> Vec<Route> {
    use Payload::{Bytes, Empty};
    let r = |method: Method,
             path: &'static str,
             summary: &'static str,
             query: &'static [(&'static str, bool, &'static str)],
             request: Payload,
             reply: Payload,
             handler: Handler| Route {
        method,
        path,
        summary,
        query,
        request,
        reply,
        handler,
    };
    const PATH: &[(&str, bool, &str)] = &[("path", true, "Relative to the workspace root.")];
    vec![
        r(Method::GET, "/v1/version", "The API and Berth versions.", &[], Empty, json::<api::Version>(), sandboxes::version),
        r(Method::GET, "/v1/openapi.json", "This document.", &[], Empty, Bytes("application/json"), sandboxes::openapi),
        r(Method::GET, "/v1/defaults", "The bounds new sandboxes get where their settings say nothing (the server's config.toml over Berth's own).", &[], Empty, json::<api::HostDefaults>(), sandboxes::defaults),
        r(Method::GET, "/v1/backends", "The backend kinds this server creates, with their settings.", &[], Empty, json::<Vec<api::BackendKind>>(), sandboxes::backends),
        r(Method::GET, "/v1/sandboxes", "List sandboxes.", &[], Empty, json::<Vec<api::SandboxSummary>>(), sandboxes::list),
        r(Method::POST, "/v1/sandboxes", "Create a sandbox (and start it, unless `start` is false).", &[], json::<api::CreateSandbox>(), json::<api::SandboxRecord>(), sandboxes::create),
        r(Method::GET, "/v1/pools", "List warm pools: each one's template, size, and members ready in this server.", &[], Empty, json::<Vec<api_pools::Pool>>(), pools::list),
        r(Method::POST, "/v1/pools", "Make a warm pool: the server keeps `size` sandboxes of the template started and open, refilled in the background; a create naming `from_pool` claims one.", &[], json::<api_pools::CreatePool>(), json::<api_pools::Pool>(), pools::create),
        r(Method::GET, "/v1/pools/{pool}", "One warm pool.", &[], Empty, json::<api_pools::Pool>(), pools::get),
        r(Method::DELETE, "/v1/pools/{pool}", "Remove a warm pool: every member shut down and forgotten (claimed sandboxes are not members).", &[], Empty, json::<api_pools::PoolRemoved>(), pools::remove),
        r(Method::GET, "/v1/sandboxes/{name}", "A sandbox's record (`berth inspect`).", &[], Empty, json::<api::SandboxRecord>(), sandboxes::inspect),
        r(Method::DELETE, "/v1/sandboxes/{name}", "Shut a sandbox down, delete the snapshots Berth made for it (unless `keep_snapshot`) and forget it.", &[("keep_snapshot", false, "Persist the workspace first and keep its snapshot."), ("force", false, "Forget it even if shutting down or deleting fails.")], Empty, json::<api::Done>(), sandboxes::remove),
        r(Method::POST, "/v1/sandboxes/{name}/start", "Start: reuse, rebuild or restore the workspace.", &[], Empty, json::<api::Started>(), sandboxes::start),
        r(Method::POST, "/v1/sandboxes/{name}/stop", "Persist the workspace into its snapshot (destroys nothing).", &[], Empty, json::<api::SandboxRecord>(), sandboxes::stop),
        r(Method::POST, "/v1/sandboxes/{name}/fork", "Fork: a new sandbox starting from one of this one's kept generations (deduplicated snapshots).", &[], json::<api::ForkBody>(), json::<api::SandboxRecord>(), sandboxes::fork),
        r(Method::POST, "/v1/sandboxes/{name}/forks", "Fork into many: `count` new sandboxes (`prefix1` …) made and started in parallel from one generation — by default a checkpoint of the running workspace written now (a live fork; the parent keeps running). All or none: a child that fails removes the others.", &[], json::<api_pools::ForksBody>(), json::<api_pools::Forked>(), forks::forks),
        r(Method::GET, "/v1/sandboxes/{name}/history", "The kept generations of a deduplicated snapshot, oldest first: when, why (a command's checkpoint, a named checkpoint, a rewind, a stop) and what each changed.", &[], Empty, json::<api_history::History>(), history::history),
        r(Method::GET, "/v1/sandboxes/{name}/diff", "The paths two kept generations differ by, read from their indexes (nothing else is downloaded).", &[("from", true, "The older generation."), ("to", true, "The newer generation.")], Empty, json::<api_history::Diff>(), history::diff),
        r(Method::POST, "/v1/sandboxes/{name}/checkpoint", "Write a generation of the running workspace now (it keeps running).", &[], json::<api_history::CheckpointBody>(), json::<api::Checkpointed>(), history::checkpoint),
        r(Method::POST, "/v1/sandboxes/{name}/rewind", "Make the workspace a kept generation; the workspace as it was is saved first as a new generation (rewind to it to undo). Background processes do not survive it.", &[], json::<api_history::RewindBody>(), json::<api_history::Rewound>(), history::rewind),
        r(Method::POST, "/v1/sandboxes/{name}/shutdown", "Destroy the running instance (the snapshot stays).", &[], Empty, json::<api::SandboxRecord>(), sandboxes::shutdown),
        r(Method::GET, "/v1/sandboxes/{name}/archive", "The workspace as a tar stream.", &[], Empty, Bytes("application/x-tar"), files::persist),
        r(Method::PUT, "/v1/sandboxes/{name}/archive", "Extract a tar stream into the workspace, after all of it passed the hydrate policy.", &[], Bytes("application/x-tar"), json::<api::Written>(), files::hydrate),
        r(Method::GET, "/v1/sandboxes/{name}/egress", "The egress policy and the log of connections (host, port, bytes, allowed or denied and by which rule).", &[], Empty, json::<api_egress::EgressReport>(), egress::get),
        r(Method::PUT, "/v1/sandboxes/{name}/egress", "Replace the egress policy; it counts from the next connection.", &[], json::<api_egress::EgressRules>(), json::<api_egress::EgressReport>(), egress::put),
        r(Method::GET, "/v1/sandboxes/{name}/ports", "Where published ports are reached on the server's host.", &[], Empty, json::<Vec<api::Port>>(), sandboxes::ports),
        r(Method::POST, "/v1/sandboxes/{name}/exec", "Run a command: its result, or (`stream`) its output as it is produced. Closing the reply stops it.", &[], json::<api::ExecBody>(), lines::<api::ExecLine>(), exec::exec),
        r(Method::POST, "/v1/execs/{id}/stdin", "Stream bytes to an interactive exec's stdin; its end closes stdin unless `keep_open`.", &[("keep_open", false, "Leave stdin open after this body.")], Bytes("application/octet-stream"), json::<api::Written>(), exec::stdin),
        r(Method::POST, "/v1/execs/{id}/resize", "Resize an exec's terminal.", &[], json::<api::ResizeBody>(), json::<api::Done>(), exec::resize),
        r(Method::POST, "/v1/execs/{id}/signal", "Send an exec's command a signal.", &[], json::<api::SignalBody>(), json::<api::Done>(), exec::signal),
        r(Method::GET, "/v1/sandboxes/{name}/processes", "List background processes.", &[], Empty, json::<Vec<api::Process>>(), processes::list),
        r(Method::POST, "/v1/sandboxes/{name}/processes", "Start a background process.", &[], json::<api::DetachBody>(), json::<api::Process>(), processes::detach),
        r(Method::GET, "/v1/sandboxes/{name}/processes/{id}", "One background process.", &[], Empty, json::<api::Process>(), processes::get),
        r(Method::GET, "/v1/sandboxes/{name}/processes/{id}/logs", "What its log ring keeps, as exec events; with `follow`, until it exits.", &[("follow", false, "Go on until it exits."), ("tail", false, "Start at the last N lines of each stream."), ("framing", false, "`json-lines` (the default) or `binary`: as exec's `framing`.")], Empty, lines::<api::ExecLine>(), processes::logs),
        r(Method::POST, "/v1/sandboxes/{name}/processes/{id}/kill", "Send it a signal.", &[], json::<api::SignalBody>(), json::<api::Done>(), processes::kill),
        r(Method::POST, "/v1/sandboxes/{name}/processes/{id}/wait", "Wait for it to exit.", &[], Empty, json::<api::Waited>(), processes::wait),
        r(Method::GET, "/v1/sandboxes/{name}/files/content", "A file's bytes, streamed.", PATH, Empty, Bytes("application/octet-stream"), files::read),
        r(Method::PUT, "/v1/sandboxes/{name}/files/content", "Write a file from the body (needs Content-Length), atomically.", &[("path", true, "Relative to the workspace root."), ("mode", false, "Permission bits, octal (default 644).")], Bytes("application/octet-stream"), json::<api::Written>(), files::write),
        r(Method::GET, "/v1/sandboxes/{name}/files/stat", "Describe a path (symlinks not followed).", PATH, Empty, json::<api::FileEntry>(), files::stat),
        r(Method::GET, "/v1/sandboxes/{name}/files/list", "A directory's entries.", PATH, Empty, json::<Vec<api::FileEntry>>(), files::list),
        r(Method::DELETE, "/v1/sandboxes/{name}/files", "Remove a path.", &[("path", true, "Relative to the workspace root."), ("recursive", false, "Remove a directory and everything in it.")], Empty, json::<api::Done>(), files::remove),
        r(Method::POST, "/v1/sandboxes/{name}/files/mkdir", "Make a directory.", &[("path", true, "Relative to the workspace root."), ("parents", false, "Make missing parents too.")], Empty, json::<api::Done>(), files::make_dir),
    ]
}

/// The route matching `method` and `path`, with the path's parameters;
/// or the reply that none does.
pub(crate) fn find<'t>(
    table: &'t [Route],
    method: &Method,
    path: &str,
) -> Result<(&'t Route, Vec<String>), ApiError> {
    let mut path_known = false;
    for route in table {
        if let Some(params) = matches(route.path, path) {
            path_known = true;
            if route.method == method {
                return Ok((route, params));
            }
        }
    }
    Err(if path_known {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "bad_request",
            format!("{method} is not allowed on {path}"),
        )
    } else {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_such_endpoint",
            format!("no endpoint {path}; see /v1/openapi.json"),
        )
    })
}

fn matches(pattern: &str, path: &str) -> Option<Vec<String>> {
    let mut params = Vec::new();
    let mut want = pattern.split('/');
    let mut got = path.split('/');
    loop {
        match (want.next(), got.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(g)) if w.starts_with('{') => {
                if g.is_empty() {
                    return None;
                }
                params.push(percent_decode(g)?);
            }
            (Some(w), Some(g)) if w == g => {}
            _ => return None,
        }
    }
}

/// `a%20b` → `a b`, `+` kept; `None` for a bad escape or bad UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A query string's pairs.
pub(crate) fn parse_query(query: Option<&str>) -> Result<HashMap<String, String>, ApiError> {
    let mut pairs = HashMap::new();
    for part in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, "1"));
        let decode = |s: &str| {
            percent_decode(&s.replace('+', " "))
                .ok_or_else(|| ApiError::bad_request(format!("bad escape in the query: {part:?}")))
        };
        pairs.insert(decode(k)?, decode(v)?);
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_their_patterns_and_nothing_else() {
        assert_eq!(
            matches("/v1/sandboxes/{name}/exec", "/v1/sandboxes/box/exec"),
            Some(vec!["box".to_string()])
        );
        assert_eq!(matches("/v1/sandboxes/{name}", "/v1/sandboxes/"), None);
        assert_eq!(matches("/v1/sandboxes/{name}", "/v1/sandboxes/a/b"), None);
        assert_eq!(
            matches("/v1/sandboxes/{name}", "/v1/sandboxes/a%2Fb"),
            Some(vec!["a/b".to_string()])
        );
        assert_eq!(matches("/v1/sandboxes/{name}", "/v1/sandboxes/%zz"), None);
    }

    #[test]
    fn no_two_routes_share_a_method_and_path() {
        let t = table();
        let mut seen = std::collections::HashSet::new();
        for r in &t {
            assert!(
                seen.insert((r.method.clone(), r.path)),
                "{} {}",
                r.method,
                r.path
            );
        }
    }

    #[test]
    fn queries_decode() {
        let q = parse_query(Some("path=a%20b/c+d&recursive")).unwrap();
        assert_eq!(q["path"], "a b/c d");
        assert_eq!(q["recursive"], "1");
        assert!(parse_query(Some("path=%G0")).is_err());
    }
}
