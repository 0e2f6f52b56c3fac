//! Background processes: commands that outlive the call (and the host
//! process) that started them, with bounded logs to re-attach to.
//!
//! Berth's helper runs each under a supervisor of its own in the sandbox,
//! outside the agent session, so a host that exits or an agent that is
//! restarted leaves it running. Its output goes to a ring of at most
//! [`DetachRequest::log_ring`] bytes per stream on the sandbox's side (not
//! in the workspace, so not in snapshots). `stop` leaves them running;
//! `shutdown` ends them; a start that finds its instance re-created says
//! which did not come back ([`Sandbox::background_not_restored`]).

use serde::Deserialize;

use super::helper::STREAMED;
use super::state::BackgroundRecord;
use super::{Sandbox, SandboxError};
use crate::backend::ExecProcess;

/// The default ring of log bytes kept per stream of a background process.
pub const DEFAULT_LOG_RING: u64 = 16 << 20;

/// A background process to start.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DetachRequest {
    /// Passed to `sh -c`, in the workspace root.
    pub command: String,
    /// Its id; `None`: one is made up.
    pub name: Option<String>,
    /// Bytes of each stream's newest output kept.
    pub log_ring: u64,
}

impl DetachRequest {
    /// A background command with a made-up id and the default log ring.
    pub fn new(command: impl Into<String>) -> Self {
        DetachRequest {
            command: command.into(),
            name: None,
            log_ring: DEFAULT_LOG_RING,
        }
    }

    /// Names it (letters, digits, `-`, `_`, `.`; at most 64). By default,
    /// `bg-` and random hex.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Keeps the newest `bytes` of each stream (as two halves, the older
    /// dropped when a third begins). By default, [`DEFAULT_LOG_RING`].
    pub fn log_ring(mut self, bytes: u64) -> Self {
        self.log_ring = bytes;
        self
    }
}

/// Where a background process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ProcessState {
    /// Running.
    Running,
    /// Ended; its exit code is known.
    Exited,
    /// Its supervisor is gone without an exit (the sandbox's instance was
    /// restarted while it ran).
    Lost,
}

/// A background process, as the sandbox reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[non_exhaustive]
pub struct BackgroundProcess {
    /// Its id.
    pub id: String,
    /// Its command.
    pub command: String,
    /// Where it is.
    pub state: ProcessState,
    /// When it started, in milliseconds since the Unix epoch (the
    /// sandbox's clock).
    pub started_ms: u64,
    /// Its exit code, once it exited (128+N for signal N).
    pub exit_code: Option<i32>,
    /// Its process group in the sandbox.
    pub pid: Option<i64>,
}

/// A sandbox's background processes (see [`Sandbox::processes`]).
pub struct Processes<'a> {
    sandbox: &'a Sandbox,
}

impl Sandbox {
    /// Starts a background process and returns at once.
    ///
    /// ```no_run
    /// # async fn f(sandbox: &mut berth::Sandbox) -> Result<(), berth::SandboxError> {
    /// use berth::DetachRequest;
    /// let web = sandbox.detach(DetachRequest::new("python3 -m http.server 8080").name("web")).await?;
    /// let logs = sandbox.processes().logs(&web.id, false, Some(20)).await?;
    /// let lines = logs.collect(1 << 20, 1 << 20, 0).await?;
    /// print!("{}", lines.stdout_text());
    /// # Ok(()) }
    /// ```
    pub async fn detach(
        &mut self,
        request: DetachRequest,
    ) -> Result<BackgroundProcess, SandboxError> {
        let id = request
            .name
            .clone()
            .unwrap_or_else(|| format!("bg-{:08x}", crate::random_id::random_u64() as u32));
        let helper = self.sandbox_helper().await?;
        let ring = request.log_ring.to_string();
        let r = self
            .run_helper(
                "proc",
                &[
                    "start",
                    &id,
                    &ring,
                    &helper.workspace_root,
                    &request.command,
                ],
                &id,
            )
            .await?;
        let started: BackgroundProcess = parse(r.stdout_text().trim())?;
        self.state.background.retain(|b| b.id != id);
        self.state.background.push(BackgroundRecord {
            id: id.clone(),
            command: request.command,
        });
        self.save_state()?;
        Ok(started)
    }

