//! Security groups in the data path, between classify and tx: a frame from a port with rules
//! (`PortPolicy::rules`, compiled by `secgroup`) is checked as that port's egress, and a frame
//! to one as its ingress, each in the port's own connection-tracking zone. A frame of a tracked
//! connection (either way: replies need no rule) or related to one (an ICMP error quoting it)
//! passes; a new connection passes if a rule of its direction allows it, and is then committed
//! (its mark says which way it opened, for a rule change to re-check: `OPENED_*`); an invalid
//! frame (a TCP segment outside the window, a fragment whose first did not pass, an echo reply
//! nobody asked for) is dropped; a later fragment passes where its first fragment passed. Frames that are not IP (ARP: its addresses are port security's, `spoof.rs`) pass,
//! and so does the traffic a port needs before any rule: DHCP as a client, neighbour discovery
//! and MLD; a guest acting as a DHCP server or sending router advertisements is dropped.
//!
//! A unicast frame is checked here for both ports; a flood or an action list's copies are
//! checked per destination as they are delivered (`admits`), from the front made deep enough
//! here. Costs nothing to a switch whose ports have no rules (`PortTable::conntrack` is None:
//! the stage is not entered), and one lookup in the shared table per port with rules a frame
//! of an established connection; no lock (the table's hits take none, `conntrack::table`).
#![forbid(unsafe_code)]

use super::Env;
use super::counters::DropReason;
use super::frame::{FRONT_MAX, Frame, Out, ct_seen};
use crate::config::secgroup::Direction;
use crate::conntrack::{BURST, Commit, Conntrack, CtPacket, Tuple, state};
use crate::secgroup::PortRules;
use crate::wire::{ethertype, protocol};

/// A committed connection's `ct_mark`: it opened toward the port.
pub const OPENED_INGRESS: u32 = 1;
/// It opened from the port.
pub const OPENED_EGRESS: u32 = 2;
/// Added to the mark when a rule change no longer allows the connection: its frames, either
/// way, are dropped until it expires (as OpenStack's firewall marks them; removing it would
/// let the next frame the other way open it again).
pub const CUT: u32 = 4;

/// What port rules `rules` (None: the port has none any more, or is gone) make of the tracked
/// connections of `zone`: those they no longer allow are cut, those they allow again are
/// not; a port without rules loses its connections. Returns how many changed.
pub fn rules_changed(ct: &Conntrack, zone: u16, rules: Option<&PortRules>) -> usize {
    let Some(rules) = rules else { return ct.flush(Some(zone)) };
    ct.remark(zone, |t, mark| {
        let allowed = match mark & !CUT {
            OPENED_INGRESS => rules.allows(Direction::Ingress, t),
            OPENED_EGRESS => rules.allows(Direction::Egress, t),
            _ => true,
        };
        if allowed { mark & !CUT } else { mark | CUT }
    })
}

/// The stage: checks each frame of a classified burst from `in_port` against the rules of its
/// sender and of its (unicast) destination. A frame one denies is dropped: counted on the
/// sender for its egress, on the destination for its ingress.
///
/// Each frame is parsed once as the tracker sees it, for both checks. In a table large enough
/// (`Conntrack::worth_prefetching`) a burst's lookups are started together: each frame's
/// connection's place in each zone it is checked in starts loading, then the slots there, and
/// the checks find them in the cache.
pub(super) fn filter_burst(env: &Env, ct: &Conntrack, in_port: u16, frames: &mut [Frame]) {
    let now = ct.clock();
    let egress = env.ports.policy[in_port as usize].rules.as_deref();
    if !ct.worth_prefetching() {
        for f in frames.iter_mut() {
            if let Some(ingress) = to_check(env, egress, f) {
                let pkt = ct_packet(f);
                check_frame(env, ct, egress, ingress, f, &pkt, now);
            }
        }
        return;
    }
    for frames in frames.chunks_mut(BURST) {
        // Per frame to check: the tracker's view of it and its destination's rules.
        let mut todo = [None; BURST];
        let mut places = [[None; 2]; BURST];
        for ((f, todo), places) in frames.iter_mut().zip(todo.iter_mut()).zip(places.iter_mut()) {
            let Some(ingress) = to_check(env, egress, f) else { continue };
            let pkt = ct_packet(f);
            *places = [
                egress.and_then(|r| ct.prefetch_tags(&pkt, r.zone)),
                ingress.and_then(|(_, r)| ct.prefetch_tags(&pkt, r.zone)),
            ];
            *todo = Some((pkt, ingress));
        }
        for place in places.iter().flatten().flatten() {
            ct.prefetch_slots(*place);
        }
        for (f, todo) in frames.iter_mut().zip(todo) {
            if let Some((pkt, ingress)) = todo {
                check_frame(env, ct, egress, ingress, f, &pkt, now);
            }
        }
    }
}

