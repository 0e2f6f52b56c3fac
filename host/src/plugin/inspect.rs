//! What a component declares: its imports and exports, and which contract
//! world (if any) it implements — `berth plugin inspect`.

use std::path::Path;

use super::manifest::World;
use super::{PluginError, PluginHost, PluginManifest, CONTRACT_VERSION};

/// A component's declared shape.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ComponentInfo {
    /// BLAKE3 digest of the component bytes.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// The contract world it implements, if it exports one.
    pub world: Option<World>,
    /// The contract version it was built against, if any.
    pub contract_version: Option<String>,
    /// Imported interfaces and functions.
    pub imports: Vec<String>,
    /// Exported interfaces and functions.
    pub exports: Vec<String>,
}

/// Inspects the component at `path` (compiling it through the cache).
pub async fn inspect_component(
    host: &PluginHost,
    path: &Path,
) -> Result<ComponentInfo, PluginError> {
    let manifest = PluginManifest::for_component(path, World::RemoteClient);
    let (component, digest, _, _) = host.compile(&manifest).await?;
    let engine = host.engine();
    let ty = component.component_type();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let mut world = None;
    let mut contract_version = None;
    for e in &exports {
        let (iface, version) = e.split_once('@').unwrap_or((e.as_str(), ""));
        let w = match iface {
            "berth:snapshot/remote-client" => World::RemoteClient,
            "berth:snapshot/snapshot" => World::Snapshot,
            _ => continue,
        };
        world = Some(w);
        contract_version = Some(version.to_string());
    }
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    Ok(ComponentInfo {
        digest,
        size,
        world,
        contract_version,
        imports,
        exports,
    })
}

/// Which world a component exports, for loading a bare component without a
/// manifest. Errors if it exports neither at this host's version.
pub async fn detect_world(host: &PluginHost, path: &Path) -> Result<World, PluginError> {
    let info = inspect_component(host, path).await?;
    match (info.world, info.contract_version.as_deref()) {
        (Some(w), Some(CONTRACT_VERSION)) => Ok(w),
        (Some(_), Some(v)) => Err(PluginError::ContractViolation {
            plugin: path.display().to_string(),
            message: format!(
                "built against berth:snapshot@{v}, but this host implements @{CONTRACT_VERSION}; \
                 rebuild the plugin against wit/ from this version of Berth"
            ),
            source: None,
        }),
        _ => Err(PluginError::ContractViolation {
            plugin: path.display().to_string(),
            message: format!(
                "exports neither berth:snapshot/remote-client nor berth:snapshot/snapshot; it exports [{}]",
                info.exports.join(", ")
            ),
            source: None,
        }),
    }
}
