//! Where the CLI keeps its sandboxes (`$BERTH_HOME`) and the client it
//! opens them with: every backend kind this `berth` knows, their slow
//! steps drawn on stderr. No kind is named here.

use std::path::{Path, PathBuf};

use anyhow::bail;
use berth::backend::{BackendProgress, ProgressSink};
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

/// The client every command uses: sandboxes under `home`, every kind
/// this `berth` knows (the library's, `berth-docker`'s and an embedder's), their slow steps
/// drawn on stderr.
pub(crate) fn client(home: &Path) -> SandboxClient {
    let mut builder = SandboxClient::builder(home)
        .backend_progress(progress_on_stderr())
        .backend_providers(berth_docker::providers())
        .backend_providers(crate::extra_providers().iter().cloned());
    for provider in crate::extra_snapshot_providers() {
        builder = builder.snapshot_provider_shared(provider.clone());
    }
    builder.build()
}

/// How a kind's slow step goes, on stderr: on a terminal a bar when it
/// counts bytes (as `docker pull` draws one) or a spinner with its state;
/// when it ends, the line the kind has to say about it, terminal or not.
fn progress_on_stderr() -> ProgressSink {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let drawn = std::sync::Mutex::new(None::<indicatif::ProgressBar>);
    ProgressSink(std::sync::Arc::new(move |step: &BackendProgress| {
        let mut drawn = drawn.lock().unwrap_or_else(|p| p.into_inner());
        if step.finished {
            if let Some(bar) = drawn.take() {
                bar.finish_and_clear();
            }
            if let Some(summary) = &step.summary {
                say(summary);
            }
            return;
        }
        if !terminal {
            return;
        }
        let bar = drawn.get_or_insert_with(|| match step.bytes {
            Some(_) => {
                let bar = indicatif::ProgressBar::new(0);
                bar.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar
            }
            None => {
                let spinner = indicatif::ProgressBar::new_spinner();
                spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                spinner
            }
        });
        if let Some((done, total)) = step.bytes {
            bar.set_length(total);
            bar.set_position(done);
        }
        bar.set_message(match &step.detail {
            Some(detail) => format!("{}: {detail}", step.what),
            None => step.what.clone(),
        });
    }))
}
