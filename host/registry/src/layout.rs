//! The Wasm OCI artifact layout (CNCF TAG-Runtime): an OCI image manifest
//! whose config is `application/vnd.wasm.config.v0+json` and whose one
//! layer is the component, `application/wasm`. What Berth writes, and the
//! checks a pulled manifest passes before any layer byte is fetched.

use serde::{Deserialize, Serialize};

use super::reference::Digest;
use berth_base::contract::World;
use berth_base::contract::{CONTRACT_PACKAGE, CONTRACT_VERSION};

/// The manifest media type.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// An image index (multi-platform), refused.
pub(crate) const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The Wasm config media type.
pub const CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The component layer media type.
pub const LAYER_TYPE: &str = "application/wasm";
/// Largest manifest or config accepted.
pub(crate) const MAX_METADATA_BYTES: u64 = 1 << 20;

/// A content descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Descriptor {
    /// Media type.
    #[serde(rename = "mediaType")]
    pub media_type: String,
    /// Digest of the content.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// An OCI image manifest, as much of it as Berth reads and writes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ImageManifest {
    /// Always 2.
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    /// The manifest media type, when the registry or pusher wrote it.
    #[serde(rename = "mediaType", default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layers.
    pub layers: Vec<Descriptor>,
}

/// The `component` section of the Wasm config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub(crate) struct ComponentSection {
    /// Exported interfaces and functions, sorted.
    #[serde(default)]
    pub exports: Vec<String>,
    /// Imported interfaces and functions, sorted.
    #[serde(default)]
    pub imports: Vec<String>,
    /// The world the component targets, e.g. `berth:snapshot/remote-client-plugin@0.1.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The Wasm config blob.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WasmConfig {
    /// `wasm`.
    pub architecture: String,
    /// `wasip2`.
    pub os: String,
    /// The layer digests, in order.
    #[serde(rename = "layerDigests", default)]
    pub layer_digests: Vec<String>,
    /// What the component declares; absent for a core module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentSection>,
}

/// The world name a config's `target` carries for `world`.
pub(crate) fn target_of(world: World) -> String {
    format!("{CONTRACT_PACKAGE}/{}@{CONTRACT_VERSION}", world.name())
}

/// The config for a component, deterministic: no timestamps, sorted lists,
/// a fixed field order, so the same bytes push to the same digest.
pub(crate) fn config_for(
    world: Option<World>,
    layer: &Digest,
    mut imports: Vec<String>,
    mut exports: Vec<String>,
) -> Vec<u8> {
    imports.sort();
    exports.sort();
    let config = WasmConfig {
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec![layer.to_string()],
        component: Some(ComponentSection {
            exports,
            imports,
            target: world.map(target_of),
        }),
    };
    // Serializing plain strings and vectors cannot fail.
    serde_json::to_vec(&config).unwrap_or_default()
}

/// The manifest naming `config` and `layer`.
pub(crate) fn manifest_for(config: Descriptor, layer: Descriptor) -> Vec<u8> {
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_TYPE.into()),
        config,
        layers: vec![layer],
    };
    serde_json::to_vec(&manifest).unwrap_or_default()
}

/// Parses a manifest and checks it is one Wasm component, naming what is
/// wrong otherwise. `content_type` is what the registry said it served.
pub(crate) fn check_manifest(
    bytes: &[u8],
    content_type: Option<&str>,
    max_component: u64,
) -> Result<ImageManifest, String> {
    let ct = content_type.map(|c| c.split(';').next().unwrap_or(c).trim());
    if ct == Some(INDEX_TYPE)
        || ct == Some("application/vnd.docker.distribution.manifest.list.v2+json")
    {
        return Err(format!(
            "it is an image index ({}), not a single Wasm component; push the component itself",
            ct.unwrap_or_default()
        ));
    }
    let manifest: ImageManifest = serde_json::from_slice(bytes)
        .map_err(|e| format!("its manifest is not an OCI image manifest: {e}"))?;
    if let Some(mt) = manifest.media_type.as_deref().or(ct) {
        if mt != MANIFEST_TYPE {
            return Err(format!(
                "its manifest type is {mt}, not {MANIFEST_TYPE} (a Docker image, not a Wasm artifact?)"
            ));
        }
    }
    if manifest.config.media_type != CONFIG_TYPE {
        return Err(format!(
            "its config type is {}, not {CONFIG_TYPE}: it is not a Wasm component artifact \
             (a container image?)",
            manifest.config.media_type
        ));
    }
    if manifest.config.size > MAX_METADATA_BYTES {
        return Err(format!(
            "its config declares {} bytes, over the {MAX_METADATA_BYTES}-byte limit",
            manifest.config.size
        ));
    }
    if manifest.layers.len() != 1 {
        return Err(format!(
            "it has {} layers; a plugin is exactly one {LAYER_TYPE} layer",
            manifest.layers.len()
        ));
    }
    let layer = &manifest.layers[0];
    if layer.media_type != LAYER_TYPE {
        return Err(format!(
            "its layer type is {}, not {LAYER_TYPE}",
            layer.media_type
        ));
    }
    if layer.size > max_component {
        return Err(format!(
            "its layer declares {} bytes, over the {max_component}-byte limit for a component \
             (raise it with BERTH_PLUGIN_MAX_BYTES or RegistryOptions::max_component_bytes)",
            layer.size
        ));
    }
    Digest::parse(&layer.digest).map_err(|e| format!("its layer digest: {e}"))?;
    Digest::parse(&manifest.config.digest).map_err(|e| format!("its config digest: {e}"))?;
    Ok(manifest)
}

