//! Lines for the user: on stderr, or, inside `berth serve`, to the client
//! whose request is running.

/// Whether this process is `berth serve`: lines for the user then go to
/// the client of the request at hand.
static SERVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says `line` to the user: on stderr, or, in `berth serve`, to the client
/// whose request this is (which prints it on its stderr).
pub(crate) fn say(line: &str) {
    if SERVING.load(std::sync::atomic::Ordering::SeqCst) {
        tracing::info!(target: "berth::notice", "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Marks this process as `berth serve`.
pub(crate) fn serving() {
    SERVING.store(true, std::sync::atomic::Ordering::SeqCst);
}
