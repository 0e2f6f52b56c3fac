//! `berth plugin check|inspect|push|pull|save|load|new`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use berth::conformance::{self, ConformanceOptions, OpenSnapshot};
use berth::plugin::inspect::{detect_world, inspect_component};
use berth::plugin::registry::ComponentShape;
use berth::plugin::{
    ComponentSource, DirMode, OciReference, Plugin, PluginHost, PluginManifest, Registry,
    RegistryOptions, World,
};
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
    /// Push a component to a registry and print its pinned reference.
    ///
    /// TARGET is a manifest (its component is pushed) or a component file.
    /// REFERENCE is oci://HOST[:PORT]/REPO:TAG; the digest is computed and
    /// printed, to paste into manifests. The same bytes pushed twice get the
    /// same digest. Registries speaking plain HTTP must be listed in
    /// BERTH_REGISTRY_PLAIN_HTTP; credentials come from the docker config.
    Push {
        /// Manifest or component.
        target: PathBuf,
        /// Where to push: oci://HOST[:PORT]/REPO:TAG.
        reference: String,
    },
    /// Fetch a component into the plugin cache (and compile it), so hosts
    /// load it without the network. Prints the pinned reference.
    Pull {
        /// oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]; a tag is resolved
        /// and the digest printed.
        reference: String,
    },
    /// Write cached plugins to an OCI image layout tar, for hosts with no
    /// registry (pulling any that are not cached yet).
    Save {
        /// References to save.
        #[arg(required = true)]
        references: Vec<String>,
        /// The tar to write.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Read a tar written by `berth plugin save` into the plugin cache;
    /// every blob is checked against its digest before any is kept.
    Load {
        /// The tar to read (`-` for standard input).
        input: PathBuf,
    },
    /// Write a new, working store plugin to start from.
    New(crate::scaffold::NewArgs),
    /// List a component's world, imports and exports.
    Inspect {
        /// The component: a file, or an oci:// reference (pulled first).
        component: PathBuf,
        /// Print as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_size(s: &str) -> Result<u64, String> {
    parse_size_arg(s)
}

/// Parses a size argument such as `512MiB`.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    berth::units::parse_size(s).map_err(|e| e.to_string())
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
        PluginCommand::Push { target, reference } => push(&target, &reference).await,
        PluginCommand::Pull { reference } => pull(&reference).await,
        PluginCommand::Save { references, output } => save(&references, &output).await,
        PluginCommand::Load { input } => load(&input),
        PluginCommand::New(args) => crate::scaffold::run(args),
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
    let fetched;
    let component = match component.to_str() {
        Some(r) if r.starts_with(berth::plugin::registry::SCHEME) => {
            let reference = parse_reference(r)?;
            fetched = host.registry().fetch(&reference, None, true, None).await?;
            if !json {
                println!("reference: {}", fetched.reference);
            }
            fetched.path.as_path()
        }
        _ => component,
    };
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

fn parse_reference(s: &str) -> anyhow::Result<OciReference> {
    s.parse::<OciReference>()
        .map_err(|e| anyhow::anyhow!("bad plugin reference: {e}"))
}

async fn push(target: &Path, reference: &str) -> anyhow::Result<ExitCode> {
    let reference = parse_reference(reference)?;
    let host = PluginHost::new()?;
    let (component, declared) = if target.extension().and_then(|e| e.to_str()) == Some("toml") {
        let manifest = PluginManifest::from_file(target)?;
        match &manifest.component {
            ComponentSource::Path(p) => (p.clone(), Some(manifest.world)),
            ComponentSource::Registry(r) => anyhow::bail!(
                "{}: its component is already a registry reference ({r}); push the component file",
                target.display()
            ),
        }
    } else {
        (target.to_path_buf(), None)
    };
    let info = inspect_component(&host, &component).await?;
    if let Some(world) = declared {
        if info.world != Some(world) {
            anyhow::bail!(
                "{}: the manifest says {}, but {} exports [{}]; nothing was pushed",
                target.display(),
                world.name(),
                component.display(),
                info.exports.join(", ")
            );
        }
    }
    let shape = ComponentShape {
        world: info.world,
        imports: info.imports,
        exports: info.exports,
    };
    let pinned = host.registry().push(&component, shape, &reference).await?;
    println!("pushed {pinned}");
    println!("  (paste this into manifests: component = \"{pinned}\")");
    Ok(ExitCode::SUCCESS)
}

async fn pull(reference: &str) -> anyhow::Result<ExitCode> {
    let reference = parse_reference(reference)?;
    let host = PluginHost::new()?;
    let fetched = host.registry().fetch(&reference, None, true, None).await?;
    // Compile now, so the first load is quick.
    let info = inspect_component(&host, &fetched.path).await?;
    println!(
        "pulled {} ({} bytes{}{})",
        fetched.reference,
        info.size,
        match info.world {
            Some(w) => format!(", {}", w.name()),
            None => String::new(),
        },
        if fetched.from_cache {
            ", already cached"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

async fn save(references: &[String], output: &Path) -> anyhow::Result<ExitCode> {
    let registry = Registry::new(RegistryOptions::from_env());
    let mut pinned = Vec::new();
    for r in references {
        let reference = parse_reference(r)?;
        let fetched = registry.fetch(&reference, None, true, None).await?;
        pinned.push(fetched.reference);
    }
    let dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let temp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a file in {}", dir.display()))?;
    registry.save(&pinned, std::io::BufWriter::new(temp.as_file()))?;
    temp.persist(output)
        .with_context(|| format!("writing {}", output.display()))?;
    for p in &pinned {
        println!("saved {p}");
    }
    println!(
        "wrote {} (load it with `berth plugin load {}`)",
        output.display(),
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn load(input: &Path) -> anyhow::Result<ExitCode> {
    let registry = Registry::new(RegistryOptions::from_env());
    let references = if input == Path::new("-") {
        registry.load(std::io::stdin().lock())?
    } else {
        let file =
            std::fs::File::open(input).with_context(|| format!("opening {}", input.display()))?;
        registry.load(std::io::BufReader::new(file))?
    };
    for r in &references {
        println!("loaded {r}");
    }
    Ok(ExitCode::SUCCESS)
}
