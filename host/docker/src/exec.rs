//! Commands in the container without the agent: one Docker exec each,
//! output streamed as it comes, stdin and terminals through the exec's
//! own attach, timeouts and cancels enforced by killing the command's
//! process group inside the container.

use std::pin::Pin;
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::{api, op, DockerBackend};
use berth::backend::exec::TIMEOUT_EXIT_CODE;
use berth::backend::{
    BackendError, ExecDriver, ExecEvent, ExecExit, ExecInput, ExecProcess, ExecRequest, ExecResult,
    PtySize,
};

/// How long output may go on after a kill before it is abandoned.
const KILL_GRACE: Duration = Duration::from_secs(2);

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;

impl DockerBackend {
    /// Runs a short helper command (no timeout semantics beyond `limit`).
    pub(super) async fn helper(
        &self,
        cmd: Vec<String>,
        limit: Duration,
    ) -> Result<ExecResult, BackendError> {
        let req = ExecRequest::new(String::new(), limit).caps(64 * 1024, 64 * 1024);
        start_exec(&self.docker, &self.target(), cmd, &req, None, None, None)
            .await?
            .collect(req.stdout_cap, req.stderr_cap, req.tail_kept)
            .await
    }

    /// Starts a user command as one exec in the workspace root. The exec's
    /// shell leads its own process group and writes its id to a pid file,
    /// which a timeout, a cancel or a signal aims at.
    pub(super) async fn spawn_plain(
        &self,
        request: &ExecRequest,
    ) -> Result<ExecProcess, BackendError> {
        let pidfile = format!("/tmp/.berth-exec-{:x}", berth::random_id::random_u64());
        // The shell leads the process group and removes the pid file
        // itself, so a normal exec costs no extra round trip; it runs the
        // command line in a shell of its own, or the argv in a subshell
        // that `exec`s it (a program, never a builtin of that name).
        let run = if request.argv.is_some() {
            "p=$1; shift; echo $$ > \"$p\"; (exec \"$@\"); rc=$?; rm -f \"$p\"; exit $rc"
        } else {
            "echo $$ > \"$1\"; sh -c \"$2\"; rc=$?; rm -f \"$1\"; exit $rc"
        };
        let mut cmd = vec![
            "sh".to_string(),
            "-c".to_string(),
            run.to_string(),
            "berth".to_string(),
            pidfile.clone(),
        ];
        match &request.argv {
            Some(_) => cmd.extend(request.words()?),
            None => cmd.push(request.command.clone()),
        }
        start_exec(
            &self.docker,
            &self.target(),
            cmd,
            request,
            Some(self.state.workspace_root.clone()),
            Some(pidfile),
            self.state.memory_size_bytes.map(|b| b as u64),
        )
        .await
    }
}

/// Creates and starts an exec, and drives it on a task.
async fn start_exec(
    docker: &Docker,
    container: &str,
    cmd: Vec<String>,
    request: &ExecRequest,
    working_dir: Option<String>,
    pidfile: Option<String>,
    memory_limit: Option<u64>,
) -> Result<ExecProcess, BackendError> {
    let env: Vec<String> = request
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let attach_stdin = request.stdin || request.pty.is_some();
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(attach_stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(request.pty.is_some()),
                env: Some(env),
                cmd: Some(cmd),
                working_dir,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| api("creating the exec", e))?;
    let (output, input) = match docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| api("starting the exec", e))?
    {
        StartExecResults::Attached { output, input } => (output, input),
        StartExecResults::Detached => {
            return Err(op("starting the exec", "the daemon detached the exec"))
        }
    };
    if let Some(size) = request.pty {
        resize(docker, &exec.id, size).await;
    }
    let (process, driver) = ExecProcess::channel();
    tokio::spawn(drive(
        Exec {
            docker: docker.clone(),
            container: container.to_string(),
            id: exec.id,
            pidfile,
            timeout: request.timeout,
            memory_limit,
        },
        attach_stdin.then_some(input),
        output,
        driver,
    ));
    Ok(process)
}

/// One running exec.
struct Exec {
    docker: Docker,
    container: String,
    id: String,
    pidfile: Option<String>,
    timeout: Duration,
    memory_limit: Option<u64>,
}

type Stdin = Option<Pin<Box<dyn AsyncWrite + Send>>>;

impl Exec {
    /// Sends `signal` to the command's process group; for SIGKILL, stops
    /// then kills it round after round, so a loop that forks cannot outrun
    /// one kill. Shell builtins only: a command that filled the pids limit
    /// leaves no room to fork helpers.
    async fn signal_group(&self, signal: i32) {
        let Some(pidfile) = &self.pidfile else { return };
        let script = if signal == libc::SIGKILL {
            format!(
                "read pg < '{pidfile}' || exit 0; i=0; while [ $i -lt 200 ]; do \
                 kill -STOP -$pg 2>/dev/null; kill -9 -$pg 2>/dev/null || break; i=$((i+1)); done; \
                 rm -f '{pidfile}'"
            )
        } else {
            format!("read pg < '{pidfile}' || exit 0; kill -{signal} -$pg 2>/dev/null")
        };
        let done = run_quietly(
            &self.docker,
            &self.container,
            vec!["sh".into(), "-c".into(), script],
        );
        if let Err(e) = tokio::time::timeout(Duration::from_secs(10), done).await {
            tracing::warn!(error = %e, "signalling a command's group timed out");
        }
    }
}

