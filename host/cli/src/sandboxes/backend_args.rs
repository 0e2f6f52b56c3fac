//! A backend kind and its settings as flags, shared by `create` and `pool
//! create`.

use std::path::PathBuf;

use anyhow::Context;
use berth::backend::BackendSettings;
use clap::Args;

/// A backend kind and its settings, as `create` and `pool create` take
/// them.
#[derive(Args)]
pub struct BackendArgs {
    /// The backend kind: local (the default), docker, swarm, or one an
    /// embedder registered. Its settings follow as -o KEY=VALUE or --KEY
    /// VALUE (see below).
    #[arg(long, value_name = "KIND")]
    backend: Option<String>,
    /// A backend setting, KEY=VALUE (repeatable; a repeated key is a
    /// list): -o image=alpine -o memory=2GiB.
    #[arg(short = 'o', long = "opt", value_name = "KEY=VALUE")]
    opts: Vec<String>,
    /// Backend settings from a JSON file: {"type": KIND, KEY: VALUE, ...}
    /// (-o and --backend given too win).
    #[arg(long, value_name = "FILE")]
    backend_config: Option<PathBuf>,
}

impl BackendArgs {
    /// Whether any was given.
    pub fn given(&self) -> bool {
        self.backend.is_some() || !self.opts.is_empty() || self.backend_config.is_some()
    }
}

/// The backend settings the flags give: `--backend-config`, then
/// `--backend`, then each `-o`.
pub fn backend_settings(args: &BackendArgs) -> anyhow::Result<BackendSettings> {
    let default_kind = args
        .backend
        .as_deref()
        .unwrap_or(berth::backend::local::KIND);
    let mut settings = match &args.backend_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --backend-config {}", path.display()))?;
            let value: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("--backend-config {} is not JSON", path.display()))?;
            BackendSettings::from_json(value, default_kind)
                .with_context(|| format!("--backend-config {}", path.display()))?
        }
        None => BackendSettings::new(default_kind),
    };
    if settings.kind() != default_kind && args.backend.is_some() {
        let values = settings.values().clone();
        settings = BackendSettings::new(default_kind);
        for (key, value) in values {
            settings.add(key, value);
        }
    }
    for pair in &args.opts {
        settings.add_pair(pair)?;
    }
    Ok(settings)
}
