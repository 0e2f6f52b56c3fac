//! `berth pool create|ls|rm` and `berth create --from-pool`: warm pools,
//! kept full by `berth serve` (started on demand, as for `exec`).
//!
//! Without a server (`--no-server`), a pool is made full once by the
//! command that creates it, and a claim refills it after it has printed
//! its sandbox; nothing keeps it warm in between.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use berth::sandbox::{ClaimRequest, ClaimSource, PoolSpec, Pools};
use berth::workspace::WorkspaceSpec;
use berth_server::{Claimed, Pool, PoolRemoved, SandboxRecord};
use clap::{Args, Subcommand};
use http::Method;

use super::backend_args::{backend_settings, BackendArgs};
use super::egress::CreateEgressArgs;
use crate::home::{berth_home, named};
use crate::server::{encode, Remote};
use crate::table::Table;

/// `berth pool …`.
#[derive(Subcommand)]
pub enum PoolCommand {
    /// Make a warm pool: SIZE sandboxes of this template kept started
    /// (by `berth serve`, in the background); `berth create NAME
    /// --from-pool POOL` claims one at once.
    Create(Box<PoolCreateArgs>),
    /// List pools: size, members ready, members being made.
    Ls {
        /// As JSON (with each pool's template).
        #[arg(long)]
        json: bool,
    },
    /// Remove a pool: every member shut down and forgotten (sandboxes
    /// claimed from it are not members and stay).
    Rm {
        /// The pool.
        name: String,
    },
}

/// `berth pool create`.
#[derive(Args)]
pub struct PoolCreateArgs {
    /// The pool's name ([A-Za-z0-9._-]).
    name: String,
    /// How many started sandboxes to keep (1 to 256).
    #[arg(long)]
    size: u32,
    /// The backend and its settings, as `berth create` takes them.
    #[command(flatten)]
    backend: BackendArgs,
    /// Snapshot store of the sandboxes claimed, as `berth create`'s.
    #[arg(long, default_value = "local")]
    snapshot: String,
    /// Store deduplicated generations (remote:MANIFEST only).
    #[arg(long)]
    dedup: bool,
    /// Generations to keep (with --dedup).
    #[arg(long, requires = "dedup")]
    keep: Option<u32>,
    /// With --dedup: `each-exec` writes a generation after every command.
    #[arg(long, requires = "dedup", value_parser = ["each-exec", "off"])]
    checkpoint: Option<String>,
    /// Compress snapshots with zstd.
    #[arg(long)]
    compress: bool,
    /// What the pool's sandboxes may reach beyond themselves (no secrets:
    /// a template is stored, a secret's value never is).
    #[command(
        flatten,
        next_help_heading = "Egress (default deny, enforced on the host)"
    )]
    egress: CreateEgressArgs,
}

/// `berth pool …`.
pub async fn pool(command: PoolCommand) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    match command {
        PoolCommand::Create(args) => create(&home, *args).await,
        PoolCommand::Ls { json } => list(&home, json).await,
        PoolCommand::Rm { name } => remove(&home, &name).await,
    }
}

fn spec_of(args: &PoolCreateArgs) -> anyhow::Result<PoolSpec> {
    let mut spec = PoolSpec::new(&args.name, args.size, &backend_settings(&args.backend)?);
    spec.snapshot = args.snapshot.clone();
    spec.compression = args.compress;
    let checkpointing = args.checkpoint.as_deref() == Some("each-exec");
    spec.checkpoint_each_exec = checkpointing;
    spec.dedup_keep = args.dedup.then(|| {
        args.keep
            .unwrap_or_else(|| berth::sandbox::default_keep(checkpointing))
    });
    spec.egress = args.egress.settings()?;
    Ok(spec)
}

