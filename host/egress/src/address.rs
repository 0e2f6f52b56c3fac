//! The address classes a name may not resolve into unless a CIDR rule
//! allows them: a sandbox that may reach `api.example.test` must not reach
//! the host's loopback services or the cloud's metadata endpoint because
//! that name (or one it redirects to) resolves there.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What an address is, for the rebinding guard. Only
/// [`AddressClass::Public`] is reached without an `--allow-cidr` rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// A globally routed unicast address.
    Public,
    /// `127.0.0.0/8`, `::1`: the host itself.
    Loopback,
    /// `0.0.0.0/8`, `::`: "this host" on some stacks.
    Unspecified,
    /// `10/8`, `172.16/12`, `192.168/16`, `fc00::/7`: private networks.
    Private,
    /// `100.64.0.0/10`: carrier-grade NAT, shared address space.
    SharedNat,
    /// `169.254.0.0/16` but the metadata address, `fe80::/10`.
    LinkLocal,
    /// `169.254.169.254`, `fd00:ec2::254`: cloud instance metadata.
    Metadata,
    /// Multicast and broadcast.
    Multicast,
    /// Documentation, benchmarking, reserved and other special-purpose
    /// ranges that no public service uses.
    Reserved,
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AddressClass::Public => "public",
            AddressClass::Loopback => "loopback",
            AddressClass::Unspecified => "unspecified",
            AddressClass::Private => "private",
            AddressClass::SharedNat => "shared (carrier-grade NAT)",
            AddressClass::LinkLocal => "link-local",
            AddressClass::Metadata => "cloud metadata",
            AddressClass::Multicast => "multicast or broadcast",
            AddressClass::Reserved => "reserved",
        })
    }
}

/// The address an IPv6 address stands for when it embeds an IPv4 one
/// (IPv4-mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`); others as
/// they are. Connecting to the embedded form reaches the IPv4 address.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let o = v6.octets();
                return IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

impl AddressClass {
    /// The class of `ip` (of the IPv4 address an IPv6 one embeds).
    pub fn of(ip: IpAddr) -> AddressClass {
        match canonical(ip) {
            IpAddr::V4(v4) => v4_class(v4),
            IpAddr::V6(v6) => v6_class(v6),
        }
    }
}

fn v4_class(ip: Ipv4Addr) -> AddressClass {
    let [a, b, c, _] = ip.octets();
    match () {
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => AddressClass::Metadata,
        _ if a == 127 => AddressClass::Loopback,
        _ if a == 0 => AddressClass::Unspecified,
        _ if a == 10 || (a == 172 && (16..32).contains(&b)) || (a == 192 && b == 168) => {
            AddressClass::Private
        }
        _ if a == 100 && (64..128).contains(&b) => AddressClass::SharedNat,
        _ if a == 169 && b == 254 => AddressClass::LinkLocal,
        _ if a >= 224 => {
            if a < 240 || ip == Ipv4Addr::BROADCAST {
                AddressClass::Multicast
            } else {
                AddressClass::Reserved
            }
        }
        // 192.0.0/24 (protocol assignments), 192.0.2/24, 198.51.100/24,
        // 203.0.113/24 (documentation), 198.18/15 (benchmarking).
        _ if (a == 192 && b == 0 && (c == 0 || c == 2))
            || (a == 198 && b == 51 && c == 100)
            || (a == 203 && b == 0 && c == 113)
            || (a == 198 && (b & 0xfe) == 18) =>
        {
            AddressClass::Reserved
        }
        _ => AddressClass::Public,
    }
}

fn v6_class(ip: Ipv6Addr) -> AddressClass {
    let s = ip.segments();
    match () {
        _ if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => AddressClass::Metadata,
        _ if ip == Ipv6Addr::LOCALHOST => AddressClass::Loopback,
        _ if ip == Ipv6Addr::UNSPECIFIED => AddressClass::Unspecified,
        _ if (s[0] & 0xfe00) == 0xfc00 => AddressClass::Private,
        _ if (s[0] & 0xffc0) == 0xfe80 => AddressClass::LinkLocal,
        _ if (s[0] & 0xff00) == 0xff00 => AddressClass::Multicast,
        // Only 2000::/3 is allocated for global unicast; within it,
        // documentation (2001:db8::/32), and the transition forms whose
        // reach depends on relays: 6to4 (2002::/16), Teredo (2001::/32).
        _ if (s[0] & 0xe000) != 0x2000
            || (s[0] == 0x2001 && s[1] == 0xdb8)
            || s[0] == 0x2002
            || (s[0] == 0x2001 && s[1] == 0) =>
        {
            AddressClass::Reserved
        }
        _ => AddressClass::Public,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_addresses_a_rebinding_attack_aims_at_are_not_public() {
        for (text, class) in [
            ("127.0.0.1", AddressClass::Loopback),
            ("127.8.9.10", AddressClass::Loopback),
            ("::1", AddressClass::Loopback),
            ("::ffff:127.0.0.1", AddressClass::Loopback),
            ("64:ff9b::7f00:1", AddressClass::Loopback),
            ("0.0.0.0", AddressClass::Unspecified),
            ("::", AddressClass::Unspecified),
            ("169.254.169.254", AddressClass::Metadata),
            ("::ffff:169.254.169.254", AddressClass::Metadata),
            ("fd00:ec2::254", AddressClass::Metadata),
            ("169.254.1.1", AddressClass::LinkLocal),
            ("fe80::1", AddressClass::LinkLocal),
            ("10.1.2.3", AddressClass::Private),
            ("172.16.0.1", AddressClass::Private),
            ("172.31.255.255", AddressClass::Private),
            ("192.168.1.1", AddressClass::Private),
            ("fd12::1", AddressClass::Private),
            ("100.64.0.1", AddressClass::SharedNat),
            ("224.0.0.1", AddressClass::Multicast),
            ("255.255.255.255", AddressClass::Multicast),
            ("ff02::1", AddressClass::Multicast),
            ("240.0.0.1", AddressClass::Reserved),
            ("198.18.0.1", AddressClass::Reserved),
            ("2001:db8::1", AddressClass::Reserved),
            ("2002:7f00:1::", AddressClass::Reserved),
            ("::7f00:1", AddressClass::Reserved),
        ] {
            assert_eq!(AddressClass::of(text.parse().unwrap()), class, "{text}");
        }
        for text in [
            "93.184.215.14",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
        ] {
            assert_eq!(
                AddressClass::of(text.parse().unwrap()),
                AddressClass::Public,
                "{text}"
            );
        }
    }
}
