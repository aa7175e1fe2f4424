//! VXLAN decapsulation, on the poll threads, in the same visits as every frame (`VtepRx`): a
//! VTEP's underlay is a dpdk port whose receive queues are visited as a NIC's are, through this
//! source. Each received frame is checked once (`check_outer`: IPv4/UDP to the VTEP's
//! address and port, sane lengths, the I flag; a known remote endpoint, believed only from its
//! next hop's MAC when it is on the underlay's segment; a known VNI; an untagged inner frame)
//! and rewritten in place: its inner addresses move 4 bytes toward the outer headers and the
//! VNI's VLAN is written as an 802.1Q tag after them. The inner frame then enters the switch
//! from the remote's tunnel port (a trunk of its VLANs), in runs of consecutive frames from the
//! same remote: the rest of the data path (port security, learning per VLAN, flows, delivery)
//! is unchanged. ARP for the VTEP's address is answered here; a reply to our own request for a
//! tunnel's next hop resolves it (nothing else does). Anything else on the underlay is dropped
//! and counted on the underlay port, whether or not any remote is known: the underlay never
//! carries a tenant's frame unencapsulated. Encapsulation is `tx::vxlan`.
#![forbid(unsafe_code)]

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering::Relaxed;

use super::nic::NicRx;
use super::source::Source;
use crate::capture::Tap;
use crate::config::MAX_BURST;
use crate::datapath::Env;
use crate::datapath::counters::{DropReason, PortCounters, bump};
use crate::datapath::frame::Frame;
use crate::datapath::plan::Underlay;
use crate::datapath::tap;
use crate::datapath::tx::delivery::Delivery;
use crate::datapath::tx::nic::NicDest;
use crate::datapath::tx::vxlan::ask;
use crate::port::nic::NicPort;
use crate::vring::RingError;
use crate::wire::arp::{self, ArpPacket, arp_frame};
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::protocol;
use crate::wire::udp::UdpPacket;
use crate::wire::vxlan::{HEADER_LEN, OUTER_LEN, VXLAN_AT, VxlanPacket, VxlanRepr};
use crate::wire::{MacAddr, ethertype};

/// No tunnel port: the frame is not switched (dropped, or the VTEP's own ARP).
const NONE: u16 = u16::MAX;
/// ARP replies one burst may owe.
const MAX_REPLIES: usize = 4;

/// A VTEP's underlay receive queue as a source of inner frames, in runs from one remote.
pub(in crate::datapath) struct VtepRx<'a> {
    env: &'a Env<'a>,
    nic: &'a NicPort,
    queue: usize,
    rx: &'a mut NicRx,
    under: &'a Underlay,
    /// The underlay port's counters (this thread's).
    pc: &'a PortCounters,
    /// Per frame of the burst: its tunnel port (NONE: not switched), where its inner frame
    /// (tagged) starts and how long it is.
    to: [u16; MAX_BURST as usize],
    at: [(u16, u16); MAX_BURST as usize],
    /// Frames received, and the next one to hand out.
    n: usize,
    next: usize,
    /// The tunnel port of the run `ready` found.
    run: u16,
    replies: [[u8; arp::RARP_FRAME_LEN]; MAX_REPLIES],
    n_replies: usize,
}

impl<'a> VtepRx<'a> {
    pub fn new(env: &'a Env<'a>, nic: &'a NicPort, queue: usize, rx: &'a mut NicRx, under: &'a Underlay) -> Self {
        VtepRx {
            env,
            nic,
            queue,
            rx,
            under,
            pc: &env.cx.stats.ports[under.port as usize],
            to: [NONE; MAX_BURST as usize],
            at: [(0, 0); MAX_BURST as usize],
            n: 0,
            next: 0,
            run: NONE,
            replies: [[0; arp::RARP_FRAME_LEN]; MAX_REPLIES],
            n_replies: 0,
        }
    }

    /// Ends the visit: the burst is freed, the ARP replies owed go out, and (at most once a
    /// millisecond for the underlay) a tunnel whose next hop is unresolved asks for it now,
    /// not when its first frame is dropped for want of it.
    pub fn finish(self, dv: &mut Delivery) {
        self.rx.clear();
        let to = NicDest { id: self.under.port, nic: self.nic, thread: self.env.cx.index, pc: self.pc };
        let taps = self.taps();
        for r in &self.replies[..self.n_replies] {
            match dv.nic_tx.write_bytes(&to, r) {
                Ok(()) if !taps.is_empty() => tap::underlay_sent(to.thread, taps, r, None),
                Ok(()) => {}
                Err(why) => self.pc.drop(why, 1),
            }
        }
        let (now, hz) = (self.env.now, crate::counter::cycles_per_sec());
        let swept = &self.under.swept;
        if now.wrapping_sub(swept.load(Relaxed)) < hz / 1000 {
            return;
        }
        swept.store(now, Relaxed);
        for &(_, id) in &self.under.remotes {
            if let Some(t) = self.env.ports.get(id).and_then(|p| p.tunnel())
                && t.neighbour().is_none()
                && t.should_ask(now, hz)
            {
                ask(t, &to, dv, taps);
            }
        }
    }

