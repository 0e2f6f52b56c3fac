//! The plugin host: loads snapshot-store components, checks them against
//! the contract, grants them exactly what their manifest says, and exposes
//! them as [`RemoteSnapshotClient`](crate::RemoteSnapshotClient) and
//! [`SandboxSnapshot`](crate::SandboxSnapshot).
//!
//! - [`manifest`]: what a plugin is and what it may use.
//! - `engine`: the one shared engine (pooling, epoch ticker).
//! - [`compile_cache`]: compiled code on disk, verified before use.
//! - `capability`: one module per grantable capability.
//! - `stream_bridge`: tokio streams ↔ `wasi:io` streams, bounded.
//! - `call`: fresh instance per operation, deadlines, error mapping.
//! - [`WasmRemoteClient`] / [`WasmSnapshot`]: the traits over a plugin.
//! - [`inspect`]: a component's world, imports and exports.

mod bindings;
mod call;
mod capability;
pub mod compile_cache;
mod engine;

pub mod inspect;
pub mod manifest;
/// The OCI registry client, by its old path.
pub use crate::registry;
mod lazy_host;
mod snapshot_kinds;
mod stream_bridge;
mod wasm_remote_client;
mod wasm_snapshot;

pub use crate::plugin_error::PluginError;
pub use compile_cache::{CacheOutcome, CompileCache};
pub use lazy_host::LazyPluginHost;
pub use manifest::{
    ComponentSource, DirGrant, DirMode, Grants, HttpOrigin, ManifestError, OriginError,
    PluginManifest, World,
};
pub use registry::{OciReference, Registry, RegistryError, RegistryOptions};
pub use snapshot_kinds::{PluginKindProvider, PluginOptions, PluginRef};
pub use wasm_remote_client::WasmRemoteClient;
pub use wasm_snapshot::WasmSnapshot;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

use capability::PluginState;

pub use crate::contract::{CONTRACT_PACKAGE, CONTRACT_VERSION};

/// Loads plugins. Cheap to clone; every host in a process shares one engine.
#[derive(Clone)]
pub struct PluginHost {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost").finish_non_exhaustive()
    }
}

struct HostInner {
    engine: Engine,
    linker: Linker<PluginState>,
    cache: CompileCache,
    registry: Registry,
}

/// The pre-linked instance factory of a plugin, by world.
#[derive(Clone)]
enum Pre {
    Remote(bindings::remote::RemoteClientPluginPre<PluginState>),
    Snapshot(bindings::snapshot::SnapshotPluginPre<PluginState>),
}

/// A loaded plugin; shared by every client or snapshot made from it.
pub(crate) struct LoadedPlugin {
    manifest: PluginManifest,
    engine: Engine,
    pre: Pre,
    digest: String,
    resolved: Option<OciReference>,
    cache_outcome: CacheOutcome,
    load_time: Duration,
    warnings: Vec<String>,
}

/// A plugin ready to serve calls; each call gets a fresh instance.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<LoadedPlugin>,
}

impl PluginHost {
    /// A host with the compile cache and registry options from the
    /// environment (see [`CompileCache::from_env`],
    /// [`RegistryOptions::from_env`]).
    pub fn new() -> Result<Self, PluginError> {
        Self::with_cache(CompileCache::from_env())
    }

    /// A host with the given compile cache (registries as the environment
    /// says).
    pub fn with_cache(cache: CompileCache) -> Result<Self, PluginError> {
        Self::with_cache_and_registry(cache, RegistryOptions::from_env())
    }

    /// A host with the given compile cache and registry options.
    pub fn with_cache_and_registry(
        cache: CompileCache,
        registry: RegistryOptions,
    ) -> Result<Self, PluginError> {
        let host_error = |message: String| PluginError::Host {
            plugin: "-".into(),
            operation: "start",
            message,
        };
        let engine = engine::shared_engine().map_err(host_error)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| host_error(format!("linking WASI: {e}")))?;
        #[cfg(feature = "http")]
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(|e| host_error(format!("linking wasi:http: {e}")))?;
        Ok(PluginHost {
            inner: Arc::new(HostInner {
                engine,
                linker,
                cache,
                registry: Registry::new(registry),
            }),
        })
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The compile cache.
    pub fn cache(&self) -> &CompileCache {
        &self.inner.cache
    }

    /// The registries and the plugin cache `oci://` components come from.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Loads the plugin described by the manifest file at `path`.
    pub async fn load_file(&self, path: &Path) -> Result<Plugin, PluginError> {
        self.load(PluginManifest::from_file(path)?).await
    }

