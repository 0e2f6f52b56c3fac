//! The Docker backend's settings from a front end: `berth create
//! --backend docker -o image=IMG -o memory=2GiB`, the API's `{"type":
//! "docker", "image": ..., "memory": ...}`, the Python client's dict. The
//! only place that turns them into [`DockerOptions`].

use std::path::PathBuf;

use serde::Deserialize;

use super::{DockerOptions, PullPolicy};
use berth::backend::limits::{self, Bound};
use berth::backend::settings::{lenient, BackendSettings, SettingDoc, SettingsError};

/// A new Docker sandbox's settings, as a front end gives them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DockerSettings {
    /// The image.
    pub image: String,
    /// The engine: an endpoint or a Docker context's name.
    #[serde(default)]
    pub engine: Option<String>,
    /// The engine's TLS certificate directory.
    #[serde(default)]
    pub tls_cert_path: Option<PathBuf>,
    /// When to pull the image: `missing`, `always` or `never`.
    #[serde(default)]
    pub pull: Option<String>,
    /// Whether commands run through Berth's agent in the container.
    #[serde(default, deserialize_with = "lenient::flag")]
    pub agent: Option<bool>,
    /// The memory limit, in bytes, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::size")]
    pub memory: Option<Bound>,
    /// The CPU limit (a number of CPUs), or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::cpus")]
    pub cpus: Option<Bound>,
    /// The process limit, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::count")]
    pub pids: Option<Bound>,
    /// The workspace's disk quota, or unlimited.
    #[serde(default, deserialize_with = "limits::lenient::size")]
    pub disk: Option<Bound>,
    /// The network.
    #[serde(default)]
    pub network: Option<String>,
    /// Container ports published on 127.0.0.1.
    #[serde(default, deserialize_with = "lenient::list")]
    pub expose: Vec<String>,
    /// An existing container to use (not owned by Berth).
    #[serde(default)]
    pub container: Option<String>,
    /// `docker run` arguments from the supported subset.
    #[serde(default, deserialize_with = "lenient::list", alias = "run_arg")]
    pub run_args: Vec<String>,
    /// The OCI runtime (`runsc` for gVisor).
    #[serde(default)]
    pub runtime: Option<String>,
    /// The user commands run as.
    #[serde(default)]
    pub user: Option<String>,
}

/// What [`DockerSettings`] takes.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc::required("image", "IMAGE", "the image; pulled as `pull` says"),
    SettingDoc::optional(
        "engine",
        "ENGINE",
        "an endpoint (unix:///PATH, tcp://HOST:PORT) or a Docker context's name (default: what the docker CLI would use; the sandbox remembers it)",
    ),
    SettingDoc::optional(
        "tls_cert_path",
        "PATH",
        "the directory of ca.pem, cert.pem and key.pem for a tcp:// engine (default: $DOCKER_CERT_PATH when $DOCKER_TLS_VERIFY is set)",
    ),
    SettingDoc::optional(
        "pull",
        "missing|always|never",
        "when to pull the image (default: missing)",
    ),
    SettingDoc::optional(
        "agent",
        "BOOL",
        "run commands through Berth's in-container agent (default: true; false runs each as its own docker exec, without persistent sessions)",
    ),
    SettingDoc::optional(
        "memory",
        "SIZE|unlimited",
        "memory limit, swap included, e.g. 512MiB (default: the host's, 2GiB; unlimited is warned about)",
    ),
    SettingDoc::optional(
        "cpus",
        "NUMBER|unlimited",
        "CPU limit, e.g. 1.5 (default: the host's, all its CPUs but one)",
    ),
    SettingDoc::optional(
        "pids",
        "COUNT|unlimited",
        "processes and threads at once (default: the host's, 1024)",
    ),
    SettingDoc::optional(
        "disk",
        "SIZE|unlimited",
        "the workspace's disk quota: a filesystem image on the engine's host bind-mounted at the workspace (default: the host's, 10GiB; needs a local engine and root)",
    ),
    SettingDoc::optional(
        "network",
        "NETWORK",
        "the network (default: none, no network)",
    ),
    SettingDoc::optional(
        "expose",
        "PORT",
        "a container port to publish on 127.0.0.1 (repeatable; needs a network)",
    ),
    SettingDoc::optional(
        "container",
        "NAME",
        "use this existing container; Berth will not remove it",
    ),
    SettingDoc::optional(
        "run_args",
        "ARG",
        "a `docker run` argument from the supported subset (repeatable)",
    )
    .aliases(&["run_arg"]),
    SettingDoc::optional(
        "runtime",
        "RUNTIME",
        "the engine's OCI runtime to run under, e.g. runsc for gVisor (default: the engine's, runc); refused when the engine lacks it",
    ),
    SettingDoc::optional(
        "user",
        "UID[:GID]|NAME",
        "the user commands run as (default: the image's, often root)",
    ),
];

