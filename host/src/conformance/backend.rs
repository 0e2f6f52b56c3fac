//! The lifecycle's promises to a backend's users, as checks any backend
//! must pass: what a new backend (Swarm, Kubernetes, an embedder's own)
//! runs to know it kept them.
//!
//! Every clause drives real sandboxes through the public lifecycle
//! ([`SandboxClient`], [`Sandbox`]) — never the backend directly — with
//! local snapshots under a scratch home, and resumes through the state's
//! JSON text only, as a fresh process would. The backend under test says
//! which disasters it can suffer ([`Disaster`]) and inflicts them; each
//! one gets its own round-trip clause. A clause that cannot run is a
//! failure, never a silent pass: the report has a row for every clause.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::commands::{chain, exec, expect_out, run};
use super::Report;
use crate::backend::{BackendError, BackendProvider, BackendSpec, ExecEvent, ExecRequest};
use crate::sandbox::{
    Sandbox, SandboxClient, SandboxError, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec,
    StartBranch,
};
use crate::workspace::WorkspaceSpec;

/// What can happen to a sandbox behind Berth's back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disaster {
    /// The instance holding the workspace (a container) was removed.
    InstanceRemoved,
    /// The instance was stopped (its processes gone, its files kept).
    InstanceStopped,
    /// The workspace's files were deleted, the instance left running.
    WorkspaceDeleted,
}

impl Disaster {
    fn clause(self) -> &'static str {
        match self {
            Disaster::InstanceRemoved => "round-trip-after-instance-removed",
            Disaster::InstanceStopped => "round-trip-after-instance-stopped",
            Disaster::WorkspaceDeleted => "round-trip-after-workspace-deleted",
        }
    }
}

/// A backend under test: how to make one of its sandboxes, and how to
/// inflict the disasters it can suffer.
#[async_trait::async_trait]
pub trait BackendUnderTest: Send + Sync {
    /// What is checked, for the report.
    fn name(&self) -> String;

    /// Options for a new sandbox on this backend.
    fn spec(&self) -> BackendSpec;

    /// The provider that resumes this backend's sandboxes, when the client
    /// does not know the kind already (any kind outside the core, Docker's
    /// and swarm's included). By default, `None`.
    fn provider(&self) -> Option<Arc<dyn BackendProvider>> {
        None
    }

    /// The snapshot the suite's sandboxes persist into. By default, a local
    /// snapshot under `home`; a backend that starts sandboxes on other
    /// hosts needs a shared store.
    fn snapshot(&self, home: &Path) -> SnapshotSpec {
        SnapshotSpec::local(home.join("snapshots"))
    }

    /// The disasters this backend can suffer (each gets a clause).
    fn disasters(&self) -> Vec<Disaster>;

    /// Inflicts `disaster` on the sandbox whose state is `state`; `Err`
    /// says why it could not.
    async fn inflict(&self, disaster: Disaster, state: &SandboxState) -> Result<(), String>;
}

