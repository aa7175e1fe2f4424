//! Classify: where each frame of a burst goes. Frames too short, over the port's MTU, or from a
//! source MAC the port may not use are dropped. With no flow table, NORMAL (MAC learning, then
//! known unicast to its port, everything else flooded) reads only the two addresses. A table
//! whose flows match on in_port alone answers by port, once a burst. Any other table: a first
//! pass (`classify_burst`) extracts each frame's key to the table's depth and prefetches its
//! cache set, a second (`lookup_flows`) looks the keys up in the exact-match cache and then the
//! classifier. The first pass picks its mode (NORMAL, by port, by key) once a burst and runs
//! that mode's loop; the rare cases (a header asking for offloads, a drop) are out of line.
#![forbid(unsafe_code)]

use super::Env;
use super::counters::{DropReason, bump};
use super::frame::{FRONT, FRONT_MAX, Frame, NO_VLAN};
use super::frame::{FlowState, Out};
use super::mac_table::Learned;
use super::plan::{Learning, PortPolicy};
use super::route;
use super::spoof::{self, Source};
use super::vlan::ingress_vlan;
use crate::flow::table::{NO_MATCH, Verdict};
use crate::flow::{Depth, Emc, FlowKey, FrameBytes, PacketKey};
use crate::port::Port;
use crate::wire::gso::{self, Offload, OffloadError};
use crate::wire::virtio_net::Negotiated;
use crate::wire::{MacAddr, VirtioNetHdr, virtio_net};

/// The first pass over a burst: where each frame goes. With no flow table: MAC learning on
/// the source, lookup on the destination, flooding for broadcast, multicast and unknown
/// unicast (OVS's NORMAL). With one: each frame's key, for [`lookup_flows`].
///
/// The table's mode, the port's MTU and what the sender negotiated are read once a burst (a
/// burst is switched as of one moment), and each mode's loop is its own: one call a burst, not
/// one a frame, and the rare cases (a header asking for an offload, a drop) out of the loops.
///
/// Fronts are copied for the whole burst before any frame is classified: the copies of a burst
/// overlap one another's cache misses, and no decision then loads from a copy whose stores are
/// still in flight (a load that spans two of them waits until both are done: with the copy and
/// the reads of one frame back to back, a flow table's field reads cost 12% of the rate).
#[inline]
pub(super) fn classify_burst(env: &Env, emc: &Emc, recent: &mut Recent, sender: &Sender, frames: &mut [Frame]) {
    let (in_port, policy) = (sender.in_port.id, sender.policy);
    if policy.mirrors.output {
        return sender.refuse_all(frames, DropReason::MirrorOutput);
    }
    let admitted = |f: &Frame| !matches!(f.out, Out::Drop(_));
    if env.flows.is_normal() {
        for f in frames.iter_mut() {
            if sender.admit(env, f) {
                f.take_front(front_for(f, L2_FRONT));
            }
        }
        for f in frames.iter_mut().filter(|f| admitted(f)) {
            classify_normal(env, recent, in_port, policy, f);
        }
    } else if let Some(i) = env.flows.port_flow(in_port) {
        // Flows on in_port alone read a frame only for port security or NORMAL, each taking
        // its front when it does: the others are delivered whole from the sender.
        for f in frames {
            if sender.admit(env, f) {
                classify_port_flow(env, recent, in_port, policy, f, i);
            }
        }
    } else {
        let (scope, depth) = (env.flows.scope(), env.flows.depth());
        let need = if depth == Depth::L2 { L2_FRONT } else { FRONT };
        for f in frames.iter_mut() {
            if sender.admit(env, f) {
                f.take_front(front_for(f, need));
            }
        }
        for f in frames.iter_mut().filter(|f| admitted(f)) {
            extract_key(emc, recent, sender, f, scope, depth);
        }
    }
}

/// The front a decision that reads `need` bytes of a frame takes: those bytes, or the whole
/// frame when it fits in [`FRONT`] (a small frame is then delivered from the front alone, no
/// guest memory read again). A longer frame's front is only what is read: its delivery copies
/// the rest from the sender in one piece, as long a piece as it can be (a 64-byte front cost
/// a 1518-byte frame a second line read in classify and a split copy).
#[inline(always)]
fn front_for(f: &Frame, need: usize) -> usize {
    if f.len as usize <= FRONT { FRONT } else { need }
}

