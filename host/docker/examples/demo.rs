//! The whole story on the embedded default, no Docker needed (`cargo xtask
//! demo` runs it: `cargo run -p berth-docker --example demo -- FS_STORE.wasm`).
//! A local sandbox whose snapshots go through the `fs-store` Wasm plugin:
//! create, exec, stop, lose the workspace, resume, see the files return.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use berth::backend::local::LocalState;
use berth::backend::ExecRequest;
use berth::plugin::{CompileCache, PluginHost};
use berth::sandbox::{
    BackendSpec, Sandbox, SandboxClient, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec,
};
use berth::workspace::WorkspaceSpec;
use berth_docker::{DockerOptions, DockerState};

/// The fs-store component: the first argument (`cargo xtask demo` passes
/// it), else `$BERTH_FS_STORE`.
fn fs_store_component() -> anyhow::Result<PathBuf> {
    let given = std::env::args_os()
        .nth(1)
        .or_else(|| std::env::var_os("BERTH_FS_STORE"))
        .map(PathBuf::from)
        .context("usage: demo FS_STORE.wasm (or set BERTH_FS_STORE); `cargo xtask demo` builds and passes it")?;
    if !given.is_file() {
        bail!("{} is not a file: build the fs-store example plugin first (`cargo xtask build-guests`)", given.display());
    }
    Ok(std::path::absolute(given)?)
}

async fn sh(sandbox: &Sandbox, cmd: &str) -> anyhow::Result<String> {
    let r = sandbox
        .exec(ExecRequest::new(cmd, Duration::from_secs(60)))
        .await?;
    if r.exit_code != 0 {
        bail!("`{cmd}` exited {}: {}", r.exit_code, r.stderr_text());
    }
    Ok(r.stdout_text().into_owned())
}

fn step(n: u32, text: &str) {
    println!("\n[{n}] {text}");
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let component = fs_store_component()?;
    let scratch = tempfile::Builder::new().prefix("berth-demo-").tempdir()?;
    let base = scratch.path();
    let store = base.join("object-store");
    std::fs::create_dir(&store)?;
    let manifest = base.join("fs-store.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = \"fs-store\"\ncomponent = {component:?}\nworld = \"remote-client-plugin\"\n\
             [config]\nroot = \"/data\"\n[grants]\nmax_memory = \"64MiB\"\n\
             [[grants.dirs]]\nhost = {store:?}\nguest = \"/data\"\nmode = \"rw\"\n"
        ),
    )?;
    println!("Berth demo: a local sandbox whose snapshots are stored by a WebAssembly plugin.");
    println!("scratch directory: {}", base.display());

    step(
        1,
        "Load the fs-store plugin (a Wasm component, granted one directory and nothing else)",
    );
    let cache = CompileCache::at(base.join("compile-cache"));
    for attempt in ["cold", "from the compile cache"] {
        let host = PluginHost::with_cache(cache.clone())?;
        let t = Instant::now();
        let plugin = host.load_file(&manifest).await?;
        println!(
            "    load {attempt}: {:.1} ms ({:?})",
            t.elapsed().as_secs_f64() * 1e3,
            plugin.cache_outcome()
        );
    }
    let host = PluginHost::with_cache(cache)?;

    step(2, "Create a sandbox from a workspace manifest and start it");
    let workspace: WorkspaceSpec = serde_json::from_value(serde_json::json!({
        "environment": {"PROJECT": "demo"},
        "entries": {
            "README.md": {"type": "file", "content": "# A workspace the agent works in\n"},
            "src": {"type": "dir", "children": {"app.sh": {"type": "file", "content": "echo \"building $PROJECT\"\n", "mode": 493}}},
            ".cache": {"type": "dir", "ephemeral": true, "children": {"token": {"type": "file", "content": "not persisted"}}}
        }
    }))?;
    // The Docker kind is `berth-docker`'s: registered, the client resumes
    // Docker sandboxes from their state.
    let client = SandboxClient::builder(base.join("home"))
        .plugin_host(host)
        .backend_providers(berth_docker::providers())
        .build();
    let options = || SandboxOptions {
        compression: true,
        ..SandboxOptions::default()
    };
    let mut sandbox = client
        .create(
            SandboxSpec::new(workspace)
                .snapshot(SnapshotSpec::remote(manifest.clone()))
                .backend(BackendSpec::local())
                .options(options()),
        )
        .await?;
    let branch = sandbox.start().await?;
    let root = sandbox.state().backend.decode::<LocalState>()?.root_dir;
    println!("    started: {branch}; workspace at {}", root.display());

    step(3, "The agent runs commands");
    print!(
        "    $ sh src/app.sh\n    {}",
        sh(&sandbox, "sh src/app.sh").await?
    );
    sh(
        &sandbox,
        "mkdir -p out && seq 1 100000 > out/numbers.txt && echo 'done' > out/status",
    )
    .await?;
    let before = sh(
        &sandbox,
        "find . -path ./.cache -prune -o -type f -print | sort | xargs sha256sum",
    )
    .await?;
    println!("    wrote out/numbers.txt and out/status");

    step(
        4,
        "Stop: the workspace streams through the plugin into the object store",
    );
    let t = Instant::now();
    sandbox.stop().await?;
    let state = sandbox.state();
    println!(
        "    persisted in {:.0} ms: snapshot {} ({} bytes, zstd, {})",
        t.elapsed().as_secs_f64() * 1e3,
        state.snapshot.id,
        state.snapshot.size.unwrap_or(0),
        state.snapshot.digest.as_deref().unwrap_or("-")
    );
    let state_json = state.to_json()?;

    step(
        5,
        "Disaster: the workspace is lost, with the disk image that holds it",
    );
    if let Some(disk) = state.backend.decode::<LocalState>()?.disk() {
        disk.remove(berth::backend::local::KIND)
            .await
            .context("unmounting and deleting the workspace's disk image")?;
        println!(
            "    umount {0} && rm {1}",
            root.display(),
            disk.image.display()
        );
    }
    std::fs::remove_dir_all(&root).context("deleting the workspace")?;
    println!("    rm -rf {}", root.display());

    step(6, "Resume from the saved state JSON alone");
    let mut resumed = client
        .resume(SandboxState::from_json(&state_json)?, None, options())
        .await?;
    let branch = resumed.start().await?;
    println!("    started: {branch}");
    let after = sh(
        &resumed,
        "find . -path ./.cache -prune -o -type f -print | sort | xargs sha256sum",
    )
    .await?;
    if after != before {
        bail!("the restored workspace differs:\nbefore:\n{before}\nafter:\n{after}");
    }
    println!("    every file came back byte-identical:");
    for line in after.lines() {
        println!("      {line}");
    }
    print!(
        "    ephemeral .cache/token re-applied from the manifest: {}",
        sh(&resumed, "cat .cache/token; echo").await?
    );

    step(
        7,
        "Shut down: the workspace is removed, the snapshot stays in the store",
    );
    resumed.shutdown().await?;
    println!("    object store holds: {}", list(&store)?.join(", "));

    docker_half(&client, &manifest).await?;
    println!("\nDemo complete.");
    Ok(ExitCode::SUCCESS)
}