    /// Compiles (or fetches from the cache) and links a plugin, checking that
    /// it exports the manifest's world at this host's contract version.
    ///
    /// ```no_run
    /// use berth::plugin::{DirMode, PluginHost, PluginManifest, World};
    /// use berth::{SandboxSpec, SnapshotSpec, WorkspaceSpec};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let manifest = PluginManifest::for_component("fs_store.wasm", World::RemoteClient)
    ///     .with_dir("/srv/snapshots", "/data", DirMode::ReadWrite) // its only grant
    ///     .with_config("root", "/data");
    /// let plugin = PluginHost::new()?.load(manifest).await?;
    /// let spec = SandboxSpec::new(WorkspaceSpec::default())
    ///     .snapshot(SnapshotSpec::loaded_plugin(plugin));
    /// # let _ = spec; Ok(()) }
    /// ```
    pub async fn load(&self, manifest: PluginManifest) -> Result<Plugin, PluginError> {
        let started = Instant::now();
        create_granted_dirs(&manifest)?;
        // Fail at load, not on the first call, when a grant cannot be met.
        PluginState::from_grants(&manifest.name, &manifest.grants)?;
        let (component, digest, resolved, cache_outcome) = self.compile(&manifest).await?;
        check_exports(&self.inner.engine, &component, &manifest)?;
        let warnings = unused_grants(&self.inner.engine, &component, &manifest);
        for warning in &warnings {
            tracing::warn!(plugin = %manifest.name, "{warning}");
        }
        let violation = |message: &str, e: wasmtime::Error| PluginError::ContractViolation {
            plugin: manifest.name.clone(),
            message: message.to_string(),
            source: Some(e.into()),
        };
        let instance_pre = self.inner.linker.instantiate_pre(&component).map_err(|e| {
            violation(
                "it imports something this host does not provide; plugins may import \
                 berth:snapshot types, wasi:io, wasi:cli, wasi:clocks, wasi:random, \
                 wasi:filesystem, wasi:sockets (always denied) and wasi:http",
                e,
            )
        })?;
        let pre = match manifest.world {
            World::RemoteClient => Pre::Remote(
                bindings::remote::RemoteClientPluginPre::new(instance_pre).map_err(|e| {
                    violation("its exports do not match the remote-client world", e)
                })?,
            ),
            World::Snapshot => Pre::Snapshot(
                bindings::snapshot::SnapshotPluginPre::new(instance_pre)
                    .map_err(|e| violation("its exports do not match the snapshot world", e))?,
            ),
        };
        let load_time = started.elapsed();
        tracing::debug!(plugin = %manifest.name, ?cache_outcome, ?load_time, "plugin loaded");
        Ok(Plugin {
            inner: Arc::new(LoadedPlugin {
                engine: self.inner.engine.clone(),
                manifest,
                pre,
                digest,
                resolved,
                cache_outcome,
                load_time,
                warnings,
            }),
        })
    }

    /// Reads and compiles a component through the cache.
    pub(crate) async fn compile(
        &self,
        manifest: &PluginManifest,
    ) -> Result<(Component, String, Option<OciReference>, CacheOutcome), PluginError> {
        let (path, bytes, resolved) = match &manifest.component {
            ComponentSource::Path(path) => {
                let bytes = tokio::fs::read(path).await.map_err(|e| PluginError::Load {
                    plugin: manifest.name.clone(),
                    path: path.clone(),
                    message: "cannot read it".into(),
                    source: Some(e.into()),
                })?;
                (path.clone(), bytes, None)
            }
            ComponentSource::Registry(reference) => {
                let registry_error = |source| PluginError::Registry {
                    plugin: manifest.name.clone(),
                    source,
                };
                let key = match &manifest.signature_key {
                    Some(path) => {
                        Some(registry::CosignKey::from_file(path).map_err(registry_error)?)
                    }
                    None => None,
                };
                let fetched = self
                    .inner
                    .registry
                    .fetch(
                        reference,
                        Some(manifest.world),
                        manifest.accept_unpinned,
                        key.as_ref(),
                    )
                    .await
                    .map_err(registry_error)?;
                tracing::debug!(plugin = %manifest.name, reference = %fetched.reference, from_cache = fetched.from_cache, "component fetched");
                (fetched.path, fetched.bytes, Some(fetched.reference))
            }
        };
        let load_error =
            |message: &str, source: Option<Box<dyn std::error::Error + Send + Sync>>| {
                PluginError::Load {
                    plugin: manifest.name.clone(),
                    path: path.clone(),
                    message: message.to_string(),
                    source,
                }
            };
        if !bytes.starts_with(b"\0asm") {
            return Err(load_error("not a WebAssembly file", None));
        }
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return Err(load_error(
                "this is a core module, not a component; wrap it with `wasm-tools component new` \
                 (and the wasi_snapshot_preview1 reactor adapter if it uses WASI)",
                None,
            ));
        }
        let digest = blake3::hash(&bytes).to_hex().to_string();
        let engine = self.inner.engine.clone();
        let cache = self.inner.cache.clone();
        let digest2 = digest.clone();
        let (component, outcome) =
            tokio::task::spawn_blocking(move || cache.load_or_compile(&engine, &bytes, &digest2))
                .await
                .map_err(|e| load_error("the compiler thread failed", Some(e.into())))?
                .map_err(|e| load_error("it does not compile", Some(e.into())))?;
        Ok((component, digest, resolved, outcome))
    }
}