/// What NORMAL reads of a frame: its addresses, and its outer tag with the type after it
/// (a VLAN's, and whether a second tag follows).
const L2_FRONT: usize = 18;

/// The port a visit's frames come from, and what each of its frames is checked against before
/// it is classified. Read once a visit.
pub(super) struct Sender<'a> {
    in_port: &'a Port,
    /// Its port security.
    policy: &'a PortPolicy,
    /// Its virtio-net header's length (0 for a NIC).
    hdr_len: u32,
    /// The offloads it negotiated.
    negotiated: &'a Negotiated,
    /// It negotiated an offload, so its header is read.
    offloads: bool,
    max_frame: u32,
}

impl<'a> Sender<'a> {
    pub fn new(in_port: &'a Port, policy: &'a PortPolicy, hdr_len: u32, negotiated: &'a Negotiated) -> Sender<'a> {
        let offloads = hdr_len > 0 && negotiated.any();
        Sender { in_port, policy, hdr_len, negotiated, offloads, max_frame: in_port.max_frame() }
    }

    pub fn policy(&self) -> &'a PortPolicy {
        self.policy
    }

    /// Drops every frame of a burst for `why` (from a port that may send nothing).
    #[cold]
    fn refuse_all(&self, frames: &mut [Frame], why: DropReason) {
        for f in frames {
            f.place(self.hdr_len);
            f.flow = FlowState::Unmatched;
            f.ct = 0;
            f.out = Out::Drop(why);
        }
    }

    /// Resets `f`'s classification and checks it: long enough for an Ethernet header, within
    /// the MTU, and (from a sender that negotiated offloads) with a header that asks only for
    /// what was negotiated. False if it is dropped (`f.out` says why).
    #[inline(always)]
    fn admit(&self, env: &Env, f: &mut Frame) -> bool {
        f.place(self.hdr_len);
        f.out = Out::Nowhere;
        f.vlan = NO_VLAN;
        f.flow = FlowState::Unmatched;
        f.off = Offload::NONE;
        f.ct = 0;
        if f.len < 14 {
            f.out = Out::Drop(DropReason::Runt);
            return false;
        }
        // Every decision from here on reads the switch's copy of the frame's front, and every
        // destination gets that copy (`frame`): a sender rewriting its buffer cannot change
        // what was decided on. A frame asking for offloads takes its longer front there.
        // A guest's frames (a NIC's have no header): the header must ask only for what the
        // sender negotiated. A sender that negotiated no offload must leave its header zero
        // (the virtio spec's rules for transmission), and its header is not read at all: as
        // in DPDK's vhost, and as Linux's comment on the header says, without CSUM or GSO it
        // is ignored. Reading it cost a cache miss a frame on a line the sender's core had
        // just written (docs/benchmark-history.md has the measurement).
        if self.offloads {
            return self.offloaded(env, f);
        }
        // The front is taken by whatever reads the frame first (`take_front`): a frame no
        // decision reads (flows on in_port alone, no port security) is copied in one piece
        // from the sender, as no byte of it was decided on.
        if f.len > self.max_frame {
            f.out = Out::Drop(DropReason::Mtu);
            return false;
        }
        true
    }

    /// [`Sender::admit`]'s checks of a frame whose sender negotiated offloads.
    #[inline(never)]
    fn offloaded(&self, env: &Env, f: &mut Frame) -> bool {
        match offload(f, self.negotiated) {
            Ok(o) => f.off = o,
            Err(e) => {
                f.out = Out::Drop(e.into());
                return false;
            }
        }
        // The MTU applies to what goes on a wire: a TSO frame's segments, not the frame.
        let too_big = match f.off.tso {
            Some(t) => {
                bump(&env.cx.stats.ports[self.in_port.id as usize].rx_gso, 1);
                f.len > gso::MAX_FRAME || t.hdr_len as u32 + t.mss as u32 > self.max_frame
            }
            None => f.len > self.max_frame,
        };
        if too_big {
            f.out = Out::Drop(DropReason::Mtu);
            return false;
        }
        true
    }
}

