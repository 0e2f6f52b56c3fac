//! rustfmt and clippy, warnings denied.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

use crate::process::run;

pub(crate) fn lint(root: &Path) -> Result<()> {
    run(Command::new("cargo")
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo").current_dir(root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The library without its optional subsystem (http) too.
    run(Command::new("cargo").current_dir(root).args([
        "clippy",
        "--package",
        "berth",
        "--no-default-features",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(Command::new("cargo")
        .current_dir(root.join("guest-examples"))
        .args([
            "clippy",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--",
            "-D",
            "warnings",
        ]))
}
