//! The contracts' clauses as named, executable checks.
//!
//! The same suite runs against every store — native Rust and Wasm plugins
//! alike — so they are held to one contract. [`check_backend`] holds every
//! backend to the lifecycle's promises the same way. `berth plugin check` prints the
//! [`Report`] as a table (or JSON) and fails on any failed clause.
//!
//! Archives are generated and verified as streams ([`pattern`]), so the
//! multi-GiB clause needs no memory beyond a few buffers.

mod backend;
mod commands;
pub mod pattern;
mod remote;
mod snapshot;
mod words;

pub use backend::{check_backend, BackendUnderTest, Disaster, WORKSPACE_LISTING};
pub use remote::check_remote_client;
pub use snapshot::{check_snapshot, OpenSnapshot};

use std::future::Future;
use std::time::Instant;

use crate::store_error::StoreError;

/// Sizes and concurrency of a conformance run.
#[derive(Debug, Clone)]
pub struct ConformanceOptions {
    /// Size of the medium round trip (default 64 MiB).
    pub medium_size: u64,
    /// Size of the streamed large round trip (default 2 GiB; 0 skips it).
    pub large_size: u64,
    /// Concurrent operations in the concurrency clause (default 8).
    pub concurrency: usize,
    /// Prefix for the ids this run creates, so runs never collide.
    pub id_prefix: String,
}

impl Default for ConformanceOptions {
    fn default() -> Self {
        ConformanceOptions {
            medium_size: 64 << 20,
            large_size: 2 << 30,
            concurrency: 8,
            id_prefix: format!("conf-{:08x}", crate::random_id::random_u64() as u32),
        }
    }
}

/// Outcome of one clause.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClauseResult {
    /// Stable clause name, e.g. `interrupted-upload-keeps-previous`.
    pub clause: &'static str,
    /// What the clause requires.
    pub requirement: &'static str,
    /// Whether the store honoured it.
    pub passed: bool,
    /// Measurements on success, the violation on failure.
    pub detail: String,
    /// Wall time in milliseconds.
    pub millis: u128,
}

/// A whole run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// What was checked.
    pub subject: String,
    /// Which interface: `remote-client`, `snapshot` or `backend`.
    pub interface: &'static str,
    /// Clause results in run order.
    pub results: Vec<ClauseResult>,
    /// Clauses that did not run, with why (a snapshot without persistence
    /// runs none of the persistence clauses). They count neither as passed
    /// nor failed, and the table names them.
    pub not_run: Vec<String>,
}

impl Report {
    fn new(subject: impl Into<String>, interface: &'static str) -> Self {
        Report {
            subject: subject.into(),
            interface,
            results: Vec::new(),
            not_run: Vec::new(),
        }
    }

    /// Whether clauses ran and every one passed (an empty report did not
    /// pass: nothing was checked).
    pub fn passed(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| r.passed)
    }

    /// Names of the failed clauses.
    pub fn failed_clauses(&self) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| !r.passed)
            .map(|r| r.clause)
            .collect()
    }

    /// The result of `clause`, if it ran.
    pub fn clause(&self, clause: &str) -> Option<&ClauseResult> {
        self.results.iter().find(|r| r.clause == clause)
    }

    /// A clause-by-clause table ending in `N passed, N failed`.
    pub fn table(&self) -> String {
        let mut out = if self.interface == "backend" {
            format!(
                "{}: the lifecycle's promises to a backend, clause by clause\n",
                self.subject
            )
        } else {
            format!(
                "{}: the berth:snapshot/{} contract, clause by clause\n",
                self.subject, self.interface
            )
        };
        let width = self
            .results
            .iter()
            .map(|r| r.clause.len())
            .max()
            .unwrap_or(6)
            .max(6);
        out.push_str(&format!(
            "{:<width$}  RESULT  {:>8}  DETAIL\n",
            "CLAUSE", "TIME"
        ));
        for r in &self.results {
            out.push_str(&format!(
                "{:<width$}  {:<6}  {:>6}ms  {}\n",
                r.clause,
                if r.passed { "pass" } else { "FAIL" },
                r.millis,
                r.detail
            ));
        }
        let failed = self.results.iter().filter(|r| !r.passed).count();
        out.push_str(&format!(
            "{} passed, {} failed",
            self.results.len() - failed,
            failed
        ));
        if !self.not_run.is_empty() {
            out.push_str(&format!(", {} not run:", self.not_run.len()));
            for why in &self.not_run {
                out.push_str(&format!("\n  {why}"));
            }
        }
        out.push('\n');
        out
    }

    /// Runs a clause the subject may decline: `Ok(Err(why))` (declined,
    /// say as unsupported) goes to [`Report::not_run`], named in the table
    /// and logged, not among the passes; `Err` is a failure.
    async fn run_optional_clause<F>(
        &mut self,
        clause: &'static str,
        requirement: &'static str,
        check: F,
    ) where
        F: Future<Output = Result<Result<String, String>, String>>,
    {
        let mut declined = None;
        self.run_clause_outcome(clause, requirement, async {
            match check.await {
                Ok(Ok(detail)) => Some(Ok(detail)),
                Ok(Err(why)) => {
                    declined = Some(why);
                    None
                }
                Err(failure) => Some(Err(failure)),
            }
        })
        .await;
        if let Some(why) = declined {
            tracing::info!(clause, why, "conformance clause not run");
            self.not_run.push(format!("{clause}: {why}"));
        }
    }

    async fn run_clause<F>(&mut self, clause: &'static str, requirement: &'static str, check: F)
    where
        F: Future<Output = Result<String, String>>,
    {
        self.run_clause_outcome(clause, requirement, async { Some(check.await) })
            .await;
    }

    /// Runs `check`, recording its result unless it gives none.
    async fn run_clause_outcome<F>(
        &mut self,
        clause: &'static str,
        requirement: &'static str,
        check: F,
    ) where
        F: Future<Output = Option<Result<String, String>>>,
    {
        let start = Instant::now();
        let Some(outcome) = check.await else {
            return;
        };
        let millis = start.elapsed().as_millis();
        tracing::debug!(clause, ok = outcome.is_ok(), millis, "conformance clause");
        let (passed, detail) = match outcome {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        self.results.push(ClauseResult {
            clause,
            requirement,
            passed,
            detail,
            millis,
        });
    }
}

/// Ids outside the grammar, each of which must be refused with
/// `invalid-id`.
pub const INVALID_IDS: &[&str] = &[
    "",
    ".",
    "..",
    "../escape",
    "a/b",
    "/abs",
    "sp ace",
    "nul\0byte",
    "ünïcode",
    "back\\slash",
    // 129 characters: one over the limit.
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
];

/// Requires `result` to be the contract error `want`.
fn expect_storage<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, StoreError>,
    want: &str,
) -> Result<(), String> {
    match result {
        Err(StoreError::Storage(e)) if e.kind() == want => Ok(()),
        Err(e) => Err(format!("{what}: expected {want}, got error: {e}")),
        Ok(v) => Err(format!("{what}: expected {want}, got success ({v:?})")),
    }
}

fn is_kind(e: &StoreError, kind: &str) -> bool {
    matches!(e, StoreError::Storage(s) if s.kind() == kind)
}

fn mib_per_s(bytes: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "∞".into();
    }
    format!("{:.0} MiB/s", bytes as f64 / (1u64 << 20) as f64 / secs)
}

fn human(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} B")
    }
}
