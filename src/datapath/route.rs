//! Routing at the edge (`[[vrf]]`): each tenant network (a VLAN) of a VRF has an anycast
//! gateway, the same address and MAC on every host. NORMAL asks here first, for a frame in a
//! VLAN that is a VRF's network (`decide`):
//! - an ARP request for the gateway's address is answered by the switch (`Out::Answer`), as is
//!   an ICMP echo request to it, and one for a neighbour's address (ARP suppression: answered
//!   on the asker's host, not flooded, nor carried over a tunnel);
//! - an IPv4 frame to the gateway's MAC is routed: the VRF's network that holds its
//!   destination (connected networks, the longest prefix first), the neighbour there (a port
//!   whose `allowed_ips` hold the address as a host, with its one `allowed_macs` entry), then
//!   `Out::Routed`: delivery writes it with the neighbour's MAC as destination, the gateway's as
//!   source, its TTL one less (the IPv4 checksum updated, RFC 1624), in the destination
//!   network's VLAN (`shape_routed`);
//! - a frame that claims the gateway's MAC as its source is dropped (port security).
//!
//! A VRF reaches only its own networks: the lookup is in the sender's VRF, so two tenants may
//! use the same addresses. The frame's bytes are never rewritten in place: delivery writes the
//! new headers as a shape's prefix, so captures and mirrors of the sender see what it sent.
//! Neighbours come from configuration only (a tenant cannot teach the router an address); the
//! table is made with each plan, so a port added at run time is routed to at once.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;

use super::counters::DropReason;
use super::frame::{FRONT_MAX, Frame, Out, Shape};
use crate::config::VrfConfig;
use crate::config::ips::IpPrefix;
use crate::config::vlan::PortVlan;
use crate::wire::arp::{self, arp_frame};
use crate::wire::{MacAddr, ethertype};

/// No network: the VLAN is in no VRF.
const NONE: u16 = u16::MAX;
/// The longest header a routed frame's prefix holds: addresses, a tag, the type, and an IPv4
/// header with options.
pub const MAX_PREFIX: usize = 18 + 60;
/// A new IPv4 header's TTL, the switch's own (an echo reply).
const TTL: u8 = 64;

/// One network of a VRF, as the data path reads it.
#[derive(Debug, Clone, Copy)]
pub struct Net {
    pub vrf: u16,
    pub vlan: u16,
    pub gateway: Ipv4Addr,
    mask: u32,
    pub gateway_mac: MacAddr,
}

impl Net {
    fn contains(&self, a: u32) -> bool {
        (a ^ u32::from(self.gateway)) & self.mask == 0
    }
}

/// A routed address: the port it is on and its MAC, in network `net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// The VRF (high 32 bits) and the address.
    key: u64,
    pub mac: MacAddr,
    pub port: u16,
    pub net: u16,
}

impl Neighbour {
    /// Its address.
    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.key as u32)
    }
}

/// Every VRF's networks and neighbours, made with each plan (`PortTable::with_routes`).
#[derive(Debug)]
pub struct Routes {
    /// By VLAN id: its network in `nets` (`NONE`: in no VRF).
    by_vlan: Box<[u16]>,
    pub nets: Vec<Net>,
    /// Per VRF: its networks, the longest prefix first.
    by_vrf: Vec<Vec<u16>>,
    /// Sorted by key.
    neighbours: Vec<Neighbour>,
    /// An open-addressed index of `neighbours` by key (1 + the index; 0 empty), at most half
    /// full: a lookup is a multiply and, mostly, one probe. Its keys are the configuration's,
    /// so no guest chooses where they fall.
    slots: Box<[u16]>,
    /// 64 - log2(slots).
    shift: u32,
}

fn key(vrf: u16, a: Ipv4Addr) -> u64 {
    (vrf as u64) << 32 | u32::from(a) as u64
}

