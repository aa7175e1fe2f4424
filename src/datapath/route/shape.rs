//! The headers routing writes: a routed frame's new front (`shape_routed`), and the switch's
//! answers to a frame (`shape_answer`): ARP replies and neighbour advertisements for the
//! gateway or a neighbour, echo replies from the gateway, ICMP and ICMPv6 errors. Each is a
//! `Shape` over the sender's frame, whose bytes are never rewritten in place.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

use super::table::{Neighbour, Net, Routes, mapped};
use super::{ND_NS, ND_RS, ipv4_header, ipv6_header, solicited};
use crate::datapath::counters::DropReason;
use crate::datapath::frame::{FRONT_MAX, Frame, Shape};
use crate::wire::arp::{self, arp_frame};
use crate::wire::checksum::{checksum, combine, pseudo_header_v6};
use crate::wire::{MacAddr, ethertype};

/// The longest header a routed frame's prefix holds: addresses, a tag, the type, and an IPv4
/// header with options (an IPv6 header is shorter).
pub const MAX_PREFIX: usize = 18 + 60;
/// A new IP header's TTL (hop limit), the switch's own (an echo reply, an error).
const TTL: u8 = 64;
/// ICMPv6 types: echo reply, neighbour advertisement.
const ICMP6_ECHO_REPLY: u8 = 129;
const ND_RA: u8 = 134;
const ND_NA: u8 = 136;
/// A router advertisement's router lifetime (seconds), and its prefix's valid and preferred
/// lifetimes (RFC 4861's defaults: 1800 s, 30 days, 7 days).
const RA_LIFETIME: u16 = 1800;
const PREFIX_VALID: u32 = 2_592_000;
const PREFIX_PREFERRED: u32 = 604_800;

/// A frame the switch answers, and what every answer needs of it: the network it came from,
/// where its IP header starts (`l2`), the asker's MAC, and the tag to answer with.
#[derive(Clone, Copy)]
struct Asked<'a, 'f> {
    f: &'a Frame<'f>,
    net: &'a Net,
    l2: usize,
    asker: MacAddr,
    tci: Option<u16>,
}

/// What the switch answers a frame with (`Out::Answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The gateway's or a neighbour's MAC, to an ARP request or a neighbour solicitation.
    Arp,
    /// The gateway's router advertisement, to a router solicitation.
    Advert,
    /// An echo reply from the gateway.
    Echo,
    /// An ICMP error, for a frame dropped for this reason: time exceeded (TTL), net
    /// unreachable (no network of the VRF holds its destination), host unreachable (no port
    /// has the address).
    Error(DropReason),
}

/// The shape of routed frame `f` (its header at `l2`) to neighbour `n`, into `buf`: the
/// neighbour's MAC, the gateway's, a tag if the port sends the VLAN `tagged`, the IP header
/// with its TTL (hop limit) one less (IPv4's checksum updated for it); the rest of the frame
/// after.
pub(in crate::datapath) fn shape_routed<'b>(
    f: &Frame,
    n: &Neighbour,
    net: &Net,
    tagged: bool,
    buf: &'b mut [u8; MAX_PREFIX],
) -> Option<Shape<'b>> {
    let l2 = if f.tag.is_some() { 18 } else { 14 };
    let front = f.front();
    let v6 = front.get(l2 - 2..l2)? == ethertype::IPV6.to_be_bytes();
    let (ip, ty) = match v6 {
        false => (ipv4_header(front, l2, f.len)?, ethertype::IPV4),
        true => (ipv6_header(front, l2, f.len)?, ethertype::IPV6),
    };
    let tci = tagged.then_some((f.tag.unwrap_or(0) & 0xe000) | net.vlan);
    let at = l2_header(buf, n.mac, net.gateway_mac, tci, ty);
    let hdr = &mut buf[at..at + ip.len()];
    hdr.copy_from_slice(ip);
    if v6 {
        hdr[7] = hdr[7].wrapping_sub(1);
    } else {
        hdr[8] = hdr[8].wrapping_sub(1);
        // RFC 1624: the TTL is the high byte of the fifth word; one less there is 0x0100 less
        // in the sum, so its complement (the checksum) is 0x0100 more, end-around.
        let sum = u16::from_be_bytes([hdr[10], hdr[11]]);
        hdr[10..12].copy_from_slice(&combine(sum, 0x0100).to_be_bytes());
    }
    Some(Shape { prefix: &buf[..at + ip.len()], skip: (l2 + ip.len()) as u32, take: u32::MAX, patch: None })
}

