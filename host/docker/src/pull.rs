//! Image pulls: when an image is missing (or always, or never, as the
//! sandbox's [`PullPolicy`] says), pulled through the engine with the
//! registry credentials of the docker CLI's config, its progress reported
//! per layer and byte.

use std::collections::BTreeMap;
use std::sync::Arc;

use bollard::auth::DockerCredentials;
use bollard::query_parameters::CreateImageOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::config;
use super::engine::Engine;
use berth::backend::BackendError;

/// When a sandbox's image is pulled from its registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PullPolicy {
    /// Pull when the engine does not have the image (the default, as
    /// `docker run` does).
    #[default]
    Missing,
    /// Pull every time a container is created, for the newest image.
    Always,
    /// Never pull: a missing image is an error.
    Never,
}

impl std::str::FromStr for PullPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "missing" => Ok(PullPolicy::Missing),
            "always" => Ok(PullPolicy::Always),
            "never" => Ok(PullPolicy::Never),
            other => Err(format!(
                "{other:?} is not a pull policy: use missing, always or never"
            )),
        }
    }
}

impl std::fmt::Display for PullPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PullPolicy::Missing => "missing",
            PullPolicy::Always => "always",
            PullPolicy::Never => "never",
        })
    }
}

/// How far a pull has come, as told to a [`PullProgress`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PullStatus {
    /// The image being pulled.
    pub image: String,
    /// Layers the engine has announced so far.
    pub layers: usize,
    /// Layers downloaded (or already present).
    pub layers_done: usize,
    /// Bytes downloaded so far.
    pub bytes_done: u64,
    /// Bytes to download, over the layers whose size is known yet.
    pub bytes_total: u64,
    /// Whether the pull has finished.
    pub finished: bool,
}

/// The function behind a [`PullProgress`].
pub type PullProgressFn = dyn Fn(&PullStatus) + Send + Sync;

/// Told how a pull progresses, e.g. to draw a progress bar.
#[derive(Clone)]
pub struct PullProgress(pub Arc<PullProgressFn>);

impl std::fmt::Debug for PullProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PullProgress")
    }
}

/// A [`PullProgress`] that tells `sink` in the kinds' common shape, as
/// `backend`: a byte count while layers download, and when a pull ends a
/// line saying what came and how long it took (timed from its first
/// report; pulls of several images at once are kept apart).
pub(crate) fn reported_to(
    backend: &'static str,
    sink: berth::backend::ProgressSink,
) -> PullProgress {
    let started =
        std::sync::Mutex::new(std::collections::HashMap::<String, std::time::Instant>::new());
    PullProgress(Arc::new(move |status: &PullStatus| {
        let mut starts = started.lock().unwrap_or_else(|p| p.into_inner());
        let since = *starts
            .entry(status.image.clone())
            .or_insert_with(std::time::Instant::now);
        let mut report =
            berth::backend::BackendProgress::new(backend, format!("pulling {}", status.image));
        report.bytes = Some((status.bytes_done, status.bytes_total));
        report.detail = Some(format!("{}/{} layers", status.layers_done, status.layers));
        if status.finished {
            starts.remove(&status.image);
            report.finished = true;
            report.summary = Some(format!(
                "pulled {}: {} layer{}, {:.1} MiB in {:.1} s",
                status.image,
                status.layers,
                if status.layers == 1 { "" } else { "s" },
                status.bytes_done as f64 / (1 << 20) as f64,
                since.elapsed().as_secs_f64()
            ));
        }
        drop(starts);
        sink.report(&report);
    }))
}

/// An image reference split as the engine's pull API wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageRef {
    /// The registry host (`docker.io` for Docker Hub).
    pub registry: String,
    /// The repository with its registry, as given.
    pub repository: String,
    /// A tag (`latest` when none is given) or a digest (`sha256:...`).
    pub tag: String,
}

/// Docker Hub's key in the docker CLI's config.
const HUB_AUTH_KEY: &str = "https://index.docker.io/v1/";

impl ImageRef {
    /// Splits `image` the way the docker CLI does: the first path component
    /// is a registry when it has a `.` or `:` or is `localhost`.
    pub(crate) fn parse(image: &str) -> Self {
        let (name, tag) = if let Some((name, digest)) = image.split_once('@') {
            (name.to_string(), digest.to_string())
        } else {
            let last = image.rfind('/').map_or(0, |i| i + 1);
            match image[last..].rfind(':') {
                Some(i) => (
                    image[..last + i].to_string(),
                    image[last + i + 1..].to_string(),
                ),
                None => (image.to_string(), "latest".to_string()),
            }
        };
        let registry = match name.split_once('/') {
            Some((first, _))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                first.to_string()
            }
            _ => "docker.io".to_string(),
        };
        ImageRef {
            registry,
            repository: name,
            tag,
        }
    }

    fn auth_key(&self) -> &str {
        if self.registry == "docker.io" {
            HUB_AUTH_KEY
        } else {
            &self.registry
        }
    }
}

fn pull_error(image: &ImageRef, message: String) -> BackendError {
    BackendError::ImagePull {
        image: format!("{}:{}", image.repository, image.tag),
        registry: image.registry.clone(),
        message,
    }
}

