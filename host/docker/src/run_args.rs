//! Translation of a documented subset of `docker run` arguments
//! (`additional_run_args`) into the API's container and host config.
//! Anything outside the subset is refused at create, by name.

use std::collections::{BTreeMap, HashMap};

use bollard::models::ResourcesUlimits;

use super::BACKEND;
use berth::backend::BackendError;

/// The supported arguments, for error messages and docs.
pub const SUPPORTED: &[&str] = &[
    "--cap-add",
    "--cap-drop",
    "--security-opt",
    "--pids-limit",
    "--read-only",
    "--tmpfs",
    "--user",
    "--label",
    "-e/--env",
    "--ulimit",
    "--shm-size",
    "--add-host",
    "--workdir",
];

/// What the arguments asked for.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RunArgs {
    /// Capabilities to add back.
    pub cap_add: Vec<String>,
    /// Capabilities to drop (replaces the default `ALL` when given).
    pub cap_drop: Option<Vec<String>>,
    /// Security options (added to `no-new-privileges` unless it is set
    /// explicitly, e.g. `no-new-privileges=false`).
    pub security_opt: Vec<String>,
    /// Pids limit.
    pub pids_limit: Option<i64>,
    /// Read-only root file system.
    pub read_only: bool,
    /// tmpfs mounts: path → options.
    pub tmpfs: HashMap<String, String>,
    /// User.
    pub user: Option<String>,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// Extra environment.
    pub env: BTreeMap<String, String>,
    /// Ulimits.
    pub ulimits: Vec<ResourcesUlimits>,
    /// /dev/shm size in bytes.
    pub shm_size: Option<i64>,
    /// Extra /etc/hosts lines (`host:ip`).
    pub extra_hosts: Vec<String>,
    /// Working directory of the keep-alive process.
    pub workdir: Option<String>,
}

fn config_error(message: String) -> BackendError {
    BackendError::Config {
        backend: BACKEND,
        message,
    }
}

fn parse_size(s: &str) -> Option<i64> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = match t.chars().last()? {
        'b' => (&t[..t.len() - 1], 1),
        'k' => (&t[..t.len() - 1], 1 << 10),
        'm' => (&t[..t.len() - 1], 1 << 20),
        'g' => (&t[..t.len() - 1], 1 << 30),
        _ => (t.as_str(), 1),
    };
    num.parse::<i64>().ok()?.checked_mul(mult)
}

/// Parses `args` (as given to `docker run`, split into words).
// Kept as one function: one match arm per accepted `docker run` flag; its
// length is the list of flags.
pub fn parse(args: &[String]) -> Result<RunArgs, BackendError> {
    let mut out = RunArgs::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        const KNOWN: &[&str] = &[
            "--cap-add",
            "--cap-drop",
            "--security-opt",
            "--pids-limit",
            "--read-only",
            "--tmpfs",
            "--user",
            "-u",
            "--label",
            "-l",
            "--env",
            "-e",
            "--ulimit",
            "--shm-size",
            "--add-host",
            "--workdir",
            "-w",
        ];
        if !KNOWN.contains(&flag.as_str()) {
            return Err(config_error(format!(
                "unsupported run argument {flag:?}; supported: {}",
                SUPPORTED.join(", ")
            )));
        }
        let takes_value = !matches!(flag.as_str(), "--read-only");
        let value = if takes_value {
            match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| config_error(format!("run argument {flag} needs a value")))?
                }
            }
        } else {
            if inline.is_some() && inline.as_deref() != Some("true") {
                return Err(config_error(format!(
                    "run argument {arg}: use --read-only without a value"
                )));
            }
            String::new()
        };
        let bad = |what: &str| config_error(format!("run argument {flag} {value:?}: {what}"));
        match flag.as_str() {
            "--cap-add" => out.cap_add.push(value),
            "--cap-drop" => out.cap_drop.get_or_insert_with(Vec::new).push(value),
            "--security-opt" => out.security_opt.push(value),
            "--pids-limit" => {
                out.pids_limit = Some(value.parse().map_err(|_| bad("not a number"))?)
            }
            "--read-only" => out.read_only = true,
            "--tmpfs" => {
                let (path, opts) = value.split_once(':').unwrap_or((value.as_str(), ""));
                if !path.starts_with('/') {
                    return Err(bad("tmpfs path must be absolute"));
                }
                out.tmpfs.insert(path.to_string(), opts.to_string());
            }
            "--user" | "-u" => out.user = Some(value),
            "--label" | "-l" => {
                let (k, v) = value.split_once('=').unwrap_or((value.as_str(), ""));
                if k.starts_with("berth.") {
                    return Err(bad("labels starting with berth. are reserved"));
                }
                out.labels.insert(k.to_string(), v.to_string());
            }
            "--env" | "-e" => {
                let (k, v) = value
                    .split_once('=')
                    .ok_or_else(|| bad("expected KEY=VALUE"))?;
                out.env.insert(k.to_string(), v.to_string());
            }
            "--ulimit" => {
                let (name, limits) = value
                    .split_once('=')
                    .ok_or_else(|| bad("expected NAME=SOFT[:HARD]"))?;
                let (soft, hard) = limits.split_once(':').unwrap_or((limits, limits));
                out.ulimits.push(ResourcesUlimits {
                    name: Some(name.to_string()),
                    soft: Some(
                        soft.parse()
                            .map_err(|_| bad("soft limit is not a number"))?,
                    ),
                    hard: Some(
                        hard.parse()
                            .map_err(|_| bad("hard limit is not a number"))?,
                    ),
                });
            }
            "--shm-size" => {
                out.shm_size = Some(parse_size(&value).ok_or_else(|| bad("not a size like 64m"))?)
            }
            "--add-host" => {
                if !value.contains(':') {
                    return Err(bad("expected HOST:IP"));
                }
                out.extra_hosts.push(value);
            }
            "--workdir" | "-w" => out.workdir = Some(value),
            _ => unreachable!("checked against KNOWN above"),
        }
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn translates_the_subset() {
        let a = parse(&words(
            "--cap-add NET_BIND_SERVICE --pids-limit=64 --read-only --tmpfs /run:size=64m -e A=1 --env=B=2 \
             --ulimit nofile=1024:2048 --shm-size 64m --add-host db:10.0.0.2 --user 1000 --label team=x --workdir /w \
             --security-opt seccomp=unconfined",
        ))
        .unwrap();
        assert_eq!(a.cap_add, vec!["NET_BIND_SERVICE"]);
        assert_eq!(a.pids_limit, Some(64));
        assert!(a.read_only);
        assert_eq!(a.tmpfs.get("/run").map(String::as_str), Some("size=64m"));
        assert_eq!(a.env.get("B").map(String::as_str), Some("2"));
        assert_eq!(a.ulimits[0].hard, Some(2048));
        assert_eq!(a.shm_size, Some(64 << 20));
        assert_eq!(a.user.as_deref(), Some("1000"));
        assert_eq!(a.workdir.as_deref(), Some("/w"));
    }

    #[test]
    fn refuses_the_rest_by_name() {
        let e = parse(&words("--privileged")).unwrap_err().to_string();
        assert!(e.contains("--privileged") && e.contains("supported"), "{e}");
        let e = parse(&words("-v /:/host")).unwrap_err().to_string();
        assert!(e.contains("-v"), "{e}");
        let e = parse(&words("--pids-limit")).unwrap_err().to_string();
        assert!(e.contains("needs a value"), "{e}");
        assert!(parse(&words("--label berth.owned=false")).is_err());
    }
}
