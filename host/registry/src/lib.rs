//! Plugins by reference: components pulled from and pushed to OCI
//! registries, pinned by digest, kept in a content-addressed cache so a
//! pinned reference loads with no network at all, and carried to
//! air-gapped hosts as an OCI image layout tar.
//!
//! ```toml
//! component = "oci://registry.example.com/plugins/fs-store:0.1.0@sha256:…"
//! world = "remote-client-plugin"
//! ```
//!
//! - `reference`: the `oci://` grammar.
//! - `layout`: the Wasm OCI artifact layout, and the checks a manifest
//!   passes before any layer byte is fetched.
//! - `cache`: blobs by digest, re-hashed on every read.
//! - `credentials`: docker config `auths`, `credHelpers`, `credsStore`.
//! - `client`: the distribution API.
//! - `layout_archive`: `save` / `load`.
//! - `signature`: key-based cosign signatures.

mod cache;
mod client;
mod credentials;
mod layout;
mod layout_archive;
mod reference;
mod signature;

pub use cache::BlobCache;
pub use credentials::Credentials;
pub use layout::{CONFIG_TYPE, LAYER_TYPE, MANIFEST_TYPE};
pub use reference::{Digest, OciReference, ReferenceError, SCHEME};
pub use signature::CosignKey;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use berth_base::contract::World;
use client::{Payload, RegistryClient};
use layout::Descriptor;

/// Default limit on a component's size.
pub const DEFAULT_MAX_COMPONENT_BYTES: u64 = 256 << 20;
/// Default timeout for connecting and for each wait on the registry.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong reaching a registry or the plugin cache.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The reference is not `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]`.
    #[error("bad plugin reference: {0}")]
    Reference(String),
    /// A reference without a digest, where one is required.
    #[error("{reference} is not pinned: add @sha256:… (`berth plugin push` and `berth plugin pull` print it), or set `accept_unpinned = true` in the manifest to take whatever the tag names now")]
    Unpinned {
        /// The reference.
        reference: String,
    },
    /// The artifact is not one Wasm component of the wanted world.
    #[error("{reference} is refused: {reason}")]
    Refused {
        /// The reference.
        reference: String,
        /// Why, naming what it is.
        reason: String,
    },
    /// The registry answered with an error status.
    #[error("registry {registry} answered {request} with {status}: {message}")]
    Status {
        /// `host[:port]`.
        registry: String,
        /// Method and path.
        request: String,
        /// HTTP status.
        status: u16,
        /// The registry's own text.
        message: String,
    },
    /// Authentication failed or is needed.
    #[error("registry {registry}: {message}")]
    Unauthorized {
        /// `host[:port]`.
        registry: String,
        /// What happened and what to do.
        message: String,
    },
    /// The registry could not be reached.
    #[error("cannot reach registry {registry}: {message}")]
    Transport {
        /// `host[:port]`.
        registry: String,
        /// The transport error chain, and what to check.
        message: String,
    },
    /// The registry did not answer in time.
    #[error("registry {registry} did not answer {what} within {seconds:.0} s (BERTH_REGISTRY_TIMEOUT_SECS raises it)")]
    Timeout {
        /// `host[:port]`.
        registry: String,
        /// What was waited for.
        what: String,
        /// The timeout.
        seconds: f64,
    },
    /// A response was larger than allowed.
    #[error("registry {registry} sent {what} over the {limit}-byte limit")]
    TooLarge {
        /// `host[:port]`.
        registry: String,
        /// What.
        what: String,
        /// The limit.
        limit: u64,
    },
    /// Bytes did not hash to the digest that names them.
    #[error("{what} does not match its digest: expected {expected}, got {got}")]
    DigestMismatch {
        /// Which bytes.
        what: String,
        /// The expected digest (or size).
        expected: String,
        /// What was found.
        got: String,
    },
    /// The TLS set-up (CA file) is unusable.
    #[error("TLS: {message}")]
    Tls {
        /// What is wrong.
        message: String,
    },
    /// The docker config or a credential helper failed.
    #[error("credentials for {registry}: {message}")]
    Credentials {
        /// `host[:port]`.
        registry: String,
        /// What failed.
        message: String,
    },
    /// A signature the manifest requires is missing or does not verify.
    #[error("signature: {message}")]
    Signature {
        /// What was checked and what to do.
        message: String,
    },
    /// A saved plugin archive is malformed.
    #[error("plugin archive: {0}")]
    Archive(String),
    /// A local file operation failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// How to reach registries and where to cache what they serve. Built like
