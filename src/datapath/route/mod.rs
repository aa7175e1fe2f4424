//! Routing at the edge (`[[vrf]]`): each tenant network (a VLAN) of a VRF has an anycast
//! gateway, the same address and MAC on every host. NORMAL asks here first, for a frame in a
//! VLAN that is a VRF's network (`decide`):
//! - an ARP request or neighbour solicitation for the gateway's address is answered by the
//!   switch (`Out::Answer`), as are an ICMP or ICMPv6 echo request to it, a router
//!   solicitation (with the gateway's advertisement), and a request or
//!   solicitation for a neighbour's address (ARP and ND suppression: answered on the asker's
//!   host, not flooded, nor carried over a tunnel);
//! - an IPv4 or IPv6 frame to the gateway's MAC is routed: the VRF's network that holds its
//!   destination (connected networks, the longest prefix first), the neighbour there (a port
//!   whose `allowed_ips` hold the address as a host, with its one `allowed_macs` entry), then
//!   `Out::Routed`: delivery writes it with the neighbour's MAC as destination, the gateway's as
//!   source, its TTL (hop limit) one less (the IPv4 checksum updated, RFC 1624), in the
//!   destination network's VLAN (`shape::routed`);
//! - a frame that claims the gateway's MAC as its source is dropped (port security), unless it
//!   came through a tunnel: there it is one another host's gateway routed (the same anycast
//!   MAC on every host), and is switched as any frame is.
//!
//! A VRF reaches only its own networks: the lookup is in the sender's VRF, so two tenants may
//! use the same addresses. The frame's bytes are never rewritten in place: delivery writes the
//! new headers as a shape's prefix, so captures and mirrors of the sender see what it sent.
//! Neighbours come from configuration only (a tenant cannot teach the router an address); the
//! table is made with each plan, so a port added at run time is routed to at once.
//!
//! `table.rs` holds what is looked up, this file decides, `shape.rs` writes the headers of a
//! routed frame and the switch's answers.
#![forbid(unsafe_code)]

mod shape;
mod table;

pub use shape::{Answer, MAX_PREFIX};
pub(super) use shape::{shape_answer, shape_routed};
pub use table::{Neighbour, Net, Remote, Routes};

use std::net::Ipv4Addr;

use super::counters::DropReason;
use super::frame::{FRONT_MAX, Frame, Out};
use crate::config::vlan::{PortVlan, VlanMode};
use crate::wire::arp;
use crate::wire::{MacAddr, ethertype};
use table::mapped;

/// ICMPv6 types: echo request, router and neighbour solicitation.
const ICMP6_ECHO: u8 = 128;
const ND_RS: u8 = 133;
const ND_NS: u8 = 135;
/// IPv6 next headers: a fragment header, ICMPv6.
const NH_FRAGMENT: u8 = 44;
const NH_ICMP6: u8 = 58;