/// NORMAL, with no flow table: only the two addresses are read, straight into registers.
#[inline(always)]
fn classify_normal(env: &Env, recent: &mut Recent, in_port: u16, policy: &PortPolicy, f: &mut Frame) {
    let Some(addrs) = f.front_at::<12>(0) else {
        f.out = Out::Drop(DropReason::Runt);
        return;
    };
    f.out = if !policy.allows(&MacAddr::from_bytes(&addrs[6..12])) {
        Out::Drop(DropReason::PortSecurity)
    } else if !policy.allowed_ips.is_empty() && !source_ip_ok(policy, f) {
        Out::Drop(DropReason::IpSpoofed)
    } else {
        normal_frame(env, recent, in_port, policy, f, &addrs)
    };
}

/// Port security by address (`spoof.rs`), for a port with `allowed_ips`: false if the frame's
/// source address is not the port's. The front grows if the check reads past it (a copy
/// more for a large frame on such a port; ports without the feature keep their short front).
#[cold]
fn source_ip_ok(policy: &PortPolicy, f: &mut Frame) -> bool {
    loop {
        let had = f.front().len();
        match spoof::check(&policy.allowed_ips, f.front(), f.len as usize) {
            Source::Allowed => return true,
            Source::Spoofed => return false,
            Source::Deeper(n) => {
                f.deepen_front(n);
                if f.front().len() <= had {
                    // Past what the switch copies: not checkable, so not allowed.
                    return false;
                }
            }
        }
    }
}

/// NORMAL for one frame whose two addresses are `addrs`: by VLAN if the switch has VLANs
/// (the frame's VLAN is set, or it is dropped for a VLAN its port may not use).
#[inline(always)]
pub(super) fn normal_frame(
    env: &Env,
    recent: &mut Recent,
    in_port: u16,
    policy: &PortPolicy,
    f: &mut Frame,
    addrs: &[u8; 12],
) -> Out {
    if !env.ports.vlans {
        return normal_in_burst(env, recent, in_port, 0, addrs);
    }
    match ingress_vlan(&policy.vlan, f) {
        Ok((vid, tag)) => {
            (f.vlan, f.tag) = (vid, tag);
            // A VRF's network: its gateway routes and answers (`route/`) before NORMAL.
            if let Some(routes) = env.ports.routes.as_deref()
                && let Some(out) = route::decide(routes, f, in_port, &policy.vlan, vid, addrs)
            {
                return out;
            }
            normal_in_burst(env, recent, in_port, vid, addrs)
        }
        Err(why) => Out::Drop(why),
    }
}

/// Flows on in_port alone: the flow (`i`) is known from the port. Its burst's later frames go
/// where the first went, unread, unless port security needs their source.
#[inline(always)]
fn classify_port_flow(env: &Env, recent: &mut Recent, in_port: u16, policy: &PortPolicy, f: &mut Frame, i: u32) {
    if let Some(out) = recent.port_out
        && policy.allows_any()
    {
        f.flow = FlowState::Hit(i);
        f.out = out;
        return;
    }
    // The two addresses are all that is read (for port security, and NORMAL's VLAN); port
    // security by address reads deeper itself (`source_ip_ok`).
    f.take_front(front_for(f, L2_FRONT));
    let Some(addrs) = f.front_at::<12>(0) else {
        f.out = Out::Drop(DropReason::Runt);
        return;
    };
    if !policy.allows(&MacAddr::from_bytes(&addrs[6..12])) {
        f.out = Out::Drop(DropReason::PortSecurity);
        return;
    }
    if !policy.allowed_ips.is_empty() && !source_ip_ok(policy, f) {
        f.out = Out::Drop(DropReason::IpSpoofed);
        return;
    }
    f.flow = FlowState::Hit(i);
    f.out = match recent.port_out {
        Some(out) => out,
        None => {
            let out = verdict(env, recent, in_port, policy, f, i);
            // The same for every frame of the burst, unless NORMAL decides by address.
            if i == NO_MATCH || env.flows.verdict(i) != Verdict::Normal {
                recent.port_out = Some(out);
            }
            out
        }
    };
}