impl Routes {
    /// The VRFs of the configuration, with the neighbours the ports give (each port's id, its
    /// `allowed_macs`, `allowed_ips` and VLANs): each port with one allowed MAC, for each host
    /// address of its `allowed_ips` that is in a network of a VLAN the port carries (the first
    /// such port, for an address two name). None without VRFs.
    pub fn new<'p>(
        vrfs: &[VrfConfig],
        ports: impl Iterator<Item = (u16, &'p [MacAddr], &'p [IpPrefix], &'p PortVlan)>,
    ) -> Option<Routes> {
        if vrfs.is_empty() {
            return None;
        }
        let mut r = Routes {
            by_vlan: vec![NONE; 4096].into_boxed_slice(),
            nets: Vec::new(),
            by_vrf: Vec::new(),
            neighbours: Vec::new(),
            slots: Box::new([]),
            shift: 63,
        };
        for (vi, v) in vrfs.iter().enumerate() {
            let mut mine = Vec::new();
            for n in &v.networks {
                r.by_vlan[n.vlan as usize] = r.nets.len() as u16;
                mine.push(r.nets.len() as u16);
                r.nets.push(Net {
                    vrf: vi as u16,
                    vlan: n.vlan,
                    gateway: n.gateway,
                    mask: n.mask(),
                    gateway_mac: v.gateway_mac,
                });
            }
            mine.sort_by_key(|&i| std::cmp::Reverse(r.nets[i as usize].mask.count_ones()));
            r.by_vrf.push(mine);
        }
        for (id, macs, ips, vlan) in ports {
            let [mac] = macs[..] else { continue };
            for a in ips.iter().filter_map(|p| p.host4()) {
                let net = r.nets.iter().position(|n| n.contains(u32::from(a)) && vlan.carries(n.vlan));
                if let Some(net) = net {
                    let k = key(r.nets[net].vrf, a);
                    r.neighbours.push(Neighbour { key: k, mac, port: id, net: net as u16 });
                }
            }
        }
        // The first port to name an address keeps it.
        r.neighbours.sort_by_key(|n| n.key);
        r.neighbours.dedup_by_key(|n| n.key);
        r.neighbours.truncate(u16::MAX as usize / 2);
        let size = (2 * r.neighbours.len()).next_power_of_two().max(16);
        (r.slots, r.shift) = (vec![0; size].into_boxed_slice(), 64 - size.trailing_zeros());
        for i in 0..r.neighbours.len() {
            let mut h = r.slot(r.neighbours[i].key);
            while r.slots[h] != 0 {
                h = (h + 1) & (size - 1);
            }
            r.slots[h] = i as u16 + 1;
        }
        Some(r)
    }

    /// The network of VLAN `vid`, if it is a VRF's.
    #[inline]
    pub fn net_of(&self, vid: u16) -> Option<&Net> {
        match self.by_vlan.get(vid as usize) {
            Some(&i) if i != NONE => self.nets.get(i as usize),
            _ => None,
        }
    }

    /// Neighbour `i` (`Out::Routed`'s).
    pub fn neighbour(&self, i: u16) -> Option<&Neighbour> {
        self.neighbours.get(i as usize)
    }