/// wasmtime's `WasiCtxBuilder`: start from [`RegistryOptions::from_env`] or
/// [`Default`], then set what differs.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    plain_http: Vec<String>,
    ca_file: Option<PathBuf>,
    timeout: Duration,
    docker_config: Option<PathBuf>,
    cache: BlobCache,
    max_component_bytes: u64,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: Vec::new(),
            ca_file: None,
            timeout: DEFAULT_TIMEOUT,
            docker_config: credentials::default_docker_config_dir(),
            cache: BlobCache::from_env(),
            max_component_bytes: DEFAULT_MAX_COMPONENT_BYTES,
        }
    }
}

impl RegistryOptions {
    /// The defaults, then the environment: `BERTH_REGISTRY_PLAIN_HTTP`
    /// (comma-separated `host[:port]`), `BERTH_REGISTRY_CA_FILE`,
    /// `BERTH_REGISTRY_TIMEOUT_SECS`, `BERTH_PLUGIN_MAX_BYTES`,
    /// `BERTH_PLUGIN_CACHE` and `DOCKER_CONFIG`.
    pub fn from_env() -> Self {
        let mut o = Self::default();
        if let Ok(hosts) = std::env::var("BERTH_REGISTRY_PLAIN_HTTP") {
            o.plain_http = hosts
                .split(',')
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect();
        }
        if let Some(ca) = std::env::var_os("BERTH_REGISTRY_CA_FILE") {
            o.ca_file = Some(PathBuf::from(ca));
        }
        if let Some(secs) = std::env::var("BERTH_REGISTRY_TIMEOUT_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0 && s.is_finite())
        {
            o.timeout = Duration::from_secs_f64(secs);
        }
        if let Some(max) = std::env::var("BERTH_PLUGIN_MAX_BYTES")
            .ok()
            .and_then(|s| berth_base::units::parse_size(&s).ok())
        {
            o.max_component_bytes = max;
        }
        o
    }

    /// Lets `host[:port]` be reached over plain HTTP. By default, every
    /// registry is reached over HTTPS.
    pub fn plain_http(mut self, host: impl Into<String>) -> Self {
        self.plain_http.push(host.into().to_ascii_lowercase());
        self
    }

    /// Trusts the certificates in this PEM file besides the system's. By
    /// default, only the system's roots are trusted.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Sets the connect timeout and the longest wait for each answer or
    /// piece of a body. By default, 30 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Reads credentials from the docker config in `dir` (its
    /// `config.json`), or none with `None`. By default, `$DOCKER_CONFIG`,
    /// else `~/.docker`.
    pub fn docker_config(mut self, dir: Option<PathBuf>) -> Self {
        self.docker_config = dir;
        self
    }

    /// Caches blobs under `dir`. By default, `$BERTH_PLUGIN_CACHE`, else
    /// `~/.cache/berth/plugins`.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = BlobCache::at(dir);
        self
    }

    /// Refuses components declared larger than this, before fetching. By
    /// default, 256 MiB.
    pub fn max_component_bytes(mut self, bytes: u64) -> Self {
        self.max_component_bytes = bytes;
        self
    }

    /// The blob cache.
    pub fn cache(&self) -> &BlobCache {
        &self.cache
    }
}

/// A component fetched (or found in the cache), verified.
#[derive(Debug)]
pub struct Fetched {
    /// The reference pinned to the manifest digest it resolved to.
    pub reference: OciReference,
    /// The component layer's digest.
    pub layer: Digest,
    /// Where the verified component lives in the cache.
    pub path: PathBuf,
    /// The component's bytes, as verified.
    pub bytes: Vec<u8>,
    /// Whether no network was needed.
    pub from_cache: bool,
}

/// What a pushed component declares, for its config.
#[derive(Debug, Clone, Default)]
pub struct ComponentShape {
    /// The contract world it implements, if any.
    pub world: Option<World>,
    /// Its imports.
    pub imports: Vec<String>,
    /// Its exports.
    pub exports: Vec<String>,
}