/// Where NORMAL sends frame `f` from `in_port` (whose VLAN policy is `vlan`), in VLAN `vid`,
/// if routing decides it (None: switched as any frame is). `addrs`: its destination and
/// source MACs.
#[inline(never)]
pub(super) fn decide(
    routes: &Routes,
    f: &mut Frame,
    in_port: u16,
    vlan: &PortVlan,
    vid: u16,
    addrs: &[u8; 12],
) -> Option<Out> {
    let net = routes.net_of(vid)?;
    let (dst, src) = (MacAddr::from_bytes(&addrs[..6]), MacAddr::from_bytes(&addrs[6..]));
    if src == net.gateway_mac {
        // Through a tunnel: routed by another host's gateway (asymmetric IRB), switched here.
        return (vlan.mode != VlanMode::Tunnel).then_some(Out::Drop(DropReason::PortSecurity));
    }
    let l2 = if f.tag.is_some() { 18 } else { 14 };
    if dst == net.gateway_mac {
        f.deepen_front(l2 + 60 + 8);
        return Some(route(routes, net, f, l2));
    }
    let ty = f.front().get(l2 - 2..l2)?;
    if dst == MacAddr::BROADCAST && ty == ethertype::ARP.to_be_bytes() {
        f.deepen_front(l2 + 28);
        if let Some(asked) = arp_request(f.front(), l2)
            && (asked == net.gateway || suppressed(routes, net, in_port, f.front(), l2, asked))
        {
            return Some(Out::Answer);
        }
    } else if addrs[..2] == [0x33, 0x33] && ty == ethertype::IPV6.to_be_bytes() && net.gateway6.is_some() {
        if addrs[2] == 0xff {
            // To a solicited-node group: a neighbour solicitation, perhaps.
            f.deepen_front(l2 + 40 + 24);
            if let Some(target) = solicited(f.front(), l2)
                && (is_gateway6(net, target) || suppressed6(routes, net, in_port, f.front(), l2, target))
            {
                return Some(Out::Answer);
            }
        } else if addrs[2..6] == [0, 0, 0, 2] {
            // To all routers: a router solicitation is the gateway's to answer.
            f.deepen_front(l2 + 40 + 8);
            if router_solicitation(f.front(), l2) {
                return Some(Out::Answer);
            }
        }
    }
    None
}

/// The address an ARP request asks for, if the front (`l2`: where the ARP packet starts) is
/// one.
fn arp_request(front: &[u8], l2: usize) -> Option<Ipv4Addr> {
    if front.get(l2 - 2..l2) != Some(&ethertype::ARP.to_be_bytes()[..])
        || front.get(l2 + 6..l2 + 8) != Some(&arp::OP_REQUEST.to_be_bytes()[..])
    {
        return None;
    }
    let t = front.get(l2 + 24..l2 + 28)?;
    Some(Ipv4Addr::new(t[0], t[1], t[2], t[3]))
}

/// ARP suppression: whether a request for `asked`, a neighbour of `net` on another port than
/// the asker's, is answered by the switch rather than flooded. A probe (sender 0.0.0.0, a VM
/// checking that its address is free) and a gratuitous request (sender = target) are not:
/// they are announcements, and flood as ever.
fn suppressed(routes: &Routes, net: &Net, in_port: u16, front: &[u8], l2: usize, asked: Ipv4Addr) -> bool {
    let Some(spa) = front.get(l2 + 14..l2 + 18) else { return false };
    if spa == [0, 0, 0, 0] || spa == asked.octets() {
        return false;
    }
    routes.answer_for(net, mapped(asked.into())).is_some_and(|n| n.port != in_port)
}

/// The target of the neighbour solicitation whose IPv6 header is at `l2` of `front`, if it
/// is a valid one (RFC 4861 7.1.1: hop limit 255, ICMPv6 code 0, a unicast target) from an
/// address (not duplicate address detection: a VM checking that its address is free floods,
/// as ARP probes do).
fn solicited(front: &[u8], l2: usize) -> Option<u128> {
    let ip = front.get(l2..l2 + 40)?;
    let icmp = front.get(l2 + 40..l2 + 40 + 24)?;
    let ok = ip[0] >> 4 == 6
        && ip[6] == NH_ICMP6
        && ip[7] == 255
        && u16::from_be_bytes([ip[4], ip[5]]) >= 24
        && icmp[0] == ND_NS
        && icmp[1] == 0
        && icmp[8] != 0xff
        && ip[8..24] != [0; 16];
    ok.then(|| u128::from_be_bytes(icmp[8..24].try_into().unwrap()))
}

/// Whether the front holds a valid router solicitation at `l2` (RFC 4861 6.1.1: hop limit 255,
/// ICMPv6 code 0, 8 bytes or more).
fn router_solicitation(front: &[u8], l2: usize) -> bool {
    let (Some(ip), Some(icmp)) = (front.get(l2..l2 + 40), front.get(l2 + 40..l2 + 48)) else { return false };
    ip[0] >> 4 == 6
        && ip[6] == NH_ICMP6
        && ip[7] == 255
        && u16::from_be_bytes([ip[4], ip[5]]) >= 8
        && icmp[0] == ND_RS
        && icmp[1] == 0
}