    /// The background processes of this running sandbox.
    pub fn processes(&self) -> Processes<'_> {
        Processes { sandbox: self }
    }

    /// The background processes the last start found gone: the sandbox's
    /// instance was re-created (its container removed, say), and they did
    /// not come back. Empty otherwise.
    pub fn background_not_restored(&self) -> &[BackgroundRecord] {
        &self.lost_background
    }

    /// After a start: forgets, and reports, the recorded background
    /// processes the sandbox no longer has.
    pub(super) async fn check_background(&mut self) -> Result<(), SandboxError> {
        self.lost_background.clear();
        if self.state.background.is_empty() {
            return Ok(());
        }
        let listed = match self.processes().list().await {
            Ok(l) => l,
            // No helper here now: nothing can be said of them.
            Err(SandboxError::Backend(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let (kept, lost): (Vec<_>, Vec<_>) = std::mem::take(&mut self.state.background)
            .into_iter()
            .partition(|r| {
                listed
                    .iter()
                    .any(|p| p.id == r.id && p.state != ProcessState::Lost)
            });
        self.state.background = kept;
        if !lost.is_empty() {
            tracing::warn!(
                lost = ?lost.iter().map(|l| &l.id).collect::<Vec<_>>(),
                "background processes did not come back with the sandbox"
            );
            self.lost_background = lost;
            self.save_state()?;
        }
        Ok(())
    }
}

impl Processes<'_> {
    /// Every background process the sandbox knows, running or not.
    pub async fn list(&self) -> Result<Vec<BackgroundProcess>, SandboxError> {
        let r = self
            .sandbox
            .run_helper("proc", &["list"], "background processes")
            .await?;
        r.stdout_text()
            .lines()
            .filter(|l| !l.is_empty())
            .map(parse)
            .collect()
    }

    /// One background process.
    pub async fn get(&self, id: &str) -> Result<BackgroundProcess, SandboxError> {
        self.list()
            .await?
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| SandboxError::NotFound {
                what: format!("background process {id:?}"),
            })
    }

    /// Its logs as a command's output (stdout and stderr apart): what the
    /// ring still holds, from the oldest byte or from the last `tail`
    /// lines; with `follow`, on until the process has exited. Drop the
    /// stream to stop following.
    pub async fn logs(
        &self,
        id: &str,
        follow: bool,
        tail: Option<u64>,
    ) -> Result<ExecProcess, SandboxError> {
        // Asked first, so a wrong id is an error here, not an empty log.
        self.get(id).await?;
        let tail_text = tail.map(|n| n.to_string());
        let mut args = vec!["logs", id];
        if follow {
            args.push("--follow");
        }
        if let Some(n) = &tail_text {
            args.extend(["--tail", n]);
        }
        self.sandbox
            .start_helper("proc", &args, STREAMED, false)
            .await
    }

    /// Sends `signal` to its process group (SIGKILL: to everything it
    /// started, round after round).
    pub async fn kill(&self, id: &str, signal: i32) -> Result<(), SandboxError> {
        let sig = signal.to_string();
        self.sandbox
            .run_helper("proc", &["kill", id, &sig], id)
            .await
            .map(drop)
    }

    /// Waits for it to exit and returns its exit code.
    pub async fn wait(&self, id: &str) -> Result<i32, SandboxError> {
        let r = self
            .sandbox
            .start_helper("proc", &["wait", id], STREAMED, false)
            .await?
            .collect(4096, 64 * 1024, 0)
            .await?;
        if r.exit_code != 0 {
            return Err(super::helper::helper_failure(
                "proc wait",
                id,
                r.exit_code,
                &r.stderr_text(),
            ));
        }
        r.stdout_text()
            .trim()
            .parse()
            .map_err(|_| SandboxError::Helper {
                operation: format!("proc wait {id}"),
                message: format!("an unreadable exit code {:?}", r.stdout_text()),
            })
    }
}

fn parse(line: &str) -> Result<BackgroundProcess, SandboxError> {
    serde_json::from_str(line).map_err(|e| SandboxError::Helper {
        operation: "proc list".into(),
        message: format!("an unreadable answer ({e}): {line:.200}"),
    })
}
