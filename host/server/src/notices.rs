//! Warnings the library logs while the API handles a request, relayed to
//! the client that sent it (header `berth-warnings`), so a command run
//! through a server says what the same command run in-process would.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::future::Future;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// The reply header carrying a request's warnings: a base64 JSON array of
/// lines (`TARGET: MESSAGE field=value …`).
pub const WARNINGS_HEADER: &str = "berth-warnings";

tokio::task_local! {
    static NOTICES: RefCell<Vec<String>>;
}

/// Runs `f`, collecting the warnings logged on its task while it runs.
pub(crate) async fn collecting<F: Future>(f: F) -> (F::Output, Vec<String>) {
    NOTICES
        .scope(RefCell::new(Vec::new()), async move {
            let out = f.await;
            let notes = NOTICES.with(|n| n.take());
            (out, notes)
        })
        .await
}

/// A `tracing` layer that hands each WARN or ERROR event logged while the
/// API handles a request to that request's reply. Add it (filtered to
/// WARN) to the subscriber of a process that serves the API; elsewhere it
/// does nothing.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// tracing_subscriber::registry()
///     .with(berth_server::WarningRelay.with_filter(tracing_subscriber::filter::LevelFilter::WARN))
///     .init();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct WarningRelay;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningRelay {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() > tracing::Level::WARN {
            return;
        }
        let mut line = Line::default();
        event.record(&mut line);
        let text = format!(
            "{}: {}{}",
            event.metadata().target(),
            line.message,
            line.fields
        );
        let _ = NOTICES.try_with(|n| n.borrow_mut().push(text));
    }
}

/// An event's message and its other fields, as `fmt` prints them.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}