    /// The underlay's captures (empty but while it is captured).
    #[inline]
    fn taps(&self) -> &'a [Tap] {
        &self.env.ports.policy[self.under.port as usize].taps.0
    }

    /// Checks and decapsulates the burst's `n` frames in place. A captured underlay's captures
    /// are offered each frame as it came, between the checks and the decapsulation.
    fn sort(&mut self, n: usize) {
        let mut bytes = 0u64;
        let taps = self.taps();
        for i in 0..n {
            self.to[i] = NONE;
            let d = self.rx.frame_mut(i);
            bytes += d.len() as u64;
            // Err(None): the VTEP's own ARP, not switched but no drop.
            let checked = match check_outer(d, d.len(), self.under.local, self.under.udp_port) {
                Ok(r) => from_next_hop(self.env, self.under, d, r.remote)
                    .and_then(|port| Ok((port, r, inner_vlan(self.under, d, r)?)))
                    .map_err(Some),
                Err(Refusal::NotOurs) if self.arp(i) => Err(None),
                Err(Refusal::NotOurs) => Err(Some(DropReason::UnderlayOther)),
                Err(Refusal::BadOuter) => Err(Some(DropReason::VxlanBadOuter)),
                Err(Refusal::BadInner) => Err(Some(DropReason::VxlanBadInner)),
            };
            let d = self.rx.frame_mut(i);
            if !taps.is_empty() {
                let drop = checked.err().flatten().map(|why| why as u8);
                tap::underlay_received(self.env.cx.index, taps, d, d.len() as u32, drop);
            }
            match checked {
                Ok((port, r, vlan)) => (self.to[i], self.at[i]) = (port, decap(d, r, vlan)),
                Err(None) => {}
                Err(Some(why)) => self.pc.drop(why, 1),
            }
        }
        bump(&self.pc.rx_packets, n as u64);
        bump(&self.pc.rx_bytes, bytes);
    }

    /// Frame `i` as ARP on the underlay: a request for the VTEP's address is answered, and a
    /// tunnel's next hop that speaks is resolved. False if it is not ARP.
    fn arp(&mut self, i: usize) -> bool {
        let d = self.rx.frame_mut(i);
        if d.get(12..14) != Some(&ethertype::ARP.to_be_bytes()[..]) {
            return false;
        }
        let Ok(a) = ArpPacket::new_checked(&d[14..]) else { return false };
        let local = self.under.local;
        let (op, sha, spa, tpa) = (a.operation(), a.sender_hw(), a.sender_ip(), a.target_ip());
        if tpa != local {
            // Not about us (gratuitous ARP included: it resolves nothing here).
            return true;
        }
        if op == arp::OP_REPLY && a.target_hw() == self.nic.mac() && sha.is_unicast() && sha != MacAddr::ZERO {
            learn_neighbour(self.env, self.under, spa, sha);
        }
        if op == arp::OP_REQUEST && self.n_replies < MAX_REPLIES {
            self.replies[self.n_replies] = arp_frame(sha, arp::OP_REPLY, self.nic.mac(), local, sha, spa);
            self.n_replies += 1;
        }
        true
    }
}

/// Why a frame from the underlay is not a VXLAN frame for this tunnel endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not IPv4/UDP to our address and port at all: other traffic on the underlay.
    NotOurs,
    /// Addressed to us, but its outer headers are short or inconsistent (lengths, IP options,
    /// a fragment, the VXLAN flags).
    BadOuter,
    /// Its inner frame is shorter than an Ethernet header.
    BadInner,
}

/// What the outer headers of a received VXLAN frame said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Received {
    /// The sending tunnel endpoint (outer IPv4 source).
    pub remote: Ipv4Addr,
    pub vni: u32,
    /// The inner frame's length (it starts at `OUTER_LEN`).
    pub inner_len: usize,
}

