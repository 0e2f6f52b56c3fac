//! A Docker sandbox's egress route (see [`berth::egress`]): its
//! container has network `none` and the egress point's socket bound in;
//! each command starts after the agent's bridge listens on the proxy
//! address.

use berth::backend::{BackendError, ExecRequest, HelperCall};

use crate::{DockerBackend, BACKEND};

impl DockerBackend {
    /// Refuses an engine not on this host: it could not bind the egress
    /// point's socket, a path on this host, into the container.
    pub(crate) fn check_egress_engine(&self) -> Result<(), BackendError> {
        if self.state.egress_socket_dir.is_some() && !self.engine_on_this_host() {
            return Err(BackendError::Config {
                backend: BACKEND,
                message: format!(
                    "the sandbox's egress point is a socket on this host, which the engine {} (not on this host) cannot bind into its container: use an engine on this host",
                    self.engine.reference
                ),
            });
        }
        Ok(())
    }

    /// Whether `request` needs the route: a sandbox with an egress policy,
    /// and a command that is not the file helper (which needs no network).
    fn routes(&self, request: &ExecRequest) -> bool {
        self.state.egress_socket_dir.is_some() && request.helper != Some(HelperCall::Files)
    }

    /// Runs `request` (through the agent) after making sure the agent's
    /// bridge listens on the proxy address: it leaves at once when one
    /// does, so a restarted container gets a new one with its next
    /// command.
    pub(crate) fn behind_egress_bridge(&self, request: &mut ExecRequest) {
        if self.routes(request) {
            request.command = format!(
                "{} egress-bridge {} {} --daemon </dev/null >/dev/null 2>&1; {}",
                berth_agent::AGENT_PATH,
                berth::egress::SANDBOX_EGRESS_SOCKET,
                berth::egress::SANDBOX_PROXY,
                request.command
            );
        }
    }

    /// Refuses a command that needs the route when the agent, its bridge,
    /// is not running (`why`).
    pub(crate) fn egress_needs_the_agent(
        &self,
        request: &ExecRequest,
        why: &str,
    ) -> Result<(), BackendError> {
        if self.routes(request) {
            return Err(BackendError::Unsupported {
                backend: BACKEND,
                what: "route the sandbox's egress",
                why: format!(
                    "its bridge is Berth's in-container agent, which is not running here ({why})"
                ),
            });
        }
        Ok(())
    }
}
