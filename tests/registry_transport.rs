//! How Berth reaches registries: the contract package fetched by name (as
//! wkg does), HTTPS with its CA and plain HTTP only when listed, and a
//! registry that never answers.

use super::*;

/// The contract published as a WIT package, as the README says (the WIT
/// encoded by `wasm-tools component wit --wasm`, pushed with `berth plugin
/// push` to `REGISTRY/berth/snapshot:0.1.0`), is fetched by its package
/// name with `oci-client`, the client wkg's `wasm-pkg-client` uses, mapping
/// `NAMESPACE:NAME@VERSION` to `NAMESPACE/NAME:VERSION` as it does.
#[tokio::test]
async fn the_contract_package_is_fetched_by_name_with_the_client_wkg_uses() {
    let path = format!(
        "{}:{}",
        std::env::var("HOME")
            .map(|h| format!("{h}/.cargo/bin"))
            .unwrap_or_default(),
        std::env::var("PATH").unwrap_or_default()
    );
    let have = Command::new("sh")
        .args(["-c", "command -v wasm-tools"])
        .env("PATH", &path)
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !have {
        assert!(!docker_required(), "wasm-tools is required (CI is set) but missing; `cargo xtask build-guests` installs it");
        skipped("contract_package", "wasm-tools is not installed");
        return;
    }
    let Some(reg) = LocalRegistry::start("contract_package", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let encoded = h.join("berth-snapshot.wasm");
    let status = Command::new("wasm-tools")
        .args(["component", "wit", "--wasm", "-o"])
        .arg(&encoded)
        .arg(berth_tests::repo_root().join("wit"))
        .env("PATH", &path)
        .status()
        .unwrap();
    assert!(status.success());
    let version = berth::plugin::CONTRACT_VERSION;
    ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                encoded.to_str().unwrap(),
                &reg.reference(&format!("berth/snapshot:{version}")),
            ],
        ),
        "push the contract",
    );

    // reqwest is built without a provider of its own (see tests/Cargo.toml).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (namespace, name) = berth::plugin::CONTRACT_PACKAGE.split_once(':').unwrap();
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let reference = oci_client::Reference::with_tag(
        reg.addr.clone(),
        format!("{namespace}/{name}"),
        version.to_string(),
    );
    let image = client
        .pull(
            &reference,
            &oci_client::secrets::RegistryAuth::Anonymous,
            vec!["application/wasm"],
        )
        .await
        .unwrap();
    assert_eq!(
        image.config.media_type,
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(image.layers.len(), 1);
    let fetched = h.join("fetched.wasm");
    std::fs::write(&fetched, &image.layers[0].data).unwrap();
    let out = Command::new("wasm-tools")
        .args(["component", "wit"])
        .arg(&fetched)
        .env("PATH", &path)
        .output()
        .unwrap();
    let wit = String::from_utf8(out.stdout).unwrap();
    assert!(
        wit.contains(&format!("package berth:snapshot@{version};")),
        "{wit}"
    );
    for item in [
        "interface remote-client",
        "interface snapshot",
        "world remote-client-plugin",
        "world snapshot-plugin",
    ] {
        assert!(
            wit.contains(item),
            "{item} missing from the fetched package:\n{wit}"
        );
    }
}

#[test]
fn https_needs_the_ca_and_plain_http_must_be_listed() {
    let Some(tls) = LocalRegistry::start_with("https_and_plain_http", None, true) else {
        return;
    };
    let Some(plain) = LocalRegistry::start("https_and_plain_http", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let fs = guest("fs_store");
    let run = |env: &[(&str, &Path)], args: &[&str]| {
        let mut c = Command::new(berth_bin());
        c.env("BERTH_HOME", h)
            .env("BERTH_PLUGIN_CACHE", h.join("plugin-cache"))
            .env("DOCKER_CONFIG", h)
            .env_remove("BERTH_REGISTRY_PLAIN_HTTP")
            .env_remove("BERTH_REGISTRY_CA_FILE")
            .args(args);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let target = tls.reference("tls/fs:1");
    // HTTPS to a certificate nobody vouches for: refused, saying where a CA goes.
    let e = failed(
        run(&[], &["plugin", "push", fs.to_str().unwrap(), &target]),
        "push without the CA",
    );
    assert!(
        e.contains("certificate") && e.contains("BERTH_REGISTRY_CA_FILE"),
        "{e}"
    );
    let ca = tls.dir().join("cert.pem");
    let reference = pushed(&ok(
        run(
            &[("BERTH_REGISTRY_CA_FILE", &ca)],
            &["plugin", "push", fs.to_str().unwrap(), &target],
        ),
        "push with the CA",
    ));
    std::fs::remove_dir_all(h.join("plugin-cache")).unwrap();
    ok(
        run(
            &[("BERTH_REGISTRY_CA_FILE", &ca)],
            &["plugin", "pull", &reference],
        ),
        "pull with the CA",
    );
    // A plain-HTTP registry is reached over HTTPS unless it is listed.
    let e = failed(
        run(
            &[],
            &[
                "plugin",
                "push",
                fs.to_str().unwrap(),
                &plain.reference("p/fs:1"),
            ],
        ),
        "push to an unlisted plain-HTTP registry",
    );
    assert!(e.contains("BERTH_REGISTRY_PLAIN_HTTP"), "{e}");
}

#[test]
fn a_registry_that_never_answers_times_out_by_name() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Accepts connections and never says a word.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let started = Instant::now();
    let out = Command::new(berth_bin())
        .env("BERTH_HOME", h)
        .env("BERTH_PLUGIN_CACHE", h.join("plugin-cache"))
        .env("BERTH_REGISTRY_PLAIN_HTTP", &addr)
        .env("BERTH_REGISTRY_TIMEOUT_SECS", "1.5")
        .env("DOCKER_CONFIG", h)
        .args(["plugin", "pull", &format!("oci://{addr}/p/fs:1")])
        .output()
        .unwrap();
    let e = failed(out, "pull from a silent registry");
    assert!(
        e.contains("did not answer") && e.contains("within 2 s"),
        "{e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