/// Registries and the blob cache. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Registry {
    options: RegistryOptions,
    clients: Arc<Mutex<HashMap<String, Arc<RegistryClient>>>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RegistryClient")
    }
}

impl Registry {
    /// Registries reached as `options` say.
    pub fn new(options: RegistryOptions) -> Self {
        Registry {
            options,
            clients: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The options.
    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }

    fn client(&self, registry: &str) -> Result<Arc<RegistryClient>, RegistryError> {
        if let Some(c) = self
            .clients
            .lock()
            .ok()
            .and_then(|m| m.get(registry).cloned())
        {
            return Ok(c);
        }
        let c = Arc::new(RegistryClient::new(&self.options, registry)?);
        if let Ok(mut m) = self.clients.lock() {
            m.insert(registry.to_string(), c.clone());
        }
        Ok(c)
    }

    fn cache(&self) -> &BlobCache {
        &self.options.cache
    }

    /// Resolves a tag to the digest the registry names now.
    pub async fn resolve(&self, reference: &OciReference) -> Result<OciReference, RegistryError> {
        if reference.is_pinned() {
            return Ok(reference.clone());
        }
        let tag = reference.manifest_ref().unwrap_or_default().to_string();
        let client = self.client(&reference.registry)?;
        let (bytes, content_type, digest) = client
            .get_manifest(&reference.repository, &tag, layout::MANIFEST_TYPE)
            .await?;
        layout::check_manifest(
            &bytes,
            content_type.as_deref(),
            self.options.max_component_bytes,
        )
        .map_err(|reason| refused(reference, reason))?;
        self.cache().put(&bytes)?;
        Ok(reference.pinned(digest))
    }

    /// Fetches the component `reference` names, verified, from the cache
    /// when it is there (a pinned reference then needs no network). A
    /// reference without a digest is refused unless `accept_unpinned`; the
    /// digest it resolved to is then logged. `world`, when given, is checked
    /// against the artifact's config before the layer is fetched; `key`,
    /// when given, must verify a cosign signature on the manifest digest
    /// before the layer is fetched.
    // Kept as one function: the order of the checks (cache, pin, world,
    // signature, size) before any layer byte is fetched is the point, and
    // reads top to bottom here.
    pub async fn fetch(
        &self,
        reference: &OciReference,
        world: Option<World>,
        accept_unpinned: bool,
        key: Option<&CosignKey>,
    ) -> Result<Fetched, RegistryError> {
        let pinned = if reference.is_pinned() {
            reference.clone()
        } else if accept_unpinned {
            let pinned = self.resolve(reference).await?;
            tracing::info!(reference = %reference, resolved = %pinned, "an unpinned plugin reference resolved");
            pinned
        } else {
            return Err(RegistryError::Unpinned {
                reference: reference.to_string(),
            });
        };
        let Some(digest) = pinned.digest.clone() else {
            return Err(RegistryError::Unpinned {
                reference: reference.to_string(),
            });
        };
        let max = self.options.max_component_bytes;
        let mut network = false;
        let manifest_bytes = match self
            .cache()
            .read_verified(&digest, layout::MAX_METADATA_BYTES)?
        {
            Some(b) => b,
            None => {
                network = true;
                let client = self.client(&pinned.registry)?;
                let (bytes, _ct, got) = client
                    .get_manifest(&pinned.repository, digest.as_str(), layout::MANIFEST_TYPE)
                    .await?;
                if got != digest {
                    return Err(RegistryError::DigestMismatch {
                        what: format!("the manifest of {pinned}"),
                        expected: digest.to_string(),
                        got: got.to_string(),
                    });
                }
                self.cache().put(&bytes)?;
                bytes
            }
        };
        let manifest = layout::check_manifest(&manifest_bytes, None, max)
            .map_err(|reason| refused(&pinned, reason))?;
        if let Some(key) = key {
            if !self.verify_signature(&pinned, &digest, key, false).await? {
                network = true;
                if !self.verify_signature(&pinned, &digest, key, true).await? {
                    return Err(RegistryError::Signature {
                        message: format!(
                            "no cosign signature on {pinned} verifies with the key {}; \
                             sign it with `cosign sign --key cosign.key` or name the right key",
                            key.path().display()
                        ),
                    });
                }
            }
            tracing::info!(reference = %pinned, key = %key.path().display(), "cosign signature verified");
        }
        let config_digest = parse_digest(&manifest.config.digest, &pinned)?;
        let config_bytes = match self
            .cache()
            .read_verified(&config_digest, layout::MAX_METADATA_BYTES)?
        {
            Some(b) => b,
            None => {
                network = true;
                let b = self
                    .client(&pinned.registry)?
                    .get_small_blob(
                        &pinned.repository,
                        &config_digest,
                        layout::MAX_METADATA_BYTES,
                    )
                    .await?;
                self.cache().put(&b)?;
                b
            }
        };
        layout::check_config(&config_bytes, world).map_err(|reason| refused(&pinned, reason))?;
        let layer = &manifest.layers[0];
        let layer_digest = parse_digest(&layer.digest, &pinned)?;
        let bytes = match self.cache().read_verified(&layer_digest, max)? {
            Some(b) => b,
            None => {
                network = true;
                let temp = self.cache().temp()?;
                let mut file =
                    tokio::fs::File::from_std(temp.reopen().map_err(|e| RegistryError::Io {
                        what: "opening a cache file".into(),
                        source: e,
                    })?);
                self.client(&pinned.registry)?
                    .get_blob_into(&pinned.repository, &layer_digest, layer.size, &mut file)
                    .await?;
                tokio::io::AsyncWriteExt::flush(&mut file)
                    .await
                    .map_err(|e| RegistryError::Io {
                        what: "writing the plugin cache".into(),
                        source: e,
                    })?;
                drop(file);
                self.cache().commit(temp, &layer_digest)?;
                self.cache()
                    .read_verified(&layer_digest, max)?
                    .ok_or_else(|| RegistryError::DigestMismatch {
                        what: format!("the cached component of {pinned}"),
                        expected: layer_digest.to_string(),
                        got: "nothing (removed while loading)".into(),
                    })?
            }
        };
        Ok(Fetched {
            path: self.cache().path(&layer_digest),
            reference: pinned,
            layer: layer_digest,
            bytes,
            from_cache: !network,
        })
    }

    /// Whether a signature in the signature manifest (the cached one, or
    /// with `fetch` the registry's) vouches for `digest` with `key`.
    async fn verify_signature(
        &self,
        pinned: &OciReference,
        digest: &Digest,
        key: &CosignKey,
        fetch: bool,
    ) -> Result<bool, RegistryError> {
        const PAYLOAD_MAX: u64 = 64 << 10;
        let link = self.cache().root().join("signatures").join(digest.hex());
        let bytes = if fetch {
            let client = self.client(&pinned.registry)?;
            let tag = signature::signature_tag(digest);
            let (bytes, _ct, got) = match client
                .get_manifest(
                    &pinned.repository,
                    &tag,
                    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
                )
                .await
            {
                Err(RegistryError::Status { status: 404, .. }) => {
                    return Err(RegistryError::Signature {
                        message: format!(
                            "{pinned} is not signed: the registry has no {}/{}:{tag}; sign it with \
                             `cosign sign --key cosign.key`",
                            pinned.registry, pinned.repository
                        ),
                    })
                }
                other => other?,
            };
            self.cache().put(&bytes)?;
            if let Some(parent) = link.parent() {
                std::fs::create_dir_all(parent).map_err(|e| RegistryError::Io {
                    what: format!("creating {}", parent.display()),
                    source: e,
                })?;
            }
            let mut temp = self.cache().temp()?;
            std::io::Write::write_all(&mut temp, got.as_str().as_bytes())
                .and_then(|_| temp.persist(&link).map(drop).map_err(|e| e.error))
                .map_err(|e| RegistryError::Io {
                    what: format!("writing {}", link.display()),
                    source: e,
                })?;
            bytes
        } else {
            let cached = std::fs::read_to_string(&link)
                .ok()
                .and_then(|s| Digest::parse(s.trim()).ok());
            match cached {
                Some(d) => match self.cache().read_verified(&d, layout::MAX_METADATA_BYTES)? {
                    Some(b) => b,
                    None => return Ok(false),
                },
                None => return Ok(false),
            }
        };
        let manifest: signature::SignatureManifest =
            serde_json::from_slice(&bytes).map_err(|e| RegistryError::Signature {
                message: format!("the signature manifest of {pinned} is not a manifest: {e}"),
            })?;
        for layer in manifest
            .layers
            .iter()
            .filter(|l| l.media_type == signature::PAYLOAD_TYPE && l.size <= PAYLOAD_MAX)
            .take(signature::MAX_SIGNATURES)
        {
            let Some(sig) = layer.annotations.get(signature::SIGNATURE_ANNOTATION) else {
                continue;
            };
            let Ok(d) = Digest::parse(&layer.digest) else {
                continue;
            };
            let payload = match self.cache().read_verified(&d, PAYLOAD_MAX)? {
                Some(b) => b,
                None if fetch => {
                    let b = self
                        .client(&pinned.registry)?
                        .get_small_blob(&pinned.repository, &d, PAYLOAD_MAX)
                        .await?;
                    self.cache().put(&b)?;
                    b
                }
                None => continue,
            };
            if signature::payload_vouches(key, &payload, sig, digest) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Pushes the component at `path` to `reference` (a tag; the digest is
    /// computed), with a deterministic config: the same bytes pushed twice
    /// get the same digest. Returns the pinned reference. The blobs are
    /// cached too, so this host loads the reference without the network.
    pub async fn push(
        &self,
        path: &Path,
        shape: ComponentShape,
        reference: &OciReference,
    ) -> Result<OciReference, RegistryError> {
        let Some(tag) = reference.tag.clone() else {
            return Err(RegistryError::Reference(format!(
                "{reference}: push to a tag (oci://HOST/REPO:TAG); the digest is computed from the bytes"
            )));
        };
        if reference.digest.is_some() {
            return Err(RegistryError::Reference(format!(
                "{reference}: push to a tag without @sha256:…; the digest is computed from the bytes"
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| RegistryError::Io {
            what: format!("reading {}", path.display()),
            source: e,
        })?;
        if bytes.len() as u64 > self.options.max_component_bytes {
            return Err(RegistryError::Refused {
                reference: reference.to_string(),
                reason: format!(
                    "{} is {} bytes, over the {}-byte limit",
                    path.display(),
                    bytes.len(),
                    self.options.max_component_bytes
                ),
            });
        }
        let layer_digest = self.cache().put(&bytes)?;
        let size = bytes.len() as u64;
        drop(bytes);
        let config = layout::config_for(shape.world, &layer_digest, shape.imports, shape.exports);
        let config_digest = self.cache().put(&config)?;
        let manifest = layout::manifest_for(
            Descriptor {
                media_type: layout::CONFIG_TYPE.into(),
                digest: config_digest.to_string(),
                size: config.len() as u64,
            },
            Descriptor {
                media_type: layout::LAYER_TYPE.into(),
                digest: layer_digest.to_string(),
                size,
            },
        );
        let manifest_digest = self.cache().put(&manifest)?;
        let client = self.client(&reference.registry)?;
        client
            .put_blob(
                &reference.repository,
                &layer_digest,
                Payload::File(Arc::from(self.cache().path(&layer_digest).as_path()), size),
            )
            .await?;
        client
            .put_blob(
                &reference.repository,
                &config_digest,
                Payload::Bytes(Bytes::from(config)),
            )
            .await?;
        client
            .put_manifest(
                &reference.repository,
                &tag,
                layout::MANIFEST_TYPE,
                Bytes::from(manifest),
            )
            .await?;
        Ok(reference.pinned(manifest_digest))
    }

    /// Writes the pinned, cached `references` as an OCI image layout tar.
    pub fn save(
        &self,
        references: &[OciReference],
        out: impl std::io::Write,
    ) -> Result<(), RegistryError> {
        layout_archive::save(
            self.cache(),
            references,
            self.options.max_component_bytes,
            out,
        )
    }

    /// Reads an OCI image layout tar into the cache, every blob verified
    /// against its name before anything is kept. Returns the references it
    /// carried.
    pub fn load(&self, input: impl std::io::Read) -> Result<Vec<OciReference>, RegistryError> {
        layout_archive::load(self.cache(), input, self.options.max_component_bytes)
    }
}

fn refused(reference: &OciReference, reason: String) -> RegistryError {
    RegistryError::Refused {
        reference: reference.to_string(),
        reason,
    }
}

fn parse_digest(s: &str, reference: &OciReference) -> Result<Digest, RegistryError> {
    Digest::parse(s).map_err(|reason| refused(reference, reason.reason))
}
