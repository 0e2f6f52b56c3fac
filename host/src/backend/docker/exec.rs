//! Commands in the container without the agent: one Docker exec each,
//! output streamed under caps, timeouts enforced in the container.

use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use futures::StreamExt;

use super::{api, op, DockerBackend};
use crate::backend::exec::{CappedBuffer, TIMEOUT_EXIT_CODE};
use crate::backend::{BackendError, ExecRequest, ExecResult, OutputStream};

impl DockerBackend {
    /// Runs a short helper command (no timeout semantics beyond `limit`).
    pub(super) async fn helper(
        &self,
        cmd: Vec<String>,
        limit: Duration,
    ) -> Result<ExecResult, BackendError> {
        let mut req = ExecRequest::new(String::new(), limit);
        req.stdout_cap = 64 * 1024;
        req.stderr_cap = 64 * 1024;
        self.run_exec(cmd, &req, false).await
    }

    /// Runs `cmd` and collects its output. `in_workspace` runs it in the
    /// workspace root (user commands) rather than `/` (helpers).
    pub(super) async fn run_exec(
        &self,
        cmd: Vec<String>,
        request: &ExecRequest,
        in_workspace: bool,
    ) -> Result<ExecResult, BackendError> {
        let started = Instant::now();
        let env: Vec<String> = request
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let exec = self
            .docker
            .create_exec(
                &self.target(),
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    env: Some(env),
                    cmd: Some(cmd),
                    working_dir: in_workspace.then(|| self.state.workspace_root.clone()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| api("creating the exec", e))?;
        let created = started.elapsed();
        let output = match self
            .docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| api("starting the exec", e))?
        {
            StartExecResults::Attached { output, .. } => output,
            StartExecResults::Detached => {
                return Err(op("starting the exec", "the daemon detached the exec"))
            }
        };
        let mut stdout = CappedBuffer::new(request.stdout_cap);
        let mut stderr = CappedBuffer::new(request.stderr_cap);
        let callback = request.on_output.clone();
        let collect = async {
            let mut output = output;
            while let Some(item) = output.next().await {
                match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        if let Some(cb) = &callback {
                            cb(OutputStream::Stdout, &message);
                        }
                        stdout.push(&message);
                    }
                    Ok(LogOutput::StdErr { message }) => {
                        if let Some(cb) = &callback {
                            cb(OutputStream::Stderr, &message);
                        }
                        stderr.push(&message);
                    }
                    Ok(LogOutput::StdIn { .. }) => {}
                    Err(e) => return Err(api("reading the exec output", e)),
                }
            }
            Ok(())
        };
        let timed_out = match tokio::time::timeout(request.timeout, collect).await {
            Ok(r) => {
                r?;
                false
            }
            Err(_) => true,
        };
        let output_done = started.elapsed();
        let exit_code = if timed_out {
            TIMEOUT_EXIT_CODE
        } else {
            let inspect = self
                .docker
                .inspect_exec(&exec.id)
                .await
                .map_err(|e| api("inspecting the exec", e))?;
            inspect.exit_code.unwrap_or(-1) as i32
        };
        // Where an exec's time goes, for `RUST_LOG=berth=debug`: daemon
        // round trips (create, inspect) against the command's own run
        // (start until the output stream ends).
        tracing::debug!(
            create_ms = created.as_secs_f64() * 1e3,
            start_to_output_end_ms = (output_done - created).as_secs_f64() * 1e3,
            inspect_ms = (started.elapsed() - output_done).as_secs_f64() * 1e3,
            "exec timings"
        );
        let (stdout, stdout_dropped) = stdout.finish();
        let (mut stderr, stderr_dropped) = stderr.finish();
        self.explain_oom(exit_code, timed_out, &mut stderr);
        if timed_out {
            stderr.push_str(&format!(
                "\ncommand timed out after {:?} and was killed",
                request.timeout
            ));
        }
        Ok(ExecResult {
            exit_code,
            stdout,
            stderr,
            truncated: stdout_dropped + stderr_dropped > 0,
            stdout_dropped,
            stderr_dropped,
            timed_out,
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }

    /// Says, after a SIGKILL under a memory limit, that the out-of-memory
    /// killer most likely ended the command.
    pub(super) fn explain_oom(&self, exit_code: i32, timed_out: bool, stderr: &mut String) {
        if exit_code == 137 && !timed_out {
            if let Some(limit) = self.state.memory_size_bytes {
                stderr.push_str(&format!(
                    "\nberth: the command was killed (SIGKILL, exit 137); with a memory limit of {limit} bytes \
                     this is most likely the out-of-memory killer: raise the sandbox's memory limit"
                ));
            }
        }
    }
}
