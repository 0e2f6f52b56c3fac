//! `berth egress NAME`: a sandbox's egress policy and its connection log;
//! with rules, the policy changed while it runs. The flags `berth create`
//! takes to give a sandbox a policy are here too.

use std::process::ExitCode;

use berth::egress::{CidrRule, EgressPolicy, EgressSettings, HostRule, TestResolve, Verdict};
use clap::Args;

use super::*;

/// The rules of an egress policy, as `berth create` and `berth egress`
/// take them.
#[derive(Args, Debug, Default)]
pub struct EgressRules {
    /// Hold the sandbox to an egress policy that allows HOST[:PORT]
    /// (`api.example.com`, `*.example.com:443`; ports 80 and 443 when
    /// none is given). Repeatable. Everything not allowed is denied; tools
    /// that ignore HTTP(S)_PROXY reach nothing.
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    pub allow_hosts: Vec<HostRule>,
    /// Deny HOST[:PORT] whatever allows it. Repeatable.
    #[arg(long = "deny-host", value_name = "HOST[:PORT]")]
    pub deny_hosts: Vec<HostRule>,
    /// Allow IP literals in CIDR[:PORT], and names that resolve into it
    /// even when it is private, loopback or link-local. Repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORT]")]
    pub allow_cidrs: Vec<CidrRule>,
}

impl EgressRules {
    fn is_empty(&self) -> bool {
        self.allow_hosts.is_empty() && self.deny_hosts.is_empty() && self.allow_cidrs.is_empty()
    }

    fn add_to(&self, policy: &mut EgressPolicy) {
        for (list, new) in [
            (&mut policy.allow_hosts, &self.allow_hosts),
            (&mut policy.deny_hosts, &self.deny_hosts),
        ] {
            for rule in new {
                if !list.contains(rule) {
                    list.push(rule.clone());
                }
            }
        }
        for rule in &self.allow_cidrs {
            if !policy.allow_cidrs.contains(rule) {
                policy.allow_cidrs.push(rule.clone());
            }
        }
    }
}

/// `berth create`'s egress flags.
#[derive(Args, Debug, Default)]
pub struct CreateEgressArgs {
    #[command(flatten)]
    rules: EgressRules,
    /// Hold the sandbox to an egress policy even with no rule: it reaches
    /// nothing (rules can be added later with `berth egress`).
    #[arg(long)]
    egress_deny_all: bool,
    /// For tests: names under .test resolve to these addresses on the
    /// host's egress point (`*.pkg.test=127.0.0.1`). Repeatable; refused
    /// for any name outside .test.
    #[arg(long = "test-resolve", value_name = "NAME=ADDR[,ADDR]")]
    test_resolve: Vec<TestResolve>,
    /// A secret kept out of the sandbox: it sees NAME set to a placeholder,
    /// and the egress point puts the value (read from FILE, or from this
    /// process's variable VAR) in its place in the request headers of
    /// HTTPS connections to the hosts of --secret-hosts. Repeatable.
    #[arg(long = "secret", value_name = "NAME=@FILE|NAME=env:VAR")]
    secrets: Vec<String>,
    /// The hosts secret NAME is sent to (each must be allowed by
    /// --allow-host). Repeatable.
    #[arg(long = "secret-hosts", value_name = "NAME=HOST[,HOST]")]
    secret_hosts: Vec<String>,
}

/// `NAME=VALUE` split at its first `=`, or an error naming the flag.
fn name_and_value<'a>(
    flag: &str,
    text: &'a str,
    shape: &str,
) -> anyhow::Result<(&'a str, &'a str)> {
    text.split_once('=')
        .filter(|(name, _)| !name.is_empty())
        .ok_or_else(|| anyhow::anyhow!("{flag} {text:?}: expected {shape}"))
}

/// The value of `--secret NAME=@FILE` or `NAME=env:VAR`.
fn secret_value(name: &str, source: &str) -> anyhow::Result<String> {
    if let Some(path) = source.strip_prefix('@') {
        return std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--secret {name}: reading {path}: {e}"));
    }
    if let Some(var) = source.strip_prefix("env:") {
        return std::env::var(var).map_err(|_| {
            anyhow::anyhow!("--secret {name}: the variable {var} is not set (or not UTF-8)")
        });
    }
    anyhow::bail!(
        "--secret {name}: give the value from a file (--secret {name}=@FILE) or a variable \
         (--secret {name}=env:VAR), not on the command line, where any process can read it"
    )
}