/// The same story in a Docker container, when an engine answers.
async fn docker_half(client: &SandboxClient, manifest: &Path) -> anyhow::Result<()> {
    let image = std::env::var("BERTH_DEMO_IMAGE").unwrap_or_else(|_| "berth-test:busybox".into());
    let probe = DockerOptions::new(image.clone()).into_state_for_probe();
    match berth_docker::image_present(&probe).await {
        Ok(true) => {}
        Ok(false) => {
            println!(
                "\n[docker] skipped: image {image} is not present (`cargo xtask setup` imports it)"
            );
            return Ok(());
        }
        Err(e) => {
            println!("\n[docker] skipped: {e}");
            return Ok(());
        }
    }
    step(
        8,
        &format!("The same on Docker ({image}): no network, no capabilities, no new privileges"),
    );
    let options = || SandboxOptions {
        compression: true,
        ..SandboxOptions::default()
    };
    let mut sandbox = client
        .create(
            SandboxSpec::new(WorkspaceSpec::default())
                .snapshot(SnapshotSpec::remote(manifest.to_path_buf()))
                .backend(BackendSpec::new(
                    DockerOptions::new(image).memory(256 << 20),
                ))
                .options(options()),
        )
        .await?;
    sandbox.start().await?;
    sh(
        &sandbox,
        "echo 'written inside a container' > note.txt && seq 1 20000 > n.txt",
    )
    .await?;
    let before = sh(&sandbox, "sha256sum note.txt n.txt").await?;
    print!(
        "    {}",
        before.replace('\n', "\n    ").trim_end_matches(' ')
    );
    sandbox.stop().await?;
    let state = sandbox.state();
    let id = state
        .backend
        .decode::<DockerState>()?
        .container_id
        .unwrap_or_default();
    println!(
        "    stopped; snapshot {} in the object store",
        state.snapshot.id
    );

    step(9, "Someone removes the container behind Berth's back");
    bollard::Docker::connect_with_defaults()?
        .remove_container(
            &id,
            Some(
                bollard::query_parameters::RemoveContainerOptionsBuilder::new()
                    .force(true)
                    .build(),
            ),
        )
        .await?;
    println!("    removed container {}", &id[..12.min(id.len())]);

    step(
        10,
        "Resume: Berth re-creates the container and restores the workspace",
    );
    let t = Instant::now();
    let mut resumed = client
        .resume(SandboxState::from_json(&state.to_json()?)?, None, options())
        .await?;
    let branch = resumed.start().await?;
    println!("    {branch}, in {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    let after = sh(&resumed, "sha256sum note.txt n.txt").await?;
    if after != before {
        bail!("the restored container workspace differs");
    }
    println!("    files byte-identical in the new container");
    resumed.shutdown().await?;
    println!("    container removed (Berth owned it)");
    Ok(())
}

fn list(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut v: Vec<String> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    v.sort();
    Ok(v)
}
