//! Where the CLI's log lines go and how they read.
//!
//! By default (no `RUST_LOG`) warnings and errors are short human lines,
//! `berth: warning: what happened: why (detail: value)`, with no colour,
//! no module path and no timestamp (`berth serve` adds a UTC time, its
//! log being a file). With `RUST_LOG` set, tracing's own format at the
//! levels asked for; colour only when stderr is a terminal.

use std::io::IsTerminal;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// Installs the process's subscriber; `serving` for `berth serve`.
pub fn init(serving: bool) {
    let terminal = std::io::stderr().is_terminal();
    match tracing_subscriber::EnvFilter::try_from_default_env() {
        Ok(filter) => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(terminal)
                    .with_filter(filter),
            )
            // `berth serve` hands the warnings of a request to its client.
            .with(berth_server::WarningRelay.with_filter(berth_server::WarningRelay::filter()))
            .init(),
        Err(_) => tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .event_format(Human {
                        timestamps: serving,
                    })
                    .with_filter(tracing_subscriber::filter::LevelFilter::WARN),
            )
            .with(berth_server::WarningRelay.with_filter(berth_server::WarningRelay::filter()))
            .init(),
    }
}

/// One line per event: `berth: warning: message: error (field: value)`.
struct Human {
    timestamps: bool,
}

impl<S, N> FormatEvent<S, N> for Human
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if self.timestamps {
            write!(writer, "{} ", utc_now())?;
        }
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error: ",
            tracing::Level::WARN => "warning: ",
            tracing::Level::INFO => "",
            tracing::Level::DEBUG => "debug: ",
            tracing::Level::TRACE => "trace: ",
        };
        let text = berth_server::EventText::of(event);
        writeln!(writer, "berth: {level}{text}")
    }
}

/// Now as `2026-12-04T17:32:07Z`.
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn dates_from_day_counts() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_791), (2026, 12, 4));
        // Day by day over four centuries, the date only ever moves forward
        // by one day.
        let mut previous = civil_from_days(-1);
        for z in 0..146_097 {
            let date = civil_from_days(z);
            assert!(date > previous, "{z}: {date:?} after {previous:?}");
            let (y, m, d) = date;
            assert!(
                (1..=12).contains(&m) && (1..=31).contains(&d),
                "{y}-{m}-{d}"
            );
            previous = date;
        }
    }
}
