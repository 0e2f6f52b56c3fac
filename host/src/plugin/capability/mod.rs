//! Host capabilities a plugin can be granted, one module per capability
//! (after Spin's factors): each turns one part of the manifest's `[grants]`
//! into explicit builder values. What is not granted is not linked in any
//! usable form: no preopens, no network, no environment, a frozen clock.

mod clock;
mod filesystem;
#[cfg(feature = "http")]
mod http;
mod log;
mod memory;

#[cfg(feature = "http")]
pub(crate) use http::HttpGate;
pub(crate) use memory::MemoryCap;

use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
#[cfg(feature = "http")]
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::manifest::Grants;
use crate::plugin_error::PluginError;

/// The per-call store data: one fresh instance per operation gets one of
/// these, built from the grants.
pub(crate) struct PluginState {
    wasi: WasiCtx,
    #[cfg(feature = "http")]
    http: WasiHttpCtx,
    #[cfg(feature = "http")]
    http_gate: HttpGate,
    pub(crate) table: ResourceTable,
    pub(crate) memory: MemoryCap,
}

impl PluginState {
    /// Builds the capabilities `grants` allow for plugin `name`.
    pub(crate) fn from_grants(name: &str, grants: &Grants) -> Result<Self, PluginError> {
        let mut wasi = WasiCtxBuilder::new();
        // File operations run inline on the calling thread instead of a hop
        // through tokio's blocking pool for every stat and open: a plugin
        // call is already one task doing one thing, and the hop cost more
        // than the syscall (BENCHMARKS.md). It must be set before the
        // preopens: each directory takes the setting when it is added.
        wasi.allow_blocking_current_thread(true);
        wasi.envs(&grants.env);
        filesystem::preopen(&mut wasi, name, &grants.dirs)?;
        log::route_stdio(&mut wasi, name);
        clock::apply(&mut wasi, grants.wall_clock);
        // Sockets stay off: the builder's defaults deny every address and
        // name lookup; outbound HTTP goes through `HttpGate` only.
        wasi.allow_ip_name_lookup(false);
        #[cfg(not(feature = "http"))]
        if !grants.http.is_empty() {
            return Err(PluginError::Host {
                plugin: name.to_string(),
                operation: "open",
                message: "the manifest grants http_hosts, but this build of berth has no outbound HTTP for plugins (cargo feature `http`)".into(),
            });
        }

        Ok(PluginState {
            wasi: wasi.build(),
            #[cfg(feature = "http")]
            http: WasiHttpCtx::new(),
            #[cfg(feature = "http")]
            http_gate: HttpGate::new(grants.http.clone()),
            table: ResourceTable::new(),
            memory: MemoryCap::new(grants.max_memory),
        })
    }
}

impl PluginState {
    /// The outbound HTTP requests refused during this call, as "what was
    /// asked for" (none in a build without the `http` feature).
    pub(crate) fn http_denials(&self) -> Vec<String> {
        #[cfg(feature = "http")]
        return self.http_gate.denials();
        #[cfg(not(feature = "http"))]
        Vec::new()
    }
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

#[cfg(feature = "http")]
impl WasiHttpView for PluginState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            hooks: &mut self.http_gate,
            table: &mut self.table,
            ctx: &mut self.http,
        }
    }
}
