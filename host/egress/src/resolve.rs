//! Test names: a sandbox's override of the host's resolver, for names
//! under the reserved `.test` domain only (RFC 6761), so a test can point
//! `*.pkg.test` at a server it started on loopback or in a namespace it
//! made, and nothing can redirect a real name.

use std::fmt;
use std::net::IpAddr;

use crate::rules::{HostRule, RuleError};

/// `NAME=ADDRESS[,ADDRESS…]`: names a host rule matches (under `.test`)
/// resolve to these addresses instead of through the host's resolver
/// (`berth create --test-resolve '*.pkg.test=127.0.0.1'`). The addresses
/// still pass the rebinding guard: loopback needs an `--allow-cidr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResolve {
    /// The names.
    pub names: HostRule,
    /// Their addresses.
    pub addresses: Vec<IpAddr>,
}

const WHAT: &str = "test resolution";

impl TestResolve {
    /// Parses `NAME=ADDRESS[,ADDRESS…]`; refuses a name outside `.test`.
    pub fn parse(text: &str) -> Result<Self, RuleError> {
        let bad = |why: String| RuleError {
            text: text.to_string(),
            what: WHAT,
            why,
        };
        let (name, addresses) = text
            .split_once('=')
            .ok_or_else(|| bad("write NAME=ADDRESS, as in *.pkg.test=127.0.0.1".into()))?;
        let names = HostRule::parse(name)?;
        if names.port().is_some() {
            return Err(bad("a test name has no port".into()));
        }
        if !names.is_under("test") {
            return Err(bad(format!(
                "{name:?} is not under .test: only the reserved .test names (RFC 6761) may be \
                 resolved by a test's table; every other name resolves through the host's resolver"
            )));
        }
        let addresses = addresses
            .split(',')
            .map(|a| {
                a.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| bad(format!("{:?} is not an IP address", a.trim())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TestResolve { names, addresses })
    }
}

impl fmt::Display for TestResolve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=", self.names)?;
        for (n, a) in self.addresses.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl serde::Serialize for TestResolve {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TestResolve {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        TestResolve::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for TestResolve {
    type Err = RuleError;
    fn from_str(text: &str) -> Result<Self, RuleError> {
        TestResolve::parse(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_test_names_may_be_resolved_by_a_table() {
        let r = TestResolve::parse("*.pkg.test=127.0.0.1,::1").unwrap();
        assert_eq!(r.to_string(), "*.pkg.test=127.0.0.1,::1");
        assert!(TestResolve::parse("api.test=10.0.0.1").is_ok());
        for (text, says) in [
            ("example.com=127.0.0.1", "not under .test"),
            ("*.test.example.com=127.0.0.1", "not under .test"),
            ("a.test", "NAME=ADDRESS"),
            ("a.test=nope", "not an IP"),
            ("a.test:443=127.0.0.1", "no port"),
        ] {
            let err = TestResolve::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }
}
