//! One rule of a policy, as a user writes it: `host`, `*.domain`, either
//! with `:port`; `10.9.0.0/24` or `[fd00::/8]`, either with `:port`.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// Why a rule (or a name asked for) is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a valid {what}: {why}")]
pub struct RuleError {
    /// What was given.
    pub text: String,
    /// What it was meant to be ("host rule", "CIDR rule", "host name").
    pub what: &'static str,
    /// What is wrong with it.
    pub why: String,
}

fn bad(text: &str, what: &'static str, why: impl Into<String>) -> RuleError {
    RuleError {
        text: text.to_string(),
        what,
        why: why.into(),
    }
}

/// A DNS name in the form rules compare: lowercase ASCII, no trailing dot,
/// labels of letters, digits, `-` and `_` (1–63 bytes, no `-` at either
/// end), 253 bytes at most. Names in other scripts are given in their
/// `xn--` form.
pub(crate) fn normalize_name(text: &str) -> Result<String, RuleError> {
    let name = text.strip_suffix('.').unwrap_or(text).to_ascii_lowercase();
    let refuse = |why: &str| Err(bad(text, "host name", why));
    if name.is_empty() {
        return refuse("it is empty");
    }
    if name.len() > 253 {
        return refuse("it is longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return refuse("each dot-separated label holds 1 to 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return refuse("a label holds only letters, digits, `-` and `_` (give other scripts in their xn-- form)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return refuse("a label neither starts nor ends with `-`");
        }
    }
    if name
        .rsplit('.')
        .next()
        .is_some_and(|top| top.bytes().all(|b| b.is_ascii_digit()))
    {
        return refuse("its last label is all digits, as an IP address's would be");
    }
    Ok(name)
}

/// Splits a trailing `:port` off (1–65535). `None` when there is none.
fn split_port<'a>(
    text: &'a str,
    body: &'a str,
    what: &'static str,
) -> Result<(&'a str, Option<u16>), RuleError> {
    match body.rsplit_once(':') {
        None => Ok((body, None)),
        Some((left, port)) => match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok((left, Some(p))),
            _ => Err(bad(
                text,
                what,
                "the port after `:` is a number from 1 to 65535",
            )),
        },
    }
}

/// A host rule: an exact name (`api.example.test`) or every name under a
/// domain (`*.example.test`, which does not match `example.test` itself),
/// on one port or, without one, on the policy's default ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostRule {
    name: String,
    subdomains: bool,
    port: Option<u16>,
}

