//! The policy's promises, over generated, seeded inputs:
//! - default deny: a connection is allowed only when an allow rule names
//!   its host on its port, and then only when no deny rule names it;
//! - `*.d` names what is under `d`, never `d` itself nor `xd`;
//! - names compare without case or trailing dot;
//! - an IP literal is reached only through a CIDR rule;
//! - a resolved address that is not public needs a CIDR rule;
//! - the server name of a real TLS ClientHello is read whole, however it
//!   is cut into reads and records, and no input makes the reader panic.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use berth_egress::{client_hello_sni, AddressClass, CidrRule, Denial, EgressPolicy, HostRule, Sni};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEED: u64 = 0x00e9_7e55;

/// A name from a small alphabet of labels, so rules and queries collide.
fn name(rng: &mut StdRng) -> String {
    const LABELS: &[&str] = &["a", "b", "api", "git", "xa", "test", "pkg"];
    let n = rng.gen_range(1..=3);
    let mut labels: Vec<&str> = (0..n)
        .map(|_| LABELS[rng.gen_range(0..LABELS.len())])
        .collect();
    labels.push("test");
    labels.join(".")
}

fn port(rng: &mut StdRng) -> u16 {
    [80, 443, 8080, 22][rng.gen_range(0..4)]
}

fn rule(rng: &mut StdRng) -> String {
    let mut text = name(rng);
    if rng.gen_bool(0.4) {
        text = format!("*.{text}");
    }
    if rng.gen_bool(0.3) {
        text = format!("{text}:{}", port(rng));
    }
    text
}

/// The reference: what a rule's text says, read the plain way.
fn names(rule: &str, host: &str, port: u16) -> bool {
    let (pattern, rule_port) = match rule.rsplit_once(':') {
        Some((p, n)) => (p, Some(n.parse::<u16>().unwrap())),
        None => (rule, None),
    };
    let port_ok = rule_port.map_or(port == 80 || port == 443, |p| p == port);
    let host_ok = match pattern.strip_prefix("*.") {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => host == pattern,
    };
    host_ok && port_ok
}

fn names_any_port(rule: &str, host: &str) -> bool {
    names(rule.rsplit_once(':').map_or(rule, |(p, _)| p), host, 80)
}

#[test]
fn a_connection_is_allowed_exactly_when_an_allow_rule_and_no_deny_rule_names_it() {
    let mut rng = StdRng::seed_from_u64(SEED);
    for case in 0..3000 {
        let allow: Vec<String> = (0..rng.gen_range(0..4)).map(|_| rule(&mut rng)).collect();
        let deny: Vec<String> = (0..rng.gen_range(0..2)).map(|_| rule(&mut rng)).collect();
        let policy = EgressPolicy {
            allow_hosts: allow.iter().map(|r| r.parse().unwrap()).collect(),
            deny_hosts: deny.iter().map(|r| r.parse().unwrap()).collect(),
            allow_cidrs: vec![],
        };
        let host = name(&mut rng);
        let port = port(&mut rng);
        let denied_by = deny.iter().find(|r| {
            if r.contains(':') {
                names(r, &host, port)
            } else {
                names_any_port(r, &host)
            }
        });
        let allowed_by = allow.iter().find(|r| names(r, &host, port));
        let decision = policy.decide(&host, port);
        let context = format!("case {case}: {host}:{port} allow {allow:?} deny {deny:?}");
        match (denied_by, allowed_by, &decision) {
            (Some(_), _, Err(Denial::DeniedBy { .. })) => {}
            (None, Some(_), Ok(allowed)) => {
                assert!(names(&allowed.rule, &host, port), "{context}: {decision:?}")
            }
            (None, None, Err(Denial::NotListed { .. })) => {
                assert!(!allow.iter().any(|r| names_any_port(r, &host)), "{context}")
            }
            (None, None, Err(Denial::Port { .. })) => {
                assert!(allow.iter().any(|r| names_any_port(r, &host)), "{context}")
            }
            _ => panic!("{context}: {decision:?}"),
        }
        // Case and a trailing dot change nothing.
        let shouted = format!("{}.", host.to_ascii_uppercase());
        let again = policy.decide(&shouted, port);
        assert_eq!(
            again.is_ok(),
            decision.is_ok(),
            "{context}: {again:?} vs {decision:?}"
        );
        // The policy is kept in state as text, and read back the same.
        let json = serde_json::to_string(&policy).unwrap();
        assert_eq!(serde_json::from_str::<EgressPolicy>(&json).unwrap(), policy);
    }
}

#[test]
fn a_wildcard_names_what_is_under_its_domain_and_nothing_else() {
    let rule: HostRule = "*.example.test".parse().unwrap();
    let policy = EgressPolicy {
        allow_hosts: vec![rule],
        ..Default::default()
    };
    for host in ["a.example.test", "a.b.example.test", "A.Example.Test."] {
        assert!(policy.decide(host, 443).is_ok(), "{host}");
    }
    for host in [
        "example.test",
        "xexample.test",
        "example.test.evil.test",
        "a.example.testx",
    ] {
        assert!(
            matches!(policy.decide(host, 443), Err(Denial::NotListed { .. })),
            "{host}"
        );
    }
    let err = policy.decide("a.example.test", 22).unwrap_err().to_string();
    assert_eq!(
        err,
        "a.example.test is allowed on port(s) 80, 443 (by *.example.test), not on 22"
    );
    let err = policy.decide("bad host", 443).unwrap_err().to_string();
    assert!(err.contains("not a host name"), "{err}");
}