impl DockerSettings {
    /// Decodes a front end's settings.
    pub fn decode(settings: &BackendSettings) -> Result<Self, SettingsError> {
        settings.decode(SETTINGS)
    }

    /// The options these settings make; `settings` is where they came
    /// from, for errors.
    pub fn into_options(self, settings: &BackendSettings) -> Result<DockerOptions, SettingsError> {
        if self.image.trim().is_empty() {
            return Err(settings.invalid("image is empty; give the image to run"));
        }
        let network = self.network.clone().unwrap_or_else(|| "none".into());
        if !self.expose.is_empty() && network == "none" {
            return Err(settings.invalid(format!(
                "expose {} needs a network the engine can publish on, and the sandbox has none (the default, network=none): \
                 make one (`docker network create NET`) and set network=NET, or leave expose out",
                self.expose.join(",")
            )));
        }
        let mut options = DockerOptions::new(self.image)
            .run_args(self.run_args)
            .agent(self.agent.unwrap_or(true))
            .network(network);
        if let Some(pull) = &self.pull {
            let policy: PullPolicy = pull
                .parse()
                .map_err(|e: String| settings.invalid(format!("pull: {e}")))?;
            options = options.pull(policy);
        }
        if let Some(engine) = self.engine {
            options = options.engine(engine);
        }
        if let Some(dir) = self.tls_cert_path {
            options = options.tls_cert_path(dir);
        }
        match self.memory {
            Some(Bound::At(bytes)) => {
                options = options.memory(settings.signed_bytes("memory", bytes)?);
            }
            Some(Bound::Unlimited) => options = options.unlimited_memory(),
            None => {}
        }
        if let Some(bound) = self.cpus {
            options = options.cpus_millis(bound);
        }
        if let Some(bound) = self.pids {
            options = options.pids(bound);
        }
        if let Some(bound) = self.disk {
            options = options.disk(bound);
        }
        for port in self.expose {
            options = options.expose(port);
        }
        if let Some(runtime) = self.runtime {
            if runtime.trim().is_empty() {
                return Err(settings.invalid("runtime is empty; name one the engine registers (runsc for gVisor), or leave it out"));
            }
            options = options.runtime(runtime);
        }
        if let Some(user) = self.user {
            let valid = |part: &str| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            };
            if !user.split(':').all(valid) || user.split(':').count() > 2 {
                return Err(settings.invalid(format!(
                    "user {user:?} is not UID[:GID] or a user name (e.g. 1000 or 1000:1000)"
                )));
            }
            options = options.user(user);
        }
        if let Some(container) = self.container {
            options = options.existing_container(container);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KIND;

    #[test]
    fn the_documented_settings_are_the_fields() {
        let keys = berth::backend::settings::documented_names(SETTINGS);
        assert_eq!(
            keys,
            berth::backend::settings::struct_fields::<DockerSettings>()
        );
    }

    #[test]
    fn text_settings_make_the_options() {
        let mut s = BackendSettings::new(KIND);
        for pair in [
            "image=busybox",
            "memory=64MiB",
            "cpus=0.5",
            "agent=false",
            "network=bridge",
            "expose=8080",
            "expose=9090",
            "runtime=runsc",
            "user=1000:1000",
        ] {
            s.add_pair(pair).unwrap();
        }
        let state = DockerSettings::decode(&s)
            .unwrap()
            .into_options(&s)
            .unwrap()
            .into_state_for_probe();
        assert_eq!(state.memory_size_bytes, Some(64 << 20));
        assert_eq!(state.cpu_count, Some(0.5));
        assert!(!state.agent);
        assert_eq!(state.exposed_ports, ["8080", "9090"]);
        assert_eq!(state.runtime.as_deref(), Some("runsc"));
        assert_eq!(state.user.as_deref(), Some("1000:1000"));
    }

    #[test]
    fn what_cannot_work_is_refused_naming_the_key() {
        for (pairs, word) in [
            (&["image=b", "expose=80"][..], "expose"),
            (&["image=b", "pull=sometimes"][..], "pull"),
            (&["image=b", "cpus=-1"][..], "cpus"),
            (&["image=b", "user=1000:"][..], "user"),
            (&["image=b", "memory=0"][..], "memory"),
            (&["memory=1GiB"][..], "image is required"),
        ] {
            let mut s = BackendSettings::new(KIND);
            for p in pairs {
                s.add_pair(p).unwrap();
            }
            let e = DockerSettings::decode(&s)
                .and_then(|d| d.into_options(&s))
                .unwrap_err()
                .to_string();
            assert!(e.contains(word), "{pairs:?}: {e}");
        }
    }
}