/// Runs every clause against `backend`, with sandboxes under `home`.
pub async fn check_backend(backend: &dyn BackendUnderTest, home: &Path) -> Report {
    let suite = Suite {
        backend,
        home: home.to_path_buf(),
    };
    let mut report = Report::new(backend.name(), "backend");
    report
        .run_clause(
            "start-exec-stop-resume",
            "a fresh sandbox starts from its manifest, runs commands, stops without destroying anything, and resumed from its JSON reuses the same workspace",
            suite.start_exec_stop_resume(),
        )
        .await;
    report
        .run_clause(
            "restore-is-identical",
            "after shutdown, start restores exactly what stop persisted: files, bytes, modes, empty directories, symlinks",
            suite.restore_is_identical(),
        )
        .await;
    report
        .run_clause(
            "exit-codes-and-streams",
            "exit codes are reported as the command gave them, stdout and stderr apart, the manifest's environment and the request's applied",
            suite.exit_codes_and_streams(),
        )
        .await;
    report
        .run_clause(
            "output-caps",
            "output beyond the caps is dropped from the middle and counted, the start and the end kept, and the result says it was truncated",
            suite.output_caps(),
        )
        .await;
    report
        .run_clause(
            "streamed-output",
            "a command's output arrives as events while it runs, before its exit, as bytes",
            suite.streamed_output(),
        )
        .await;
    report
        .run_clause(
            "stdin",
            "stdin written to a running command reaches it whole, and closing it ends the command's input",
            suite.stdin_reaches_the_command(),
        )
        .await;
    report
        .run_clause(
            "drop-stops-the-command",
            "dropping a running command's stream stops the command in the sandbox",
            suite.drop_stops_the_command(),
        )
        .await;
    report
        .run_optional_clause(
            "files",
            "the file API writes and reads a file byte for byte and refuses paths out of the workspace (a backend that refuses it as unsupported does not run the clause, and the report says so)",
            suite.files(),
        )
        .await;
    report
        .run_clause(
            "timeout-kills-the-tree",
            "a command past its timeout returns promptly, marked timed out, and whatever it started is killed too",
            suite.timeout_kills_the_tree(),
        )
        .await;
    report
        .run_clause(
            "argv-words-reach-the-program",
            "a command given as words runs with no shell: generated words reach the program as given, a program named as a builtin runs, a missing one exits 127, an empty argv and argv in a session are refused",
            suite.on_fresh(async |sb: &mut Sandbox| super::words::words_reach_the_program(sb).await),
        )
        .await;
    report
        .run_clause(
            "concurrent-commands",
            "commands run at once on one sandbox each get their own output and exit code",
            suite.concurrent_commands(),
        )
        .await;
    report
        .run_clause(
            "lineage-refusal",
            "a stop never replaces the snapshot with a workspace held by another instance than the one it was set up in; the snapshot is left as it was",
            suite.lineage_refusal(),
        )
        .await;
    for disaster in backend.disasters() {
        report
            .run_clause(
                disaster.clause(),
                "after the disaster, a fresh resume from the state's JSON brings the persisted workspace back, identical",
                suite.round_trip_after(disaster),
            )
            .await;
    }
    report
}

struct Suite<'a> {
    backend: &'a dyn BackendUnderTest,
    home: PathBuf,
}

/// A shell command listing the workspace (run in its root): every path
/// with its type and mode, and every regular file's checksum and size
/// (busybox and coreutils alike). Two listings are equal when the
/// workspaces are.
pub const WORKSPACE_LISTING: &str = "find . ! -name . | sort | while read -r p; do \
    if [ -L \"$p\" ]; then echo \"$p link $(readlink \"$p\")\"; \
    elif [ -d \"$p\" ]; then echo \"$p dir $(stat -c %a \"$p\")\"; \
    else echo \"$p file $(stat -c '%a %s' \"$p\") $(cksum < \"$p\")\"; fi; done";

/// The branches that restore the snapshot.
const RESTORED: &[StartBranch] = &[
    StartBranch::Restore,
    StartBranch::Rebuild { restored: true },
];

/// Writes a workspace with the shapes archives get wrong.
const POPULATE: &str =
    "mkdir -p src/deep/er empty && printf 'x%.0s' $(seq 1 3000) > src/deep/er/big.txt && \
    printf '\\000\\001\\377binary' > bin.dat && echo run > run.sh && chmod 751 run.sh && \
    ln -s src/deep/er/big.txt link && echo 'hello' > 'with space.txt'";

