//! Isolation verified inside a task's container, not assumed: a service
//! cannot ask for network `none` (a task given no network gets the default
//! bridge unless its node's daemon runs `--bridge=none`), and daemons on
//! older API versions ignore newer container fields (no-new-privileges for
//! services needs API 1.46). So after a task starts Berth reads, inside
//! it, what it really got, and fails closed naming the node.

use std::time::Duration;

use super::BACKEND;
use crate::DockerBackend;
use berth::backend::{Backend, BackendError, ExecRequest};

/// What the container's first process runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Effective {
    /// Network interfaces, `lo` included.
    pub interfaces: Vec<String>,
    /// Whether no-new-privileges is set.
    pub no_new_privs: bool,
    /// The effective and bounding capability sets (hex masks).
    pub cap_eff: u64,
    pub cap_bnd: u64,
}

const PROBE: &str =
    "cat /proc/net/dev; echo @@; grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/1/status";

/// Parses the probe's output.
pub(super) fn parse(output: &str) -> Option<Effective> {
    let (net, status) = output.split_once("@@")?;
    let interfaces = net
        .lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .filter(|n| !n.is_empty() && !n.contains('|'))
        .collect();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim_start_matches(':').trim().to_string())
    };
    Some(Effective {
        interfaces,
        no_new_privs: field("NoNewPrivs")? == "1",
        cap_eff: u64::from_str_radix(&field("CapEff")?, 16).ok()?,
        cap_bnd: u64::from_str_radix(&field("CapBnd")?, 16).ok()?,
    })
}

/// What is wrong with `effective` for a sandbox that asked for `network`
/// (or none) and no capabilities; empty when nothing is.
pub(super) fn violations(effective: &Effective, network: Option<&str>) -> Vec<String> {
    let mut wrong = Vec::new();
    let others: Vec<&str> = effective
        .interfaces
        .iter()
        .map(String::as_str)
        .filter(|i| *i != "lo")
        .collect();
    if network.is_none() && !others.is_empty() {
        wrong.push(format!(
            "it has network interfaces besides lo ({}) though no network was asked for: run the node's dockerd with --bridge=none, \
             or give the sandbox a network of yours explicitly",
            others.join(", ")
        ));
    }
    if !effective.no_new_privs {
        wrong.push(
            "no-new-privileges is not set (the node's daemon ignores the service field before API 1.46): \
             run the node's dockerd with --no-new-privileges (\"no-new-privileges\": true in daemon.json)"
                .into(),
        );
    }
    if effective.cap_eff != 0 || effective.cap_bnd != 0 {
        wrong.push(format!(
            "it holds capabilities (effective {:#x}, bounding {:#x}) though all were to be dropped",
            effective.cap_eff, effective.cap_bnd
        ));
    }
    wrong
}

/// Reads what the task's container really got and fails, naming `node`,
/// when it is less isolated than asked.
pub(super) async fn verify(
    container: &DockerBackend,
    network: Option<&str>,
    node: &str,
) -> Result<(), BackendError> {
    let mut request = ExecRequest::new(PROBE.to_string(), Duration::from_secs(30));
    request.stdout_cap = 64 * 1024;
    request.stderr_cap = 16 * 1024;
    let result = container.exec(request).await?;
    let effective = parse(&result.stdout_text()).ok_or_else(|| BackendError::Operation {
        backend: BACKEND,
        operation: "checking the sandbox's isolation",
        source: format!(
            "the check's output is unreadable (exit {}: {})",
            result.exit_code,
            result.stderr_text().trim()
        )
        .into(),
    })?;
    let wrong = violations(&effective, network);
    if wrong.is_empty() {
        return Ok(());
    }
    Err(BackendError::Config {
        backend: BACKEND,
        message: format!(
            "the sandbox's container on node {node} is less isolated than asked, so Berth will not use it: {}",
            wrong.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET: &str =
        "Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n    lo:       0       0    0\n";

    fn probe(net: &str, nnp: &str, eff: &str, bnd: &str) -> String {
        format!("{net}@@\nNoNewPrivs:\t{nnp}\nCapEff:\t{eff}\nCapBnd:\t{bnd}\n")
    }

    #[test]
    fn loopback_only_no_capabilities_and_no_new_privileges_pass() {
        let e = parse(&probe(NET, "1", "0000000000000000", "0000000000000000")).unwrap();
        assert_eq!(e.interfaces, vec!["lo"]);
        assert!(violations(&e, None).is_empty());
    }

    #[test]
    fn each_weakness_is_named_once() {
        let net = format!("{NET}  eth0: 1 2 3\n");
        let e = parse(&probe(&net, "0", "00000000a80425fb", "00000000a80425fb")).unwrap();
        let wrong = violations(&e, None);
        assert_eq!(wrong.len(), 3, "{wrong:?}");
        assert!(wrong[0].contains("eth0"));
        assert!(wrong[1].contains("no-new-privileges"));
        assert!(wrong[2].contains("0xa80425fb"));
        // A network asked for is not a weakness.
        assert_eq!(violations(&e, Some("overlay1")).len(), 2);
    }

    #[test]
    fn unreadable_output_is_none() {
        assert!(parse("no marker").is_none());
        assert!(parse(&probe(NET, "1", "zz", "0")).is_none());
    }
}