/// Checks a frame from the underlay (`head`: at least its first `OUTER_LEN + 14` bytes, `len`:
/// its whole length) against this VTEP (`local`:`port`): IPv4 without options or
/// fragmentation, UDP to us, lengths that agree with the frame, the VXLAN I flag. A frame not
/// addressed to us is `NotOurs` (ARP, other hosts' traffic); one addressed to us but broken is
/// `BadOuter` or `BadInner`, counted apart.
#[inline]
pub(crate) fn check_outer(head: &[u8], len: usize, local: Ipv4Addr, port: u16) -> Result<Received, Refusal> {
    const IP: usize = 14;
    if head.get(12..14) != Some(&ethertype::IPV4.to_be_bytes()[..]) {
        return Err(Refusal::NotOurs);
    }
    let Some(ip) = head.get(IP..IP + 20).map(Ipv4Packet::new_unchecked) else { return Err(Refusal::NotOurs) };
    if ip.protocol() != protocol::UDP || ip.dst_addr() != local {
        return Err(Refusal::NotOurs);
    }
    let (Some(udp), Some(vx)) = (head.get(IP + 20..VXLAN_AT), head.get(VXLAN_AT..VXLAN_AT + HEADER_LEN)) else {
        return Err(Refusal::BadOuter);
    };
    let (Ok(udp), Ok(vx)) = (UdpPacket::new_checked(udp), VxlanPacket::new_checked(vx)) else {
        return Err(Refusal::BadOuter);
    };
    if udp.dst_port() != port {
        return Err(Refusal::NotOurs);
    }
    // Version 4 without options; neither a fragment nor one to come.
    let (ip_len, udp_len) = (ip.total_len() as usize, udp.len() as usize);
    if ip.version() != 4
        || ip.header_len() != 20
        || ip.is_fragment()
        || ip_len + IP > len
        || ip_len < 20 + udp_len
        || udp_len < 8 + HEADER_LEN
    {
        return Err(Refusal::BadOuter);
    }
    let Ok(VxlanRepr { vni }) = VxlanRepr::parse(&vx) else { return Err(Refusal::BadOuter) };
    let inner_len = udp_len - 8 - HEADER_LEN;
    if inner_len < 14 {
        return Err(Refusal::BadInner);
    }
    Ok(Received { remote: ip.src_addr(), vni, inner_len })
}

/// Tells every tunnel of `under` whose next hop is `ip`, and that asked for it lately, that
/// it is at `mac` (a reply to our request).
fn learn_neighbour(env: &Env, under: &Underlay, ip: Ipv4Addr, mac: MacAddr) {
    let hz = crate::counter::cycles_per_sec();
    for &(_, id) in &under.remotes {
        if let Some(t) = env.ports.get(id).and_then(|p| p.tunnel())
            && t.next_hop == ip
            && t.awaits_reply(env.now, hz)
        {
            t.learned(mac, env.now);
        }
    }
}

/// The tunnel port of remote endpoint `remote`, if frame `d` (still encapsulated) is believed to
/// come from it: a remote on the underlay's segment only from its next hop's MAC, resolved by
/// our own ARP or configured (a remote behind the gateway arrives from whichever router
/// forwarded it, which is not checked).
#[inline]
fn from_next_hop(env: &Env, under: &Underlay, d: &[u8], remote: Ipv4Addr) -> Result<u16, DropReason> {
    let port = under.tunnel(remote).ok_or(DropReason::VxlanUnknownRemote)?;
    let Some(t) = env.ports.get(port).and_then(|p| p.tunnel()) else { return Err(DropReason::VxlanUnknownRemote) };
    if t.next_hop != remote {
        return Ok(port);
    }
    match (t.neighbour(), d.get(6..12)) {
        (Some(m), Some(src)) if m.0 == src => Ok(port),
        // Unresolved: the end of the visit asks for it.
        _ => Err(DropReason::VxlanNotFromNextHop),
    }
}

/// The VLAN the inner frame of VXLAN frame `d`, which `r` describes, enters the switch in: its
/// VNI's. An unknown VNI, or an inner frame too short or tagged, is dropped.
#[inline]
pub(crate) fn inner_vlan(under: &Underlay, d: &[u8], r: Received) -> Result<u16, DropReason> {
    let vlan = under.vlan(r.vni).ok_or(DropReason::VxlanUnknownVni)?;
    let ty = d.get(OUTER_LEN + 12..OUTER_LEN + 14).ok_or(DropReason::VxlanBadInner)?;
    // RFC 7348: a decapsulated frame with a VLAN tag is dropped (the VNI is its network).
    if matches!(u16::from_be_bytes([ty[0], ty[1]]), ethertype::VLAN | ethertype::QINQ | 0x9100) {
        return Err(DropReason::VxlanBadInner);
    }
    Ok(vlan)
}

