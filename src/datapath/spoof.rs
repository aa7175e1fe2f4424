//! Port security by address (`allowed_ips`): whether a frame's source address is one its port
//! may use, read from the switch's copy of the frame's front. Checked: an IPv4 packet's source
//! (0.0.0.0 only for a DHCP request), an ARP packet's sender address (0.0.0.0 for a probe), an
//! IPv6 packet's source (the unspecified address, or the link-local address the frame's own MAC
//! makes, besides the allowed prefixes) and a neighbour advertisement's target (what a spoofer
//! would claim). Frames that are not IP or ARP claim no address and pass. Pure.
#![forbid(unsafe_code)]

use crate::config::ips::IpPrefix;
use crate::wire::{ethertype, protocol};

/// What the check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Allowed,
    Spoofed,
    /// The front must hold this many bytes to tell (the frame is that long).
    Deeper(usize),
}

const ICMPV6_NA: u8 = 136;
const DHCP_SERVER_PORT: u16 = 67;

/// Checks the frame whose front is `b` and whose length is `len` against `ips`.
pub fn check(ips: &[IpPrefix], b: &[u8], len: usize) -> Source {
    match check_inner(ips, b) {
        Ok(s) => s,
        Err(need) if need <= len => Source::Deeper(need),
        // Shorter than the headers it claims: nothing to vouch for its source.
        Err(_) => Source::Spoofed,
    }
}

/// `Err(n)`: `n` bytes are needed.
fn check_inner(ips: &[IpPrefix], b: &[u8]) -> Result<Source, usize> {
    let get = |o: usize, n: usize| b.get(o..o + n).ok_or(o + n);
    let be16 = |o: usize| get(o, 2).map(|x| u16::from_be_bytes([x[0], x[1]]));
    let mut at = 12;
    let mut ty = be16(at)?;
    for _ in 0..2 {
        if ty != ethertype::VLAN && ty != ethertype::QINQ {
            break;
        }
        at += 4;
        ty = be16(at)?;
    }
    let l3 = at + 2;
    let ok = |yes: bool| if yes { Source::Allowed } else { Source::Spoofed };
    let v4 = |a: &[u8]| {
        let a = [a[0], a[1], a[2], a[3]];
        ips.iter().any(|p| p.contains4(a))
    };
    match ty {
        ethertype::IPV4 => {
            let src = get(l3 + 12, 4)?;
            if v4(src) {
                return Ok(Source::Allowed);
            }
            if src != [0; 4] || get(l3 + 9, 1)?[0] != protocol::UDP {
                return Ok(Source::Spoofed);
            }
            // 0.0.0.0: a DHCP client's request before it has an address.
            let ihl = (get(l3, 1)?[0] & 0xf) as usize * 4;
            Ok(ok(be16(l3 + ihl + 2)? == DHCP_SERVER_PORT))
        }
        ethertype::ARP => {
            let spa = get(l3 + 14, 4)?;
            Ok(ok(v4(spa) || spa == [0; 4]))
        }
        ethertype::IPV6 => {
            let own = link_local(get(6, 6)?);
            let v6 = |a: &[u8]| {
                let a: [u8; 16] = a.try_into().unwrap();
                a == own || ips.iter().any(|p| p.contains6(&a))
            };
            let src = get(l3 + 8, 16)?;
            if !(v6(src) || src == [0; 16]) {
                return Ok(Source::Spoofed);
            }
            // A neighbour advertisement's target, past hop-by-hop, routing and destination
            // options headers (a fragmented one is ignored by its receivers: RFC 6980).
            let (mut nh, mut at) = (get(l3 + 6, 1)?[0], l3 + 40);
            for _ in 0..4 {
                if !matches!(nh, 0 | 43 | 60) {
                    break;
                }
                let h = get(at, 2)?;
                nh = h[0];
                at += (h[1] as usize + 1) * 8;
            }
            if nh == protocol::ICMPV6 && get(at, 1)?[0] == ICMPV6_NA {
                return Ok(ok(v6(get(at + 8, 16)?)));
            }
            Ok(Source::Allowed)
        }
        _ => Ok(Source::Allowed),
    }
}