fn random_ip(rng: &mut StdRng) -> IpAddr {
    // Half anywhere, half in the ranges that matter.
    let v4 = if rng.gen_bool(0.5) {
        Ipv4Addr::from(rng.gen::<u32>())
    } else {
        let prefixes = [
            [127, 0],
            [10, 1],
            [172, 20],
            [192, 168],
            [169, 254],
            [100, 100],
            [0, 0],
        ];
        let [a, b] = prefixes[rng.gen_range(0..prefixes.len())];
        Ipv4Addr::new(a, b, rng.gen(), rng.gen())
    };
    if rng.gen_bool(0.3) {
        IpAddr::V6(v4.to_ipv6_mapped())
    } else {
        IpAddr::V4(v4)
    }
}

#[test]
fn addresses_that_are_not_public_need_a_cidr_rule() {
    let mut rng = StdRng::seed_from_u64(SEED + 1);
    let cidr: CidrRule = "10.1.0.0/16".parse().unwrap();
    let open = EgressPolicy {
        allow_hosts: vec!["api.test".parse().unwrap()],
        allow_cidrs: vec![cidr.clone()],
        ..Default::default()
    };
    let closed = EgressPolicy {
        allow_hosts: vec!["api.test".parse().unwrap()],
        ..Default::default()
    };
    for _ in 0..5000 {
        let ip = random_ip(&mut rng);
        let class = AddressClass::of(ip);
        let in_cidr = matches!(ip, IpAddr::V4(v4) if v4.octets()[..2] == [10, 1])
            || matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.octets()[..2] == [10, 1]));
        let public = class == AddressClass::Public;
        assert_eq!(
            closed.check_address("api.test", ip, 443).is_ok(),
            public,
            "{ip} ({class})"
        );
        assert_eq!(
            open.check_address("api.test", ip, 443).is_ok(),
            public || in_cidr,
            "{ip} ({class})"
        );
        // An IP literal needs the rule whatever its class.
        assert_eq!(open.decide(&ip.to_string(), 443).is_ok(), in_cidr, "{ip}");
        assert!(closed.decide(&ip.to_string(), 443).is_err(), "{ip}");
        if let IpAddr::V4(v4) = ip {
            let mapped = IpAddr::V6(v4.to_ipv6_mapped());
            assert_eq!(AddressClass::of(mapped), class, "{ip}");
        }
    }
    let err = closed
        .check_address("api.test", "169.254.169.254".parse().unwrap(), 443)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "api.test resolves to 169.254.169.254, a cloud metadata address, which no --allow-cidr rule allows"
    );
}

/// A real ClientHello, as rustls sends it, naming `host`.
fn client_hello(host: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// The same handshake message, carried in records of random sizes.
fn refragment(hello: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let len = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
    let message = &hello[5..5 + len];
    let mut out = Vec::new();
    let mut rest = message;
    while !rest.is_empty() {
        let n = rng.gen_range(1..=rest.len().min(300));
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(n as u16).to_be_bytes());
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    }
    out
}

#[test]
fn the_server_name_of_a_real_client_hello_is_read_however_it_arrives() {
    let mut rng = StdRng::seed_from_u64(SEED + 2);
    for case in 0..300 {
        let host = name(&mut rng);
        let hello = client_hello(&host);
        assert_eq!(
            client_hello_sni(&hello),
            Sni::Name(host.clone()),
            "case {case}"
        );
        let cut = rng.gen_range(0..hello.len());
        assert_eq!(
            client_hello_sni(&hello[..cut]),
            Sni::Incomplete,
            "case {case}, cut {cut}"
        );
        let fragmented = refragment(&hello, &mut rng);
        assert_eq!(
            client_hello_sni(&fragmented),
            Sni::Name(host.clone()),
            "case {case}"
        );
        // Damage anywhere never panics; what it reads is one of the four.
        let mut damaged = fragmented.clone();
        for _ in 0..rng.gen_range(1..8) {
            let i = rng.gen_range(0..damaged.len());
            damaged[i] = rng.gen();
        }
        let _ = client_hello_sni(&damaged);
        let garbage: Vec<u8> = (0..rng.gen_range(0..4096)).map(|_| rng.gen()).collect();
        let _ = client_hello_sni(&garbage);
    }
    assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n"), Sni::NotTls);
    // A hello that never ends is refused, not waited for forever.
    let mut endless = Vec::new();
    endless.extend_from_slice(&[22, 3, 1, 0x40, 0x00, 1, 0xff, 0xff, 0xff]);
    assert_eq!(client_hello_sni(&endless), Sni::NotTls);
}
