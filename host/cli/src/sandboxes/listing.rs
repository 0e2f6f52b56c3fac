//! `berth ls` and `berth fork`.

use std::process::ExitCode;

use anyhow::{bail, Context};
use berth::snapshot::DedupRecord;

use super::*;

/// `berth ls`.
pub async fn ls(json: bool) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let rows = saved_sandboxes(&home);
    if json {
        let states: Vec<_> = rows
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "state": r.state}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&states)?);
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = table::Table::new(&[
        "NAME",
        "BACKEND",
        "ISOLATION",
        "SNAPSHOT",
        "READY",
        "SNAPSHOT ID",
        "WHERE",
        "NODE",
        "ORPHANS",
    ]);
    let client = client(&home);
    // Every backend's columns come from its provider's summary; a kind
    // this berth has no provider for shows `-`.
    let summary = |b: &berth::sandbox::BackendState| client.backend_summary(b).unwrap_or_default();
    for r in rows {
        let orphans: Vec<String> = r
            .state
            .orphans
            .iter()
            .map(|o| {
                let s = summary(&o.backend);
                format!(
                    "{} on {}",
                    s.instance.as_deref().unwrap_or("?"),
                    s.location.as_deref().unwrap_or("?")
                )
            })
            .collect();
        table.row(vec![
            r.name.clone(),
            r.state.backend.kind.clone(),
            summary(&r.state.backend)
                .isolation
                .unwrap_or_else(|| "-".into()),
            r.state.snapshot.kind.clone(),
            if r.state.workspace_root_ready {
                "yes"
            } else {
                "no"
            }
            .to_string(),
            r.state.snapshot.id.to_string(),
            summary(&r.state.backend)
                .location
                .unwrap_or_else(|| "-".into()),
            summary(&r.state.backend).node.unwrap_or_else(|| "-".into()),
            if orphans.is_empty() {
                "-".to_string()
            } else {
                orphans.join(", ")
            },
        ]);
    }
    print!("{}", table.render());
    // Pool members are not sandboxes anyone owns: counted apart.
    for pool in berth::sandbox::Pools::new(named(&home)).list() {
        println!(
            "pool {}: {} warm sandboxes of {} kept (`berth pool ls`; `berth create NAME --from-pool {}` claims one)",
            pool.spec.name,
            pool.members.len(),
            pool.spec.size,
            pool.spec.name
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `berth fork`.
#[derive(clap::Args)]
pub struct ForkArgs {
    /// The sandbox to fork.
    name: String,
    /// The new sandbox's name (or --count N and --prefix P for many).
    #[arg(required_unless_present = "count")]
    new: Option<String>,
    /// Start from this kept generation instead of the newest (see
    /// `berth history NAME`).
    #[arg(long, conflicts_with = "live")]
    generation: Option<u64>,
    /// Fork the workspace as it is now: a checkpoint of the running
    /// sandbox first (it keeps running), every fork from it.
    #[arg(long)]
    live: bool,
    /// Make N forks at once (1 to 64), named PREFIX1 … PREFIXN, made and
    /// started in parallel; all or none.
    #[arg(long, requires = "prefix", conflicts_with = "new")]
    count: Option<u32>,
    /// The names' beginning, with --count.
    #[arg(long, requires = "count")]
    prefix: Option<String>,
    /// Create without starting.
    #[arg(long)]
    no_start: bool,
}

/// `berth fork NAME NEW [--generation K | --live]`, or `berth fork NAME
/// --count N --prefix P [--live]`.
pub async fn fork(args: ForkArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let name = args.name.as_str();
    let generation = match args.live {
        true => Some(
            super::history::take_checkpoint(&home, name, Some("live fork".into()))
                .await
                .with_context(|| format!("checkpointing {name} for a live fork"))?,
        ),
        false => args.generation,
    };
    match (&args.new, args.count, &args.prefix) {
        (Some(new), _, _) => fork_one(&home, name, new, generation, args.no_start).await,
        (None, Some(count), Some(prefix)) => {
            fork_many(&home, name, prefix, count, generation, args.no_start).await
        }
        _ => bail!("give the new sandbox's name, or --count N and --prefix P"),
    }
}

/// N forks, through the server when one runs.
async fn fork_many(
    home: &Path,
    name: &str,
    prefix: &str,
    count: u32,
    generation: Option<u64>,
    no_start: bool,
) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let names = match crate::server::Remote::for_home(home).await {
        Some(remote) => {
            let path = format!("{}/forks", super::through_server::sandbox_path(name));
            let forked: berth_server::Forked = remote
                .json(
                    http::Method::POST,
                    &path,
                    Some(serde_json::json!({
                        "count": count,
                        "prefix": prefix,
                        "generation": generation,
                        "start": !no_start,
                    })),
                )
                .await
                .with_context(|| format!("forking {name}"))?;
            forked.sandboxes.into_iter().map(|s| s.name).collect()
        }
        None => {
            let names = berth::sandbox::fork_names(prefix, count)?;
            named(home)
                .fork_many(name, generation, &names, !no_start)
                .await
                .with_context(|| format!("forking {name}"))?;
            names
        }
    };
    println!(
        "forked {name}{} into {} in {:.2}s: {}",
        generation
            .map(|g| format!(" (generation {g})"))
            .unwrap_or_default(),
        count,
        started.elapsed().as_secs_f64(),
        names.join(" ")
    );
    Ok(ExitCode::SUCCESS)
}

/// One fork, in this process.
async fn fork_one(
    home: &Path,
    name: &str,
    new: &str,
    generation: Option<u64>,
    no_start: bool,
) -> anyhow::Result<ExitCode> {
    let home = home.to_path_buf();
    let _source_lock = lock(&home, name).await?;
    let _lock = lock(&home, new).await?;
    if state_path(&home, new)?.exists() {
        bail!("a sandbox named {new:?} exists already; pick another name");
    }
    let source = load(&home, name)?;
    let client = client(&home);
    let backend = client.backend_like(&source.state.backend)?;
    let mut opts = named(&home).options(new, false, source.freeze, false);
    opts.progress = progress_bar();
    let mut sandbox = client
        .fork(&source.state, generation, None, backend, opts)
        .await
        .with_context(|| format!("forking {name}"))?;
    let started = if no_start {
        Ok(())
    } else {
        sandbox.start().await.map(|_| ())
    };
    let saved = Saved {
        checkpoint_each_exec: false,
        name: new.to_string(),
        compression: false,
        freeze: source.freeze,
        state: sandbox.state(),
    };
    save(&home, &saved)?;
    if let Err(e) = started {
        return Err(anyhow::Error::new(e).context(format!(
            "{new} was forked but did not start; `berth start {new}` retries, `berth rm {new}` removes it"
        )));
    }
    let base = DedupRecord::from_fields(&saved.state.snapshot.fields)
        .and_then(|d| d.base)
        .map(|g| {
            format!(
                "{name} generation {}{}",
                g.number,
                if generation.is_none() {
                    " (its newest)"
                } else {
                    ""
                }
            )
        })
        .unwrap_or_default();
    println!(
        "forked {new} from {base} (snapshot {}){}",
        saved.state.snapshot.id,
        if no_start { "" } else { ", started" }
    );
    Ok(ExitCode::SUCCESS)
}
