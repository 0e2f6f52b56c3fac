//! The swarm backend's settings from a front end: `berth create --backend
//! swarm -o engine=MANAGER -o image=IMG -o constraints=node.labels.x==y`,
//! the API's `{"type": "swarm", ...}`. The only place that turns them
//! into [`SwarmOptions`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::SwarmOptions;
use berth::backend::settings::{lenient, BackendSettings, SettingDoc, SettingsError};

/// A new swarm sandbox's settings, as a front end gives them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwarmSettings {
    /// A swarm manager: an endpoint or a Docker context's name.
    #[serde(alias = "manager")]
    pub engine: String,
    /// The image.
    pub image: String,
    /// The engines' TLS certificate directory.
    #[serde(default)]
    pub tls_cert_path: Option<PathBuf>,
    /// Whether commands run through Berth's agent in the container.
    #[serde(default, deserialize_with = "lenient::flag")]
    pub agent: Option<bool>,
    /// The memory limit, in bytes, or unlimited.
    #[serde(default, deserialize_with = "berth::backend::limits::lenient::size")]
    pub memory: Option<berth::backend::limits::Bound>,
    /// The CPU limit.
    #[serde(default, deserialize_with = "lenient::number")]
    pub cpus: Option<f64>,
    /// The pids limit.
    #[serde(default, deserialize_with = "lenient::integer")]
    pub pids_limit: Option<i64>,
    /// Memory the swarm reserves on the node, in bytes.
    #[serde(default, deserialize_with = "lenient::size")]
    pub reserve_memory: Option<u64>,
    /// CPUs the swarm reserves on the node.
    #[serde(default, deserialize_with = "lenient::number")]
    pub reserve_cpus: Option<f64>,
    /// Placement constraints.
    #[serde(default, deserialize_with = "lenient::list", alias = "constraint")]
    pub constraints: Vec<String>,
    /// A swarm network (`none` is none).
    #[serde(default)]
    pub network: Option<String>,
    /// How long a start waits for the swarm to run the sandbox.
    #[serde(
        default,
        deserialize_with = "lenient::duration",
        alias = "placement_timeout_secs"
    )]
    pub placement_timeout: Option<Duration>,
}

/// What [`SwarmSettings`] takes.
pub const SETTINGS: &[SettingDoc] = &[
    SettingDoc::required(
        "engine",
        "ENGINE",
        "a swarm manager's endpoint or Docker context",
    )
    .aliases(&["manager"]),
    SettingDoc::required("image", "IMAGE", "the image (every node pulls it)"),
    SettingDoc::optional(
        "tls_cert_path",
        "PATH",
        "the directory of ca.pem, cert.pem and key.pem for tcp:// engines",
    ),
    SettingDoc::optional(
        "agent",
        "BOOL",
        "run commands through Berth's in-container agent (default: true)",
    ),
    SettingDoc::optional(
        "memory",
        "SIZE|unlimited",
        "memory limit, e.g. 512MiB (default: 2GiB; unlimited is warned about)",
    ),
    SettingDoc::optional("cpus", "NUMBER", "CPU limit, e.g. 1.5 (default: none)"),
    SettingDoc::optional("pids_limit", "NUMBER", "pids limit (default: 1024)"),
    SettingDoc::optional(
        "reserve_memory",
        "SIZE",
        "memory the swarm reserves on the node (default: none)",
    ),
    SettingDoc::optional(
        "reserve_cpus",
        "NUMBER",
        "CPUs the swarm reserves on the node (default: none)",
    ),
    SettingDoc::optional(
        "constraints",
        "CONSTRAINT",
        "a placement constraint as `docker service create --constraint` takes it, e.g. node.labels.pool==gpu (repeatable)",
    )
    .aliases(&["constraint"]),
    SettingDoc::optional(
        "network",
        "NETWORK",
        "an attachable overlay network (default: none, loopback only)",
    ),
    SettingDoc::optional(
        "placement_timeout",
        "DURATION",
        "how long a start waits for the swarm to run the sandbox, e.g. 2m (default: 60s)",
    )
    .aliases(&["placement_timeout_secs"]),
];

impl SwarmSettings {
    /// Decodes a front end's settings.
    pub fn decode(settings: &BackendSettings) -> Result<Self, SettingsError> {
        settings.decode(SETTINGS)
    }

    /// The options these settings make; `settings` is where they came
    /// from, for errors.
    pub fn into_options(self, settings: &BackendSettings) -> Result<SwarmOptions, SettingsError> {
        let mut options =
            SwarmOptions::new(self.engine, self.image).agent(self.agent.unwrap_or(true));
        if let Some(dir) = self.tls_cert_path {
            options = options.tls_cert_path(dir);
        }
        match self.memory {
            Some(berth::backend::limits::Bound::At(n)) => {
                options = options.memory(settings.signed_bytes("memory", n)?);
            }
            Some(berth::backend::limits::Bound::Unlimited) => options = options.unlimited_memory(),
            None => {}
        }
        if let Some(n) = self.cpus {
            options = options.cpus(settings.positive("cpus", n)?);
        }
        if let Some(n) = self.pids_limit {
            if n < 1 {
                return Err(settings.invalid(format!("pids_limit: {n} is not a positive number")));
            }
            options = options.pids_limit(n);
        }
        if let Some(n) = self.reserve_memory {
            options = options.reserve_memory(settings.signed_bytes("reserve_memory", n)?);
        }
        if let Some(n) = self.reserve_cpus {
            options = options.reserve_cpus(settings.positive("reserve_cpus", n)?);
        }
        for constraint in self.constraints {
            options = options.constraint(constraint);
        }
        if let Some(network) = self.network.filter(|n| n != "none") {
            options = options.network(network);
        }
        if let Some(timeout) = self.placement_timeout {
            options = options.placement_timeout(timeout);
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_settings_are_the_fields() {
        let keys = berth::backend::settings::documented_names(SETTINGS);
        assert_eq!(
            keys,
            berth::backend::settings::struct_fields::<SwarmSettings>()
        );
    }

    #[test]
    fn older_api_names_and_text_decode_alike() {
        let json = BackendSettings::from_json(
            serde_json::json!({"type": "swarm", "engine": "m", "image": "i",
                               "placement_timeout_secs": 3, "constraints": ["a"], "pids_limit": 64}),
            "local",
        )
        .unwrap();
        let mut text = BackendSettings::new("swarm");
        for p in [
            "manager=m",
            "image=i",
            "placement_timeout=3s",
            "constraint=a",
            "pids-limit=64",
        ] {
            text.add_pair(p).unwrap();
        }
        for s in [json, text] {
            let d = SwarmSettings::decode(&s).unwrap();
            assert_eq!(d.placement_timeout, Some(Duration::from_secs(3)));
            assert_eq!(d.constraints, ["a"]);
            assert_eq!(d.pids_limit, Some(64));
            d.into_options(&s).unwrap();
        }
        let mut s = BackendSettings::new("swarm");
        for p in ["engine=m", "image=i", "pids_limit=0"] {
            s.add_pair(p).unwrap();
        }
        let e = SwarmSettings::decode(&s)
            .unwrap()
            .into_options(&s)
            .unwrap_err();
        assert!(e.to_string().contains("pids_limit"), "{e}");
    }
}