/// Decapsulates a VXLAN frame `d` that `r` describes, in place, into `vlan` (`inner_vlan`'s
/// answer): the inner frame's addresses, then an 802.1Q tag with the VLAN, then the rest of
/// the inner frame. Returns (offset, length) of the tagged inner frame.
#[inline]
pub(crate) fn decap(d: &mut [u8], r: Received, vlan: u16) -> (u16, u16) {
    let inner = OUTER_LEN..OUTER_LEN + r.inner_len;
    let start = OUTER_LEN - 4;
    d.copy_within(inner.start..inner.start + 12, start);
    d[start + 12..start + 14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
    d[start + 14..start + 16].copy_from_slice(&vlan.to_be_bytes());
    (start as u16, (r.inner_len + 4) as u16)
}

impl<'a> Source<'a> for VtepRx<'a> {
    /// The next run of frames from one remote endpoint: from this burst, else from a new one.
    #[inline]
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        while self.next < self.n && self.to[self.next] == NONE {
            self.next += 1;
        }
        if self.next >= self.n {
            self.rx.clear();
            self.n = self.rx.receive(self.nic, self.queue, max.min(MAX_BURST as usize)).unwrap_or(0);
            self.next = 0;
            self.sort(self.n);
            while self.next < self.n && self.to[self.next] == NONE {
                self.next += 1;
            }
        }
        if self.next >= self.n {
            return Ok(0);
        }
        self.run = self.to[self.next];
        let run = self.to[self.next..self.n].iter().take_while(|&&p| p == self.run).count();
        Ok(run.min(max))
    }

    #[inline]
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        for f in frames.iter_mut() {
            let (off, len) = self.at[self.next];
            self.rx.source_from(self.next, off as usize, len as usize, f.source_mut());
            f.valid = false;
            f.head = self.next as u16;
            self.next += 1;
        }
        (frames.len(), None)
    }

    /// The mbufs stay until the burst is done (`ready`, `finish`).
    #[inline]
    fn complete(&mut self, _: &[Frame<'_>], _: usize, _: &mut Delivery) {}

    #[inline]
    fn sender(&self) -> Option<u16> {
        Some(self.run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MacAddr;
    use crate::wire::vxlan::{DEFAULT_PORT, Outer};

    const LOCAL: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 11);
    const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 12);
    const IP: usize = 14;
    const UDP: usize = IP + 20;

    /// A frame from REMOTE to LOCAL with a 60-byte inner frame, as REMOTE's `Outer` fills it.
    fn received() -> Vec<u8> {
        let o =
            Outer::new(MacAddr([2, 0, 0, 0, 0, 2]), MacAddr([2, 0, 0, 0, 0, 1]), REMOTE, LOCAL, DEFAULT_PORT, 100, 64);
        let mut f = vec![0u8; OUTER_LEN + 60];
        o.fill(&mut f, 60, 7, 50000);
        f[OUTER_LEN..OUTER_LEN + 12].copy_from_slice(&[0xff; 12]);
        f
    }

    #[test]
    fn a_frame_filled_by_the_far_end_is_ours() {
        let f = received();
        assert_eq!(
            check_outer(&f, f.len(), LOCAL, DEFAULT_PORT),
            Ok(Received { remote: REMOTE, vni: 100, inner_len: 60 })
        );
    }

    #[test]
    fn frames_not_for_us_and_bad_headers_are_told_apart() {
        let f = received();
        let ok = |f: &[u8]| check_outer(f, f.len(), LOCAL, DEFAULT_PORT);
        let with = |at: usize, v: u8| {
            let mut g = f.clone();
            g[at] = v;
            g
        };
        assert_eq!(ok(&with(12, 0x86)), Err(Refusal::NotOurs), "not IPv4");
        assert_eq!(ok(&with(IP + 9, 6)), Err(Refusal::NotOurs), "TCP");
        assert_eq!(ok(&with(IP + 19, 99)), Err(Refusal::NotOurs), "another address");
        assert_eq!(ok(&with(UDP + 3, 0)), Err(Refusal::NotOurs), "another port");
        assert_eq!(ok(&f[..30]), Err(Refusal::NotOurs), "cut inside the IPv4 header");
        assert_eq!(ok(&with(IP, 0x46)), Err(Refusal::BadOuter), "IP options");
        assert_eq!(ok(&with(IP, 0x65)), Err(Refusal::BadOuter), "IP version 6 behind the IPv4 ethertype");
        assert_eq!(ok(&with(IP + 6, 0x20)), Err(Refusal::BadOuter), "more fragments");
        assert_eq!(ok(&with(VXLAN_AT, 0)), Err(Refusal::BadOuter), "no I flag");
        assert_eq!(ok(&with(IP + 2, 0xff)), Err(Refusal::BadOuter), "IP length past the frame");
        assert_eq!(ok(&with(UDP + 5, 17)), Err(Refusal::BadInner), "an inner frame of 1 byte");
        assert_eq!(ok(&f[..VXLAN_AT + 4]), Err(Refusal::BadOuter), "cut inside the VXLAN header");
        assert_eq!(
            check_outer(&f, f.len() - 10, LOCAL, DEFAULT_PORT),
            Err(Refusal::BadOuter),
            "frame shorter than IP says"
        );
    }
}
