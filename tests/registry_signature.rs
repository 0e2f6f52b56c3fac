//! Cosign signatures: a manifest that asks for one loads only what its key
//! signed.

use super::*;

/// A P-256 key pair as `cosign generate-key-pair` makes one: the signing
/// half, and the public half as the PEM `cosign.pub` holds.
fn cosign_pair() -> (ring::signature::EcdsaKeyPair, String) {
    use base64::Engine as _;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let mut spki = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
    spki.extend_from_slice(pair.public_key().as_ref());
    let pem = format!(
        "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
        base64::engine::general_purpose::STANDARD.encode(spki)
    );
    (pair, pem)
}

/// Signs `reference`'s manifest digest as `cosign sign --key` does: a
/// simplesigning payload layer with the signature in an annotation, under
/// the tag `sha256-HEX.sig`.
async fn cosign_sign(
    registry: &str,
    repo: &str,
    reference: &str,
    pair: &ring::signature::EcdsaKeyPair,
) {
    use base64::Engine as _;
    let digest = digest_of(reference);
    let payload = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"{registry}/{repo}"}},"image":{{"docker-manifest-digest":"{digest}"}},"type":"cosign container image signature"}},"optional":null}}"#
    );
    let signature = pair
        .sign(&ring::rand::SystemRandom::new(), payload.as_bytes())
        .unwrap();
    let config = br#"{"architecture":"","config":{},"created":"0001-01-01T00:00:00Z","history":[{"created":"0001-01-01T00:00:00Z"}],"os":"","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let mut layer = descriptor(
        "application/vnd.dev.cosign.simplesigning.v1+json",
        payload.as_bytes(),
    );
    layer["annotations"] = serde_json::json!({
        "dev.cosignproject.cosign/signature": base64::engine::general_purpose::STANDARD.encode(signature.as_ref())
    });
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.oci.image.config.v1+json", config),
        "layers": [layer],
    });
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    push_raw(
        registry,
        repo,
        &tag,
        &[payload.as_bytes(), config],
        &manifest,
    )
    .await;
}

#[tokio::test]
async fn a_manifest_that_asks_for_a_signature_loads_only_what_its_key_signed() {
    let Some(mut reg) = LocalRegistry::start("signatures", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let push = |file: &str, repo: &str| {
        pushed(&ok(
            berth_registry(
                h,
                &reg.addr,
                h,
                &[
                    "plugin",
                    "push",
                    guest(file).to_str().unwrap(),
                    &reg.reference(&format!("{repo}:1")),
                ],
            ),
            "push",
        ))
    };
    let signed = push("fs_store", "signed");
    let unsigned = push("c_store", "unsigned");
    let (pair, pem) = cosign_pair();
    let (_, other_pem) = cosign_pair();
    std::fs::write(h.join("cosign.pub"), pem).unwrap();
    std::fs::write(h.join("other.pub"), other_pem).unwrap();
    cosign_sign(&reg.addr, "signed", &signed, &pair).await;

    let with_key = |reference: &str, key: &str| {
        let dir = h.join(format!("m-{key}-{}", &digest_of(reference)[7..15]));
        std::fs::create_dir_all(&dir).unwrap();
        let path = reference_manifest(&dir, reference, "");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            format!("{text}[signature]\nkey = {:?}\n", h.join(key)),
        )
        .unwrap();
        PluginManifest::from_file(&path).unwrap()
    };
    let cache = h.join("sig-cache");
    let host = host(h, &reg.addr, &cache);
    host.load(with_key(&signed, "cosign.pub")).await.unwrap();
    let e = host
        .load(with_key(&signed, "other.pub"))
        .await
        .err()
        .map(|e| berth_tests::chain(&e))
        .unwrap();
    assert!(
        e.contains("no cosign signature") && e.contains("other.pub"),
        "{e}"
    );
    let e = host
        .load(with_key(&unsigned, "cosign.pub"))
        .await
        .err()
        .map(|e| berth_tests::chain(&e))
        .unwrap();
    assert!(e.contains("is not signed"), "{e}");
    assert!(
        !blob_path(
            &cache,
            &layer_of(&h.join("plugin-cache"), digest_of(&unsigned))
        )
        .exists(),
        "an unsigned component was fetched"
    );
    // Verified once, the signature is cached with the component: offline
    // loads verify it again from the cache.
    reg.stop();
    let offline = super::host(h, &reg.addr, &cache);
    offline.load(with_key(&signed, "cosign.pub")).await.unwrap();
}