impl HostRule {
    /// Parses `host`, `*.domain`, `host:port` or `*.domain:port`.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        const WHAT: &str = "host rule";
        let trimmed = text.trim();
        let (body, port) = split_port(text, trimmed, WHAT)?;
        if body.parse::<IpAddr>().is_ok() || body.starts_with('[') {
            return Err(bad(
                text,
                WHAT,
                "it is an IP address; allow addresses with a CIDR rule (--allow-cidr)",
            ));
        }
        let (subdomains, name) = match body.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, body),
        };
        if name.contains('*') {
            return Err(bad(
                text,
                WHAT,
                "`*` stands only as the whole first label, as in *.example.test",
            ));
        }
        let name = normalize_name(name).map_err(|e| bad(text, WHAT, e.why))?;
        Ok(HostRule {
            name,
            subdomains,
            port,
        })
    }

    /// Whether this rule names `host` (normalized), whatever the port.
    pub(crate) fn names(&self, host: &str) -> bool {
        if self.subdomains {
            host.len() > self.name.len() + 1
                && host.ends_with(&self.name)
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }

    /// The name (for `*.domain`, the domain).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The port this rule is for; `None`: the policy's default ports.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// Whether every name this rule matches lies under `domain` (a
    /// normalized name, without its leading dot).
    pub fn is_under(&self, domain: &str) -> bool {
        self.name.len() > domain.len()
            && self.name.ends_with(domain)
            && self.name.as_bytes()[self.name.len() - domain.len() - 1] == b'.'
            || (self.subdomains && self.name == domain)
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.subdomains {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// An address range a sandbox may reach by IP literal, or into which an
/// allowed name may resolve even where the range is loopback, private,
/// link-local or metadata: `10.9.0.0/24`, `[fd00::/8]`, either with
/// `:port` (without: the policy's default ports). A bare address is a
/// range of one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CidrRule {
    net: IpNet,
    port: Option<u16>,
}

impl CidrRule {
    /// Parses `10.9.0.0/24`, `10.9.0.7`, `10.9.0.0/24:5432`, `[fd00::/8]`
    /// or `[fd00::/8]:443`.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        const WHAT: &str = "CIDR rule";
        let trimmed = text.trim();
        let (body, port) = if let Some(rest) = trimmed.strip_prefix('[') {
            let (inside, after) = rest
                .split_once(']')
                .ok_or_else(|| bad(text, WHAT, "a `[` without its `]`"))?;
            match after {
                "" => (inside, None),
                _ => match after.strip_prefix(':').map(str::parse::<u16>) {
                    Some(Ok(p)) if p > 0 => (inside, Some(p)),
                    _ => {
                        return Err(bad(
                            text,
                            WHAT,
                            "after `]` comes nothing or `:port` (1 to 65535)",
                        ))
                    }
                },
            }
        } else if trimmed.matches(':').count() > 1 {
            return Err(bad(
                text,
                WHAT,
                "an IPv6 range is written in brackets, as in [fd00::/8] or [fd00::/8]:443",
            ));
        } else {
            split_port(text, trimmed, WHAT)?
        };
        let net = match body.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => match body.parse::<IpAddr>() {
                Ok(ip) => IpNet::from(ip),
                Err(_) => {
                    return Err(bad(
                        text,
                        WHAT,
                        "expected an address range such as 10.9.0.0/24 or [fd00::/8]",
                    ))
                }
            },
        };
        if net != net.trunc() {
            return Err(bad(
                text,
                WHAT,
                format!(
                    "bits are set past the prefix; did you mean {}?",
                    net.trunc()
                ),
            ));
        }
        Ok(CidrRule { net, port })
    }

    /// Whether the range holds `ip` (an IPv4-mapped IPv6 address counts as
    /// its IPv4 address).
    pub(crate) fn holds(&self, ip: IpAddr) -> bool {
        self.net.contains(&crate::address::canonical(ip))
    }

    /// The port this rule is for; `None`: the policy's default ports.
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

impl fmt::Display for CidrRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.net, self.port) {
            (IpNet::V6(net), Some(port)) => write!(f, "[{net}]:{port}"),
            (IpNet::V6(net), None) => write!(f, "[{net}]"),
            (net, Some(port)) => write!(f, "{net}:{port}"),
            (net, None) => write!(f, "{net}"),
        }
    }
}

/// Rules are kept in a sandbox's state as the text a user writes.
macro_rules! text_serde {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                <$ty>::parse(&text).map_err(serde::de::Error::custom)
            }
        }
        impl std::str::FromStr for $ty {
            type Err = RuleError;
            fn from_str(text: &str) -> Result<Self, RuleError> {
                <$ty>::parse(text)
            }
        }
    };
}
text_serde!(HostRule);
text_serde!(CidrRule);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_users_write_them() {
        for (text, shown) in [
            ("API.Example.Test.", "api.example.test"),
            ("*.git.example.test:443", "*.git.example.test:443"),
            ("pkg_mirror.test:8080", "pkg_mirror.test:8080"),
        ] {
            assert_eq!(HostRule::parse(text).unwrap().to_string(), shown);
        }
        for (text, shown) in [
            ("10.9.0.0/24", "10.9.0.0/24"),
            ("10.9.0.7:5432", "10.9.0.7/32:5432"),
            ("[fd00::/8]:443", "[fd00::/8]:443"),
            ("[::1]", "[::1/128]"),
        ] {
            assert_eq!(CidrRule::parse(text).unwrap().to_string(), shown);
        }
    }

    #[test]
    fn malformed_rules_say_what_is_wrong() {
        for (text, says) in [
            ("", "empty"),
            ("10.0.0.1", "--allow-cidr"),
            ("[::1]:443", "--allow-cidr"),
            ("a.*.test", "first label"),
            ("*example.test", "first label"),
            ("ex ample.test", "letters, digits"),
            ("-a.test", "neither starts"),
            ("a.test:0", "1 to 65535"),
            ("a.test:99999", "1 to 65535"),
            ("a..test", "1 to 63"),
            ("host.123", "all digits"),
        ] {
            let err = HostRule::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
        for (text, says) in [
            ("fd00::/8", "brackets"),
            ("10.9.0.1/24", "did you mean 10.9.0.0/24"),
            ("10.9.0.0/33", "address range"),
            ("[fd00::/8", "without its `]`"),
            ("[fd00::/8]x", "nothing or `:port`"),
        ] {
            let err = CidrRule::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
