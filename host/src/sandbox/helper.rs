//! Running Berth's helper (`berth-agent fs …`, `berth-agent proc …`) in a
//! sandbox through its backend, and reading its answers: exit codes into
//! typed errors, JSON lines into records.

use std::time::Duration;

use crate::backend::{ExecProcess, ExecRequest, ExecResult, HelperCall, SandboxHelper};

use super::{Sandbox, SandboxError};

/// How long a short helper operation (stat, list, kill, …) may take.
pub(super) const SHORT: Duration = Duration::from_secs(60);
/// How long a streamed helper operation (a file's contents, a tree, logs)
/// may take.
pub(super) const STREAMED: Duration = Duration::from_secs(24 * 3600);
/// The most a short operation's answer may hold.
pub(super) const ANSWER_CAP: usize = 16 << 20;

impl Sandbox {
    /// The helper, or why there is none here.
    pub(super) async fn sandbox_helper(&self) -> Result<SandboxHelper, SandboxError> {
        if !self.running {
            return Err(SandboxError::NotStarted);
        }
        Ok(self.backend.helper().await?)
    }

    /// Starts `program <group> <dir> <args…>`; `group` is `fs` (whose dir
    /// is the workspace root) or `proc` (the run directory).
    pub(super) async fn start_helper(
        &self,
        group: &str,
        args: &[&str],
        timeout: Duration,
        stdin: bool,
    ) -> Result<ExecProcess, SandboxError> {
        let helper = self.sandbox_helper().await?;
        let dir = if group == "fs" {
            &helper.workspace_root
        } else {
            &helper.run_dir
        };
        // As words: no shell in the sandbox is needed, nor any quoting.
        let mut words = vec![helper.program.clone(), group.to_string(), dir.clone()];
        words.extend(args.iter().map(|a| a.to_string()));
        let mut request = ExecRequest::program(words, timeout);
        if group != "fs" {
            self.ensure_egress().await?;
        }
        request.env = self.command_environment();
        request.helper = Some(if group == "fs" {
            HelperCall::Files
        } else {
            HelperCall::Processes
        });
        if stdin {
            request = request.with_stdin();
        }
        Ok(self.backend.spawn(request).await?)
    }

    /// Runs a short helper operation and returns its output, or the typed
    /// error its exit code names.
    pub(super) async fn run_helper(
        &self,
        group: &str,
        args: &[&str],
        subject: &str,
    ) -> Result<ExecResult, SandboxError> {
        let result = self
            .start_helper(group, args, SHORT, false)
            .await?
            .collect(ANSWER_CAP, 64 * 1024, 0)
            .await?;
        if result.exit_code == 0 {
            Ok(result)
        } else {
            Err(helper_failure(
                &format!("{group} {}", args.first().unwrap_or(&"")),
                subject,
                result.exit_code,
                &result.stderr_text(),
            ))
        }
    }
}

/// The error a helper's exit code and message name.
pub(super) fn helper_failure(
    operation: &str,
    subject: &str,
    code: i32,
    stderr: &str,
) -> SandboxError {
    // "berth-agent fs: read a/b: why" / "berth-agent proc: kill: why"
    let line = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let reason = line
        .strip_prefix("berth-agent fs: ")
        .or_else(|| line.strip_prefix("berth-agent proc: "))
        .and_then(|rest| rest.split_once(": ").map(|(_, why)| why))
        .unwrap_or(line)
        .trim()
        .to_string();
    match code {
        3 if operation.starts_with("proc") => SandboxError::NotFound {
            what: format!("background process {subject:?}"),
        },
        3 => SandboxError::NotFound {
            what: subject.to_string(),
        },
        4 => SandboxError::PathRefused {
            path: subject.to_string(),
            reason,
        },
        5 => SandboxError::ProcessRunning {
            id: subject.to_string(),
        },
        6 => SandboxError::ProcessExited {
            id: subject.to_string(),
        },
        _ => SandboxError::Helper {
            operation: format!("{operation} {subject}"),
            message: if reason.is_empty() {
                format!("the helper exited with {code}")
            } else {
                reason
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_become_typed_errors() {
        let refused = helper_failure(
            "fs read",
            "etc/passwd",
            4,
            "berth-agent fs: read etc/passwd: it leads outside the workspace\n",
        );
        assert!(
            matches!(&refused, SandboxError::PathRefused { reason, .. } if reason == "it leads outside the workspace"),
            "{refused:?}"
        );
        assert!(matches!(
            helper_failure("fs stat", "x", 3, ""),
            SandboxError::NotFound { .. }
        ));
        assert!(matches!(
            helper_failure("proc start", "web", 5, ""),
            SandboxError::ProcessRunning { .. }
        ));
    }
}
