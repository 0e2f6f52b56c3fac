//! Warnings the library logs while the API handles a request, and lines a
//! program serving the API addresses to the user (target
//! [`NOTICE_TARGET`]: an image pulled, …), relayed to the client that sent
//! the request (headers `berth-warnings`, `berth-notices`), so a command
//! run through a server says what the same command run in-process would.

use std::cell::RefCell;
use std::future::Future;

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::Context;

/// The reply header carrying a request's warnings: a base64 JSON array of
/// lines (`TARGET: MESSAGE field=value …`).
pub const WARNINGS_HEADER: &str = "berth-warnings";

/// The reply header carrying a request's notices: a base64 JSON array of
/// lines for the user, printed as they are.
pub const NOTICES_HEADER: &str = "berth-notices";

/// The `tracing` target of lines for the user (logged at INFO): relayed as
/// notices by [`WarningRelay`].
pub const NOTICE_TARGET: &str = "berth::notice";

/// What a request's task logged for its client.
#[derive(Debug, Default)]
pub(crate) struct Collected {
    pub(crate) warnings: Vec<String>,
    pub(crate) notices: Vec<String>,
}

tokio::task_local! {
    static COLLECTED: RefCell<Collected>;
}

/// Runs `f`, collecting the warnings and notices logged on its task while
/// it runs.
pub(crate) async fn collecting<F: Future>(f: F) -> (F::Output, Collected) {
    COLLECTED
        .scope(RefCell::new(Collected::default()), async move {
            let out = f.await;
            let collected = COLLECTED.with(|c| c.take());
            (out, collected)
        })
        .await
}

/// A `tracing` layer that hands each WARN or ERROR event, and each event
/// of target [`NOTICE_TARGET`], logged while the API handles a request to
/// that request's reply. Add it (with [`WarningRelay::filter`]) to the
/// subscriber of a process that serves the API; elsewhere it does nothing.
///
/// ```
/// use tracing_subscriber::prelude::*;
/// tracing_subscriber::registry()
///     .with(berth_server::WarningRelay.with_filter(berth_server::WarningRelay::filter()))
///     .init();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct WarningRelay;

impl WarningRelay {
    /// The events it needs: WARN and above, and notices.
    pub fn filter() -> tracing_subscriber::filter::FilterFn {
        tracing_subscriber::filter::FilterFn::new(|m: &tracing::Metadata<'_>| {
            *m.level() <= tracing::Level::WARN || m.target() == NOTICE_TARGET
        })
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for WarningRelay {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        let notice = meta.target() == NOTICE_TARGET;
        if !notice && *meta.level() > tracing::Level::WARN {
            return;
        }
        let line = EventText::of(event);
        let _ = COLLECTED.try_with(|c| {
            let mut c = c.borrow_mut();
            if notice {
                c.notices.push(line.message);
            } else {
                c.warnings.push(line.to_string());
            }
        });
    }
}

/// An event as one human line: its message, then its `error` field after
/// a colon, then its other fields in parentheses
/// (`resuming the container failed: no such container (container: abc)`).
/// The CLI prints its log lines this way, and the server relays warnings
/// in this form.
#[derive(Debug, Default, Clone)]
pub struct EventText {
    /// The event's message.
    pub message: String,
    /// Its `error` field, if any.
    pub error: Option<String>,
    /// Its other fields, `name: value`.
    pub fields: Vec<String>,
}

impl EventText {
    /// The text of `event`.
    pub fn of(event: &tracing::Event<'_>) -> Self {
        let mut text = EventText::default();
        event.record(&mut text);
        text
    }
}

impl std::fmt::Display for EventText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(error) = &self.error {
            write!(f, ": {error}")?;
        }
        if !self.fields.is_empty() {
            write!(f, " ({})", self.fields.join(", "))?;
        }
        Ok(())
    }
}

impl Visit for EventText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            "error" => self.error = Some(value.to_string()),
            name => self.fields.push(format!("{name}: {value}")),
        }
    }
}
