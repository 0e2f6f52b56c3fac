//! Plugins by reference, against real registries: Debian's `docker-registry`
//! 2.8, one private instance per test (so it can be stopped, and given
//! htpasswd auth), the real CLI in fresh processes, real compiled guests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use berth::plugin::{
    CompileCache, PluginError, PluginHost, PluginManifest, RegistryError, RegistryOptions, World,
};
use berth_tests::{berth_bin, docker_required, guest, skipped};

/// A private registry: its own port, data directory and (optionally)
/// htpasswd users.
pub struct LocalRegistry {
    pub addr: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl LocalRegistry {
    /// Starts one, or `None` (skipped) when `docker-registry` is missing
    /// and nothing requires it.
    pub fn start(test: &str, user: Option<(&str, &str)>) -> Option<Self> {
        Self::start_with(test, user, false)
    }

    /// [`LocalRegistry::start`], over HTTPS with a fresh self-signed
    /// certificate (`cert.pem` in [`LocalRegistry::dir`]) when `tls`.
    pub fn start_with(test: &str, user: Option<(&str, &str)>, tls: bool) -> Option<Self> {
        let have = Command::new("docker-registry")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !have {
            assert!(
                !docker_required(),
                "{test}: docker-registry is required (CI or BERTH_REQUIRE_DOCKER is set) but missing; `cargo xtask setup` installs it"
            );
            skipped(
                test,
                "docker-registry is not installed (`cargo xtask setup`)",
            );
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some((u, p)) = user {
            let hash = bcrypt::hash(p, 5).unwrap();
            std::fs::write(dir.path().join("htpasswd"), format!("{u}:{hash}\n")).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: berth-test\n    path: {}\n",
                dir.path().join("htpasswd").display()
            ));
        }
        if tls {
            let status = Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-days",
                    "2",
                ])
                .args([
                    "-subj",
                    "/CN=127.0.0.1",
                    "-addext",
                    "subjectAltName=IP:127.0.0.1",
                    "-addext",
                    "basicConstraints=critical,CA:FALSE",
                ])
                .arg("-keyout")
                .arg(dir.path().join("key.pem"))
                .arg("-out")
                .arg(dir.path().join("cert.pem"))
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "openssl req failed");
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                dir.path().join("cert.pem").display(),
                dir.path().join("key.pem").display()
            ));
        }
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let mut r = LocalRegistry {
            addr: format!("127.0.0.1:{port}"),
            dir,
            child: None,
        };
        r.resume();
        Some(r)
    }

    /// Starts (again) on the same port and data.
    pub fn resume(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(&self.addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "docker-registry did not answer on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops it: from now on nothing answers on its port.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(std::net::TcpStream::connect(&self.addr).is_err());
    }

    /// Its directory (config, certificate, data).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `oci://ADDR/PATH`.
    pub fn reference(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.addr)
    }
}

impl Drop for LocalRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the CLI with a private plugin cache and compile cache, plain HTTP
/// allowed to `registry`, and `DOCKER_CONFIG` at `docker_config`.
pub fn berth_registry(
    home: &Path,
    registry: &str,
    docker_config: &Path,
    args: &[&str],
) -> std::process::Output {
    Command::new(berth_bin())
        .env("BERTH_HOME", home)
        .env("BERTH_PLUGIN_CACHE", home.join("plugin-cache"))
        .env("BERTH_REGISTRY_PLAIN_HTTP", registry)
        .env("DOCKER_CONFIG", docker_config)
        .env("RUST_LOG", "berth=info")
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn failed(out: std::process::Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).unwrap()
}

/// The pinned reference `berth plugin push` printed.
pub fn pushed(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("pushed "))
        .unwrap_or_else(|| panic!("no `pushed` line in {stdout}"))
        .trim()
        .to_string()
}

fn host(home: &Path, registry: &str, cache: &Path) -> PluginHost {
    PluginHost::with_cache_and_registry(
        CompileCache::at(home.join("compiled")),
        RegistryOptions::default()
            .plain_http(registry)
            .docker_config(None)
            .cache_dir(cache)
            .timeout(Duration::from_secs(5)),
    )
    .unwrap()
}

/// An fs-store-shaped manifest whose component is `reference`.
fn reference_manifest(dir: &Path, reference: &str, extra: &str) -> PathBuf {
    let store = dir.join("store");
    std::fs::create_dir_all(&store).unwrap();
    let path = dir.join("store.toml");
    std::fs::write(
        &path,
        format!(
            "name = \"fs-store\"\ncomponent = \"{reference}\"\n{extra}world = \"remote-client-plugin\"\n\
             [config]\nroot = \"/data\"\n[[grants.dirs]]\nhost = {store:?}\nguest = \"/data\"\nmode = \"rw\"\n"
        ),
    )
    .unwrap();
    path
}