/// Any other table: the frame's key, extracted to the table's depth and under its scope, and
/// its cache set prefetched, for [`lookup_flows`].
#[inline(always)]
fn extract_key(emc: &Emc, recent: &mut Recent, sender: &Sender, f: &mut Frame, scope: &PacketKey, depth: Depth) {
    let (in_port, policy) = (sender.in_port.id, sender.policy);
    // A table that reads L4 fields reads them wherever they are: IPv4 options can put them
    // past the front's usual 64 bytes, which then grows to hold them (a rule on a port must
    // not be passed by moving the port out of sight).
    if depth == Depth::L4 && f.front().len() < f.len as usize {
        let need = FlowKey::l4_end(f.front());
        if need > f.front().len() {
            f.deepen_front(need);
        }
    }
    if !policy.allowed_ips.is_empty() && !source_ip_ok(policy, f) {
        f.out = Out::Drop(DropReason::IpSpoofed);
        return;
    }
    // Only as much of the frame as the table's fields need.
    let front = f.front();
    let head = if depth == Depth::L2 { &front[..18.min(front.len())] } else { front };
    // At least the 14-byte header: shorter frames were dropped as runts. The source is read
    // here only for port security.
    if !policy.allows_any() && !head.at::<6>(6).is_some_and(|src| policy.allows(&MacAddr(src))) {
        f.out = Out::Drop(DropReason::PortSecurity);
        return;
    }
    let key = PacketKey::extract_under(in_port, head, scope, depth);
    // A repeat of the previous pending frame's key (under the table's scope, the common case
    // in a burst) takes that frame's flow (`Repeat`); any other key's cache entry starts
    // loading now, while the rest of the burst is read, for `lookup_flows`.
    if recent.key == Some(key) {
        f.flow = FlowState::Repeat;
        return;
    }
    f.hash = key.hash();
    emc.prefetch(f.hash);
    recent.key = Some(key);
    f.key = key;
    f.flow = FlowState::Pending;
}

/// The second pass over a burst with a flow table: each frame [`classify_burst`] left pending
/// takes its flow, through the exact-match cache (with the key's hash) and the classifier, and
/// that flow's verdict; a repeat takes the flow of the pending frame before it, whose key it
/// has: the frames are in the first pass's order, and that frame is the last looked up.
#[inline]
pub(super) fn lookup_flows(
    env: &Env,
    emc: &mut Emc,
    recent: &mut Recent,
    in_port: u16,
    policy: &PortPolicy,
    frames: &mut [Frame],
) {
    let mut last = NO_MATCH;
    for f in frames {
        let i = match f.flow {
            FlowState::Pending => {
                last = env.flows.classify_masked(emc, &f.key, f.hash);
                last
            }
            FlowState::Repeat => last,
            FlowState::Unmatched | FlowState::Hit(_) => continue,
        };
        f.flow = FlowState::Hit(i);
        f.out = verdict(env, recent, in_port, policy, f, i);
    }
}

/// Where a frame that hit flow `i` goes.
#[inline(always)]
fn verdict(env: &Env, recent: &mut Recent, in_port: u16, policy: &PortPolicy, f: &mut Frame, i: u32) -> Out {
    if i == NO_MATCH {
        return Out::Drop(DropReason::NoMatch);
    }
    match env.flows.verdict(i) {
        Verdict::Normal => match f.front_at::<12>(0) {
            Some(addrs) => normal_frame(env, recent, in_port, policy, f, &addrs),
            None => Out::Drop(DropReason::Runt),
        },
        // As in OpenFlow, output to the input port is a no-op; `in_port` is how to send back.
        Verdict::Output(p) if p == in_port => Out::Nowhere,
        Verdict::Output(p) => Out::Port(p),
        Verdict::InPort => Out::Port(in_port),
        Verdict::Flood => Out::Flood,
        Verdict::Drop => Out::Drop(DropReason::FlowDrop),
        Verdict::Actions => Out::Actions(i),
        Verdict::Pipeline => Out::Pipeline(i),
    }
}

impl Recent {
    /// Forgets the previous burst.
    #[inline]
    pub(super) fn new_burst(&mut self) {
        self.normal = None;
        self.key = None;
        self.port_out = None;
    }
}

