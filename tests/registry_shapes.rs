//! Artifacts of other shapes (an index, another config type, two layers, a
//! core module, a lying size) are refused by name before their layers are
//! fetched.

use super::*;

#[tokio::test]
async fn other_shapes_are_refused_by_name_before_their_layers_are_fetched() {
    let Some(reg) = LocalRegistry::start("other_shapes_are_refused", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let component = std::fs::read(guest("fs_store")).unwrap();
    let wasm_config = serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm", "os": "wasip2", "layerDigests": [],
        "component": {"exports": ["berth:snapshot/remote-client@0.1.0"], "imports": []}
    }))
    .unwrap();
    let core_config = br#"{"architecture":"wasm","os":"wasip1","layerDigests":[]}"#.to_vec();
    let image_config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let manifest = |config_type: &str, config: &[u8], layers: Vec<serde_json::Value>| {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor(config_type, config),
            "layers": layers,
        })
    };
    let wasm = "application/vnd.wasm.config.v0+json";
    let cases: Vec<(&str, Vec<&[u8]>, serde_json::Value, &str)> = vec![
        (
            "two-layers",
            vec![&component, &wasm_config],
            manifest(
                wasm,
                &wasm_config,
                vec![
                    descriptor("application/wasm", &component),
                    descriptor("application/wasm", &component),
                ],
            ),
            "2 layers",
        ),
        (
            "tar-layer",
            vec![&component, &wasm_config],
            manifest(
                wasm,
                &wasm_config,
                vec![descriptor(
                    "application/vnd.oci.image.layer.v1.tar",
                    &component,
                )],
            ),
            "layer type is application/vnd.oci.image.layer.v1.tar",
        ),
        (
            "container-image",
            vec![&component, &image_config],
            manifest(
                "application/vnd.oci.image.config.v1+json",
                &image_config,
                vec![descriptor("application/wasm", &component)],
            ),
            "config type is application/vnd.oci.image.config.v1+json",
        ),
        (
            "core-module",
            vec![&component, &core_config],
            manifest(
                wasm,
                &core_config,
                vec![descriptor("application/wasm", &component)],
            ),
            "core module",
        ),
    ];
    let host = host(h, &reg.addr, &h.join("cache"));
    for (repo, blobs, m, want) in cases {
        push_raw(&reg.addr, repo, "1", &blobs, &m).await;
        let reference = format!("oci://{}/{repo}:1", reg.addr);
        let pinned = host.registry().resolve(&reference.parse().unwrap()).await;
        let e = match pinned {
            Err(e) => berth_tests::chain(&e),
            Ok(p) => host
                .load(
                    PluginManifest::from_file(&reference_manifest(h, &p.to_string(), "")).unwrap(),
                )
                .await
                .err()
                .map(|e| berth_tests::chain(&e))
                .unwrap_or_else(|| panic!("{repo} loaded")),
        };
        assert!(e.contains(want), "{repo}: {e}");
        assert!(
            !blob_path(
                &h.join("cache"),
                &format!(
                    "sha256:{}",
                    hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&component))
                )
            )
            .exists(),
            "{repo}: the layer was fetched before the refusal"
        );
    }

    // Another world: a snapshot plugin where a remote client is asked for.
    let dir_snapshot = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("dir_snapshot").to_str().unwrap(),
                &reg.reference("dir:1"),
            ],
        ),
        "push dir-snapshot",
    ));
    let e = host
        .load(PluginManifest::from_file(&reference_manifest(h, &dir_snapshot, "")).unwrap())
        .await
        .err()
        .map(|e| berth_tests::chain(&e))
        .unwrap();
    assert!(
        e.contains("snapshot-plugin") && e.contains("remote-client-plugin"),
        "{e}"
    );

    // Over the size limit, declared in the manifest: refused unfetched.
    let fs = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("fs_store").to_str().unwrap(),
                &reg.reference("fs:1"),
            ],
        ),
        "push fs-store",
    ));
    let small = PluginHost::with_cache_and_registry(
        CompileCache::at(h.join("compiled")),
        RegistryOptions::default()
            .plain_http(&reg.addr)
            .docker_config(None)
            .cache_dir(h.join("small-cache"))
            .max_component_bytes(1000),
    )
    .unwrap();
    let e = small
        .load(PluginManifest::from_file(&reference_manifest(h, &fs, "")).unwrap())
        .await
        .err()
        .map(|e| berth_tests::chain(&e))
        .unwrap();
    assert!(e.contains("over the 1000-byte limit"), "{e}");
    assert!(!blob_path(
        &h.join("small-cache"),
        &layer_of(&h.join("plugin-cache"), digest_of(&fs))
    )
    .exists());
}