fn blob_path(cache: &Path, digest: &str) -> PathBuf {
    cache
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn layer_of(cache: &Path, manifest_digest: &str) -> String {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(blob_path(cache, manifest_digest)).unwrap()).unwrap();
    m["layers"][0]["digest"].as_str().unwrap().to_string()
}

fn digest_of(reference: &str) -> &str {
    reference.rsplit_once('@').unwrap().1
}

#[tokio::test]
async fn push_prints_a_stable_digest_and_a_pinned_reference_loads_offline() {
    let Some(mut reg) = LocalRegistry::start("push_prints_a_stable_digest", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let fs_store = guest("fs_store");
    let target = reg.reference("plugins/fs-store:0.1.0");
    let first = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &["plugin", "push", fs_store.to_str().unwrap(), &target],
        ),
        "push",
    ));
    assert!(first.starts_with(&format!("{target}@sha256:")), "{first}");
    // Deterministic: the same bytes from another cache get the same digest.
    std::fs::remove_dir_all(h.join("plugin-cache")).unwrap();
    let second = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &["plugin", "push", fs_store.to_str().unwrap(), &target],
        ),
        "second push",
    ));
    assert_eq!(first, second);

    // Pull into an empty cache, then lose the registry: loads need nothing.
    std::fs::remove_dir_all(h.join("plugin-cache")).unwrap();
    let pulled = ok(
        berth_registry(h, &reg.addr, h, &["plugin", "pull", &first]),
        "pull",
    );
    assert!(pulled.contains(&first), "{pulled}");
    reg.stop();
    let plugin = host(h, &reg.addr, &h.join("plugin-cache"))
        .load(PluginManifest::from_file(&reference_manifest(h, &first, "")).unwrap())
        .await
        .unwrap();
    assert_eq!(
        plugin.reference().map(|r| r.to_string()),
        Some(first.clone())
    );
    assert_eq!(
        plugin.digest(),
        blake3::hash(&std::fs::read(&fs_store).unwrap())
            .to_hex()
            .as_str()
    );

    // The CLI too, end to end, with the registry still down: a sandbox whose
    // store is the pinned reference stops, loses its workspace, starts.
    let manifest = reference_manifest(h, &first, "");
    let m = manifest.to_str().unwrap();
    let snap = format!("remote:{m}");
    ok(
        berth_registry(h, &reg.addr, h, &["create", "r1", "--snapshot", &snap]),
        "create",
    );
    ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "exec",
                "r1",
                "--",
                "mkdir -p d && echo kept > d/f && chmod 640 d/f",
            ],
        ),
        "exec",
    );
    ok(berth_registry(h, &reg.addr, h, &["stop", "r1"]), "stop");
    let state = berth_tests::berth_state(h, "r1");
    std::fs::remove_dir_all(berth_tests::local_root(&state)).unwrap();
    ok(berth_registry(h, &reg.addr, h, &["start", "r1"]), "start");
    let out = ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &["exec", "r1", "--", "cat d/f; stat -c %a d/f"],
        ),
        "exec after restore",
    );
    assert_eq!(out, "kept\n640\n");
    ok(berth_registry(h, &reg.addr, h, &["rm", "r1"]), "rm");
}