/// The link-local address a MAC makes (EUI-64, RFC 4291 appendix A).
fn link_local(mac: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xfe;
    a[1] = 0x80;
    a[8..11].copy_from_slice(&[mac[0] ^ 2, mac[1], mac[2]]);
    a[11..13].copy_from_slice(&[0xff, 0xfe]);
    a[13..16].copy_from_slice(&mac[3..6]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&MAC);
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    fn ipv4(src: [u8; 4], proto: u8, dport: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, proto, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&[10, 0, 0, 99, 0, 68]);
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 4]);
        eth(ethertype::IPV4, &p)
    }

    fn arp(spa: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0, 1, 8, 0, 6, 4, 0, 2];
        p.extend_from_slice(&MAC);
        p.extend_from_slice(&spa);
        p.extend_from_slice(&[0; 10]);
        eth(ethertype::ARP, &p)
    }

    fn ipv6(src: [u8; 16], icmp: Option<(u8, [u8; 16])>) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 32, if icmp.is_some() { 58 } else { 17 }, 255];
        p.extend_from_slice(&src);
        p.extend_from_slice(&[0xff; 16]);
        let (ty, target) = icmp.unwrap_or((0, [0; 16]));
        p.extend_from_slice(&[ty, 0, 0, 0, 0, 0, 0, 0]);
        p.extend_from_slice(&target);
        eth(ethertype::IPV6, &p)
    }

    fn ips() -> Vec<IpPrefix> {
        ["10.0.0.5", "fd00::/64"].iter().map(|s| IpPrefix::parse(s).unwrap()).collect()
    }

    fn at(f: &[u8]) -> Source {
        check(&ips(), f, f.len())
    }

    #[test]
    fn ipv4_and_arp_sources() {
        assert_eq!(at(&ipv4([10, 0, 0, 5], protocol::TCP, 80)), Source::Allowed);
        assert_eq!(at(&ipv4([10, 0, 0, 6], protocol::TCP, 80)), Source::Spoofed);
        assert_eq!(at(&ipv4([0; 4], protocol::UDP, 67)), Source::Allowed, "DHCP before an address");
        assert_eq!(at(&ipv4([0; 4], protocol::UDP, 53)), Source::Spoofed);
        assert_eq!(at(&arp([10, 0, 0, 5])), Source::Allowed);
        assert_eq!(at(&arp([10, 0, 0, 1])), Source::Spoofed, "claiming the gateway");
        assert_eq!(at(&arp([0; 4])), Source::Allowed, "a probe");
        let mut tagged = ipv4([10, 0, 0, 6], protocol::TCP, 80);
        tagged.splice(12..12, [0x81, 0, 0, 10]);
        assert_eq!(at(&tagged), Source::Spoofed, "behind a VLAN tag");
        assert_eq!(at(&eth(0x88cc, &[0; 30])), Source::Allowed, "LLDP claims no address");
    }

    #[test]
    fn ipv6_sources_and_neighbour_advertisements() {
        let mut ok = [0u8; 16];
        ok[0] = 0xfd;
        ok[15] = 9;
        let mut other = ok;
        other[0] = 0xfe;
        let own = link_local(&MAC);
        assert_eq!(own[8..], [0x50, 0x54, 0, 0xff, 0xfe, 0x12, 0x34, 0x56]);
        assert_eq!(at(&ipv6(ok, None)), Source::Allowed);
        assert_eq!(at(&ipv6(own, None)), Source::Allowed, "its own link-local address");
        assert_eq!(at(&ipv6(other, None)), Source::Spoofed);
        assert_eq!(at(&ipv6([0; 16], Some((135, ok)))), Source::Allowed, "duplicate address detection");
        assert_eq!(at(&ipv6(ok, Some((ICMPV6_NA, ok)))), Source::Allowed);
        assert_eq!(at(&ipv6(ok, Some((ICMPV6_NA, other)))), Source::Spoofed, "advertising another's address");
    }

    #[test]
    fn a_short_front_asks_for_more_and_a_short_frame_is_dropped() {
        let mut ok = [0u8; 16];
        ok[0] = 0xfd;
        let f = ipv6(ok, Some((ICMPV6_NA, ok)));
        assert_eq!(check(&ips(), &f[..56], f.len()), Source::Deeper(14 + 40 + 8 + 16), "the target");
        let f = ipv4([10, 0, 0, 5], protocol::TCP, 80);
        assert_eq!(check(&ips(), &f[..20], 20), Source::Spoofed, "a frame cut inside its IPv4 header");
    }
}
