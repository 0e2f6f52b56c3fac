//! `cargo xtask`: project automation.
//!
//! - `setup`        install what the build and tests need (idempotent)
//! - `build-guests` build the example plugins for wasm32-wasip2
//! - `demo`         build the host and the fs-store guest, run the demo example
//! - `test`         setup, build guests, then the whole test suite
//! - `lint`         the layering check (no import cycles, kinds named only
//!   by their registration), rustfmt check, clippy with warnings denied
//! - `bench`        side-by-side benchmarks (`--quick` for seconds)

use std::path::{Path, PathBuf};
use std::process::Command;

mod agent;
mod docker;
mod engines;
mod garage;
mod guests;
mod layering;
mod lint;
mod node;
mod process;
mod python;
mod swarm;

use anyhow::{bail, Result};

use agent::build_agent;
use docker::{docker_required, docker_setup};
use engines::engines_setup;
use garage::garage_setup;
use guests::{build_guests, build_rust_guests_named};
use lint::lint;
use process::{output, run};
use swarm::swarm_setup;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup(&root),
        Some("build-guests") => build_guests(&root),
        Some("build-agent") => build_agent(&root),
        Some("demo") => {
            // Only what the demo uses: the wasm target, the fs-store guest
            // and the host. The Docker half runs when an engine answers.
            wasm_target()?;
            confinement_setup()?;
            build_rust_guests_named(&root, &["fs-store"])?;
            demo(&root)
        }
        Some("test") => {
            setup(&root)?;
            build_guests(&root)?;
            build_agent(&root)?;
            test(&root, &args[1..])
        }
        Some("lint") => {
            layering::check(&root)?;
            lint(&root)
        }
        Some("bench") => {
            setup(&root)?;
            build_guests(&root)?;
            build_agent(&root)?;
            run(Command::new("cargo").current_dir(&root).args([
                "build",
                "--package",
                "berth-cli",
                "--package",
                "berth-egress",
                "--package",
                "berth-bench",
            ]))?;
            run(
                Command::new(berth_binary(&root).with_file_name("berth-bench"))
                    .current_dir(&root)
                    .args(&args[1..]),
            )
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <setup|build-guests|demo|test|lint|bench>\n\
                 \n  setup         install the wasm32-wasip2 target and tools (idempotent)\
                 \n  build-guests  build guest-examples/* into components\
                 \n  build-agent   build the in-container agent (static, musl)\
                 \n  demo          build the host and the fs-store guest, run the demo example\
                 \n  test          setup + build-guests + the whole test suite\
                 \n  lint          layering check, cargo fmt --check and clippy -D warnings\
                 \n  bench         side-by-side benchmarks (--quick for a small run)"
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

/// Installs bubblewrap, which the local backend confines commands with
/// (by default), when it is missing and this is root; otherwise says how.
fn confinement_setup() -> Result<()> {
    if process::have("bwrap") {
        return Ok(());
    }
    let root = output(Command::new("id").arg("-u")).is_ok_and(|uid| uid.trim() == "0");
    if root {
        return process::apt_install("bwrap", "bubblewrap");
    }
    let advice = "bubblewrap (bwrap) is missing: local sandboxes are confined with it by default; \
                  install it (`sudo apt-get install bubblewrap`)";
    if docker_required() {
        bail!("{advice}");
    }
    eprintln!("xtask: warning: {advice}");
    Ok(())
}

/// Installs the `wasm32-wasip2` target when it is missing.
fn wasm_target() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|l| l.trim() == "wasm32-wasip2") {
        eprintln!("xtask: wasm32-wasip2 target present");
        Ok(())
    } else {
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))
    }
}

fn setup(root: &Path) -> Result<()> {
    wasm_target()?;
    confinement_setup()?;
    match python::agents_setup(root) {
        Ok(()) => {}
        Err(e) if docker_required() => {
            return Err(e.context(
                "the Agents SDK venv is required (CI or BERTH_REQUIRE_DOCKER is set) but could not be made",
            ))
        }
        Err(e) => eprintln!("xtask: warning: no Agents SDK venv ({e:#}); its test will be skipped"),
    }
    match node::node_setup(root) {
        Ok(()) => {}
        Err(e) if docker_required() => {
            return Err(e.context(
                "Node.js and npm are required for the TypeScript client's tests (CI or BERTH_REQUIRE_DOCKER is set)",
            ))
        }
        Err(e) => eprintln!("xtask: warning: {e:#}; the TypeScript client's test will be skipped"),
    }
    match garage_setup() {
        Ok(()) => {}
        Err(e) if docker_required() => {
            return Err(e.context(
                "a Garage S3 cluster is required (CI or BERTH_REQUIRE_DOCKER is set) but could not be set up",
            ))
        }
        Err(e) => eprintln!("xtask: warning: no Garage cluster ({e:#}); S3 tests will be skipped"),
    }
    match docker_setup()
        .and_then(|()| docker::gvisor_setup())
        .and_then(|()| engines_setup())
        .and_then(|()| swarm_setup())
    {
        Ok(()) => Ok(()),
        Err(e) if docker_required() => Err(e.context(
            "Docker engines, a registry and a swarm are required (CI or BERTH_REQUIRE_DOCKER is set) but could not be set up",
        )),
        Err(e) => {
            eprintln!("xtask: warning: no Docker engines ({e:#}); Docker tests will be skipped");
            Ok(())
        }
    }
}

/// The ids of the containers with Berth's session label.
fn berth_containers() -> Vec<String> {
    output(Command::new("docker").args([
        "ps",
        "-aq",
        "--no-trunc",
        "--filter",
        "label=berth.session",
    ]))
    .map(|ids| ids.split_whitespace().map(str::to_string).collect())
    .unwrap_or_default()
}

/// Removes the Berth containers that appeared during the run and are still
/// there (a failed assertion skips a test's shutdown); those that were
/// there before (a user's sandboxes) are left alone. Says how many.
fn sweep_test_containers(before: &[String]) {
    let left: Vec<String> = berth_containers()
        .into_iter()
        .filter(|id| !before.contains(id))
        .collect();
    if left.is_empty() {
        return;
    }
    eprintln!(
        "xtask: removing {} container(s) the tests left behind",
        left.len()
    );
    let _ = Command::new("docker")
        .args(["rm", "-f"])
        .args(&left)
        .stdout(std::process::Stdio::null())
        .status();
}

fn berth_binary(root: &Path) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("debug").join("berth")
}

fn demo(root: &Path) -> Result<()> {
    let fs_store = guest_table::guest(root, "fs-store")
        .map(|g| guest_table::component_path(root, &g))
        .map_err(anyhow::Error::msg)?;
    run(Command::new("cargo")
        .current_dir(root)
        .args([
            "run",
            "--quiet",
            // Unoptimised, for a short first run (see `[profile.demo]`).
            "--profile",
            "demo",
            "--package",
            "berth-docker",
            "--example",
            "demo",
            "--",
        ])
        .arg(fs_store))
}

const GIB: f64 = (1u64 << 30) as f64;

/// Prints the free space of the filesystems the tests write to (the
/// checkout's and the temporary directory's, once each) and returns the
/// smaller, in bytes. A disk that fills mid-run fails tests far from the
/// cause (an upload stalls, a stop says "No space left"); this line names
/// it. At their peak the tests held about 6 GiB beyond the build
/// (2026-12-04, a clean clone sampled with `df` every 5 s): streamed
/// archives of up to 2 GiB (`BERTH_CONFORMANCE_LARGE`), two tests at a
/// time, and every S3 object three times over (three Garage replicas).
fn report_free_disk(root: &Path, when: &str) -> Option<u64> {
    let tmp = std::env::temp_dir();
    let mut mounts = Vec::new();
    let mut smallest: Option<u64> = None;
    for dir in [root, tmp.as_path()] {
        let Ok(text) = output(
            Command::new("df")
                .args(["-B1", "--output=target,avail"])
                .arg(dir),
        ) else {
            continue;
        };
        let Some((mount, free)) = parse_df_target_avail(&text) else {
            continue;
        };
        if mounts.contains(&mount) {
            continue;
        }
        eprintln!("xtask: {:.1} GiB free on {mount} {when}", free as f64 / GIB);
        mounts.push(mount);
        smallest = Some(smallest.map_or(free, |s| s.min(free)));
    }
    smallest
}

/// The mount point and free bytes from `df -B1 --output=target,avail DIR`.
fn parse_df_target_avail(text: &str) -> Option<(String, u64)> {
    let line = text.lines().nth(1)?;
    let (mount, free) = line.trim().rsplit_once(char::is_whitespace)?;
    Some((mount.trim().to_string(), free.parse().ok()?))
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
    // Tests that skip (no engine, no store) say so in this file; libtest
    // hides their stderr, so the summary below is where a skip shows.
    let skips = root.join("target").join("berth-skips.log");
    let before = berth_containers();
    let services_before = swarm::berth_services();
    let _ = std::fs::remove_file(&skips);
    let free_before = report_free_disk(root, "before the tests");
    if free_before.is_some_and(|free| free < 6 << 30) {
        eprintln!(
            "xtask: WARNING: under 6 GiB free; tests that stream 2 GiB archives may fail with \
             'No space left on device' (BERTH_CONFORMANCE_LARGE=512MiB needs less)"
        );
    }
    let tested = run(Command::new("cargo")
        .current_dir(root)
        .env("BERTH_SKIP_LOG", &skips)
        .args(["test", "--workspace"])
        .args(extra));
    if let (Some(before), Some(after)) = (free_before, report_free_disk(root, "after the tests")) {
        eprintln!(
            "xtask: the tests kept {:.1} GiB (scratch they removed is not counted)",
            before.saturating_sub(after) as f64 / GIB
        );
    }
    sweep_test_containers(&before);
    swarm::sweep_test_services(&services_before);
    let skipped = std::fs::read_to_string(&skips).unwrap_or_default();
    if skipped.trim().is_empty() {
        eprintln!("xtask: no test skipped");
    } else {
        eprintln!(
            "xtask: {} test(s) SKIPPED:\n{}",
            skipped.lines().count(),
            skipped.trim_end()
        );
    }
    tested
}

#[cfg(test)]
mod tests {
    use super::parse_df_target_avail;

    #[test]
    fn df_output_gives_the_mount_and_its_free_bytes() {
        let text = "Mounted on          Avail\n/mnt/my disk  67018944512\n";
        assert_eq!(
            parse_df_target_avail(text),
            Some(("/mnt/my disk".to_string(), 67018944512))
        );
        assert_eq!(parse_df_target_avail("Mounted on Avail\n"), None);
        assert_eq!(parse_df_target_avail("Mounted on Avail\n/ -\n"), None);
    }
}