/// Writes an Ethernet header (with a tag whose TCI is `tci`) into `buf`; its length.
fn l2_header(buf: &mut [u8], dst: MacAddr, src: MacAddr, tci: Option<u16>, ty: u16) -> usize {
    buf[0..6].copy_from_slice(&dst.0);
    buf[6..12].copy_from_slice(&src.0);
    let mut at = 12;
    if let Some(tci) = tci {
        buf[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        buf[14..16].copy_from_slice(&tci.to_be_bytes());
        at = 16;
    }
    buf[at..at + 2].copy_from_slice(&ty.to_be_bytes());
    at + 2
}

/// The switch's answer to frame `f` (`Out::Answer`), for its sender, which sends VLAN
/// `net.vlan` `tagged` or not: the ARP reply or neighbour advertisement (for the gateway, or
/// suppression's for a neighbour), the echo reply from the gateway, or an ICMP error; into
/// `buf`.
pub(in crate::datapath) fn shape_answer<'b>(
    routes: &Routes,
    f: &Frame,
    net: &Net,
    tagged: bool,
    buf: &'b mut [u8; FRONT_MAX],
) -> Option<(Shape<'b>, Answer)> {
    let l2 = if f.tag.is_some() { 18 } else { 14 };
    let front = f.front();
    let tci = tagged.then_some((f.tag.unwrap_or(0) & 0xe000) | net.vlan);
    let asker = MacAddr::from_bytes(front.get(6..12)?);
    let ty = front.get(l2 - 2..l2)?;
    if ty == ethertype::IPV6.to_be_bytes() {
        return answer6(routes, &Asked { f, net, l2, asker, tci }, buf);
    }
    if ty == ethertype::ARP.to_be_bytes() {
        let a = front.get(l2..l2 + 28)?;
        let (sha, spa) = (MacAddr::from_bytes(&a[8..14]), Ipv4Addr::new(a[14], a[15], a[16], a[17]));
        let asked = Ipv4Addr::new(a[24], a[25], a[26], a[27]);
        // The gateway's own MAC, or (suppression) the neighbour's.
        let mac = match asked == net.gateway {
            true => net.gateway_mac,
            false => routes.answer_for(net, mapped(asked.into()))?.mac,
        };
        let reply = arp_frame(asker, arp::OP_REPLY, mac, asked, sha, spa);
        let at = l2_header(buf, asker, mac, tci, ethertype::ARP);
        let body = &reply[14..];
        buf[at..at + body.len()].copy_from_slice(body);
        return Some((Shape { prefix: &buf[..at + body.len()], skip: f.len, take: 0, patch: None }, Answer::Arp));
    }
    let ip = ipv4_header(front, l2, f.len)?;
    let ihl = ip.len();
    // Why `route` answered: the same questions in its order.
    let why = match routes.network_of(net.vrf, u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]])) {
        None => Some(DropReason::NoRoute),
        Some(n) if n.gateway.octets() == ip[16..20] => None,
        Some(_) if ip[8] <= 1 => Some(DropReason::TtlExceeded),
        Some(_) => Some(DropReason::RouteNoNeighbour),
    };
    if let Some(why) = why {
        return icmp_error(f, net, ip, l2, why, tci, buf).map(|s| (s, Answer::Error(why)));
    }
    // An echo request to the gateway: its IPv4 header with the addresses swapped, a TTL of
    // our own, the checksum computed again; its ICMP type 0, the checksum updated for it.
    let icmp = front.get(l2 + ihl..l2 + ihl + 4)?;
    let at = l2_header(buf, asker, net.gateway_mac, tci, ethertype::IPV4);
    let hdr = &mut buf[at..at + ihl];
    hdr.copy_from_slice(ip);
    hdr[12..16].copy_from_slice(&ip[16..20]);
    hdr[16..20].copy_from_slice(&ip[12..16]);
    hdr[8] = TTL;
    hdr[10..12].copy_from_slice(&[0, 0]);
    let sum = checksum(hdr);
    hdr[10..12].copy_from_slice(&sum.to_be_bytes());
    let e = &mut buf[at + ihl..at + ihl + 4];
    e.copy_from_slice(icmp);
    e[0] = 0;
    // Type 8 -> 0 in the first word: 0x0800 less in the sum, 0x0800 more in its complement.
    let sum = u16::from_be_bytes([e[2], e[3]]);
    e[2..4].copy_from_slice(&combine(sum, 0x0800).to_be_bytes());
    Some((
        Shape { prefix: &buf[..at + ihl + 4], skip: (l2 + ihl + 4) as u32, take: u32::MAX, patch: None },
        Answer::Echo,
    ))
}