#[tokio::test]
async fn a_pinned_digest_outlives_its_tag_and_unpinned_needs_consent() {
    let Some(reg) = LocalRegistry::start("a_pinned_digest_outlives_its_tag", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let target = reg.reference("plugins/store:v1");
    let old = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("fs_store").to_str().unwrap(),
                &target,
            ],
        ),
        "push fs-store",
    ));
    // The tag now names other bytes (another remote client).
    let new = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("c_store").to_str().unwrap(),
                &target,
            ],
        ),
        "push c-store",
    ));
    assert_ne!(old, new);
    let cache = h.join("fresh-cache");
    let host = host(h, &reg.addr, &cache);
    let plugin = host
        .load(PluginManifest::from_file(&reference_manifest(h, &old, "")).unwrap())
        .await
        .unwrap();
    assert_eq!(
        plugin.digest(),
        blake3::hash(&std::fs::read(guest("fs_store")).unwrap())
            .to_hex()
            .as_str(),
        "the pinned digest must load the bytes it named, not what the tag names now"
    );
    // Without a digest: refused, unless the manifest accepts it.
    let e = host
        .load(PluginManifest::from_file(&reference_manifest(h, &target, "")).unwrap())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            &e,
            PluginError::Registry {
                source: RegistryError::Unpinned { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(berth_tests::chain(&e).contains("accept_unpinned"), "{e}");
    let plugin = host
        .load(
            PluginManifest::from_file(&reference_manifest(h, &target, "accept_unpinned = true\n"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(plugin.reference().unwrap().to_string(), new);
}

#[tokio::test]
async fn a_corrupt_or_half_written_cache_entry_is_fetched_again() {
    let Some(reg) = LocalRegistry::start("a_corrupt_cache_entry", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let reference = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("fs_store").to_str().unwrap(),
                &reg.reference("p/fs:1"),
            ],
        ),
        "push",
    ));
    let cache = h.join("plugin-cache");
    let layer = blob_path(&cache, &layer_of(&cache, digest_of(&reference)));
    let whole = std::fs::read(&layer).unwrap();
    let manifest = PluginManifest::from_file(&reference_manifest(h, &reference, "")).unwrap();
    let host = host(h, &reg.addr, &cache);
    // One flipped byte, then a truncated (half-written) file.
    let mut flipped = whole.clone();
    flipped[whole.len() / 2] ^= 0x40;
    for broken in [flipped, whole[..whole.len() / 2].to_vec()] {
        std::fs::write(&layer, &broken).unwrap();
        let plugin = host.load(manifest.clone()).await.unwrap();
        assert_eq!(plugin.digest(), blake3::hash(&whole).to_hex().as_str());
        assert_eq!(
            std::fs::read(&layer).unwrap(),
            whole,
            "the entry was fetched again"
        );
    }
}

/// Pushes a hand-made artifact: the blobs, then a manifest naming them.
async fn push_raw(
    registry: &str,
    repo: &str,
    tag: &str,
    blobs: &[&[u8]],
    manifest: &serde_json::Value,
) {
    for blob in blobs {
        let digest = format!(
            "sha256:{}",
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(blob))
        );
        let started = http_request(
            registry,
            "POST",
            &format!("/v2/{repo}/blobs/uploads/"),
            None,
            vec![],
        )
        .await;
        assert_eq!(started.0, 202, "upload start: {}", started.2);
        let location = started.1.unwrap();
        let sep = if location.contains('?') { '&' } else { '?' };
        let put = http_request(
            registry,
            "PUT",
            &format!("{location}{sep}digest={digest}"),
            None,
            blob.to_vec(),
        )
        .await;
        assert_eq!(put.0, 201, "blob put: {}", put.2);
    }
    let put = http_request(
        registry,
        "PUT",
        &format!("/v2/{repo}/manifests/{tag}"),
        Some("application/vnd.oci.image.manifest.v1+json"),
        serde_json::to_vec(manifest).unwrap(),
    )
    .await;
    assert_eq!(put.0, 201, "manifest put: {}", put.2);
}

/// One plain-HTTP request: (status, Location, body).
async fn http_request(
    registry: &str,
    method: &str,
    path_or_url: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, Option<String>, String) {
    use http_body_util::BodyExt;
    let url = if path_or_url.starts_with("http") {
        path_or_url.to_string()
    } else {
        format!("http://{registry}{path_or_url}")
    };
    let stream = tokio::net::TcpStream::connect(registry).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(&url)
        .header("host", registry)
        .header("content-length", body.len());
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = sender
        .send_request(
            req.body(http_body_util::Full::new(bytes::Bytes::from(body)))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        location,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn descriptor(media_type: &str, blob: &[u8]) -> serde_json::Value {
    serde_json::json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(blob))),
        "size": blob.len(),
    })
}

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