async fn create(home: &Path, args: PoolCreateArgs) -> anyhow::Result<ExitCode> {
    let spec = spec_of(&args)?;
    match Remote::for_home(home).await {
        Some(remote) => {
            let mut body = serde_json::json!({
                "name": spec.name,
                "size": spec.size,
                "backend": spec.backend,
                "snapshot": spec.snapshot,
                "compress": spec.compression,
                "checkpoint_each_exec": spec.checkpoint_each_exec,
            });
            if let Some(keep) = spec.dedup_keep {
                body["dedup_keep"] = keep.into();
            }
            if let Some(egress) = &spec.egress {
                body["egress"] = egress_json(egress);
            }
            let _: Pool = remote
                .json(Method::POST, "/v1/pools", Some(body))
                .await
                .with_context(|| format!("making pool {}", spec.name))?;
            println!(
                "created pool {} ({} sandboxes, kept started by the server; `berth pool ls` shows them ready)",
                spec.name, spec.size
            );
        }
        None => {
            let pools = Pools::new(named(home));
            pools.create(&spec).await?;
            let made = pools.fill(&spec.name).await?;
            println!(
                "created pool {} with {made} sandboxes started (no server: nothing refills it but a claim)",
                spec.name
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The API's `egress` for a template's policy.
fn egress_json(egress: &berth::egress::EgressSettings) -> serde_json::Value {
    let policy = &egress.policy;
    serde_json::json!({
        "allow_hosts": policy.allow_hosts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "deny_hosts": policy.deny_hosts.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "allow_cidrs": policy.allow_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "test_resolve": egress.test_resolve.iter().map(ToString::to_string).collect::<Vec<_>>(),
    })
}

async fn list(home: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let pools: Vec<Pool> = match Remote::for_home(home).await {
        Some(remote) => remote.json(Method::GET, "/v1/pools", None).await?,
        None => Pools::new(named(home))
            .list()
            .into_iter()
            .map(|p| Pool {
                name: p.spec.name.clone(),
                size: p.spec.size,
                ready: 0,
                members: p.members.len() as u32,
                making: 0,
                template: serde_json::to_value(&p.spec).unwrap_or_default(),
            })
            .collect(),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&pools)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(&["POOL", "BACKEND", "SIZE", "READY", "MEMBERS", "MAKING"]);
    for p in &pools {
        let backend = p.template["backend"]["type"]
            .as_str()
            .unwrap_or("local")
            .to_string();
        table.row(vec![
            p.name.clone(),
            backend,
            p.size.to_string(),
            p.ready.to_string(),
            p.members.to_string(),
            p.making.to_string(),
        ]);
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

async fn remove(home: &Path, name: &str) -> anyhow::Result<ExitCode> {
    let removed = match Remote::for_home(home).await {
        Some(remote) => {
            let removed: PoolRemoved = remote
                .json(Method::DELETE, &format!("/v1/pools/{}", encode(name)), None)
                .await
                .with_context(|| format!("removing pool {name}"))?;
            removed.members_removed as usize
        }
        None => Pools::new(named(home)).remove(name).await?,
    };
    println!("removed pool {name} ({removed} sandboxes removed)");
    Ok(ExitCode::SUCCESS)
}

/// `berth create NAME --from-pool POOL [--workspace FILE]`.
pub async fn claim(
    home: &Path,
    pool: &str,
    name: &str,
    workspace: WorkspaceSpec,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (record, claimed) = match Remote::for_home(home).await {
        Some(remote) => {
            let body = serde_json::json!({
                "name": name,
                "workspace": workspace,
                "from_pool": pool,
            });
            let reply: SandboxRecord = remote
                .json(Method::POST, "/v1/sandboxes", Some(body))
                .await
                .with_context(|| format!("claiming {name} from pool {pool}"))?;
            let claimed = reply.claimed.clone().unwrap_or(Claimed {
                pool: pool.to_string(),
                warm: false,
                reason: None,
            });
            (reply.state, claimed)
        }
        None => {
            let pools = Pools::new(named(home));
            let mut request = ClaimRequest::new(name);
            request.workspace = workspace;
            let claim = pools.claim(pool, &request).await?;
            let claimed = match &claim.source {
                ClaimSource::Member(_) => Claimed {
                    pool: pool.to_string(),
                    warm: true,
                    reason: None,
                },
                ClaimSource::Cold(reason) => Claimed {
                    pool: pool.to_string(),
                    warm: false,
                    reason: Some(reason.clone()),
                },
            };
            let state = serde_json::to_value(&claim.record.state)?;
            drop(claim);
            print_claim(name, &state, &claimed, json)?;
            // No server keeps the pool full: this command does, after the
            // claim is printed.
            pools.fill(pool).await?;
            return Ok(ExitCode::SUCCESS);
        }
    };
    print_claim(name, &record, &claimed, json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_claim(
    name: &str,
    state: &serde_json::Value,
    claimed: &Claimed,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(state)?);
    }
    let line = match (&claimed.warm, &claimed.reason) {
        (true, _) => format!(
            "created {name} from pool {} (a warm sandbox), started",
            claimed.pool
        ),
        (false, reason) => format!(
            "created {name} cold from pool {}'s template ({}), started",
            claimed.pool,
            reason.as_deref().unwrap_or("no warm sandbox")
        ),
    };
    match json {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    }
    Ok(())
}