/// Whether frame `f` is checked here (None: not, or per destination at delivery), and then
/// its unicast destination and that port's rules, if it has any; its front made deep enough.
#[inline]
fn to_check<'a>(env: &'a Env, egress: Option<&PortRules>, f: &mut Frame) -> Option<Option<(u16, &'a PortRules)>> {
    let ingress = match f.out {
        Out::Drop(_) | Out::Nowhere | Out::Pipeline(_) => return None,
        Out::Port(p) | Out::Routed(p, _) => env.ports.policy[p as usize].rules.as_deref().map(|r| (p, r)),
        // The switch's own answer (its gateway's): the sender's egress rules only.
        Out::Answer => None,
        // Checked per destination as delivered (`admits`), from this front.
        Out::Flood | Out::Actions(_) | Out::Path(_) => {
            f.deepen_front(FRONT_MAX);
            None
        }
    };
    if egress.is_none() && ingress.is_none() {
        return None;
    }
    f.deepen_front(FRONT_MAX);
    Some(ingress)
}

/// Frame `f` (`pkt` to the tracker) checked against its sender's rules (`egress`), then its
/// destination's (`ingress`): dropped where one denies it (counted on the destination for its
/// ingress), and what the tracker said of it kept in the frame.
#[inline]
fn check_frame(
    env: &Env,
    ct: &Conntrack,
    egress: Option<&PortRules>,
    ingress: Option<(u16, &PortRules)>,
    f: &mut Frame,
    pkt: &CtPacket,
    now: u32,
) {
    let mut seen = 0;
    if let Some(rules) = egress
        && let Err(why) = check(ct, rules, Direction::Egress, f, pkt, now, &mut seen)
    {
        f.out = Out::Drop(why);
        f.ct = seen;
        return;
    }
    if let Some((p, rules)) = ingress
        && let Err(why) = check(ct, rules, Direction::Ingress, f, pkt, now, &mut seen)
    {
        env.cx.stats.ports[p as usize].drop(why, 1);
        f.out = Out::Nowhere;
    }
    f.ct = seen;
}

/// Whether port `p` takes a copy of `f` (flooded, or an action list's): its ingress rules, if
/// it has any. A copy it refuses is counted on it.
#[inline]
pub(super) fn admits(env: &Env, p: u16, f: &Frame) -> bool {
    let (Some(ct), Some(rules)) = (env.ports.conntrack.as_deref(), env.ports.policy[p as usize].rules.as_deref())
    else {
        return true;
    };
    match check(ct, rules, Direction::Ingress, f, &ct_packet(f), ct.clock(), &mut 0) {
        Ok(()) => true,
        Err(why) => {
            env.cx.stats.ports[p as usize].drop(why, 1);
            false
        }
    }
}

