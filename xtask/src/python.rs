//! The Python side of the tests: the stdlib client needs only `python3`;
//! the OpenAI Agents SDK provider needs the SDK, installed at the version
//! `host/python/requirements-agents.txt` pins into a venv of its own
//! (`target/py-agents`), so nothing is added to the system's Python.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::process::{have, run};

/// The venv the provider's tests run in.
pub(crate) fn agents_venv(root: &Path) -> PathBuf {
    root.join("target").join("py-agents")
}

/// Makes the venv and installs the pinned SDK, unless it already holds
/// exactly what the requirements file says (a stamp beside it).
pub(crate) fn agents_setup(root: &Path) -> Result<()> {
    if !have("python3") {
        anyhow::bail!("python3 is needed for the Python client and the Agents SDK provider");
    }
    let requirements = root.join("host/python/requirements-agents.txt");
    let wanted = std::fs::read_to_string(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let venv = agents_venv(root);
    let stamp = venv.join(".berth-requirements");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str())
        && venv.join("bin/python").exists()
    {
        eprintln!("xtask: Agents SDK venv ready ({})", venv.display());
        return Ok(());
    }
    eprintln!("xtask: installing the Agents SDK into {}", venv.display());
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/python"))
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&requirements))?;
    std::fs::write(&stamp, wanted).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(())
}
