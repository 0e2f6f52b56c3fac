//! `berth create|start|exec|ps|logs|kill|wait|shell|cp|files|stop|rm|ls|inspect|persist|hydrate|gc|fork`: sandboxes
//! kept by name as state files under `$BERTH_HOME`.

use std::path::{Path, PathBuf};

use anyhow::bail;
use berth::backend::docker::swarm::{PlacementProgress, SwarmProvider};
use berth::backend::docker::{DockerProvider, PullProgress};
use berth::sandbox::{NamedSandboxes, Progress, Sandbox, SandboxClient, SandboxOptions, StateLock};

use crate::table;

mod commands;
mod create;
mod files;
mod history;
mod listing;
mod remove;
mod run;
mod setting_flags;
mod through_server;

pub use commands::{exec, kill, logs, port, ps, shell, wait, ExecArgs, LogsArgs};
pub use create::{create, CreateArgs};
pub use files::{cp, files, FilesCommand};
pub use history::{diff, history, rewind};
pub use listing::{fork, ls};
pub use remove::{gc, gc_orphans, rm};
pub use run::{hydrate, inspect, persist, shutdown, start, stop, StartArgs};

/// `$BERTH_HOME`, else `$XDG_DATA_HOME/berth`, else `~/.local/share/berth`.
pub fn berth_home() -> anyhow::Result<PathBuf> {
    if let Some(h) = std::env::var_os("BERTH_HOME") {
        return Ok(PathBuf::from(h));
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME") {
        return Ok(PathBuf::from(x).join("berth"));
    }
    match std::env::var_os("HOME") {
        Some(h) => Ok(PathBuf::from(h).join(".local/share/berth")),
        None => bail!("cannot find a home for berth's state: set BERTH_HOME"),
    }
}

/// What the CLI keeps per sandbox (shared with `berth serve`).
type Saved = berth::sandbox::NamedSandbox;

/// The named sandboxes under `home`, resumed through the CLI's client.
pub(crate) fn named(home: &Path) -> NamedSandboxes {
    NamedSandboxes::new(client(home))
}

fn state_path(home: &Path, name: &str) -> anyhow::Result<PathBuf> {
    Ok(named(home).state_file(name)?.path().to_path_buf())
}

/// Takes sandbox `name`'s lock: lifecycle commands hold it from before they
/// read the state until after they wrote it, so parallel commands on one
/// sandbox see each other's work instead of racing.
async fn lock(home: &Path, name: &str) -> anyhow::Result<StateLock> {
    Ok(named(home).lock(name).await?)
}

fn load(home: &Path, name: &str) -> anyhow::Result<Saved> {
    Ok(named(home).load(name)?)
}

/// Writes the state file atomically: temp file, fsync, rename.
fn save(home: &Path, saved: &Saved) -> anyhow::Result<()> {
    Ok(named(home).save(saved)?)
}

/// Options for a CLI sandbox: the state file is rewritten (atomically)
/// whenever the lifecycle says a crash must not lose the moment; progress
/// drawn on stderr.
fn options(home: &Path, name: &str, compression: bool, freeze: bool) -> SandboxOptions {
    let mut options = named(home).options(name, compression, freeze);
    options.progress = progress_bar();
    options
}

/// Every kind's settings, for `create`'s flags and help.
pub fn backend_settings_docs() -> setting_flags::KindDocs {
    client(Path::new("/")).backend_settings_docs()
}

pub(crate) use setting_flags::{expand as expand_setting_flags, help as settings_help};

/// The client every command uses: sandboxes under `home`, image pulls
/// drawn on stderr.
fn client(home: &Path) -> SandboxClient {
    let mut builder = SandboxClient::builder(home)
        .backend_provider(DockerProvider::default().pull_progress(pull_progress()))
        .backend_provider(SwarmProvider::default().placement_progress(placement_progress()));
    for provider in crate::extra_providers() {
        builder = builder.backend_provider_shared(provider.clone());
    }
    builder.build()
}