#[tokio::test]
async fn htpasswd_auth_through_the_docker_config() {
    let Some(reg) = LocalRegistry::start("htpasswd_auth", Some(("agent", "s3cret"))) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let fs = guest("fs_store");
    let target = reg.reference("private/fs:1");
    let none = h.join("no-config");
    std::fs::create_dir_all(&none).unwrap();
    let e = failed(
        berth_registry(
            h,
            &reg.addr,
            &none,
            &["plugin", "push", fs.to_str().unwrap(), &target],
        ),
        "push without credentials",
    );
    assert!(e.contains("docker login") && e.contains(&reg.addr), "{e}");
    let auth = |user: &str, pass: &str| {
        use base64::Engine as _;
        let dir = h.join(format!("config-{user}-{pass}"));
        std::fs::create_dir_all(&dir).unwrap();
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"auths":{{"{}":{{"auth":"{token}"}}}}}}"#, reg.addr),
        )
        .unwrap();
        dir
    };
    let wrong = auth("agent", "guess");
    let e = failed(
        berth_registry(
            h,
            &reg.addr,
            &wrong,
            &["plugin", "push", fs.to_str().unwrap(), &target],
        ),
        "push with a wrong password",
    );
    assert!(e.contains("refused"), "{e}");
    let right = auth("agent", "s3cret");
    let reference = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            &right,
            &["plugin", "push", fs.to_str().unwrap(), &target],
        ),
        "push with credentials",
    ));
    std::fs::remove_dir_all(h.join("plugin-cache")).unwrap();
    ok(
        berth_registry(h, &reg.addr, &right, &["plugin", "pull", &reference]),
        "pull with credentials",
    );
    let e = failed(
        berth_registry(h, &reg.addr, &none, &["plugin", "pull", &target]),
        "pull of a tag without credentials",
    );
    assert!(
        e.contains("UNAUTHORIZED") || e.contains("docker login"),
        "{e}"
    );
}

#[tokio::test]
async fn save_and_load_carry_plugins_to_a_host_without_a_registry() {
    let Some(mut reg) = LocalRegistry::start("save_and_load", None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let fs = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("fs_store").to_str().unwrap(),
                &reg.reference("p/fs:1"),
            ],
        ),
        "push fs",
    ));
    let c = pushed(&ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &[
                "plugin",
                "push",
                guest("c_store").to_str().unwrap(),
                &reg.reference("p/c:1"),
            ],
        ),
        "push c",
    ));
    let tar = h.join("plugins.tar");
    ok(
        berth_registry(
            h,
            &reg.addr,
            h,
            &["plugin", "save", &fs, &c, "-o", tar.to_str().unwrap()],
        ),
        "save",
    );
    reg.stop();

    // A tampered archive loads nothing.
    let air = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(&tar).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    let bad = h.join("tampered.tar");
    std::fs::write(&bad, bytes).unwrap();
    let e = failed(
        berth_registry(
            air.path(),
            &reg.addr,
            air.path(),
            &["plugin", "load", bad.to_str().unwrap()],
        ),
        "load of a tampered archive",
    );
    assert!(
        e.contains("does not match its digest") || e.contains("archive"),
        "{e}"
    );
    let blobs = air.path().join("plugin-cache/blobs/sha256");
    assert!(
        !blobs.exists() || std::fs::read_dir(&blobs).unwrap().next().is_none(),
        "a bad archive wrote blobs"
    );

    let out = ok(
        berth_registry(
            air.path(),
            &reg.addr,
            air.path(),
            &["plugin", "load", tar.to_str().unwrap()],
        ),
        "load",
    );
    assert!(out.contains(&fs) && out.contains(&c), "{out}");
    let host = host(air.path(), &reg.addr, &air.path().join("plugin-cache"));
    for r in [&fs, &c] {
        let plugin = host
            .load(PluginManifest::from_file(&reference_manifest(air.path(), r, "")).unwrap())
            .await
            .unwrap();
        assert_eq!(plugin.world(), World::RemoteClient);
    }
}