    /// Where `key`'s probe starts.
    #[inline]
    fn slot(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The neighbour at `a` in VRF `vrf`, by index.
    #[inline]
    fn find(&self, vrf: u16, a: Ipv4Addr) -> Option<u16> {
        let (k, mask) = (key(vrf, a), self.slots.len() - 1);
        let mut h = self.slot(k);
        loop {
            let i = *self.slots.get(h)? as usize;
            let n = self.neighbours.get(i.checked_sub(1)?)?;
            if n.key == k {
                return Some(i as u16 - 1);
            }
            h = (h + 1) & mask;
        }
    }

    /// The network of VRF `vrf` that holds `a` (the longest prefix).
    fn network_of(&self, vrf: u16, a: u32) -> Option<&Net> {
        self.by_vrf.get(vrf as usize)?.iter().map(|&i| &self.nets[i as usize]).find(|n| n.contains(a))
    }

    /// The neighbour at `a` in network `net` (an address of another network, or another
    /// VRF's, is none).
    pub fn answer_for(&self, net: &Net, a: Ipv4Addr) -> Option<&Neighbour> {
        let n = &self.neighbours[self.find(net.vrf, a)? as usize];
        (self.nets[n.net as usize].vlan == net.vlan).then_some(n)
    }

    /// Every neighbour, for `pvswitchctl`.
    pub fn neighbours(&self) -> &[Neighbour] {
        &self.neighbours
    }
}

/// Where NORMAL sends frame `f` from `in_port`, in VLAN `vid`, if routing decides it (None:
/// switched as any frame is). `addrs`: its destination and source MACs.
#[inline(never)]
pub(super) fn decide(routes: &Routes, f: &mut Frame, in_port: u16, vid: u16, addrs: &[u8; 12]) -> Option<Out> {
    let net = routes.net_of(vid)?;
    let (dst, src) = (MacAddr::from_bytes(&addrs[..6]), MacAddr::from_bytes(&addrs[6..]));
    if src == net.gateway_mac {
        return Some(Out::Drop(DropReason::PortSecurity));
    }
    let l2 = if f.tag.is_some() { 18 } else { 14 };
    if dst == net.gateway_mac {
        f.deepen_front(l2 + 60 + 8);
        return Some(route(routes, net, f, l2));
    }
    if dst == MacAddr::BROADCAST && f.front().get(l2 - 2..l2) == Some(&ethertype::ARP.to_be_bytes()[..]) {
        f.deepen_front(l2 + 28);
        if let Some(asked) = arp_request(f.front(), l2)
            && (asked == net.gateway || suppressed(routes, net, in_port, f.front(), l2, asked))
        {
            return Some(Out::Answer);
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
    routes.answer_for(net, asked).is_some_and(|n| n.port != in_port)
}

/// Routes an IPv4 frame sent to the gateway of `net` (its header at `l2` of the front).
fn route(routes: &Routes, net: &Net, f: &mut Frame, l2: usize) -> Out {
    let front = f.front();
    if front.get(l2 - 2..l2) != Some(&ethertype::IPV4.to_be_bytes()[..]) {
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
    let Some(n) = routes.find(net.vrf, Ipv4Addr::from(dst)) else { return refuse(DropReason::RouteNoNeighbour) };
    f.vlan = to.vlan;
    Out::Routed(routes.neighbours[n as usize].port, n)
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

/// The shape of routed frame `f` (its header at `l2`) to neighbour `n`, into `buf`: the
/// neighbour's MAC, the gateway's, a tag if the port sends the VLAN `tagged`, the IPv4 header
/// with its TTL one less and its checksum updated for it; the rest of the frame after.
pub(super) fn shape_routed<'b>(
    f: &Frame,
    n: &Neighbour,
    net: &Net,
    tagged: bool,
    buf: &'b mut [u8; MAX_PREFIX],
) -> Option<Shape<'b>> {
    let l2 = if f.tag.is_some() { 18 } else { 14 };
    let ip = ipv4_header(f.front(), l2, f.len)?;
    let at = l2_header(
        buf,
        n.mac,
        net.gateway_mac,
        tagged.then_some((f.tag.unwrap_or(0) & 0xe000) | net.vlan),
        ethertype::IPV4,
    );
    let hdr = &mut buf[at..at + ip.len()];
    hdr.copy_from_slice(ip);
    hdr[8] = hdr[8].wrapping_sub(1);
    // RFC 1624: the TTL is the high byte of the fifth word; one less there is 0x0100 less in
    // the sum, so its complement (the checksum) is 0x0100 more, end-around.
    let sum = u16::from_be_bytes([hdr[10], hdr[11]]);
    hdr[10..12].copy_from_slice(&crate::wire::checksum::combine(sum, 0x0100).to_be_bytes());
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

/// What the switch answers a frame with (`Out::Answer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The gateway's or a neighbour's MAC, to an ARP request.
    Arp,
    /// An echo reply from the gateway.
    Echo,
    /// An ICMP error, for a frame dropped for this reason: time exceeded (TTL), net
    /// unreachable (no network of the VRF holds its destination), host unreachable (no port
    /// has the address).
    Error(DropReason),
}

/// The switch's answer to frame `f` (`Out::Answer`), for its sender, which sends VLAN
/// `net.vlan` `tagged` or not: the ARP reply (for the gateway, or suppression's for a
/// neighbour), the echo reply from the gateway, or time exceeded; into `buf`.
pub(super) fn shape_answer<'b>(
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
    if front.get(l2 - 2..l2) == Some(&ethertype::ARP.to_be_bytes()[..]) {
        let a = front.get(l2..l2 + 28)?;
        let (sha, spa) = (MacAddr::from_bytes(&a[8..14]), Ipv4Addr::new(a[14], a[15], a[16], a[17]));
        let asked = Ipv4Addr::new(a[24], a[25], a[26], a[27]);
        // The gateway's own MAC, or (suppression) the neighbour's.
        let mac = match asked == net.gateway {
            true => net.gateway_mac,
            false => routes.answer_for(net, asked)?.mac,
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
    let sum = crate::wire::checksum::checksum(hdr);
    hdr[10..12].copy_from_slice(&sum.to_be_bytes());
    let e = &mut buf[at + ihl..at + ihl + 4];
    e.copy_from_slice(icmp);
    e[0] = 0;
    // Type 8 -> 0 in the first word: 0x0800 less in the sum, 0x0800 more in its complement.
    let sum = u16::from_be_bytes([e[2], e[3]]);
    e[2..4].copy_from_slice(&crate::wire::checksum::combine(sum, 0x0800).to_be_bytes());
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
    let sum = crate::wire::checksum::checksum(hdr);
    hdr[10..12].copy_from_slice(&sum.to_be_bytes());
    let icmp = &mut buf[at + 20..at + len];
    icmp[..8].copy_from_slice(&[ty, code, 0, 0, 0, 0, 0, 0]);
    icmp[8..].copy_from_slice(quoted);
    let sum = crate::wire::checksum::checksum(icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(Shape { prefix: &buf[..at + len], skip: f.len, take: 0, patch: None })
}