/// The verdict of `rules` on frame `f` (`pkt` as the tracker sees it) crossing their port in
/// direction `dir`; `seen` gets what the tracker said of it (`Frame::ct`'s form), if it was
/// tracked.
fn check(
    ct: &Conntrack,
    rules: &PortRules,
    dir: Direction,
    f: &Frame,
    pkt: &CtPacket,
    now: u32,
    seen: &mut u32,
) -> Result<(), DropReason> {
    let front = f.front();
    let Some((ty, l3)) = ip_of(front) else { return Ok(()) };
    let verdict = |pass: bool| if pass { Ok(()) } else { Err(DropReason::SecurityGroup) };
    let tuple = match *pkt {
        CtPacket::NotIp => return Ok(()),
        // Neighbour discovery and MLD are no connection: the tracker calls them invalid.
        CtPacket::Invalid => {
            return match (ty == ethertype::IPV6).then(|| icmpv6_before_rules(&front[l3..], dir)).flatten() {
                Some(pass) => verdict(pass),
                None => Err(DropReason::CtInvalid),
            };
        }
        CtPacket::Conn { tuple, .. } => {
            if let Some(pass) = dhcp_before_rules(&tuple, dir) {
                return verdict(pass);
            }
            Some(tuple)
        }
        // An ICMP error, a fragment after the first: what their connection's verdict was.
        CtPacket::Error { .. } | CtPacket::Fragment { .. } => None,
    };
    let tracked = ct.track(pkt, rules.zone, None, now);
    *seen = ct_seen(rules.zone, tracked.state);
    if tracked.state & state::INV != 0 {
        return Err(DropReason::CtInvalid);
    }
    if tracked.mark & CUT != 0 {
        return Err(DropReason::SecurityGroup);
    }
    // Established, related, or committed already (its first frames before any reply).
    if tracked.state & (state::EST | state::REL) != 0 || tracked.mark != 0 {
        return Ok(());
    }
    let Some(tuple) = tuple else { return Err(DropReason::CtInvalid) };
    if !rules.allows(dir, &tuple) {
        return Err(DropReason::SecurityGroup);
    }
    let mark = match dir {
        Direction::Ingress => OPENED_INGRESS,
        Direction::Egress => OPENED_EGRESS,
    };
    match ct.track(pkt, rules.zone, Some(Commit { mark: Some((mark, u32::MAX)) }), now).refused {
        None => Ok(()),
        Some(_) => Err(DropReason::CtLimit),
    }
}

/// Frame `f` as the tracker sees it (its front deep enough for the headers it reads).
#[inline]
pub(super) fn ct_packet(f: &Frame) -> CtPacket {
    let front = f.front();
    match ip_of(front) {
        Some((ty, l3)) => CtPacket::parse(ty, &front[l3..], (f.len as usize).saturating_sub(l3)),
        None => CtPacket::NotIp,
    }
}

/// The IP ethertype of a frame and where its IP header starts (past up to two VLAN tags);
/// None for what is not IP.
pub(super) fn ip_of(front: &[u8]) -> Option<(u16, usize)> {
    let mut at = 12;
    for _ in 0..3 {
        let ty = u16::from_be_bytes(front.get(at..at + 2)?.try_into().ok()?);
        match ty {
            ethertype::VLAN | ethertype::QINQ => at += 4,
            ethertype::IPV4 | ethertype::IPV6 => return Some((ty, at + 2)),
            _ => return None,
        }
    }
    None
}

const DHCP_SERVER: u16 = 67;
const DHCP_CLIENT: u16 = 68;
const DHCP6_CLIENT: u16 = 546;
const DHCP6_SERVER: u16 = 547;

/// DHCP before any rule, as OpenStack's firewall allows it: a port may be a client (IPv4 and
/// IPv6: Some(true)), not a server (Some(false)). None: not DHCP, the rules decide.
fn dhcp_before_rules(t: &Tuple, dir: Direction) -> Option<bool> {
    if t.proto != protocol::UDP {
        return None;
    }
    let egress = dir == Direction::Egress;
    match (t.sport, t.dport) {
        (DHCP_CLIENT, DHCP_SERVER) | (DHCP6_CLIENT, DHCP6_SERVER) => Some(egress),
        (DHCP_SERVER, DHCP_CLIENT) | (DHCP6_SERVER, DHCP6_CLIENT) => Some(!egress),
        _ => None,
    }
}

