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
        let port = berth_tests::free_port();
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
    berth_tests::remove_workspace(berth_tests::local_root(&state));
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

#[path = "registry_scaffold.rs"]
mod scaffold;
#[path = "registry_transport.rs"]
mod transport;

#[path = "registry_signature.rs"]
mod signature;

#[path = "registry_shapes.rs"]
mod shapes;
