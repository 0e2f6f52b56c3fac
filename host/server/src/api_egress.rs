//! The wire types of a sandbox's egress (`/v1/sandboxes/{name}/egress`,
//! and `egress` in a create): rules as the CLI writes them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An egress policy: default deny, then what it allows. Rules are written
/// as `berth create --allow-host` takes them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressRules {
    /// `HOST[:PORT]` a sandbox may reach (`*.example.com:443`; ports 80
    /// and 443 when none is given).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// `HOST[:PORT]` it may not, whatever allows it.
    #[serde(default)]
    pub deny_hosts: Vec<String>,
    /// `CIDR[:PORT]` it may reach by IP literal, and into which allowed
    /// names may resolve even when the range is not public.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
}

/// `egress` in a create: the policy, and test names.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEgress {
    /// The policy's rules (none: the sandbox reaches nothing).
    #[serde(flatten)]
    pub rules: EgressRules,
    /// For tests: `NAME=ADDR[,ADDR]`, names under `.test` only.
    #[serde(default)]
    pub test_resolve: Vec<String>,
    /// Secrets by placeholder: the sandbox sees each name set to a
    /// placeholder; the egress point sends the value in its place to the
    /// secret's hosts only. Values are never given back.
    #[serde(default)]
    pub secrets: Vec<CreateSecret>,
}

/// A secret in a create. Its value is kept by Berth (mode 0600), never in
/// the sandbox, its state, its snapshots or a reply.
#[derive(Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSecret {
    /// The environment variable that holds the placeholder in the sandbox.
    pub name: String,
    /// The value sent in the placeholder's place.
    pub value: String,
    /// `HOST[:PORT]` the value is sent to (each allowed by the policy).
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for CreateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A secret of a sandbox, as reported: never its value.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressSecret {
    /// The variable holding the placeholder.
    pub name: String,
    /// The hosts its value is sent to.
    pub hosts: Vec<String>,
    /// What the sandbox holds instead of the value.
    pub placeholder: String,
}

/// One connection a sandbox asked for.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressConnection {
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The host asked for (a name or an IP literal).
    pub host: String,
    /// The port asked for.
    pub port: u16,
    /// Bytes from the sandbox (counted as they pass).
    pub bytes_out: u64,
    /// Bytes to the sandbox (counted as they pass).
    pub bytes_in: u64,
    /// `allowed` or `denied`.
    pub verdict: String,
    /// The allow rule, when allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why it was denied, naming the rule (or the missing one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The secrets whose values were sent on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// `GET /v1/sandboxes/{name}/egress`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressReport {
    /// The policy in force (kept in the sandbox's state).
    pub policy: EgressRules,
    /// The sandbox's secrets (names, hosts, placeholders).
    #[serde(default)]
    pub secrets: Vec<EgressSecret>,
    /// Whether its egress point runs (it starts with the sandbox).
    pub running: bool,
    /// The newest connections, oldest first (a bounded log).
    pub connections: Vec<EgressConnection>,
    /// How many older connections the log dropped.
    pub dropped: u64,
    /// Connections open now.
    pub open: u64,
    /// The egress point's resident memory, in bytes.
    pub rss_bytes: u64,
}

impl EgressRules {
    /// The policy these rules write, or what is wrong with one of them.
    pub fn policy(&self) -> Result<berth::egress::EgressPolicy, String> {
        fn each<T: std::str::FromStr<Err = berth::egress::RuleError>>(
            field: &str,
            rules: &[String],
        ) -> Result<Vec<T>, String> {
            rules
                .iter()
                .map(|r| r.parse().map_err(|e| format!("`{field}`: {e}")))
                .collect()
        }
        Ok(berth::egress::EgressPolicy {
            allow_hosts: each("allow_hosts", &self.allow_hosts)?,
            deny_hosts: each("deny_hosts", &self.deny_hosts)?,
            allow_cidrs: each("allow_cidrs", &self.allow_cidrs)?,
        })
    }

    /// The rules of `policy`.
    pub fn of(policy: &berth::egress::EgressPolicy) -> Self {
        let text = |v: &[_]| -> Vec<String> {
            v.iter()
                .map(|r: &berth::egress::HostRule| r.to_string())
                .collect()
        };
        EgressRules {
            allow_hosts: text(&policy.allow_hosts),
            deny_hosts: text(&policy.deny_hosts),
            allow_cidrs: policy.allow_cidrs.iter().map(ToString::to_string).collect(),
        }
    }
}

impl CreateEgress {
    /// The library's settings, or what is wrong.
    pub fn settings(&self) -> Result<berth::egress::EgressSettings, String> {
        let mut settings = berth::egress::EgressSettings {
            policy: self.rules.policy()?,
            test_resolve: self
                .test_resolve
                .iter()
                .map(|r| r.parse().map_err(|e| format!("`test_resolve`: {e}")))
                .collect::<Result<_, _>>()?,
            ..Default::default()
        };
        for secret in &self.secrets {
            settings
                .add_secret(&secret.name, &secret.value, &secret.hosts)
                .map_err(|e| format!("`secrets`: {e}"))?;
        }
        settings
            .check_secrets()
            .map_err(|e| format!("`secrets`: {e}"))?;
        Ok(settings)
    }
}

impl EgressSecret {
    /// The reported form of a secret's binding.
    pub fn of(binding: &berth::egress::SecretBinding) -> Self {
        EgressSecret {
            name: binding.name.clone(),
            hosts: binding.hosts.iter().map(ToString::to_string).collect(),
            placeholder: binding.placeholder.clone(),
        }
    }
}

impl EgressConnection {
    /// The wire form of a logged connection.
    pub fn of(c: &berth::egress::Connection) -> Self {
        let (verdict, rule, reason) = match &c.verdict {
            berth::egress::Verdict::Allowed { rule } => ("allowed", Some(rule.clone()), None),
            berth::egress::Verdict::Denied { reason } => ("denied", None, Some(reason.clone())),
        };
        EgressConnection {
            at_ms: c.at_ms,
            host: c.host.clone(),
            port: c.port,
            bytes_out: c.bytes_out,
            bytes_in: c.bytes_in,
            verdict: verdict.to_string(),
            rule,
            reason,
            secrets: c.secrets.clone(),
        }
    }
}