/// The ICMP error for a frame dropped for `why` (time exceeded in transit, type 11 code 0; net
/// unreachable, 3/0; host unreachable, 3/1) from the gateway of `net` to the sender of `f` (its
/// IPv4 header `ip` at `l2`), quoting that header and the first 8 bytes after it.
fn icmp_error<'b>(
    f: &Frame,
    net: &Net,
    ip: &[u8],
    l2: usize,
    why: DropReason,
    tci: Option<u16>,
    buf: &'b mut [u8; FRONT_MAX],
) -> Option<Shape<'b>> {
    let (ty, code) = match why {
        DropReason::TtlExceeded => (11, 0),
        DropReason::NoRoute => (3, 0),
        _ => (3, 1),
    };
    let front = f.front();
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let quoted = front.get(l2..l2 + (ip.len() + 8).min(total))?;
    let asker = MacAddr::from_bytes(front.get(6..12)?);
    let at = l2_header(buf, asker, net.gateway_mac, tci, ethertype::IPV4);
    let len = 20 + 8 + quoted.len();
    let hdr = &mut buf[at..at + 20];
    hdr.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, TTL, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    hdr[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    hdr[12..16].copy_from_slice(&net.gateway.octets());
    hdr[16..20].copy_from_slice(&ip[12..16]);
    let sum = checksum(hdr);
    hdr[10..12].copy_from_slice(&sum.to_be_bytes());
    let icmp = &mut buf[at + 20..at + len];
    icmp[..8].copy_from_slice(&[ty, code, 0, 0, 0, 0, 0, 0]);
    icmp[8..].copy_from_slice(quoted);
    let sum = checksum(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(Shape { prefix: &buf[..at + len], skip: f.len, take: 0, patch: None })
}

/// The answer to an IPv6 frame (its header at `l2`): the neighbour advertisement for a
/// solicitation, the echo reply from the gateway, or an ICMPv6 error.
fn answer6<'b>(routes: &Routes, q: &Asked, buf: &'b mut [u8; FRONT_MAX]) -> Option<(Shape<'b>, Answer)> {
    let Asked { f, net, l2, asker, tci } = *q;
    let front = f.front();
    let ip = ipv6_header(front, l2, f.len)?;
    let (src, dst) = (&ip[8..24], u128::from_be_bytes(ip[24..40].try_into().unwrap()));
    let icmp = (ip[6] == super::NH_ICMP6).then(|| front.get(l2 + 40)).flatten().copied();
    if icmp == Some(ND_NS) {
        return neighbour_advert(routes, q, buf).map(|s| (s, Answer::Arp));
    }
    if icmp == Some(ND_RS) {
        return router_advert(q, buf).map(|s| (s, Answer::Advert));
    }
    let to = routes.network_of6(net.vrf, dst);
    let why = match to {
        _ if dst == net.link_local() => None,
        Some(n) if n.gateway6.is_some_and(|(g, _)| g == dst) => None,
        None => Some(DropReason::NoRoute),
        Some(_) if ip[7] <= 1 => Some(DropReason::TtlExceeded),
        Some(_) => Some(DropReason::RouteNoNeighbour),
    };
    if let Some(why) = why {
        // From the gateway's address in the sender's network, quoting as much of the packet
        // as the answer's buffer holds (RFC 4443 asks for as much as fits 1280 bytes).
        let (ty, code) = match why {
            DropReason::TtlExceeded => (3, 0),
            DropReason::NoRoute => (1, 0),
            _ => (1, 3),
        };
        let (gw, _) = net.gateway6?;
        let at = l2_header(buf, asker, net.gateway_mac, tci, ethertype::IPV6);
        let room = FRONT_MAX - at - 40 - 8;
        let quoted = front.get(l2..)?;
        let quoted = &quoted[..quoted.len().min(room).min(f.len as usize - l2)];
        let mut msg = [0u8; FRONT_MAX];
        msg[..2].copy_from_slice(&[ty, code]);
        msg[8..8 + quoted.len()].copy_from_slice(quoted);
        let len = ipv6_icmp(buf, at, gw.to_be_bytes(), src.try_into().unwrap(), TTL, &msg[..8 + quoted.len()]);
        return Some((Shape { prefix: &buf[..len], skip: f.len, take: 0, patch: None }, Answer::Error(why)));
    }
    // An echo request to the gateway: the addresses swapped, a hop limit of our own; ICMPv6
    // type 128 -> 129, 0x0100 more in the sum, so 0x0100 less in the checksum (the pseudo
    // header's sum is the same with the addresses swapped).
    if icmp != Some(super::ICMP6_ECHO) {
        return None;
    }
    let e = front.get(l2 + 40..l2 + 44)?;
    let at = l2_header(buf, asker, net.gateway_mac, tci, ethertype::IPV6);
    let hdr = &mut buf[at..at + 44];
    hdr[..40].copy_from_slice(ip);
    hdr[8..24].copy_from_slice(&ip[24..40]);
    hdr[24..40].copy_from_slice(src);
    hdr[7] = TTL;
    hdr[40..44].copy_from_slice(e);
    hdr[40] = ICMP6_ECHO_REPLY;
    let sum = u16::from_be_bytes([e[2], e[3]]);
    hdr[42..44].copy_from_slice(&combine(sum, !0x0100).to_be_bytes());
    Some((Shape { prefix: &buf[..at + 44], skip: (l2 + 44) as u32, take: u32::MAX, patch: None }, Answer::Echo))
}

