//! Running commands in the sandbox a backend clause drives, with errors
//! as the report's text.

use std::time::Duration;

use crate::backend::ExecRequest;
use crate::sandbox::Sandbox;

/// `error` and its sources, after `what`.
pub(super) fn chain(what: &str, error: &dyn std::error::Error) -> String {
    let mut out = format!("{what}: {error}");
    let mut source = error.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// Runs `command` with a minute's timeout.
pub(super) async fn exec(
    sandbox: &Sandbox,
    command: &str,
) -> Result<crate::backend::ExecResult, String> {
    sandbox
        .exec(ExecRequest::new(command, Duration::from_secs(60)))
        .await
        .map_err(|e| chain(&format!("exec {command:?}"), &e))
}

/// Runs `command`, which must succeed; returns its stdout.
pub(super) async fn run(sandbox: &Sandbox, command: &str) -> Result<String, String> {
    let r = exec(sandbox, command).await?;
    if r.exit_code != 0 {
        return Err(format!(
            "{command:?} exited {}: {}",
            r.exit_code,
            r.stderr_text().trim()
        ));
    }
    Ok(r.stdout_text().into_owned())
}

/// Runs `command`, which must succeed and print exactly `want`.
pub(super) async fn expect_out(sandbox: &Sandbox, command: &str, want: &str) -> Result<(), String> {
    let got = run(sandbox, command).await?;
    if got == want {
        Ok(())
    } else {
        Err(format!("{command:?}: expected {want:?}, got {got:?}"))
    }
}