/// Whether `a` is the gateway's IPv6 address in `net`, or its link-local address.
fn is_gateway6(net: &Net, a: u128) -> bool {
    net.gateway6.is_some_and(|(g, _)| g == a) || a == net.link_local()
}

/// ND suppression: a solicitation for `target`, a neighbour of `net` on another port than the
/// asker's, is answered by the switch.
fn suppressed6(routes: &Routes, net: &Net, in_port: u16, front: &[u8], l2: usize, target: u128) -> bool {
    // Not a solicitation from the target itself (a VM's own address, as ARP's gratuitous).
    if front.get(l2 + 8..l2 + 24) == Some(&target.to_be_bytes()[..]) {
        return false;
    }
    routes.answer_for(net, target).is_some_and(|n| n.port != in_port)
}

/// Routes a frame sent to the gateway of `net` (its IP header at `l2` of the front).
fn route(routes: &Routes, net: &Net, f: &mut Frame, l2: usize) -> Out {
    let front = f.front();
    let ty = front.get(l2 - 2..l2);
    if ty != Some(&ethertype::IPV4.to_be_bytes()[..]) {
        if ty == Some(&ethertype::IPV6.to_be_bytes()[..]) {
            let out = route6(routes, net, f, l2);
            if out == Out::Answer {
                // An ICMPv6 error quotes as much of the packet as its answer holds.
                f.deepen_front(FRONT_MAX);
            }
            return out;
        }
        return Out::Drop(DropReason::NoRoute);
    }
    let Some(ip) = ipv4_header(front, l2, f.len) else { return Out::Drop(DropReason::RouteBadHeader) };
    let dst = u32::from_be_bytes([ip[16], ip[17], ip[18], ip[19]]);
    // What a router refuses is answered with an ICMP error (rate-limited where it is written),
    // but never an ICMP error or a later fragment (RFC 1812 4.3.2.7).
    let refuse = |why| if errors_allowed(front, l2, ip) { Out::Answer } else { Out::Drop(why) };
    let Some(to) = routes.network_of(net.vrf, dst) else { return refuse(DropReason::NoRoute) };
    if dst == u32::from(to.gateway) {
        // To the gateway itself: an echo request is answered, anything else goes nowhere.
        let l4 = l2 + (ip[0] & 0xf) as usize * 4;
        let echo = ip[9] == 1 && front.get(l4) == Some(&8) && !is_fragment(ip);
        return if echo { Out::Answer } else { Out::Drop(DropReason::NoRoute) };
    }
    if ip[8] <= 1 {
        return refuse(DropReason::TtlExceeded);
    }
    let found = routes.find4(net.vrf, dst).and_then(|n| Some((n, routes.neighbour(n)?.port)));
    let Some((n, port)) = found else { return refuse(DropReason::RouteNoNeighbour) };
    f.vlan = to.vlan;
    Out::Routed(port, n)
}