/// The answer to a neighbour solicitation (its IPv6 header at `l2`): an advertisement for the
/// target, from the target's address to the asker: the gateway's (a router's), or a
/// neighbour's (suppression).
fn neighbour_advert<'b>(routes: &Routes, q: &Asked, buf: &'b mut [u8; FRONT_MAX]) -> Option<Shape<'b>> {
    let Asked { f, net, l2, asker, tci } = *q;
    let front = f.front();
    let src: [u8; 16] = front.get(l2 + 8..l2 + 24)?.try_into().ok()?;
    let target = solicited(front, l2)?;
    // The gateway's own MAC (a router's advertisement), or (suppression) the neighbour's.
    let (mac, router) = match super::is_gateway6(net, target) {
        true => (net.gateway_mac, true),
        false => (routes.answer_for(net, target)?.mac, false),
    };
    let at = l2_header(buf, asker, mac, tci, ethertype::IPV6);
    let mut na = [0u8; 32];
    na[0] = ND_NA;
    // Router, solicited, override (RFC 4861 4.4).
    na[4] = if router { 0xe0 } else { 0x60 };
    na[8..24].copy_from_slice(&target.to_be_bytes());
    // The target link-layer address option.
    na[24..26].copy_from_slice(&[2, 1]);
    na[26..32].copy_from_slice(&mac.0);
    let len = ipv6_icmp(buf, at, target.to_be_bytes(), src, 255, &na);
    Some(Shape { prefix: &buf[..len], skip: f.len, take: 0, patch: None })
}

/// The gateway's answer to a router solicitation (RFC 4861 4.2): from its link-local address
/// to the asker (all nodes if it asked from ::), the asker's MAC: a default router for 30
/// minutes, the gateway's MAC, and the network's prefix as on-link. Not for address
/// autoconfiguration: a port's addresses are its `allowed_ips`, which the guest is given.
fn router_advert<'b>(q: &Asked, buf: &'b mut [u8; FRONT_MAX]) -> Option<Shape<'b>> {
    let Asked { f, net, l2, asker, tci } = *q;
    let (gw, mask) = net.gateway6?;
    let src = f.front().get(l2 + 8..l2 + 24)?;
    let dst = match src == [0; 16] {
        true => 0xff02_u128 << 112 | 1,
        false => u128::from_be_bytes(src.try_into().ok()?),
    };
    let mut ra = [0u8; 56];
    ra[0] = ND_RA;
    ra[4] = TTL;
    ra[6..8].copy_from_slice(&RA_LIFETIME.to_be_bytes());
    // The source link-layer address option.
    ra[16..18].copy_from_slice(&[1, 1]);
    ra[18..24].copy_from_slice(&net.gateway_mac.0);
    // The prefix information option: its length, on-link (L) only.
    ra[24..28].copy_from_slice(&[3, 4, mask.count_ones() as u8, 0x80]);
    ra[28..32].copy_from_slice(&PREFIX_VALID.to_be_bytes());
    ra[32..36].copy_from_slice(&PREFIX_PREFERRED.to_be_bytes());
    ra[40..56].copy_from_slice(&(gw & mask).to_be_bytes());
    let at = l2_header(buf, asker, net.gateway_mac, tci, ethertype::IPV6);
    let len = ipv6_icmp(buf, at, net.link_local().to_be_bytes(), dst.to_be_bytes(), 255, &ra);
    Some(Shape { prefix: &buf[..len], skip: f.len, take: 0, patch: None })
}

/// Writes at `at` of `buf` an IPv6 header from `src` to `dst` with hop limit `hops`, and the
/// ICMPv6 message `msg` (its checksum computed); where it ends.
fn ipv6_icmp(buf: &mut [u8], at: usize, src: [u8; 16], dst: [u8; 16], hops: u8, msg: &[u8]) -> usize {
    let hdr = &mut buf[at..at + 40];
    hdr[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, super::NH_ICMP6, hops]);
    hdr[4..6].copy_from_slice(&(msg.len() as u16).to_be_bytes());
    hdr[8..24].copy_from_slice(&src);
    hdr[24..40].copy_from_slice(&dst);
    let body = &mut buf[at + 40..at + 40 + msg.len()];
    body.copy_from_slice(msg);
    let mut sum = pseudo_header_v6(Ipv6Addr::from(src), Ipv6Addr::from(dst), super::NH_ICMP6, msg.len() as u32);
    let c = sum.add_bytes(body).finish();
    body[2..4].copy_from_slice(&c.to_be_bytes());
    at + 40 + msg.len()
}
