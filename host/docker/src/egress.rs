//! A Docker sandbox's egress route (see [`berth::egress`]): its
//! container has network `none`, and either the egress point's socket
//! bound in (each command starts after the agent's bridge listens on the
//! proxy address) or, on an engine that cannot bind it (a swarm node's),
//! a tunnel carrying the proxy address to the point (see [`crate::tunnel`]).

use berth::backend::{BackendError, ExecRequest, HelperCall};

use crate::tunnel::EgressTunnel;
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
        (self.state.egress_socket_dir.is_some() || self.state.egress_tunnel.is_some())
            && request.helper != Some(HelperCall::Files)
    }

    /// Makes the route ready for `request` (run through the agent): the
    /// tunnel listening, or the command put behind the bridge.
    pub(crate) async fn route_egress(&self, request: &mut ExecRequest) -> Result<(), BackendError> {
        match &self.state.egress_tunnel {
            Some(point) if self.routes(request) => self.ensure_tunnel(point).await,
            _ => {
                self.behind_egress_bridge(request);
                Ok(())
            }
        }
    }

    /// Starts the tunnel unless it runs (it ends with its container, or
    /// with a broken stream; the next command starts another).
    async fn ensure_tunnel(&self, point: &std::path::Path) -> Result<(), BackendError> {
        let mut slot = self.tunnel.lock().await;
        if slot.as_ref().is_some_and(EgressTunnel::is_alive) {
            return Ok(());
        }
        *slot = None;
        let tunnel = EgressTunnel::start(&self.docker, &self.target(), point)
            .await
            .map_err(|why| BackendError::Operation {
                backend: BACKEND,
                operation: "starting the sandbox's egress tunnel",
                source: why.into(),
            })?;
        *slot = Some(tunnel);
        Ok(())
    }

    /// Runs `request` (through the agent) after making sure the agent's
    /// bridge listens on the proxy address: it leaves at once when one
    /// does, so a restarted container gets a new one with its next
    /// command.
    fn behind_egress_bridge(&self, request: &mut ExecRequest) {
        if self.state.egress_socket_dir.is_some() && self.routes(request) {
            let bridge = format!(
                "{} egress-bridge {} {} --daemon </dev/null >/dev/null 2>&1",
                berth_agent::AGENT_PATH,
                berth::egress::SANDBOX_EGRESS_SOCKET,
                berth::egress::SANDBOX_PROXY,
            );
            match request.argv.take() {
                None => request.command = format!("{bridge}; {}", request.command),
                // Words stay words: the shell only sequences the bridge
                // and hands them, unexpanded, to `berth-agent exec`.
                Some(argv) => {
                    let mut words = vec![
                        "sh".to_string(),
                        "-c".to_string(),
                        format!("{bridge}; exec {} exec -- \"$@\"", berth_agent::AGENT_PATH),
                        "berth-egress".to_string(),
                    ];
                    words.extend(argv);
                    request.argv = Some(words);
                }
            }
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