/// `berth plugin new NAME --lang LANG`, built with the command it printed,
/// checked clause by clause, pushed, and used by its pinned reference as a
/// sandbox's store: stop, lose the workspace, start, identical.
fn scaffold_round_trip(test: &str, lang: &str, tools: &[&str]) {
    let path = format!(
        "{}:{}",
        std::env::var("HOME")
            .map(|h| format!("{h}/.cargo/bin"))
            .unwrap_or_default(),
        std::env::var("PATH").unwrap_or_default()
    );
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .env("PATH", &path)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                !docker_required(),
                "{test}: {tool} is required (CI is set) but missing; `cargo xtask build-guests` installs the guest toolchains"
            );
            skipped(
                test,
                &format!("{tool} is not installed (`cargo xtask build-guests`)"),
            );
            return;
        }
    }
    let Some(mut reg) = LocalRegistry::start(test, None) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let name = format!("my-{lang}-store");
    let project = h.join(&name);
    let addr = reg.addr.clone();
    let run = |dir: &Path, args: &[&str]| berth_registry_in(dir, h, &addr, args);
    let out = ok(
        run(h, &["plugin", "new", &name, "--lang", lang]),
        "plugin new",
    );
    // It refuses to overwrite.
    let e = failed(
        run(h, &["plugin", "new", &name, "--lang", lang]),
        "a second plugin new",
    );
    assert!(e.contains("--force"), "{e}");
    // The build commands it printed, between `cd` and `berth plugin check`.
    let build: Vec<&str> = out
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("cd "))
        .skip(1)
        .take_while(|l| !l.starts_with("berth "))
        .collect();
    assert!(!build.is_empty(), "no build command in {out}");
    for command in build {
        let status = Command::new("sh")
            .args(["-c", command])
            .current_dir(&project)
            .env("PATH", &path)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .unwrap();
        assert!(status.success(), "{test}: `{command}` failed: {status}");
    }
    let manifest = project.join("berth-plugin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let parsed = PluginManifest::from_file(&manifest).unwrap();
    assert_eq!(parsed.grants.dirs.len(), 1, "{text}");
    assert_eq!(parsed.grants.dirs[0].host, project.join("./store-data"));
    assert!(
        parsed.grants.http.is_empty() && parsed.grants.env.is_empty(),
        "{text}"
    );
    let report = ok(
        run(
            &project,
            &[
                "plugin",
                "check",
                "berth-plugin.toml",
                "--large-size",
                "32MiB",
                "--medium-size",
                "4MiB",
            ],
        ),
        "plugin check",
    );
    assert!(report.contains(", 0 failed"), "{report}");
    let reference = pushed(&ok(
        run(
            &project,
            &[
                "plugin",
                "push",
                "berth-plugin.toml",
                &reg.reference(&format!("plugins/{name}:0.1.0")),
            ],
        ),
        "plugin push",
    ));
    reg.stop();

    // A store manifest naming the pinned reference; the registry is gone,
    // so the load is served by the cache the push filled.
    let store = h.join("store.toml");
    std::fs::write(
        &store,
        text.replace(
            &text
                .lines()
                .find(|l| l.starts_with("component"))
                .unwrap()
                .to_string(),
            &format!("component = \"{reference}\""),
        )
        .replace("./store-data", project.join("store-data").to_str().unwrap()),
    )
    .unwrap();
    let snap = format!("remote:{}", store.display());
    ok(run(h, &["create", "s1", "--snapshot", &snap]), "create");
    ok(
        run(h, &["exec", "s1", "--", "mkdir -p a/b && printf 'x%.0s' $(seq 1 5000) > a/b/f && ln -s b/f a/l && chmod 600 a/b/f"]),
        "exec",
    );
    let before = ok(
        run(
            h,
            &[
                "exec",
                "s1",
                "--",
                "ls -lR --time-style=+%s . | sort; md5sum a/b/f",
            ],
        ),
        "list",
    );
    ok(run(h, &["stop", "s1"]), "stop");
    let state = berth_tests::berth_state(h, "s1");
    std::fs::remove_dir_all(berth_tests::local_root(&state)).unwrap();
    ok(run(h, &["start", "s1"]), "start");
    let after = ok(
        run(
            h,
            &[
                "exec",
                "s1",
                "--",
                "ls -lR --time-style=+%s . | sort; md5sum a/b/f",
            ],
        ),
        "list after",
    );
    assert_eq!(before, after);
    ok(run(h, &["rm", "s1"]), "rm");
}

/// [`berth_registry`] in `dir`, with the docker config at `home`.
fn berth_registry_in(
    dir: &Path,
    home: &Path,
    registry: &str,
    args: &[&str],
) -> std::process::Output {
    Command::new(berth_bin())
        .current_dir(dir)
        .env("BERTH_HOME", home)
        .env("BERTH_PLUGIN_CACHE", home.join("plugin-cache"))
        .env("BERTH_REGISTRY_PLAIN_HTTP", registry)
        .env("DOCKER_CONFIG", home)
        .env("RUST_LOG", "berth=info")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn scaffold_in_rust_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_rust", "rust", &["cargo"]);
}

#[test]
fn scaffold_in_python_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_python", "python", &["componentize-py"]);
}

#[test]
fn scaffold_in_js_builds_checks_pushes_and_restores() {
    scaffold_round_trip("scaffold_in_js", "js", &["node", "npm"]);
}

#[test]
fn scaffold_in_c_builds_checks_pushes_and_restores() {
    scaffold_round_trip(
        "scaffold_in_c",
        "c",
        &["wit-bindgen", "clang", "wasm-tools"],
    );
}

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
    let offline = super::registry::host(h, &reg.addr, &cache);
    offline.load(with_key(&signed, "cosign.pub")).await.unwrap();
}

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