impl CreateEgressArgs {
    /// The settings the flags give; `None` when none asks for a policy.
    pub fn settings(&self) -> anyhow::Result<Option<EgressSettings>> {
        if self.rules.is_empty() && !self.egress_deny_all {
            if !self.secrets.is_empty() {
                anyhow::bail!(
                    "--secret needs an egress policy that allows the secret's hosts: add --allow-host HOST"
                );
            }
            if !self.test_resolve.is_empty() {
                anyhow::bail!(
                    "--test-resolve names addresses for the egress point of a sandbox with a policy: add --allow-host (or --egress-deny-all)"
                );
            }
            return Ok(None);
        }
        let mut policy = EgressPolicy::default();
        self.rules.add_to(&mut policy);
        let mut settings = EgressSettings {
            policy,
            test_resolve: self.test_resolve.clone(),
            ..EgressSettings::default()
        };
        let mut hosts: Vec<(&str, Vec<String>)> = Vec::new();
        for text in &self.secret_hosts {
            let (name, list) = name_and_value("--secret-hosts", text, "NAME=HOST[,HOST]")?;
            let list = list.split(',').map(|h| h.trim().to_string());
            match hosts.iter_mut().find(|(n, _)| *n == name) {
                Some((_, known)) => known.extend(list),
                None => hosts.push((name, list.collect())),
            }
        }
        for text in &self.secrets {
            let (name, source) = name_and_value("--secret", text, "NAME=@FILE or NAME=env:VAR")?;
            let value = secret_value(name, source)?;
            let bound = hosts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, h)| h.clone())
                .unwrap_or_default();
            settings.add_secret(name, &value, &bound)?;
        }
        if let Some((name, _)) = hosts
            .iter()
            .find(|(n, _)| !settings.secrets.iter().any(|s| s.name == *n))
        {
            anyhow::bail!("--secret-hosts {name}=…: no --secret {name} is given");
        }
        Ok(Some(settings))
    }
}

/// `berth egress`.
#[derive(Args)]
pub struct EgressArgs {
    /// Sandbox name.
    name: String,
    /// Rules to add to the policy (in force from the next connection).
    #[command(flatten)]
    rules: EgressRules,
    /// Start from an empty policy (deny everything) before adding rules.
    #[arg(long)]
    reset: bool,
    /// Print the policy and the log as JSON.
    #[arg(long)]
    json: bool,
}

/// `berth egress NAME [RULES…]`.
pub async fn egress(args: EgressArgs) -> anyhow::Result<ExitCode> {
    let home = berth_home()?;
    let _lock = lock(&home, &args.name).await?;
    let saved = load(&home, &args.name)?;
    let Some(egress) = saved.state.egress.clone() else {
        anyhow::bail!(
            "{} has no egress policy: its network is its backend's (none, unless created with -o network=…). \
             A policy is given at create: berth create NAME --allow-host HOST",
            args.name
        );
    };
    let mut sandbox = resume(&home, &saved).await?;
    if args.reset || !args.rules.is_empty() {
        let mut policy = if args.reset {
            EgressPolicy::default()
        } else {
            egress.settings.policy.clone()
        };
        args.rules.add_to(&mut policy);
        sandbox.set_egress_policy(policy).await?;
    }
    let settings = sandbox
        .state()
        .egress
        .map(|e| e.settings)
        .unwrap_or_default();
    let policy = settings.policy;
    let secrets = settings.secrets;
    let status = match sandbox.egress_status().await {
        Ok(status) => status,
        Err(e) => {
            tracing::debug!(error = %e, "no egress status");
            None
        }
    };
    if args.json {
        let value = serde_json::json!({
            "policy": policy,
            "secrets": secrets,
            "running": status.is_some(),
            "connections": status.as_ref().map(|s| s.connections.clone()).unwrap_or_default(),
            "dropped": status.as_ref().map_or(0, |s| s.dropped),
            "open": status.as_ref().map_or(0, |s| s.open),
            "rss_bytes": status.as_ref().map_or(0, |s| s.rss_bytes),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(ExitCode::SUCCESS);
    }
    print_policy(&policy);
    for secret in &secrets {
        let hosts: Vec<String> = secret.hosts.iter().map(ToString::to_string).collect();
        println!(
            "  secret {}: sent to {} in place of {}",
            secret.name,
            hosts.join(", "),
            secret.placeholder
        );
    }
    match status {
        None => println!("\negress point: not running (it starts with the sandbox)"),
        Some(status) => {
            println!(
                "\negress point: pid {}, {} open, {} resident",
                status.pid,
                status.open,
                human_bytes(status.rss_bytes)
            );
            let mut table =
                table::Table::new(&["WHEN", "HOST", "PORT", "OUT", "IN", "VERDICT", "WHY"]);
            for c in &status.connections {
                let (verdict, mut why) = match &c.verdict {
                    Verdict::Allowed { rule } => ("allowed", format!("rule {rule}")),
                    Verdict::Denied { reason } => ("denied", reason.clone()),
                };
                if !c.secrets.is_empty() {
                    why.push_str(&format!("; sent {}", c.secrets.join(", ")));
                }
                table.row(vec![
                    clock(c.at_ms),
                    c.host.clone(),
                    c.port.to_string(),
                    c.bytes_out.to_string(),
                    c.bytes_in.to_string(),
                    verdict.to_string(),
                    why,
                ]);
            }
            println!("{}", table.render().trim_end());
            if status.dropped > 0 {
                println!(
                    "({} older connections dropped from the log)",
                    status.dropped
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_policy(policy: &EgressPolicy) {
    println!("policy: default deny");
    let words = |rules: Vec<String>| {
        if rules.is_empty() {
            "-".to_string()
        } else {
            rules.join(", ")
        }
    };
    println!(
        "  allow hosts: {}",
        words(policy.allow_hosts.iter().map(ToString::to_string).collect())
    );
    println!(
        "  deny hosts:  {}",
        words(policy.deny_hosts.iter().map(ToString::to_string).collect())
    );
    println!(
        "  allow cidrs: {}",
        words(policy.allow_cidrs.iter().map(ToString::to_string).collect())
    );
}

/// `HH:MM:SS` (UTC) of a time in milliseconds since the epoch.
fn clock(at_ms: u64) -> String {
    let secs = at_ms / 1000;
    format!(
        "{:02}:{:02}:{:02}",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}