/// Pulls `image` onto the engine, telling `progress` how it goes.
pub(crate) async fn pull(
    docker: &Docker,
    engine: &Engine,
    image: &str,
    progress: Option<&PullProgress>,
) -> Result<PullStatus, BackendError> {
    let reference = ImageRef::parse(image);
    let config = config::ConfigFile::load(&config::config_dir())
        .map_err(|e| pull_error(&reference, format!("cannot read registry credentials: {e}")))?;
    let credentials = config
        .credentials(reference.auth_key())
        .map_err(|e| pull_error(&reference, e))?
        .map(|c| DockerCredentials {
            username: c.username,
            password: c.password,
            identitytoken: c.identity_token,
            serveraddress: Some(reference.auth_key().to_string()),
            ..Default::default()
        });
    let options = CreateImageOptionsBuilder::new()
        .from_image(&reference.repository)
        .tag(&reference.tag)
        .build();
    tracing::info!(%image, %engine, registry = %reference.registry, "pulling the image");
    let mut stream = docker.create_image(Some(options), None, credentials);
    let mut layers: BTreeMap<String, (u64, u64, bool)> = BTreeMap::new();
    let mut status = PullStatus {
        image: image.to_string(),
        ..PullStatus::default()
    };
    while let Some(item) = stream.next().await {
        let info = match item {
            Ok(info) => info,
            Err(bollard::errors::Error::DockerStreamError { error }) => {
                return Err(pull_error(&reference, advise(&error, &reference)))
            }
            Err(bollard::errors::Error::DockerResponseServerError { message, .. }) => {
                return Err(pull_error(&reference, advise(&message, &reference)))
            }
            Err(e) => {
                return Err(pull_error(
                    &reference,
                    format!("the {engine} stopped answering during the pull: {e}"),
                ))
            }
        };
        if let Some(detail) = info.error_detail.as_ref().and_then(|d| d.message.clone()) {
            return Err(pull_error(&reference, advise(&detail, &reference)));
        }
        let (Some(id), Some(what)) = (info.id.as_ref(), info.status.as_deref()) else {
            continue;
        };
        // Status lines without a layer ("Pulling from library/x") carry
        // the tag as id; layers are announced with "Pulling fs layer",
        // "Waiting" or "Already exists".
        let layer = match what {
            "Pulling fs layer" | "Waiting" | "Already exists" | "Downloading"
            | "Verifying Checksum" | "Download complete" | "Extracting" | "Pull complete" => {
                layers.entry(id.clone()).or_insert((0, 0, false))
            }
            _ => continue,
        };
        match what {
            "Downloading" => {
                if let Some(d) = &info.progress_detail {
                    layer.0 = d.current.unwrap_or(0).max(0) as u64;
                    layer.1 = d.total.unwrap_or(0).max(0) as u64;
                }
            }
            "Download complete" | "Extracting" | "Pull complete" | "Already exists" => {
                layer.0 = layer.1;
                layer.2 = true;
            }
            _ => {}
        }
        status.layers = layers.len();
        status.layers_done = layers.values().filter(|l| l.2).count();
        status.bytes_done = layers.values().map(|l| l.0).sum();
        status.bytes_total = layers.values().map(|l| l.1).sum();
        if let Some(p) = progress {
            (p.0)(&status);
        }
    }
    status.finished = true;
    if let Some(p) = progress {
        (p.0)(&status);
    }
    Ok(status)
}

/// The engine's message, with what to do about the usual causes.
fn advise(message: &str, image: &ImageRef) -> String {
    let lower = message.to_ascii_lowercase();
    let hint = if lower.contains("unauthorized")
        || lower.contains("denied")
        || lower.contains("authentication required")
    {
        format!(
            "; log in with `docker login {}` (Berth reads the docker CLI's credentials)",
            image.registry
        )
    } else if lower.contains("not found") || lower.contains("manifest unknown") {
        "; check the image's name and tag".to_string()
    } else if lower.contains("connection refused")
        || lower.contains("no such host")
        || lower.contains("timeout")
        || lower.contains("dial tcp")
    {
        format!(
            "; the engine cannot reach the registry {}: check that it runs and that the engine's host can reach it",
            image.registry
        )
    } else {
        String::new()
    };
    format!("{message}{hint}")
}

/// An image reference the engine refused to parse (`400`): said as such,
/// with the engine's reason and what a reference looks like.
pub(crate) fn refused_image(image: &str, e: &bollard::errors::Error) -> Option<BackendError> {
    let bollard::errors::Error::DockerResponseServerError {
        status_code: 400,
        message,
    } = e
    else {
        return None;
    };
    // `no such image: NoSuch: invalid reference format: …` → the reason.
    let reason = message
        .find("invalid reference format")
        .map_or(message.as_str(), |at| &message[at..]);
    Some(BackendError::Config {
        backend: crate::BACKEND,
        message: format!(
            "{image:?} is not an image reference the engine accepts ({reason}); write it as REPOSITORY[:TAG] in lowercase, e.g. berth-test:busybox or registry.example:5000/team/app:1.0"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_split_as_the_docker_cli_splits_them() {
        let r = ImageRef::parse("busybox");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_str()),
            ("docker.io", "busybox", "latest")
        );
        let r = ImageRef::parse("127.0.0.1:5000/berth-test:busybox");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_str()),
            ("127.0.0.1:5000", "127.0.0.1:5000/berth-test", "busybox")
        );
        let r = ImageRef::parse("localhost:5000/team/img");
        assert_eq!(
            (r.registry.as_str(), r.tag.as_str()),
            ("localhost:5000", "latest")
        );
        let r = ImageRef::parse("ghcr.io/o/i@sha256:abc");
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_str()),
            ("ghcr.io", "ghcr.io/o/i", "sha256:abc")
        );
        let r = ImageRef::parse("library/ubuntu:24.04");
        assert_eq!(
            (r.registry.as_str(), r.tag.as_str()),
            ("docker.io", "24.04")
        );
        assert_eq!(r.auth_key(), HUB_AUTH_KEY);
        assert_eq!("never".parse::<PullPolicy>(), Ok(PullPolicy::Never));
        assert!("sometimes".parse::<PullPolicy>().is_err());
    }
}
