//! Errors as one line of text, for messages that quote a cause.

/// `e` and its sources, joined by `: `, each source left out when the
/// text so far already says it (wrappers often repeat their source).
pub fn causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}
