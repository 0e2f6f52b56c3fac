//! A sandbox's egress policy and its decisions.

use std::fmt;
use std::net::IpAddr;

use crate::address::AddressClass;
use crate::rules::{normalize_name, CidrRule, HostRule};

/// The ports a rule without `:port` allows.
pub const DEFAULT_PORTS: &[u16] = &[80, 443];

/// What a sandbox may reach. Nothing, by default: a connection is allowed
/// only when an allow rule names its host (or a CIDR rule holds its IP
/// literal) on its port, and no deny rule names the host.
///
/// Kept in the sandbox's state (rules as their text), so it survives
/// resume, restore elsewhere, a move and a fork.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EgressPolicy {
    /// Hosts a sandbox may reach (`--allow-host`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<HostRule>,
    /// Hosts it may not, whatever allows them (`--deny-host`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_hosts: Vec<HostRule>,
    /// Address ranges it may reach by IP literal, and into which allowed
    /// names may resolve even when the range is not public
    /// (`--allow-cidr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_cidrs: Vec<CidrRule>,
}

/// A connection the policy allows, and the rule that allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    /// The allow rule, as written (`*.example.test:443`, `10.9.0.0/24`).
    pub rule: String,
}

/// Why a connection is refused, for the sandbox's connection log: each
/// names the rule that refused it, or the rule that is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// The host is not a DNS name Berth would resolve.
    #[error("{host:?} is not a host name: {why}")]
    Malformed {
        /// The host asked for.
        host: String,
        /// What is wrong with it.
        why: String,
    },
    /// A deny rule names the host.
    #[error("{host} is denied by the rule --deny-host {rule}")]
    DeniedBy {
        /// The host asked for.
        host: String,
        /// The deny rule.
        rule: String,
    },
    /// No allow rule names the host.
    #[error("no --allow-host rule names {host}")]
    NotListed {
        /// The host asked for.
        host: String,
    },
    /// Rules name the host, on other ports.
    #[error("{host} is allowed on port(s) {ports} (by {rules}), not on {port}")]
    Port {
        /// The host asked for.
        host: String,
        /// The port asked for.
        port: u16,
        /// The ports the rules allow, comma-separated.
        ports: String,
        /// The rules that name the host, comma-separated.
        rules: String,
    },
    /// An IP literal no CIDR rule holds on that port.
    #[error("{ip} port {port} is an address no --allow-cidr rule holds on that port; sandboxes reach hosts by name")]
    IpLiteral {
        /// The address asked for.
        ip: IpAddr,
        /// The port asked for.
        port: u16,
    },
    /// An allowed name resolved into a range that is not public, which no
    /// CIDR rule allows (a DNS rebinding guard).
    #[error("{host} resolves to {ip}, a {class} address, which no --allow-cidr rule allows")]
    Rebinding {
        /// The allowed host.
        host: String,
        /// The address it resolved to.
        ip: IpAddr,
        /// What kind of address that is.
        class: AddressClass,
    },
}

fn allows_port(rule_port: Option<u16>, port: u16) -> bool {
    match rule_port {
        Some(p) => p == port,
        None => DEFAULT_PORTS.contains(&port),
    }
}

fn ports_text(rule_port: Option<u16>) -> Vec<u16> {
    rule_port.map_or_else(|| DEFAULT_PORTS.to_vec(), |p| vec![p])
}

impl EgressPolicy {
    /// Whether the policy allows anything at all.
    pub fn is_empty(&self) -> bool {
        self.allow_hosts.is_empty() && self.allow_cidrs.is_empty()
    }

    /// Decides a connection to `host` (a name, an IP literal, or an IPv6
    /// literal in brackets) on `port`, before anything is resolved. Deny
    /// rules come first; names are compared without case or trailing dot.
    pub fn decide(&self, host: &str, port: u16) -> Result<Allowed, Denial> {
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return self
                .cidr_for(ip, port)
                .map(|rule| Allowed {
                    rule: rule.to_string(),
                })
                .ok_or(Denial::IpLiteral { ip, port });
        }
        let name = normalize_name(host).map_err(|e| Denial::Malformed {
            host: host.to_string(),
            why: e.why,
        })?;
        if let Some(rule) = self
            .deny_hosts
            .iter()
            .find(|r| r.names(&name) && (r.port().is_none() || r.port() == Some(port)))
        {
            return Err(Denial::DeniedBy {
                host: name,
                rule: rule.to_string(),
            });
        }
        let naming: Vec<&HostRule> = self.allow_hosts.iter().filter(|r| r.names(&name)).collect();
        if let Some(rule) = naming.iter().find(|r| allows_port(r.port(), port)) {
            return Ok(Allowed {
                rule: rule.to_string(),
            });
        }
        if naming.is_empty() {
            return Err(Denial::NotListed { host: name });
        }
        let mut ports: Vec<u16> = naming.iter().flat_map(|r| ports_text(r.port())).collect();
        ports.sort_unstable();
        ports.dedup();
        Err(Denial::Port {
            host: name,
            port,
            ports: join(&ports),
            rules: join(&naming),
        })
    }

    /// Checks one address the host's resolver gave for `host` (allowed by
    /// [`EgressPolicy::decide`]) before connecting to it: a public address,
    /// or one a CIDR rule holds on `port`.
    pub fn check_address(&self, host: &str, ip: IpAddr, port: u16) -> Result<(), Denial> {
        let class = AddressClass::of(ip);
        if class == AddressClass::Public || self.cidr_for(ip, port).is_some() {
            return Ok(());
        }
        Err(Denial::Rebinding {
            host: host.to_string(),
            ip,
            class,
        })
    }

    fn cidr_for(&self, ip: IpAddr, port: u16) -> Option<&CidrRule> {
        self.allow_cidrs
            .iter()
            .find(|r| r.holds(ip) && allows_port(r.port(), port))
    }
}

fn join<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