/// Runs a command to its end, ignoring its output.
async fn run_quietly(docker: &Docker, container: &str, cmd: Vec<String>) {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(cmd),
                ..Default::default()
            },
        )
        .await;
    let Ok(exec) = created else { return };
    if let Ok(StartExecResults::Attached { mut output, .. }) =
        docker.start_exec(&exec.id, None).await
    {
        while output.next().await.is_some() {}
    }
}

async fn drive(exec: Exec, mut stdin: Stdin, mut output: Output, driver: ExecDriver) {
    let started = Instant::now();
    let ExecDriver { events, mut input } = driver;
    let deadline = tokio::time::Instant::now() + exec.timeout;
    let mut input_open = true;
    let mut timed_out = false;
    loop {
        tokio::select! {
            item = output.next() => {
                let event = match item {
                    Some(Ok(item)) => match event_of(item) {
                        Some(event) => event,
                        None => continue,
                    },
                    Some(Err(e)) => {
                        let _ = events.send(Err(api("reading the exec output", e))).await;
                        return;
                    }
                    None => break,
                };
                if events.send(Ok(event)).await.is_err() {
                    exec.signal_group(libc::SIGKILL).await;
                    return;
                }
            }
            msg = input.recv(), if input_open => match msg {
                None => input_open = false,
                Some(ExecInput::Stdin(bytes)) => {
                    let failed = match stdin.as_mut() {
                        Some(w) => w.write_all(&bytes).await.and(w.flush().await).is_err(),
                        None => false,
                    };
                    if failed {
                        // The command closed its stdin: the rest is dropped.
                        stdin = None;
                    }
                }
                Some(ExecInput::CloseStdin) => {
                    if let Some(mut w) = stdin.take() {
                        let _ = w.shutdown().await;
                    }
                }
                Some(ExecInput::Resize(size)) => resize(&exec.docker, &exec.id, size).await,
                Some(ExecInput::Signal(signal)) => exec.signal_group(signal).await,
            },
            _ = events.closed() => {
                exec.signal_group(libc::SIGKILL).await;
                return;
            }
            _ = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                break;
            }
        }
    }
    if timed_out {
        exec.signal_group(libc::SIGKILL).await;
        // What the command printed up to its kill is kept.
        let _ = tokio::time::timeout(KILL_GRACE, async {
            while let Some(Ok(item)) = output.next().await {
                let Some(event) = event_of(item) else {
                    continue;
                };
                if events.send(Ok(event)).await.is_err() {
                    return;
                }
            }
        })
        .await;
    }
    let exit_code = if timed_out {
        TIMEOUT_EXIT_CODE
    } else {
        match exec.docker.inspect_exec(&exec.id).await {
            Ok(inspect) => inspect.exit_code.unwrap_or(-1) as i32,
            Err(e) => {
                let _ = events.send(Err(api("inspecting the exec", e))).await;
                return;
            }
        }
    };
    let mut exit = ExecExit::new(exit_code, timed_out, started.elapsed());
    if timed_out {
        exit.notes.push(format!(
            "command timed out after {:?} and was killed",
            exec.timeout
        ));
    }
    if let Some(note) = oom_note(exit_code, timed_out, exec.memory_limit) {
        exit.notes.push(note);
    }
    let _ = events.send(Ok(ExecEvent::Exit(exit))).await;
}

/// A chunk of an exec's output as an event (`None`: an echo of stdin).
fn event_of(item: LogOutput) -> Option<ExecEvent> {
    match item {
        LogOutput::StdOut { message } | LogOutput::Console { message } => {
            Some(ExecEvent::Stdout(message))
        }
        LogOutput::StdErr { message } => Some(ExecEvent::Stderr(message)),
        LogOutput::StdIn { .. } => None,
    }
}

/// Tells an exec's terminal its size (a failure leaves the old size).
async fn resize(docker: &Docker, exec_id: &str, size: PtySize) {
    let _ = docker
        .resize_exec(
            exec_id,
            bollard::query_parameters::ResizeExecOptions {
                h: size.rows as i32,
                w: size.cols as i32,
            },
        )
        .await;
}

/// Says, after a SIGKILL under a memory limit, that the out-of-memory
/// killer most likely ended the command.
pub(super) fn oom_note(
    exit_code: i32,
    timed_out: bool,
    memory_limit: Option<u64>,
) -> Option<String> {
    let limit = memory_limit?;
    (exit_code == 137 && !timed_out).then(|| {
        format!(
            "berth: the command was killed (SIGKILL, exit 137); with a memory limit of {limit} bytes \
             this is most likely the out-of-memory killer: raise the sandbox's memory limit"
        )
    })
}
