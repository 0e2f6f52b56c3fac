//! The end of a restore staged beside the workspace: the staged entries
//! moved into place (by the agent, which also gives the root its time
//! back, or by a shell), or the staging directory removed.

use std::time::{Duration, Instant};

use berth::backend::{BackendError, ExecRequest};

use crate::{op, DockerBackend};

impl DockerBackend {
    /// Ends a restore staged in `dir` (under the workspace root): with
    /// `commit`, its entries replace the workspace's; either way the
    /// staging directory goes.
    pub(crate) async fn settle_staging(&self, dir: &str, commit: bool) -> Result<(), BackendError> {
        if let Ok(mut s) = self.staging.lock() {
            *s = None;
        }
        // The agent (started now if it can be: the first command needs it
        // anyway) settles the workspace, the root's own time included;
        // without it, a shell moves the entries (the root's time is then
        // the move's). The name is Berth's own ([a-z0-9.-]), safe to quote.
        let running = self.agent_session().await.ok();
        let settle = running.is_some() && commit;
        let script = format!(
            "s='{dir}'; [ -d \"$s\" ] || exit 0; \
             if [ {settle} = true ]; then exec {agent} fs . settle \"$s\"; fi; \
             if [ {commit} = true ]; then \
               for f in \"$s\"/* \"$s\"/.[!.]* \"$s\"/..?*; do \
                 [ -e \"$f\" ] || [ -L \"$f\" ] || continue; \
                 n=${{f#\"$s\"/}}; rm -rf -- \"./$n\" && mv -- \"$f\" \"./$n\" || exit 1; \
               done; \
             fi; rm -rf -- \"$s\"",
            agent = berth_agent::AGENT_PATH
        );
        let mut request = ExecRequest::new(script, Duration::from_secs(600));
        request.stdout_cap = 64 * 1024;
        request.stderr_cap = 64 * 1024;
        let started = Instant::now();
        let process = match running {
            Some(session) => session
                .spawn(&request, &self.state.workspace_root, None)
                .await
                .map_err(|why| op("moving the restored workspace into place", why))?,
            None => self.spawn_plain(&request).await?,
        };
        let result = process
            .collect(request.stdout_cap, request.stderr_cap, request.tail_kept)
            .await?;
        tracing::debug!(
            ms = started.elapsed().as_secs_f64() * 1e3,
            commit,
            "staging finished"
        );
        if result.exit_code != 0 {
            return Err(op(
                if commit {
                    "moving the restored workspace into place"
                } else {
                    "removing a refused archive's staging directory"
                },
                format!("exit {}: {}", result.exit_code, result.stderr_text().trim()),
            ));
        }
        Ok(())
    }
}