impl Suite<'_> {
    fn client(&self) -> SandboxClient {
        let mut builder = SandboxClient::builder(&self.home).save_state(false);
        if let Some(provider) = self.backend.provider() {
            builder = builder.backend_provider(SharedProvider(provider));
        }
        builder.build()
    }

    fn workspace() -> Result<WorkspaceSpec, String> {
        serde_json::from_value(serde_json::json!({
            "environment": {"BERTH_CONFORMANCE": "manifest"},
            "entries": {
                "task.md": {"type": "file", "content": "the task\n"},
                "cache": {"type": "dir", "ephemeral": true, "children": {
                    "token": {"type": "file", "content": "ephemeral\n"}
                }}
            }
        }))
        .map_err(|e| e.to_string())
    }

    async fn create(&self, client: &SandboxClient) -> Result<Sandbox, String> {
        let spec = SandboxSpec::new(Self::workspace()?)
            .snapshot(self.backend.snapshot(&self.home))
            .backend(self.backend.spec());
        client.create(spec).await.map_err(|e| chain("create", &e))
    }

    /// Resumes `state` in a new client, through its JSON text.
    async fn resume(&self, state: &SandboxState) -> Result<Sandbox, String> {
        let json = state.to_json().map_err(|e| e.to_string())?;
        let state = SandboxState::from_json(&json).map_err(|e| e.to_string())?;
        self.client()
            .resume(state, None, SandboxOptions::default())
            .await
            .map_err(|e| chain("resume", &e))
    }

    async fn start(sandbox: &mut Sandbox, want: &[StartBranch]) -> Result<StartBranch, String> {
        let branch = sandbox.start().await.map_err(|e| chain("start", &e))?;
        if want.contains(&branch) {
            Ok(branch)
        } else {
            Err(format!("start took {branch:?}, expected one of {want:?}"))
        }
    }

    /// Creates and starts a fresh sandbox, runs `body` on it, and shuts
    /// down whichever sandbox `body` left in its place, whatever happened
    /// (no clause leaks an instance).
    async fn on_fresh(
        &self,
        body: impl AsyncFnOnce(&mut Sandbox) -> Result<String, String>,
    ) -> Result<String, String> {
        let client = self.client();
        let mut sb = self.create(&client).await?;
        let outcome = match Self::start(&mut sb, &[StartBranch::Fresh]).await {
            Ok(_) => body(&mut sb).await,
            Err(e) => Err(e),
        };
        Self::discard(&mut sb).await;
        outcome
    }

    /// Shuts `sandbox` down, whatever happened before (cleanup).
    async fn discard(sandbox: &mut Sandbox) {
        if let Err(e) = sandbox.shutdown().await {
            tracing::warn!(error = %e, "conformance: shutting a sandbox down failed");
        }
    }

    async fn start_exec_stop_resume(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            expect_out(sb, "cat task.md cache/token", "the task\nephemeral\n").await?;
            run(sb, "echo kept > kept.txt").await?;
            sb.stop().await.map_err(|e| chain("stop", &e))?;
            let mut again = self.resume(&sb.state()).await?;
            let branch = Self::start(&mut again, &[StartBranch::Reuse]).await;
            let kept = expect_out(&again, "cat kept.txt", "kept\n").await;
            *sb = again;
            branch?;
            kept?;
            Ok("fresh, stopped, resumed from JSON: reused".to_string())
        })
        .await
    }

    async fn restore_is_identical(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            run(sb, POPULATE).await?;
            let before = run(sb, WORKSPACE_LISTING).await?;
            sb.stop().await.map_err(|e| chain("stop", &e))?;
            sb.shutdown().await.map_err(|e| chain("shutdown", &e))?;
            let mut again = self.resume(&sb.state()).await?;
            let branch = Self::start(&mut again, RESTORED).await;
            let after = run(&again, WORKSPACE_LISTING).await;
            *sb = again;
            branch?;
            let after = after?;
            if after != before {
                return Err(format!(
                    "restored workspace differs:\n--- persisted\n{before}--- restored\n{after}"
                ));
            }
            Ok(format!("{} paths identical", before.lines().count()))
        })
        .await
    }

    async fn exit_codes_and_streams(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            for code in [0, 1, 3, 127] {
                let r = exec(sb, &format!("echo out; echo err >&2; exit {code}")).await?;
                if r.exit_code != code || r.stdout != "out\n" || r.stderr != "err\n" {
                    return Err(format!(
                        "exit {code}: got code {}, stdout {:?}, stderr {:?}",
                        r.exit_code, r.stdout, r.stderr
                    ));
                }
            }
            let mut request = ExecRequest::new(
                "echo \"$BERTH_CONFORMANCE $EXTRA\"",
                Duration::from_secs(30),
            );
            request.env.insert("EXTRA".into(), "request".into());
            let r = sb.exec(request).await.map_err(|e| chain("exec", &e))?;
            if r.stdout != "manifest request\n" {
                return Err(format!("environment: got {:?}", r.stdout));
            }
            Ok("exit codes 0, 1, 3, 127; streams apart; environment applied".into())
        })
        .await
    }

    async fn output_caps(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let request = ExecRequest::new(
                "yes o | head -c 100000; echo END; yes e | head -c 50000 >&2",
                Duration::from_secs(30),
            )
            .caps(1004, 500)
            .tail_kept(100);
            let r = sb.exec(request).await.map_err(|e| chain("exec", &e))?;
            if !r.stdout.starts_with(b"o\no\n") || !r.stdout.ends_with(b"o\nEND\n") {
                return Err(format!(
                    "the start and the end of stdout were not both kept: {:?}",
                    r.stdout_text()
                ));
            }
            let ok = r.truncated
                && r.stdout.len() == 1004
                && r.stderr.len() == 500
                && r.stdout_dropped == 99_000
                && r.stderr_dropped == 49_500
                && r.exit_code == 0;
            if !ok {
                return Err(format!(
                    "got stdout {} B (+{} dropped), stderr {} B (+{} dropped), truncated {}, exit {}",
                    r.stdout.len(),
                    r.stdout_dropped,
                    r.stderr.len(),
                    r.stderr_dropped,
                    r.truncated,
                    r.exit_code
                ));
            }
            Ok("1004 + 500 B kept (head and tail), 99000 + 49500 B counted as dropped".into())
        })
        .await
    }

    async fn streamed_output(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let mut p = sb
                .exec_stream(ExecRequest::new(
                    "echo first; sleep 1; printf '\\377'; echo second >&2",
                    Duration::from_secs(30),
                ))
                .await
                .map_err(|e| chain("exec_stream", &e))?;
            let started = Instant::now();
            let mut first_at = None;
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            let exit = loop {
                match p.next_event().await {
                    Some(Ok(ExecEvent::Stdout(b))) => {
                        first_at.get_or_insert(started.elapsed());
                        stdout.extend_from_slice(&b);
                    }
                    Some(Ok(ExecEvent::Stderr(b))) => stderr.extend_from_slice(&b),
                    Some(Ok(ExecEvent::Exit(exit))) => break exit,
                    Some(Err(e)) => return Err(chain("reading events", &e)),
                    None => return Err("the events ended without an exit".into()),
                }
            };
            let end = started.elapsed();
            let first = first_at.ok_or("no stdout event")?;
            if end.saturating_sub(first) < Duration::from_millis(500) {
                return Err(format!(
                    "the first line came {first:?} after the start and the exit at {end:?}: output was held back"
                ));
            }
            if stdout != b"first\n\xff" || stderr != b"second\n" || exit.exit_code != 0 {
                return Err(format!("got stdout {stdout:?}, stderr {stderr:?}, exit {}", exit.exit_code));
            }
            Ok(format!("first line after {first:?}, exit after {end:?}"))
        })
        .await
    }

    async fn stdin_reaches_the_command(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let p = sb
                .exec_stream(ExecRequest::new("wc -c", Duration::from_secs(60)).with_stdin())
                .await
                .map_err(|e| chain("exec_stream", &e))?;
            let chunk = bytes::Bytes::from(vec![7u8; 64 * 1024]);
            for _ in 0..32 {
                p.write_stdin(chunk.clone())
                    .await
                    .map_err(|e| e.to_string())?;
            }
            p.close_stdin().await.map_err(|e| e.to_string())?;
            let r = p
                .collect(4096, 4096, 0)
                .await
                .map_err(|e| chain("collect", &e))?;
            if r.stdout_text().trim() != "2097152" {
                return Err(format!(
                    "wc -c counted {:?} of 2097152 bytes",
                    r.stdout_text()
                ));
            }
            Ok("2 MiB in, counted whole".into())
        })
        .await
    }

    async fn drop_stops_the_command(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let mut p = sb
                .exec_stream(ExecRequest::new(
                    "echo up; sleep 2; echo survived > dropped.txt",
                    Duration::from_secs(30),
                ))
                .await
                .map_err(|e| chain("exec_stream", &e))?;
            match p.next_event().await {
                Some(Ok(ExecEvent::Stdout(_))) => {}
                other => return Err(format!("expected stdout first, got {other:?}")),
            }
            drop(p);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let left = run(sb, "cat dropped.txt 2>/dev/null || true").await?;
            if !left.is_empty() {
                return Err("the dropped command went on and wrote dropped.txt".into());
            }
            Ok("dropped after its first line; it wrote nothing after".into())
        })
        .await
    }

    /// `Ok(Err(why))`: the backend refused the file API as unsupported.
    async fn files(&self) -> Result<Result<String, String>, String> {
        let mut declined = None;
        let checked = self
            .on_fresh(async |sb: &mut Sandbox| {
                let files = sb.files();
                let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
                match files
                    .write("conformance.bin", &data[..], data.len() as u64, None)
                    .await
                {
                    Err(SandboxError::Backend(BackendError::Unsupported { why, .. })) => {
                        declined = Some(format!("not provided: refused as unsupported ({why})"));
                        return Ok(String::new());
                    }
                    Err(e) => return Err(chain("write", &e)),
                    Ok(()) => {}
                }
                let back = files
                    .read_to_bytes("conformance.bin")
                    .await
                    .map_err(|e| chain("read", &e))?;
                if back != data {
                    return Err(format!(
                        "read {} bytes back, not the {} written",
                        back.len(),
                        data.len()
                    ));
                }
                for path in ["../outside", "/etc/passwd"] {
                    match files.read(path).await {
                        Err(SandboxError::PathRefused { .. }) => {}
                        Err(e) => return Err(chain(&format!("read {path}"), &e)),
                        Ok(_) => return Err(format!("{path} was read")),
                    }
                }
                Ok("70000 bytes written and read back; '..' and absolute paths refused".into())
            })
            .await?;
        Ok(match declined {
            Some(why) => Err(why),
            None => Ok(checked),
        })
    }

    async fn timeout_kills_the_tree(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let started = Instant::now();
            let r = sb
                .exec(ExecRequest::new(
                    "(sleep 3; touch survived) & sleep 60",
                    Duration::from_secs(1),
                ))
                .await
                .map_err(|e| chain("exec", &e))?;
            let took = started.elapsed();
            if !r.timed_out || took > Duration::from_secs(15) {
                return Err(format!(
                    "timed_out {}, returned after {:.1} s",
                    r.timed_out,
                    took.as_secs_f64()
                ));
            }
            tokio::time::sleep(Duration::from_secs(4)).await;
            let left = run(sb, "ls survived 2>/dev/null || true").await?;
            if !left.is_empty() {
                return Err(
                    "a process the command started outlived its timeout (it wrote `survived`)"
                        .into(),
                );
            }
            Ok(format!(
                "returned after {:.1} s; nothing it started survived",
                took.as_secs_f64()
            ))
        })
        .await
    }

    async fn concurrent_commands(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            let sb = &*sb;
            let runs = (0..8).map(|i| async move {
                let r = exec(sb, &format!("sleep 0.2; echo {i}; exit {i}")).await?;
                if r.stdout != format!("{i}\n") || r.exit_code != i {
                    return Err(format!(
                        "command {i}: got {:?}, exit {}",
                        r.stdout, r.exit_code
                    ));
                }
                Ok(())
            });
            for r in futures::future::join_all(runs).await {
                r?;
            }
            Ok("8 at once, each its own output and exit code".to_string())
        })
        .await
    }

    async fn lineage_refusal(&self) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            run(sb, "echo first > f.txt").await?;
            sb.stop().await.map_err(|e| chain("stop", &e))?;
            let persisted = sb.state();
            // The state now claims another instance set the workspace up,
            // as when it was re-created behind Berth's back.
            let mut json: serde_json::Value =
                serde_json::from_str(&persisted.to_json().map_err(|e| e.to_string())?)
                    .map_err(|e| e.to_string())?;
            json["lineage"]["instance"] = "an-instance-berth-never-set-up".into();
            let claimed = SandboxState::from_json(&json.to_string()).map_err(|e| e.to_string())?;
            let mut other = self.resume(&claimed).await?;
            let refused = other.stop().await;
            match refused {
                Err(SandboxError::LineageMismatch { .. }) => {}
                Err(e) => return Err(chain("stop: expected a lineage refusal, got", &e)),
                Ok(()) => return Err("the stop persisted a workspace of another instance".into()),
            }
            if other.state().snapshot.digest != persisted.snapshot.digest {
                return Err("the refused stop changed the recorded snapshot".into());
            }
            sb.shutdown().await.map_err(|e| chain("shutdown", &e))?;
            let mut again = self.resume(&persisted).await?;
            let branch = Self::start(&mut again, RESTORED).await;
            let kept = expect_out(&again, "cat f.txt", "first\n").await;
            *sb = again;
            branch?;
            kept?;
            Ok("refused with LineageMismatch; the snapshot still restores".into())
        })
        .await
    }

    async fn round_trip_after(&self, disaster: Disaster) -> Result<String, String> {
        self.on_fresh(async |sb: &mut Sandbox| {
            run(sb, POPULATE).await?;
            let before = run(sb, WORKSPACE_LISTING).await?;
            sb.stop().await.map_err(|e| chain("stop", &e))?;
            let state = sb.state();
            self.backend.inflict(disaster, &state).await?;
            let mut again = self.resume(&state).await?;
            // A stopped instance keeps its files, so reusing them is as
            // right as restoring; either way they must be identical.
            let branch = Self::start(
                &mut again,
                &[
                    StartBranch::Reuse,
                    StartBranch::Restore,
                    StartBranch::Rebuild { restored: true },
                ],
            )
            .await;
            let after = run(&again, WORKSPACE_LISTING).await;
            let task = expect_out(&again, "cat task.md cache/token", "the task\nephemeral\n").await;
            *sb = again;
            let branch = branch?;
            let after = after?;
            task?;
            if after != before {
                return Err(format!(
                    "restored workspace differs:\n--- persisted\n{before}--- restored\n{after}"
                ));
            }
            Ok(format!(
                "{branch:?}; {} paths identical",
                before.lines().count()
            ))
        })
        .await
    }
}

/// A provider shared with the backend under test.
struct SharedProvider(Arc<dyn BackendProvider>);

#[async_trait::async_trait]
impl BackendProvider for SharedProvider {
    fn kind(&self) -> &str {
        self.0.kind()
    }

    async fn resume(
        &self,
        state: &crate::backend::BackendState,
        session_id: &str,
    ) -> Result<Box<dyn crate::backend::Backend>, crate::backend::BackendError> {
        self.0.resume(state, session_id).await
    }

    fn summary(&self, state: &crate::backend::BackendState) -> crate::backend::BackendSummary {
        self.0.summary(state)
    }

    fn options_like(
        &self,
        state: &crate::backend::BackendState,
    ) -> Result<BackendSpec, crate::backend::BackendError> {
        self.0.options_like(state)
    }

    fn relocatable(&self) -> bool {
        self.0.relocatable()
    }

    async fn remove_orphan(
        &self,
        state: &crate::backend::BackendState,
        session_id: &str,
    ) -> Result<(), crate::backend::BackendError> {
        self.0.remove_orphan(state, session_id).await
    }
}