/// Checks a config says "a component of `world`", before the layer is
/// fetched.
pub(crate) fn check_config(bytes: &[u8], world: Option<World>) -> Result<WasmConfig, String> {
    let config: WasmConfig = serde_json::from_slice(bytes)
        .map_err(|e| format!("its config is not a Wasm config: {e}"))?;
    let Some(component) = &config.component else {
        return Err(
            "its config has no component section: it is a core module, not a component; \
             wrap it with `wasm-tools component new`"
                .into(),
        );
    };
    let Some(world) = world else {
        return Ok(config);
    };
    let wanted = target_of(world);
    let export = format!("{}@{CONTRACT_VERSION}", world.export_interface());
    match &component.target {
        Some(t) if *t == wanted => Ok(config),
        Some(t) => Err(format!(
            "it targets the world {t}, but the manifest asks for {wanted}"
        )),
        None if component.exports.contains(&export) => Ok(config),
        None => Err(format!(
            "it does not export {export} (it exports [{}]), so it is not a {}",
            component.exports.join(", "),
            world.name()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(media_type: &str, size: u64) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: Digest::of(b"x").to_string(),
            size,
        }
    }

    #[test]
    fn writes_what_it_accepts_deterministically() {
        let layer = Digest::of(b"component");
        let a = config_for(
            Some(World::RemoteClient),
            &layer,
            vec!["b".into(), "a".into()],
            vec!["berth:snapshot/remote-client@0.1.0".into()],
        );
        let b = config_for(
            Some(World::RemoteClient),
            &layer,
            vec!["a".into(), "b".into()],
            vec!["berth:snapshot/remote-client@0.1.0".into()],
        );
        assert_eq!(a, b);
        check_config(&a, Some(World::RemoteClient)).unwrap();
        let e = check_config(&a, Some(World::Snapshot)).unwrap_err();
        assert!(e.contains("snapshot-plugin"), "{e}");
        let m = manifest_for(desc(CONFIG_TYPE, 10), desc(LAYER_TYPE, 100));
        check_manifest(&m, Some(MANIFEST_TYPE), 1000).unwrap();
    }

    #[test]
    fn refuses_other_shapes_by_name() {
        let two = serde_json::to_vec(&ImageManifest {
            schema_version: 2,
            media_type: None,
            config: desc(CONFIG_TYPE, 1),
            layers: vec![desc(LAYER_TYPE, 1), desc(LAYER_TYPE, 1)],
        })
        .unwrap();
        assert!(check_manifest(&two, None, 10)
            .unwrap_err()
            .contains("2 layers"));
        let tar = manifest_for(
            desc(CONFIG_TYPE, 1),
            desc("application/vnd.oci.image.layer.v1.tar", 1),
        );
        assert!(check_manifest(&tar, None, 10)
            .unwrap_err()
            .contains("layer type"));
        let image = manifest_for(
            desc("application/vnd.oci.image.config.v1+json", 1),
            desc(LAYER_TYPE, 1),
        );
        assert!(check_manifest(&image, None, 10)
            .unwrap_err()
            .contains("config type"));
        let big = manifest_for(desc(CONFIG_TYPE, 1), desc(LAYER_TYPE, 11));
        assert!(check_manifest(&big, None, 10)
            .unwrap_err()
            .contains("over the 10-byte"));
        assert!(check_manifest(b"{}", Some(INDEX_TYPE), 10)
            .unwrap_err()
            .contains("index"));
        let core = br#"{"architecture":"wasm","os":"wasip1","layerDigests":[]}"#;
        assert!(check_config(core, Some(World::Snapshot))
            .unwrap_err()
            .contains("core module"));
    }
}
