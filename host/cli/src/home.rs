//! Where the CLI keeps its sandboxes (`$BERTH_HOME`) and the client it
//! opens them with: every backend kind this `berth` knows, with progress
//! drawn on stderr.

use std::path::{Path, PathBuf};

use anyhow::bail;
use berth::backend::docker::swarm::{PlacementProgress, SwarmProvider};
use berth::backend::docker::{DockerProvider, PullProgress};
use berth::sandbox::{NamedSandboxes, SandboxClient};

use crate::notice::say;

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

/// The named sandboxes under `home`, resumed through the CLI's client.
pub(crate) fn named(home: &Path) -> NamedSandboxes {
    NamedSandboxes::new(client(home))
}

/// The client every command uses: sandboxes under `home`, image pulls
/// drawn on stderr.
pub(crate) fn client(home: &Path) -> SandboxClient {
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
                say(&format!(
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
            say(&format!(
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
