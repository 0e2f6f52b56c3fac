//! `cargo xtask`: project automation.
//!
//! - `setup`        install what the build and tests need (idempotent)
//! - `build-guests` build the example plugins for wasm32-wasip2
//! - `demo`         build everything and run `berth demo`
//! - `test`         setup, build guests, then the whole test suite
//! - `lint`         rustfmt check and clippy with warnings denied

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup(&root),
        Some("build-guests") => build_guests(&root),
        Some("demo") => {
            setup(&root)?;
            build_guests(&root)?;
            demo(&root)
        }
        Some("test") => {
            setup(&root)?;
            build_guests(&root)?;
            test(&root, &args[1..])
        }
        Some("lint") => lint(&root),
        _ => {
            eprintln!(
                "usage: cargo xtask <setup|build-guests|demo|test|lint>\n\
                 \n  setup         install the wasm32-wasip2 target and tools (idempotent)\
                 \n  build-guests  build guest-examples/* into components\
                 \n  demo          build everything and run `berth demo`\
                 \n  test          setup + build-guests + the whole test suite\
                 \n  lint          cargo fmt --check and clippy -D warnings"
            );
            bail!("no command given")
        }
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn setup(_root: &Path) -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == "wasm32-wasip2") {
        eprintln!("xtask: wasm32-wasip2 target present");
    } else {
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))?;
    }
    Ok(())
}

/// The example plugins and their component file names.
const GUESTS: &[(&str, &str)] = &[
    ("fs-store", "fs_store"),
    ("dir-snapshot", "dir_snapshot"),
    ("noop-snapshot", "noop_snapshot"),
    ("broken-store", "broken_store"),
    ("faulty-store", "faulty_store"),
];

fn build_guests(root: &Path) -> Result<()> {
    let guests = root.join("guest-examples");
    run(Command::new("cargo").current_dir(&guests).args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
    ]))?;
    let out = guests.join("target/wasm32-wasip2/release");
    for (dir, file) in GUESTS {
        let wasm = out.join(format!("{file}.wasm"));
        let header =
            std::fs::read(&wasm).with_context(|| format!("{} was not built", wasm.display()))?;
        // A component's header is `\0asm` then version 0x0d 0x00 0x01 0x00.
        if header.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00]) {
            bail!("{} is not a component", wasm.display());
        }
        // Each example manifest grants a `store/` directory beside it.
        std::fs::create_dir_all(guests.join(dir).join("store"))?;
        eprintln!("xtask: built {dir} ({} bytes)", header.len());
    }
    Ok(())
}

fn berth_binary(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug").join("berth")
}

fn demo(root: &Path) -> Result<()> {
    run(Command::new("cargo")
        .current_dir(root)
        .args(["build", "--package", "berth"]))?;
    run(Command::new(berth_binary(root))
        .current_dir(root)
        .arg("demo"))
}

fn test(root: &Path, extra: &[String]) -> Result<()> {
    run(Command::new("cargo")
        .current_dir(root)
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo")
        .current_dir(root.join("guest-examples"))
        .args(["fmt", "--all", "--", "--check"]))?;
    run(Command::new("cargo")
        .current_dir(root)
        .args(["build", "--workspace", "--all-targets"]))?;
    run(Command::new("cargo")
        .current_dir(root)
        .args(["test", "--workspace"])
        .args(extra))
}

fn lint(root: &Path) -> Result<()> {
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
