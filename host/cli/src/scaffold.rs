//! `berth plugin new`: a working store plugin to start from.

use std::process::ExitCode;

/// Arguments of `berth plugin new`.
#[derive(clap::Args)]
pub struct NewArgs {
    /// The plugin's name (and directory).
    pub name: String,
}

pub fn run(_args: NewArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not yet")
}
