//! `berth plugin check|inspect`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use berth::conformance::{self, ConformanceOptions, OpenSnapshot};
use berth::plugin::inspect::{detect_world, inspect_component};
use berth::plugin::manifest::parse_byte_size;
use berth::plugin::{DirMode, Plugin, PluginHost, PluginManifest, World};
use berth::SandboxSnapshot;
use clap::Subcommand;

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Run the contract's conformance suite on a plugin and print a
    /// clause-by-clause table. Exits non-zero if any clause fails.
    ///
    /// TARGET is a manifest (.toml) or a bare component (.wasm). A bare
    /// component is granted a fresh temporary directory, read-write at
    /// /data, and given the config root=/data and dir=/data.
    Check {
        /// Manifest or component.
        target: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Size of the streamed large round trip (0 to skip).
        #[arg(long, default_value = "2GiB", value_parser = parse_size)]
        large_size: u64,
        /// Size of the medium round trip.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        medium_size: u64,
        /// Extra config for a bare component (KEY=VALUE, repeatable).
        #[arg(long = "config", value_parser = parse_kv)]
        config: Vec<(String, String)>,
    },
    /// List a component's world, imports and exports.
    Inspect {
        /// The component.
        component: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_byte_size(s)
}

/// Parses a size argument such as `512MiB`.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    parse_byte_size(s)
}

fn parse_kv(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

pub async fn run(cmd: PluginCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginCommand::Check {
            target,
            json,
            large_size,
            medium_size,
            config,
        } => check(&target, json, large_size, medium_size, config).await,
        PluginCommand::Inspect { component, json } => inspect(&component, json).await,
    }
}

/// Loads `target` as a plugin: from its manifest, or as a bare component
/// with a scratch directory granted at /data.
pub async fn load_target(
    host: &PluginHost,
    target: &Path,
    config: Vec<(String, String)>,
) -> anyhow::Result<(Plugin, Option<tempfile::TempDir>)> {
    if target.extension().and_then(|e| e.to_str()) == Some("toml") {
        let plugin = host.load_file(target).await?;
        return Ok((plugin, None));
    }
    let world = detect_world(host, target).await?;
    let scratch = tempfile::Builder::new()
        .prefix("berth-check-")
        .tempdir()
        .context("creating a scratch directory for the plugin")?;
    let mut manifest = PluginManifest::for_component(target, world)
        .with_dir(scratch.path(), "/data", DirMode::ReadWrite)
        .with_config("root", "/data")
        .with_config("dir", "/data");
    manifest.config.extend(config);
    let plugin = host.load(manifest).await?;
    Ok((plugin, Some(scratch)))
}

async fn check(
    target: &Path,
    json: bool,
    large_size: u64,
    medium_size: u64,
    config: Vec<(String, String)>,
) -> anyhow::Result<ExitCode> {
    let host = PluginHost::new()?;
    let (plugin, _scratch) = load_target(&host, target, config).await?;
    let opts = ConformanceOptions {
        large_size,
        medium_size,
        ..ConformanceOptions::default()
    };
    let subject = plugin.name().to_string();
    let report = match plugin.world() {
        World::RemoteClient => {
            let client = plugin.remote_client()?;
            conformance::check_remote_client(&subject, &client, &opts).await
        }
        World::Snapshot => {
            let opener = plugin_opener(plugin.clone());
            conformance::check_snapshot(&subject, &opener, &opts).await
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Opens snapshots of `plugin` for the conformance suite.
pub fn plugin_opener(plugin: Plugin) -> OpenSnapshot {
    let plugin = Arc::new(plugin);
    Box::new(move |id| {
        let plugin = plugin.clone();
        Box::pin(async move {
            let snap = plugin.open_snapshot(&id).await?;
            Ok(Box::new(snap) as Box<dyn SandboxSnapshot>)
        })
    })
}

async fn inspect(component: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let host = PluginHost::new()?;
    let info = inspect_component(&host, component).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("component: {}", component.display());
    println!("size:      {} bytes", info.size);
    println!("digest:    blake3:{}", info.digest);
    match (&info.world, &info.contract_version) {
        (Some(w), Some(v)) => println!("world:     berth:snapshot/{}@{v}", w.name()),
        _ => println!("world:     (implements no berth:snapshot world)"),
    }
    println!("imports:");
    for i in &info.imports {
        println!("  {i}");
    }
    println!("exports:");
    for e in &info.exports {
        println!("  {e}");
    }
    Ok(ExitCode::SUCCESS)
}
