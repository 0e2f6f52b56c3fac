//! The OCI runtime a Docker sandbox's container runs under: the engine's
//! default (runc, a plain container), or one the user names — `runsc`
//! (gVisor), whose own kernel in user space answers the sandbox's system
//! calls so that the host kernel sees only a few of them.
//!
//! A named runtime is a promise of containment, so it fails closed: a
//! sandbox is not created on an engine that does not know the runtime,
//! and a container found running under another runtime is not used.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;

use super::{DockerBackend, BACKEND};
use berth::backend::BackendError;

/// The runtime Docker registers gVisor under, by convention.
pub const GVISOR: &str = "runsc";

/// What `berth ls` shows as the isolation of a sandbox with `runtime`.
pub fn isolation_name(runtime: Option<&str>) -> String {
    match runtime {
        None | Some("runc") => "container".into(),
        Some(GVISOR) => "gvisor".into(),
        Some(other) => format!("container ({other})"),
    }
}

/// How to register `runtime` with an engine, for error messages.
fn how_to_register(runtime: &str) -> String {
    if runtime == GVISOR {
        "install gVisor (`apt-get install runsc`, or gvisor.dev's release) and register it with the engine: \
         `\"runtimes\": {\"runsc\": {\"path\": \"/usr/bin/runsc\", \"runtimeArgs\": [\"--network=none\", \"--file-access=shared\"]}}` \
         in /etc/docker/daemon.json, then `kill -HUP $(pidof dockerd)`; or leave `runtime` out for a plain container"
            .into()
    } else {
        "register it under `runtimes` in the engine's daemon.json and reload the engine; or leave `runtime` out".into()
    }
}

/// Fails unless the engine knows `runtime`.
pub(crate) async fn check_known(docker: &Docker, runtime: &str) -> Result<(), BackendError> {
    let info = docker
        .info()
        .await
        .map_err(|e| super::engine::api("asking the engine for its runtimes", e))?;
    let known: Vec<String> = info
        .runtimes
        .map(|r| r.into_keys().collect())
        .unwrap_or_default();
    if known.iter().any(|k| k == runtime) {
        return Ok(());
    }
    Err(BackendError::Unconfined {
        backend: BACKEND,
        cause: format!(
            "the engine has no runtime `{runtime}` (it has: {})",
            if known.is_empty() {
                "none listed".to_string()
            } else {
                known.join(", ")
            }
        ),
        remedy: how_to_register(runtime),
    })
}

/// Fails unless the container runs under `wanted` (as the engine
/// reports it); `actual` is the container's `HostConfig.Runtime`.
pub(crate) fn check_container(
    container: &str,
    wanted: &str,
    actual: Option<&str>,
) -> Result<(), BackendError> {
    if actual == Some(wanted) {
        return Ok(());
    }
    Err(BackendError::Unconfined {
        backend: BACKEND,
        cause: format!(
            "container {container} runs under runtime `{}`, not `{wanted}` as the sandbox asks",
            actual.unwrap_or("(the engine's default)")
        ),
        remedy: "remove that container (`docker rm -f`) so Berth re-creates it under the sandbox's runtime \
                 and restores the workspace; Berth will not run commands in it"
            .into(),
    })
}

/// After a container under gVisor starts: fails unless the kernel its
/// commands talk to is not the engine host's (gVisor's answers with a
/// version of its own). What the engine says it ran is one thing; this is
/// read from inside, as an agent's command would see it.
pub(crate) async fn verify_inside(
    backend: &DockerBackend,
    runtime: &str,
) -> Result<(), BackendError> {
    if runtime != GVISOR {
        return Ok(());
    }
    let docker = &backend.docker;
    let info = docker
        .info()
        .await
        .map_err(|e| super::engine::api("asking the engine for its kernel", e))?;
    let host_kernel = info.kernel_version.unwrap_or_default();
    // One plain exec in `/` (the workspace root may not exist yet), its
    // output bounded.
    let exec = docker
        .create_exec(
            &backend.target(),
            CreateExecOptions {
                attach_stdout: Some(true),
                cmd: Some(vec!["cat".to_string(), "/proc/version".to_string()]),
                working_dir: Some("/".to_string()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| super::engine::api("reading the sandbox's kernel", e))?;
    let mut inside = Vec::new();
    let read = async {
        if let Ok(StartExecResults::Attached { mut output, .. }) =
            docker.start_exec(&exec.id, None).await
        {
            while let Some(Ok(chunk)) = output.next().await {
                if inside.len() < 4096 {
                    inside.extend_from_slice(&chunk.into_bytes());
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(60), read).await;
    check_kernel(
        &backend.state.container_name,
        &host_kernel,
        String::from_utf8_lossy(&inside).trim(),
    )
}

/// The check of [`verify_inside`]: `inside` (the container's
/// `/proc/version`) must be readable and must not name `host_kernel`.
fn check_kernel(container: &str, host_kernel: &str, inside: &str) -> Result<(), BackendError> {
    let cause = if inside.is_empty() {
        format!("container {container}'s /proc/version could not be read, so its kernel is unknown")
    } else if !host_kernel.is_empty() && inside.contains(host_kernel) {
        format!(
            "container {container} talks to the engine host's kernel ({host_kernel}), not gVisor's"
        )
    } else {
        return Ok(());
    };
    Err(BackendError::Unconfined {
        backend: BACKEND,
        cause,
        remedy: format!("check that the engine's `{GVISOR}` runtime is gVisor's runsc (`docker info`), then remove the container so Berth re-creates it; Berth will not run commands in it"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_under_another_runtime_is_refused() {
        assert!(check_container("c", GVISOR, Some(GVISOR)).is_ok());
        for actual in [None, Some("runc")] {
            let e = check_container("c", GVISOR, actual)
                .unwrap_err()
                .to_string();
            assert!(e.contains("not `runsc`") && e.contains("docker rm"), "{e}");
        }
    }

    #[test]
    fn a_container_on_the_hosts_kernel_is_refused() {
        let gvisor = "Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016";
        assert!(check_kernel("c", "6.18.2", gvisor).is_ok());
        let e = check_kernel("c", "6.18.2", "Linux version 6.18.2 (gcc) #1 SMP")
            .unwrap_err()
            .to_string();
        assert!(e.contains("host's kernel"), "{e}");
        assert!(check_kernel("c", "6.18.2", "").is_err());
    }

    #[test]
    fn isolation_names() {
        assert_eq!(isolation_name(None), "container");
        assert_eq!(isolation_name(Some("runsc")), "gvisor");
        assert_eq!(isolation_name(Some("kata")), "container (kata)");
    }
}