/// The offload a frame's virtio-net header asks for, checked against the frame and what its
/// sender negotiated. A header asking for nothing (flags and gso_type zero) costs one read.
/// Either way the frame's front is taken: the headers an offload asks for, up to TSO's
/// longest, so segments are built from the headers checked here.
#[inline]
fn offload(f: &mut Frame, sender: &Negotiated) -> Result<Offload, OffloadError> {
    let h = f.sender_header::<{ virtio_net::HDR_LEN_LEGACY }>();
    let Some(h) = h.filter(|h| h[0] != 0 || h[1] != 0) else {
        f.take_front(FRONT);
        return Ok(Offload::NONE);
    };
    f.take_front(FRONT_MAX);
    let h = VirtioNetHdr::parse(&h).map_err(|_| OffloadError::GsoHeaders)?;
    let o = Offload::parse(&h, &f.front()[..f.front().len().min(gso::MAX_HDR)], f.len, sender)?;
    // What a destination that cannot take the offload gets is built from the front alone.
    match o.tso {
        Some(t) if t.hdr_len as usize > f.front().len() => Err(OffloadError::GsoHeaders),
        _ => Ok(o),
    }
}

/// What the previous frames of a burst were switched by: the addresses (destination,
/// source) of the last frame that went through NORMAL and where it went, and the last flow
/// keys (under the flow table's scope) seen.
#[derive(Default)]
pub(super) struct Recent {
    /// The last NORMAL frame's addresses, its VLAN, and where it went.
    normal: Option<([u8; 12], u16, Out)>,
    /// The last pending frame's key (classify's first pass): the next frame with the same key
    /// is a repeat.
    key: Option<PacketKey>,
    /// With flows on in_port alone: where this burst's frames go (the flow's verdict does not
    /// depend on the frame, unless it is NORMAL).
    port_out: Option<Out>,
}

/// NORMAL for a frame of a burst: frames of one burst mostly share their addresses, and a
/// repeat of the previous frame's pair goes where that frame went without learning (already
/// learned) or looking up again. A burst is switched as of one moment.
#[inline]
fn normal_in_burst(env: &Env, recent: &mut Recent, in_port: u16, vid: u16, addrs: &[u8; 12]) -> Out {
    if let Some((a, v, out)) = recent.normal
        && a == *addrs
        && v == vid
    {
        return out;
    }
    let out = normal(env, in_port, vid, &MacAddr::from_bytes(&addrs[0..6]), &MacAddr::from_bytes(&addrs[6..12]));
    recent.normal = Some((*addrs, vid, out));
    out
}

/// Learning on a switch with tunnels: a tunnel learns no MAC a local port owns (a frame from
/// the underlay cannot move a VM's address behind it), and nothing at all where its VTEP's
/// control plane says where remote MACs are.
#[inline(never)]
fn learn_with_tunnels(env: &Env, in_port: u16, vid: u16, src: &MacAddr) -> Learned {
    match env.ports.policy[in_port as usize].learning {
        Learning::Any => env.cx.mac.learn(src, vid, in_port),
        Learning::NotOwned if env.ports.owned(src) => Learned::Refused,
        Learning::NotOwned => env.cx.mac.learn(src, vid, in_port),
        Learning::Off => Learned::Yes,
    }
}

/// The NORMAL action, in VLAN `vid` (0 on a switch without VLANs): learn the source, forward
/// to where the destination was learned, flood broadcast, multicast and unknown unicast (in
/// the VLAN). A learned port that no longer carries the VLAN is no destination.
#[inline]
pub(super) fn normal(env: &Env, in_port: u16, vid: u16, dst: &MacAddr, src: &MacAddr) -> Out {
    if src.is_unicast() {
        let learned = match env.ports.tunnels {
            false => env.cx.mac.learn(src, vid, in_port),
            true => learn_with_tunnels(env, in_port, vid, src),
        };
        if learned == Learned::Refused {
            bump(&env.cx.stats.ports[in_port as usize].learn_refused, 1);
        }
    }
    if dst.is_multicast() {
        return Out::Flood;
    }
    match env.cx.mac.lookup(dst, vid) {
        Some(p) if p == in_port => Out::Nowhere,
        Some(p)
            if env.ports.get(p).is_some() && (!env.ports.vlans || env.ports.policy[p as usize].vlan.carries(vid)) =>
        {
            Out::Port(p)
        }
        _ => Out::Flood,
    }
}
