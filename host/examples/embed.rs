//! Berth embedded in a host program: load a storage plugin, create a
//! sandbox, run a command, stop, forget everything, resume from the JSON
//! state alone. Run: `cargo run -p berth --example embed -- FS_STORE.wasm`.
use berth::backend::ExecRequest;
use berth::plugin::{DirMode, PluginHost, PluginManifest, World};
use berth::sandbox::{SandboxClient, SandboxOptions, SandboxSpec, SandboxState, SnapshotSpec};
use berth::workspace::WorkspaceSpec;
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let component = std::env::args()
        .nth(1)
        .ok_or("usage: embed FS_STORE.wasm")?;
    let home = tempfile::tempdir()?;
    std::fs::create_dir(home.path().join("store"))?;
    // A remote store plugin, granted one directory and nothing else.
    let manifest = PluginManifest::for_component(component, World::RemoteClient)
        .with_dir(home.path().join("store"), "/data", DirMode::ReadWrite)
        .with_config("root", "/data");
    let plugin = PluginHost::new()?.load(manifest).await?;
    let client = SandboxClient::new(home.path());
    let workspace: WorkspaceSpec = serde_json::from_str(
        r#"{"entries": {"task.md": {"type": "file", "content": "fix it\n"}}}"#,
    )?;
    let spec = SandboxSpec::new(workspace).snapshot(SnapshotSpec::loaded_plugin(plugin.clone()));
    let mut sandbox = client.create(spec).await?;
    sandbox.start().await?;
    let run = |cmd: &str| ExecRequest::new(cmd, Duration::from_secs(30));
    sandbox.exec(run("echo done >> task.md")).await?;
    sandbox.stop().await?;
    let saved = sandbox.state().to_json()?;
    sandbox.shutdown().await?; // the workspace is gone; the snapshot is in the store
    drop(sandbox);

    let state = SandboxState::from_json(&saved)?;
    let snapshot = Some(SnapshotSpec::loaded_plugin(plugin));
    let mut sandbox = client
        .resume(state, snapshot, SandboxOptions::default())
        .await?;
    sandbox.start().await?; // restored from the plugin's store
    print!("{}", sandbox.exec(run("cat task.md")).await?.stdout_text());
    Ok(())
}