/// ICMPv6 before any rule (the IPv6 packet `l3`): neighbour discovery and MLD (behind
/// hop-by-hop, routing and destination options) pass, router advertisements only toward the
/// port. None: another message, or not ICMPv6.
fn icmpv6_before_rules(l3: &[u8], dir: Direction) -> Option<bool> {
    let egress = dir == Direction::Egress;
    let (mut nh, mut at) = (*l3.get(6)?, 40);
    for _ in 0..4 {
        if !matches!(nh, 0 | 43 | 60) {
            break;
        }
        nh = *l3.get(at)?;
        at += (*l3.get(at + 1)? as usize + 1) * 8;
    }
    if nh != protocol::ICMPV6 {
        return None;
    }
    match *l3.get(at)? {
        // MLD queries, reports, done; MLDv2 reports; neighbour solicitations, advertisements.
        130..=132 | 143 | 135 | 136 => Some(true),
        // Router solicitation from the port, advertisement toward it.
        133 => Some(egress),
        134 => Some(!egress),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ty: u16, l3: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(l3);
        f
    }

    #[test]
    fn what_passes_before_the_rules() {
        use Direction::*;
        let udp = |sport: u16, dport: u16| Tuple {
            src: [0; 16],
            dst: [255; 16],
            sport,
            dport,
            proto: protocol::UDP,
            v6: false,
        };
        assert_eq!(dhcp_before_rules(&udp(68, 67), Egress), Some(true), "a DHCP request");
        assert_eq!(dhcp_before_rules(&udp(68, 67), Ingress), Some(false));
        assert_eq!(dhcp_before_rules(&udp(67, 68), Ingress), Some(true), "a DHCP offer to the port");
        assert_eq!(dhcp_before_rules(&udp(67, 68), Egress), Some(false), "a guest's DHCP server");
        assert_eq!(dhcp_before_rules(&udp(546, 547), Egress), Some(true), "DHCPv6");
        assert_eq!(dhcp_before_rules(&udp(5000, 53), Egress), None);
        assert_eq!(dhcp_before_rules(&Tuple { proto: protocol::TCP, ..udp(68, 67) }, Egress), None);
        let icmp6 = |ty: u8, hop_by_hop: bool| {
            let mut p = vec![0x60, 0, 0, 0, 0, 8, if hop_by_hop { 0 } else { 58 }, 255];
            p.extend_from_slice(&[0; 32]);
            if hop_by_hop {
                p.extend_from_slice(&[58, 0, 5, 2, 0, 0, 1, 0]);
            }
            p.extend_from_slice(&[ty, 0, 0, 0, 0, 0, 0, 0]);
            p
        };
        for (ty, egress, ingress) in [(135, true, true), (136, true, true), (133, true, false), (134, false, true)] {
            let p = icmp6(ty, false);
            assert_eq!(icmpv6_before_rules(&p, Egress), Some(egress), "type {ty} out");
            assert_eq!(icmpv6_before_rules(&p, Ingress), Some(ingress), "type {ty} in");
            // And the tracker indeed calls them invalid, so the stage gets to ask.
            assert_eq!(CtPacket::parse(ethertype::IPV6, &p, p.len()), CtPacket::Invalid, "type {ty}");
        }
        assert_eq!(icmpv6_before_rules(&icmp6(143, true), Egress), Some(true), "MLDv2 behind hop-by-hop");
        assert_eq!(icmpv6_before_rules(&icmp6(128, false), Egress), None, "an echo: the rules'");
        assert_eq!(ip_of(&eth(ethertype::ARP, &[0; 28])), None);
        let mut tagged = eth(ethertype::IPV4, &[0x45; 28]);
        tagged.splice(12..12, [0x81, 0, 0, 10]);
        assert_eq!(ip_of(&tagged), Some((ethertype::IPV4, 18)));
    }
}