/// How a swarm placement goes, on stderr: a spinner with the task's state
/// on a terminal; a line when a wait took long enough to be noticed.
fn placement_progress() -> PlacementProgress {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let spinner = std::sync::OnceLock::<indicatif::ProgressBar>::new();
    // From the first report of a wait: a task found running at once says
    // nothing.
    let waiting = std::sync::OnceLock::<std::time::Instant>::new();
    PlacementProgress(std::sync::Arc::new(move |status| {
        let text = match &status.message {
            Some(m) => format!("{}: {} ({m})", status.service, status.state),
            None => format!("{}: {}", status.service, status.state),
        };
        if status.finished {
            if let Some(s) = spinner.get() {
                s.finish_and_clear();
            }
            let waited = waiting.get().map_or(0.0, |w| w.elapsed().as_secs_f64());
            if waited >= 2.0 && status.state == "running" {
                crate::server::say(&format!(
                    "{} running after {waited:.1} s of placement",
                    status.service
                ));
            }
            return;
        }
        waiting.get_or_init(std::time::Instant::now);
        if !terminal {
            return;
        }
        let s = spinner.get_or_init(|| {
            let s = indicatif::ProgressBar::new_spinner();
            s.enable_steady_tick(std::time::Duration::from_millis(120));
            s
        });
        s.set_message(format!("waiting for the swarm: {text}"));
    }))
}

/// How an image pull goes, on stderr: a bar of layers and bytes on a
/// terminal, as `docker run` draws it; elsewhere, one line when it ends.
fn pull_progress() -> PullProgress {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let bar = std::sync::OnceLock::<indicatif::ProgressBar>::new();
    let started = std::time::Instant::now();
    PullProgress(std::sync::Arc::new(move |status| {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        if status.finished {
            if let Some(bar) = bar.get() {
                bar.finish_and_clear();
            }
            crate::server::say(&format!(
                "pulled {}: {} layer{}, {:.1} MiB in {:.1} s",
                status.image,
                status.layers,
                if status.layers == 1 { "" } else { "s" },
                mib(status.bytes_done),
                started.elapsed().as_secs_f64()
            ));
            return;
        }
        if !terminal {
            return;
        }
        let bar = bar.get_or_init(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "pulling {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar
        });
        bar.set_message(format!(
            "{} ({}/{} layers)",
            status.image, status.layers_done, status.layers
        ));
        bar.set_length(status.bytes_total.max(status.bytes_done));
        bar.set_position(status.bytes_done);
    }))
}

/// A bytes-and-rate progress bar on stderr, when it is a terminal.
fn progress_bar() -> Option<Progress> {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    let bar = std::sync::Arc::new(bar);
    Some(Progress(std::sync::Arc::new(move |operation, bytes| {
        bar.set_message(operation);
        bar.set_position(bytes);
        bar.tick();
    })))
}

/// Takes the sandbox's lock, resumes it and attaches (restoring the
/// workspace if it is gone), saving what that changed even when it failed.
/// Returns the lock (still held) and the running sandbox.
async fn attach_locked(home: &Path, name: &str) -> anyhow::Result<(StateLock, Sandbox)> {
    let (lock, _, sandbox) = named(home)
        .attach_locked_with(name, |o| o.progress = progress_bar())
        .await?;
    Ok((lock, sandbox))
}

async fn resume(home: &Path, saved: &Saved) -> anyhow::Result<Sandbox> {
    Ok(named(home)
        .resume(saved, |o| o.progress = progress_bar())
        .await?)
}

/// `1015 bytes`, `3.2 MiB`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return count(n as usize, "byte");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// `3 objects`, `1 object`.
fn count(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Every sandbox's saved state, by name.
fn saved_sandboxes(home: &Path) -> Vec<Saved> {
    let (rows, unreadable) = named(home).list();
    for p in unreadable {
        eprintln!("berth: skipping unreadable state file {}", p.display());
    }
    rows
}