/// Creates each read-write granted directory that does not exist yet (mode
/// 0700), as a grant that says `rw` means the plugin's storage lives there;
/// a missing read-only one is left for the grant to refuse by name.
fn create_granted_dirs(manifest: &PluginManifest) -> Result<(), PluginError> {
    use std::os::unix::fs::DirBuilderExt;
    for d in &manifest.grants.dirs {
        if d.mode != DirMode::ReadWrite || d.host.exists() {
            continue;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&d.host)
            .map_err(|e| PluginError::Host {
                plugin: manifest.name.clone(),
                operation: "grant",
                message: format!(
                    "cannot create the granted directory {} (for guest path {}): {e}",
                    d.host.display(),
                    d.guest
                ),
            })?;
        tracing::info!(plugin = %manifest.name, dir = %d.host.display(), "created the granted directory");
    }
    Ok(())
}

/// Grants the component cannot use, because it imports nothing that would
/// use them: worth a warning, since they are usually a manifest mistake.
fn unused_grants(engine: &Engine, component: &Component, manifest: &PluginManifest) -> Vec<String> {
    let imports: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let imports_any = |prefix: &str| imports.iter().any(|i| i.starts_with(prefix));
    let mut warnings = Vec::new();
    if !manifest.grants.http.is_empty() && !imports_any("wasi:http/") {
        warnings.push(format!(
            "grants.http_hosts grants {} HTTP origin(s), but the component imports no wasi:http interface, so it cannot use them; remove the grant or build the plugin with wasi:http",
            manifest.grants.http.len()
        ));
    }
    if !manifest.grants.dirs.is_empty() && !imports_any("wasi:filesystem/") {
        warnings.push(
            "grants.dirs grants directories, but the component imports no wasi:filesystem interface, so it cannot use them"
                .to_string(),
        );
    }
    warnings
}

/// Checks the component exports the world's interface at our version.
fn check_exports(
    engine: &Engine,
    component: &Component,
    manifest: &PluginManifest,
) -> Result<(), PluginError> {
    let wanted = manifest.world.export_interface();
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let expected = format!("{wanted}@{CONTRACT_VERSION}");
    if exports.iter().any(|e| e == &expected) {
        return Ok(());
    }
    let message = match exports.iter().find(|e| e.split('@').next() == Some(wanted)) {
        Some(other) => format!(
            "it exports {other}, but this host implements {expected}; rebuild the plugin \
             against wit/ from this version of Berth"
        ),
        None => format!(
            "a {} must export {expected}; it exports [{}]",
            manifest.world.name(),
            exports.join(", ")
        ),
    };
    Err(PluginError::ContractViolation {
        plugin: manifest.name.clone(),
        message,
        source: None,
    })
}

impl Plugin {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.inner.manifest.name
    }

    /// The manifest it was loaded from.
    pub fn manifest(&self) -> &PluginManifest {
        &self.inner.manifest
    }

    /// The BLAKE3 digest of the component bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// The registry reference it was loaded from, pinned to the digest it
    /// resolved to; `None` for a component file.
    pub fn reference(&self) -> Option<&OciReference> {
        self.inner.resolved.as_ref()
    }

    /// The world it implements.
    pub fn world(&self) -> World {
        self.inner.manifest.world
    }

    /// What loading noticed about the manifest without refusing it, for
    /// people: grants the component cannot use (also logged as warnings).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }

    /// Whether loading hit the compile cache.
    pub fn cache_outcome(&self) -> &CacheOutcome {
        &self.inner.cache_outcome
    }

    /// How long loading took (read, compile or cache, link).
    pub fn load_time(&self) -> Duration {
        self.inner.load_time
    }

    /// A remote snapshot client backed by this plugin.
    pub fn remote_client(&self) -> Result<WasmRemoteClient, PluginError> {
        WasmRemoteClient::new(self.inner.clone())
    }

    /// Opens snapshot `id` through this plugin (a `snapshot-plugin`).
    pub async fn open_snapshot(&self, id: &str) -> Result<WasmSnapshot, crate::StoreError> {
        WasmSnapshot::open(self.inner.clone(), id).await
    }
}
