//! `berth create|start|exec|ps|logs|kill|wait|shell|cp|files|stop|rm|ls|inspect|persist|hydrate|gc|fork|egress`: sandboxes
//! kept by name as state files under `$BERTH_HOME`.

use std::path::{Path, PathBuf};

use berth::sandbox::{Progress, Sandbox, SandboxOptions, StateLock};

use crate::home::{berth_home, client, named};
use crate::table;

/// What the CLI keeps per sandbox (shared with `berth serve`).
type Saved = berth::sandbox::NamedSandbox;

mod backend_args;
mod commands;
mod create;
mod egress;
mod files;
mod history;
mod listing;
mod pools;
mod remove;
mod run;
mod setting_flags;
mod through_server;

pub use commands::{exec, kill, logs, port, ps, shell, wait, ExecArgs, LogsArgs};
pub use create::{create, CreateArgs};
pub use egress::{egress, EgressArgs};
pub use files::{cp, files, FilesCommand};
pub use history::{checkpoint, diff, history, rewind};
pub use listing::{fork, ls, ForkArgs};
pub use pools::{pool, PoolCommand};
pub use remove::{gc, gc_orphans, rm};
pub use run::{hydrate, inspect, persist, shutdown, start, stop, StartArgs};

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
fn options(home: &Path, saved: &Saved) -> SandboxOptions {
    let mut options = named(home).options(
        &saved.name,
        saved.compression,
        saved.freeze,
        saved.checkpoint_each_exec,
    );
    options.progress = progress_bar();
    options
}

/// Every kind's settings, for `create`'s flags and help.
pub fn backend_settings_docs() -> setting_flags::KindDocs {
    client(Path::new("/")).backend_settings_docs()
}

/// How `--snapshot` names each snapshot kind, for `create`'s help.
pub fn snapshot_choices() -> Vec<String> {
    client(Path::new("/")).snapshot_choices()
}

pub(crate) use setting_flags::{expand as expand_setting_flags, help as settings_help};

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