/// Routes an IPv6 frame sent to the gateway of `net`, as `route` does IPv4: hop limit for
/// TTL, ICMPv6 for ICMP. A network without an IPv6 gateway routes no IPv6. (Not inlined: the
/// IPv4 path stays as short as it was.)
#[inline(never)]
fn route6(routes: &Routes, net: &Net, f: &mut Frame, l2: usize) -> Out {
    if net.gateway6.is_none() {
        return Out::Drop(DropReason::NoRoute);
    }
    let front = f.front();
    let Some(ip) = ipv6_header(front, l2, f.len) else { return Out::Drop(DropReason::RouteBadHeader) };
    let dst = u128::from_be_bytes(ip[24..40].try_into().unwrap());
    let to = routes.network_of6(net.vrf, dst);
    if dst == net.link_local() || to.is_some_and(|n| n.gateway6.is_some_and(|(g, _)| g == dst)) {
        // To the gateway itself: an echo request or a (unicast) solicitation is answered.
        let icmp = (ip[6] == NH_ICMP6).then(|| front.get(l2 + 40).copied()).flatten();
        let nd = icmp == Some(ND_NS) && solicited(front, l2).is_some_and(|t| t == dst);
        return if icmp == Some(ICMP6_ECHO) || nd { Out::Answer } else { Out::Drop(DropReason::NoRoute) };
    }
    // Link-local and multicast destinations are not routed, nor answered.
    if ip[24] == 0xff || (ip[24] == 0xfe && ip[25] & 0xc0 == 0x80) {
        return Out::Drop(DropReason::NoRoute);
    }
    let refuse = |why| if errors_allowed6(front, l2, ip) { Out::Answer } else { Out::Drop(why) };
    let Some(to) = to else { return refuse(DropReason::NoRoute) };
    if ip[7] <= 1 {
        return refuse(DropReason::TtlExceeded);
    }
    let found = routes.find6(net.vrf, dst).and_then(|n| Some((n, routes.neighbour(n)?.port)));
    let Some((n, port)) = found else { return refuse(DropReason::RouteNoNeighbour) };
    f.vlan = to.vlan;
    Out::Routed(port, n)
}

/// Whether an ICMP error may answer the IPv4 packet whose header `ip` is at `l2` of `front`.
fn errors_allowed(front: &[u8], l2: usize, ip: &[u8]) -> bool {
    let later_fragment = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff != 0;
    let icmp_error = ip[9] == 1 && front.get(l2 + ip.len()).is_none_or(|t| matches!(t, 3 | 4 | 5 | 11 | 12));
    // Nor to a multicast or broadcast destination, nor from an unspecified source.
    let group = ip[16] >= 224;
    let nobody = ip[12..16] == [0, 0, 0, 0];
    !later_fragment && !icmp_error && !group && !nobody
}

/// Whether an ICMPv6 error may answer the IPv6 packet whose header `ip` is at `l2` of `front`
/// (RFC 4443 2.4 e): not an ICMPv6 error (types below 128), nor a later fragment, nor from
/// the unspecified address (a multicast destination was not routed).
fn errors_allowed6(front: &[u8], l2: usize, ip: &[u8]) -> bool {
    let icmp_error = ip[6] == NH_ICMP6 && front.get(l2 + 40).is_none_or(|&t| t < 128);
    let later_fragment =
        ip[6] == NH_FRAGMENT && front.get(l2 + 42..l2 + 44).is_none_or(|o| u16::from_be_bytes([o[0], o[1]]) >> 3 != 0);
    let nobody = ip[8..24] == [0; 16];
    !icmp_error && !later_fragment && !nobody
}

fn is_fragment(ip: &[u8]) -> bool {
    u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0
}

/// The IPv4 header at `l2` of `front` (of a frame `len` long), if it is one: version 4, a
/// length from 20 to 60 bytes within the front, a total length within the frame.
fn ipv4_header(front: &[u8], l2: usize, len: u32) -> Option<&[u8]> {
    let b = *front.get(l2)?;
    let ihl = (b & 0xf) as usize * 4;
    if b >> 4 != 4 || ihl < 20 {
        return None;
    }
    let ip = front.get(l2..l2 + ihl)?;
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    (total >= ihl && l2 + total <= len as usize).then_some(ip)
}

/// The IPv6 header at `l2` of `front` (of a frame `len` long), if it is one: version 6, its
/// payload within the frame.
fn ipv6_header(front: &[u8], l2: usize, len: u32) -> Option<&[u8]> {
    let ip = front.get(l2..l2 + 40)?;
    let payload = u16::from_be_bytes([ip[4], ip[5]]) as usize;
    (ip[0] >> 4 == 6 && l2 + 40 + payload <= len as usize).then_some(ip)
}
