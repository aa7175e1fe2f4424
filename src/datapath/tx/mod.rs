//! Delivery: a burst's frames to their destinations, in order (the "actions -> port tx" half
//! of the data path). A destination guest RX queue is held open across consecutive frames to
//! it; a full destination holds the rest of the burst back in the sender's ring (backpressure,
//! bounded by `retry_cycles`); flow action lists run on a rewritten header; `guest.rs` copies
//! each frame once into a guest's receive buffers (`write_frame`).
#![forbid(unsafe_code)]

pub mod delivery;
pub mod guest;
pub(in crate::datapath) mod mirror;
pub mod nic;
pub(crate) mod offload;
mod route;
pub(crate) mod vxlan;

use self::delivery::{Delivery, FLOOD_BACKOFF_MAX, FloodSkip};
use self::guest::{RxRing, WriteError, write_frame};
use self::nic::NicDest;
use self::offload::Segments;
use self::vxlan::encap;
use crate::datapath::classify::normal;
use crate::datapath::counters::{DropReason, PortCounters, bump, cycles};
use crate::datapath::firewall;
use crate::datapath::frame::{AS_IS, Frame, NO_VLAN, Out, Shape};
use crate::datapath::plan::PortPolicy;
use crate::datapath::tap;
use crate::datapath::vlan::{Retag, egress_tagging, header_for, header_vlan, retag};
use crate::datapath::{Ctx, Env, ring_broke};
use crate::flow::table::NO_MATCH;
use crate::flow::{Action, Emit, execute_path};
use crate::port::rate::Cost;
use crate::port::tunnel::Tunnel;
use crate::port::{Port, PortKind};
use crate::vring::{ActiveRing, RingError, Vring, VringGuard};
use crate::wire::virtio_net::Negotiated;
use crate::wire::{EthernetRepr, VirtioNetHdr, ethernet, tcp, virtio_net};

/// A guest RX queue held open while consecutive frames go to the same port, so a burst to one
/// destination costs one lock, one used-index store and at most one interrupt.
struct Open<'a> {
    env: &'a Env<'a>,
    cx: &'a Ctx,
    port: &'a Port,
    vq_index: usize,
    /// The guest RX queue; None for a NIC port (frames go to the thread's TX batch for it).
    guard: Option<VringGuard<'a>>,
    packets: u64,
    bytes: u64,
    /// The port has an egress rate cap (read once, when it is opened).
    capped: bool,
    /// It has a cap, a capture or a mirror of what it is given: its frames take `write_slow`.
    slow: bool,
    /// Its policy: its VLAN config (how NORMAL's frames leave it, on a switch with VLANs),
    /// its captures and mirrors.
    policy: &'a PortPolicy,
    /// A tunnel port: its remote endpoint and the underlay its frames leave through.
    tunnel: Option<(&'a Tunnel, NicDest<'a>)>,
    /// The iteration's start (TSC).
    now: u64,
}

impl<'a> Open<'a> {
    fn new(env: &'a Env<'a>, p: u16) -> Option<Open<'a>> {
        let port = &**env.ports.get(p)?;
        let policy = &env.ports.policy[p as usize];
        let open = |guard, vq_index, capped: bool, tunnel| Open {
            env,
            cx: env.cx,
            port,
            vq_index,
            guard,
            packets: 0,
            bytes: 0,
            capped,
            slow: capped || policy.watched_dst,
            policy,
            tunnel,
            now: env.now,
        };
        match &port.kind {
            PortKind::VhostUser(queues) => {
                let (vq_index, vq) = queues.rx_queue_for(env.src_q.get())?;
                let guard = vq.lock();
                let capped = port.rates.egress_capped();
                guard.is_ready().then(|| open(Some(guard), vq_index, capped, None))
            }
            PortKind::Nic(_) => Some(open(None, 0, port.rates.egress_capped(), None)),
            PortKind::Tunnel(t) => {
                // A tunnel takes no caps; its frames go to its underlay's TX batch.
                let u = env.ports.underlay_of(p)?;
                let nic = env.ports.get(u)?.nic()?;
                let to = NicDest { id: u, nic, thread: env.cx.index, pc: &env.cx.stats.ports[u as usize] };
                Some(open(None, 0, false, Some((t, to))))
            }
            PortKind::Failed => None,
        }
    }

    /// Whether the guest has `n` receive buffers free (all of them, for a ring smaller).
    fn has_room(&mut self, n: u32) -> bool {
        // A NIC never makes a sender wait: a full TX ring drops (nic_tx_full).
        if self.guard.is_none() {
            return true;
        }
        let Some(ring) = self.ring() else { return false };
        let want = n.min(ring.size() as u32).max(1) as u16;
        matches!(ring.avail_at_least(want), Ok(k) if k >= want)
    }

    /// Writes frame `f`, shaped by `e`, to this port: as it is, or with the offloads it asked
    /// for done here if the port cannot take them.
    #[inline(always)]
    fn write(&mut self, f: &Frame, e: Shape, dv: &mut Delivery) -> Result<(), DropReason> {
        if self.slow {
            return self.write_slow(f, e, dv);
        }
        self.write_uncapped::<false>(f, e, dv)
    }

    /// Writes frame `f` to this port as NORMAL switched it: as it came, or (on a switch with
    /// VLANs, in VLAN `f.vlan`) tagged or not as this port sends that VLAN (a flood only
    /// reaches ports that carry it; a learned port that no longer does is refused). The usual
    /// case, a frame that leaves as it came, is one inlined [`Open::write`].
    #[inline(always)]
    fn write_switched(&mut self, f: &Frame, dv: &mut Delivery) -> Result<(), DropReason> {
        if f.vlan != NO_VLAN {
            let tagged = self.policy.vlan.egress(f.vlan).ok_or(DropReason::VlanNotAllowed)?;
            if let Some(r) = egress_tagging(f, tagged) {
                return self.write_retagged(f, r, dv);
            }
        }
        self.write(f, AS_IS, dv)
    }

    /// [`Open::write_switched`] of a frame whose tag is pushed, rewritten or popped on its way out.
    #[inline(never)]
    fn write_retagged(&mut self, f: &Frame, r: Retag, dv: &mut Delivery) -> Result<(), DropReason> {
        let mut buf = [0u8; 16];
        self.write(f, retag(f, r, &mut buf), dv)
    }

    /// [`Open::write`] to a port with an egress cap, a capture or a mirror of what it is
    /// given. A capped port's frame goes only while its buckets hold tokens, and is charged
    /// what it costs on the wire once written; a watched port's is offered to its captures and
    /// copied to its mirrors as it was written (each segment of one segmented here). The write
    /// itself is `write_uncapped`'s, with `TAP` the watchers' hook compiled in: a port without
    /// any never meets it.
    #[cold]
    fn write_slow(&mut self, f: &Frame, e: Shape, dv: &mut Delivery) -> Result<(), DropReason> {
        let rates = &self.port.rates;
        let written = if self.capped && !rates.egress_allows() {
            Err(DropReason::RateCap)
        } else if !self.policy.watched_dst {
            self.write_uncapped::<false>(f, e, dv)
        } else {
            self.write_uncapped::<true>(f, e, dv)
        };
        if let Err(why) = written {
            // `capture --drops` of this port sees what it missed, and why.
            if self.policy.watched_dst && !self.policy.taps.0.is_empty() {
                tap::sent(self.cx.index, &self.policy.taps.0, f, e, Some(why));
            }
            return Err(why);
        }
        if self.capped {
            rates.charge_egress(wire_cost(f, e));
        }
        Ok(())
    }

    #[inline(always)]
    fn write_uncapped<const TAP: bool>(&mut self, f: &Frame, e: Shape, dv: &mut Delivery) -> Result<(), DropReason> {
        if f.off.is_none() {
            // A frame whose NIC verified its checksum, to a guest with GUEST_CSUM: DATA_VALID.
            const VALID: VirtioNetHdr = VirtioNetHdr { flags: virtio_net::flags::DATA_VALID, ..VirtioNetHdr::PLAIN };
            let valid = f.valid && self.guard.as_ref().is_some_and(|g| g.offloads.csum);
            self.write_one::<TAP>(f, e, if valid { &VALID } else { &VirtioNetHdr::PLAIN }, dv)?;
            if valid {
                bump(&self.cx.stats.ports[self.port.id as usize].data_valid, 1);
            }
            return Ok(());
        }
        self.write_offloaded::<TAP>(f, e, dv)
    }

    /// A frame with a partial checksum or TSO: whole to a guest that negotiated the same
    /// offloads (the header carried through, its offsets following a rewritten Ethernet
    /// header), else completed or segmented for this port alone.
    #[cold]
    fn write_offloaded<const TAP: bool>(&mut self, f: &Frame, e: Shape, dv: &mut Delivery) -> Result<(), DropReason> {
        let off = f.off.shifted(e.prefix.len() as i32 - e.skip as i32);
        let pc = &self.cx.stats.ports[self.port.id as usize];
        match (&self.guard, self.port.nic()) {
            (Some(g), _) if off.taken_by(&g.offloads) => {
                return self.write_one::<TAP>(f, e, &off.to_hdr(), dv).map(|_| ());
            }
            (None, Some(nic)) if off.taken_by(&nic.takes()) && nic.segments_fit(&off) => {
                // A NIC with the offloads: handed whole, for the device to finish.
                if let Some(job) = offload::device_job(f, e.prefix, e.skip) {
                    dv.nic_tx.write_for_device(
                        &NicDest { id: self.port.id, nic, thread: self.cx.index, pc },
                        f,
                        e,
                        &job,
                    )?;
                    bump(&pc.hw_offloaded, 1);
                    if TAP {
                        self.tap(f, e, dv);
                    }
                    return Ok(());
                }
            }
            _ => {}
        }
        let takes = self.guard.as_ref().map_or(Negotiated::default(), |g| g.offloads);
        if f.off.tso.is_none() {
            // A checksum only: its value from the sender's bytes, stored as the frame is copied.
            let (field, v) = offload::checksum(f).ok_or(DropReason::OffloadHeaders)?;
            bump(&pc.sw_checksums, 1);
            let field = (field as i32 + e.prefix.len() as i32 - e.skip as i32) as u32;
            return self
                .write_one::<TAP>(f, Shape { patch: Some((field, v)), ..e }, &VirtioNetHdr::PLAIN, dv)
                .map(|_| ());
        }
        let mut segs = Segments::new(f, e.prefix, e.skip).ok_or(DropReason::OffloadHeaders)?;
        // Each segment takes at least one receive buffer: more segments than the ring has
        // entries can never be placed, however long the sender waits.
        if self.ring_size().is_some_and(|n| segs.count > n as u32) {
            return Err(DropReason::RxBufferTooSmall);
        }
        // Room for every segment first, so backpressure retries the frame whole.
        if !self.has_room(segs.count) {
            return Err(DropReason::RxRingFull);
        }
        bump(&pc.sw_segmented, 1);
        dv.extra_segments += segs.count - 1;
        // A guest with GUEST_CSUM completes each segment's checksum itself.
        let partial = self.guard.is_some() && takes.csum;
        let (packets, bytes, mut bufs) = (self.packets, self.bytes, 0u16);
        while let Some(s) = segs.next(f, !partial) {
            let vh = if partial {
                VirtioNetHdr {
                    flags: virtio_net::flags::NEEDS_CSUM,
                    csum_start: s.l4,
                    csum_offset: tcp::CHECKSUM_OFFSET as u16,
                    ..VirtioNetHdr::PLAIN
                }
            } else {
                VirtioNetHdr::PLAIN
            };
            let shape = Shape { prefix: &s.hdrs[..s.hdr_len as usize], skip: s.skip, take: s.len, patch: None };
            match self.write_one::<TAP>(f, shape, &vh, dv) {
                Ok(n) => bufs += n,
                Err(why) => {
                    // A guest gets every segment or none: what was written is taken back
                    // (nothing is published before the port is closed), so a retry never
                    // delivers a segment twice.
                    if let Some(ring) = self.ring() {
                        ring.unpop(bufs);
                        ring.unpush(bufs);
                        (self.packets, self.bytes) = (packets, bytes);
                    }
                    return Err(why);
                }
            }
        }
        Ok(())
    }

    /// Where frames for this NIC port go (PortDown if it is not a NIC).
    fn nic_dest(&self) -> Result<NicDest<'a>, DropReason> {
        let nic = self.port.nic().ok_or(DropReason::PortDown)?;
        Ok(NicDest { id: self.port.id, nic, thread: self.cx.index, pc: &self.cx.stats.ports[self.port.id as usize] })
    }

    /// The guest RX queue's ring, if it runs (None for a NIC).
    fn ring(&mut self) -> Option<&mut ActiveRing> {
        let Vring { active, broken, .. } = &mut **self.guard.as_mut()?;
        active.as_mut().filter(|_| broken.is_none())
    }

    /// How many entries the guest's RX ring has (None for a NIC).
    fn ring_size(&mut self) -> Option<u16> {
        self.ring().map(|r| r.size())
    }

    /// Writes one frame: `e`'s bytes after virtio-net header `vh`. Returns the receive buffers
    /// it took (0 for a NIC).
    #[inline]
    fn write_one<const TAP: bool>(
        &mut self,
        f: &Frame,
        e: Shape,
        vh: &VirtioNetHdr,
        dv: &mut Delivery,
    ) -> Result<u16, DropReason> {
        let Some(guard) = self.guard.as_mut() else {
            if let Some((t, to)) = &self.tunnel {
                // A tunnel: encapsulated into an mbuf of the underlay's TX batch.
                // A captured underlay makes its tunnels watched (`PortTable::rewatch`).
                let taps: &[_] = if TAP { &self.env.ports.policy[to.id as usize].taps.0 } else { &[] };
                let len = encap(self.now, t, to, self.port.max_frame(), f, e, dv, taps)?;
                self.packets += 1;
                self.bytes += len as u64;
                if TAP {
                    self.tap(f, e, dv);
                }
                return Ok(0);
            }
            // A NIC port: copy into an mbuf of the thread's TX batch (counted when sent).
            dv.nic_tx.write(&self.nic_dest()?, f, e)?;
            if TAP {
                self.tap(f, e, dv);
            }
            return Ok(0);
        };
        let Vring { active, broken, hdr_len, mrg_rxbuf, .. } = &mut **guard;
        let Some(ring) = active.as_mut().filter(|_| broken.is_none()) else { return Err(DropReason::PortDown) };
        let len = e.body_len(f) + e.prefix.len() as u32;
        let small = &mut dv.too_small[self.port.id as usize];
        if let Some((idx, short)) = *small {
            // Buffers found too small for a frame this long: not walked again until the
            // guest makes more available.
            if ring.avail_index() != Some(idx) {
                *small = None;
            } else if len >= short {
                return Err(DropReason::RxBufferTooSmall);
            }
        }
        let walked = ring.walked();
        match write_frame(RxRing { ring: ring.lend(), hdr_len: *hdr_len, mrg: *mrg_rxbuf }, f, e, vh, dv) {
            Ok(bufs) => {
                self.packets += 1;
                self.bytes += len as u64;
                if TAP {
                    self.tap(f, e, dv);
                }
                Ok(bufs)
            }
            Err(WriteError::Drop(DropReason::RxBufferTooSmall)) => {
                // The walk was the receiver's doing: not charged to the sender's budget.
                ring.forget_walked(ring.walked() - walked);
                dv.too_small[self.port.id as usize] = ring.avail_index().map(|idx| (idx, len));
                Err(DropReason::RxBufferTooSmall)
            }
            Err(WriteError::Drop(why)) => Err(why),
            Err(WriteError::Ring(e)) => {
                ring_broke(self.port, self.vq_index, broken, e);
                Err(DropReason::Malformed)
            }
        }
    }

    /// Offers frame `f`, as shape `e` wrote it, to the port's captures, and copies it to its
    /// mirrors' outputs.
    #[inline(always)]
    fn tap(&self, f: &Frame, e: Shape, dv: &mut Delivery) {
        if !self.policy.taps.0.is_empty() {
            tap::sent(self.cx.index, &self.policy.taps.0, f, e, None);
        }
        if !self.policy.mirrors.as_dst.is_empty() {
            mirror::as_dst(self.env, dv, &self.policy.mirrors.as_dst, f, e);
        }
    }

    /// Publishes what was written with one used-index store; owes the guest an interrupt if it
    /// asked for one (sent once no ring is locked).
    fn close(mut self, pc: &PortCounters, dv: &mut Delivery) {
        let Some(guard) = self.guard.as_mut() else {
            // A tunnel counts what it encapsulated (its underlay, what it sent).
            if self.tunnel.is_some() {
                bump(&pc.tx_batches, (self.packets > 0) as u64);
                bump(&pc.tx_packets, self.packets);
                bump(&pc.tx_bytes, self.bytes);
            }
            return;
        };
        bump(&pc.tx_batches, (self.packets > 0) as u64);
        bump(&pc.tx_packets, self.packets);
        bump(&pc.tx_bytes, self.bytes);
        let Vring { active, broken, .. } = &mut **guard;
        if let Some(ring) = active.as_mut() {
            dv.walked += ring.take_walked();
            if ring.publish()
                && let Some(call) = ring.call()
            {
                if call.is_stuck() {
                    ring_broke(self.port, self.vq_index, broken, RingError::CallBlocked);
                } else {
                    dv.irqs.owe(call);
                }
            }
        }
    }
}

/// Sends a burst's frames to their ports, in order. Returns how many frames were consumed:
/// fewer than `frames.len()` when a destination's RX ring is full and the frame should be
/// retried (it and the frames after it stay in the sender's TX ring, so the sender feels
/// backpressure instead of loss, for at most `retry_cycles`).
///
/// `wait` is false for a sender that cannot be held back (a NIC): its frames to a full guest
/// ring drop at once. Frames for NIC ports are flushed with one tx_burst per port at the end.
pub(in crate::datapath) fn deliver(
    env: &Env,
    frames: &[Frame],
    dv: &mut Delivery,
    in_port: u16,
    blocked_since: &mut Option<u64>,
    wait: bool,
) -> usize {
    dv.in_port = in_port;
    let n = deliver_in_order(env, frames, dv, in_port, blocked_since, wait);
    if !dv.nic_tx.is_empty() {
        dv.nic_tx.flush(env.ports, env.cx.index, &env.cx.stats);
    }
    n
}

/// `deliver`'s loop over a burst, frame by frame, keeping a destination open across the frames
/// that go to it and a flooded run together. One body on purpose, as `rx::visit_source`: the
/// open destination and the run in progress are its locals, and each kind of frame (unicast,
/// flood run, action list, drop) is one arm of it.
fn deliver_in_order(
    env: &Env,
    frames: &[Frame],
    dv: &mut Delivery,
    in_port: u16,
    blocked_since: &mut Option<u64>,
    wait: bool,
) -> usize {
    let cx = env.cx;
    let mut open: Option<Open> = None;
    // A port found full by a source that cannot wait: its ring is not read again for the
    // rest of this burst (its avail index is a line its guest keeps writing).
    let mut full: Option<u16> = None;
    // Split horizon: what came from one remote VTEP never goes to another.
    let from_tunnel = env.ports.is_tunnel(in_port);
    let mut i = 0;
    while i < frames.len() {
        let f = &frames[i];
        // Segmenting in software may turn one frame into hundreds: once a burst has produced
        // as many as the visit's budget has room for, its later TSO frames wait in the
        // sender's ring for its next visit (the first frame of a burst always goes).
        if wait && i > 0 && f.off.tso.is_some() && i as u32 + dv.extra_segments >= dv.segment_room {
            o_close(open, env, dv);
            // Not a wait for a full receiver: the frames before went out.
            *blocked_since = None;
            return i;
        }
        match f.out {
            Out::Nowhere | Out::Drop(_) => {}
            Out::Port(p) if full == Some(p) => {
                cx.stats.ports[p as usize].drop(DropReason::RxRingFull, 1);
                dv.missed(i, p, DropReason::RxRingFull);
            }
            Out::Port(p) if from_tunnel && env.ports.is_tunnel(p) => {
                cx.stats.ports[in_port as usize].drop(DropReason::SplitHorizon, 1);
                dv.missed(i, p, DropReason::SplitHorizon);
            }
            Out::Port(p) => {
                if open.as_ref().map(|o| o.port.id) != Some(p) {
                    o_close(open.take(), env, dv);
                    open = Open::new(env, p);
                }
                let pc = &cx.stats.ports[p as usize];
                let Some(o) = open.as_mut() else {
                    pc.drop(DropReason::PortDown, 1);
                    dv.missed(i, p, DropReason::PortDown);
                    i += 1;
                    continue;
                };
                if dv.stalled[p as usize] {
                    // A destination that let a frame time out is dropped toward, without
                    // touching its ring, until it has room for a whole burst again: one free
                    // buffer at a time must not re-arm a wait for every sender.
                    if !o.has_room(cx.burst) {
                        pc.drop(DropReason::RxRingFull, 1);
                        dv.missed(i, p, DropReason::RxRingFull);
                        dv.dropped_full = true;
                        i += 1;
                        continue;
                    }
                    dv.stalled[p as usize] = false;
                }
                let wrote = o.write_switched(f, dv);
                match wrote {
                    Ok(()) => {}
                    Err(DropReason::RxRingFull) if wait => {
                        if keep_waiting(cx, dv, p, blocked_since) {
                            o_close(open, env, dv);
                            return i;
                        }
                        pc.drop(DropReason::RxRingFull, 1);
                        dv.missed(i, p, DropReason::RxRingFull);
                    }
                    Err(why) => {
                        if why == DropReason::RxRingFull {
                            dv.dropped_full = true;
                            full = Some(p);
                        }
                        pc.drop(why, 1);
                        dv.missed(i, p, why);
                    }
                }
            }
            // Classify's pipeline stage always replaces it.
            Out::Pipeline(_) => {}
            Out::Routed(p, n) => {
                // Held open across a run of frames to one port, as for `Out::Port` (a full
                // destination drops: a routed frame never makes its sender wait).
                if open.as_ref().map(|o| o.port.id) != Some(p) {
                    o_close(open.take(), env, dv);
                    open = Open::new(env, p);
                }
                let pc = &cx.stats.ports[p as usize];
                match open.as_mut() {
                    Some(o) => {
                        if let Err(why) = route::routed(env, o, f, n, dv) {
                            pc.drop(why, 1);
                            dv.missed(i, p, why);
                        }
                    }
                    None => {
                        pc.drop(DropReason::PortDown, 1);
                        dv.missed(i, p, DropReason::PortDown);
                    }
                }
            }
            Out::Answer => {
                o_close(open.take(), env, dv);
                route::answer(env, f, in_port, dv);
            }
            Out::Actions(fi) | Out::Path(fi) => {
                o_close(open.take(), env, dv);
                let path = match f.out {
                    Out::Path(_) => f.path.flows(),
                    _ => std::slice::from_ref(&fi),
                };
                // Backpressure as for a single output, checked before any copy goes out so a
                // retried frame is never sent twice: wait while a port it names is full.
                if wait
                    && let Some(p) = full_output(env, path, in_port)
                    && !dv.stalled[p as usize]
                    && keep_waiting(cx, dv, p, blocked_since)
                {
                    return i;
                }
                run_actions(env, f, path, in_port, dv);
            }
            Out::Flood => {
                o_close(open.take(), env, dv);
                // A run of consecutive flooded frames goes to each port as one batch. Best
                // effort, as broadcast is: a full or absent port misses the frame.
                // A TSO frame goes alone, so the segment bound above sees each.
                // With VLANs, a run is of one VLAN, and goes to the ports that carry it, each
                // frame tagged or not as each port sends it.
                let vid = f.vlan;
                let run = match f.off.tso {
                    Some(_) => 1,
                    None => frames[i..]
                        .iter()
                        .take_while(|f| f.out == Out::Flood && f.off.tso.is_none() && f.vlan == vid)
                        .count(),
                };
                for &id in env.ports.flood_list_from(vid, in_port).iter().filter(|&&id| id != in_port) {
                    flood_to(env, id, &frames[i..i + run], dv);
                }
                i += run;
                continue;
            }
        }
        i += 1;
    }
    o_close(open, env, dv);
    *blocked_since = None;
    frames.len()
}

/// Delivers a run of flooded frames to port `id`, unless floods skip it: found full or down in
/// the last `FLOOD_RETRY_US`, it is not opened, and its missed frames are only added up (a
/// flood costs what it delivers, not what exists). A port out of buffers takes none of the rest
/// of the run either: they are dropped at once, without a frame's work each.
#[inline]
fn flood_to(env: &Env, id: u16, run: &[Frame], dv: &mut Delivery) {
    let mut skip = dv.flood_skip[id as usize];
    if skip.until > env.now {
        if skip.full {
            skip.missed += run.len() as u32;
            dv.flood_missed = true;
            dv.flood_skip[id as usize] = skip;
        }
        return;
    }
    let pc = &env.cx.stats.ports[id as usize];
    if skip.missed > 0 {
        pc.drop(DropReason::RxRingFull, skip.missed as u64);
    }
    // Found so again, a port is skipped twice as long as the last time (up to the maximum).
    let backoff = skip.backoff;
    let until = env.now.saturating_add(dv.flood_retry.saturating_mul(1 << backoff));
    let again = (backoff + 1).min(FLOOD_BACKOFF_MAX);
    skip = FloodSkip::default();
    match Open::new(env, id) {
        None => skip = FloodSkip { until, full: false, missed: 0, backoff: again },
        Some(mut o) => {
            // Security groups: a port with rules takes the copies they admit.
            let checked = env.ports.conntrack.is_some() && env.ports.policy[id as usize].rules.is_some();
            for (k, f) in run.iter().enumerate() {
                if checked && !firewall::admits(env, id, f) {
                    continue;
                }
                match o.write_switched(f, dv) {
                    Ok(()) => {}
                    Err(DropReason::RxRingFull) => {
                        pc.drop(DropReason::RxRingFull, (run.len() - k) as u64);
                        if k == 0 {
                            skip = FloodSkip { until, full: true, missed: 0, backoff: again };
                        }
                        break;
                    }
                    Err(why) => pc.drop(why, 1),
                }
            }
            o.close(pc, dv);
        }
    }
    dv.flood_skip[id as usize] = skip;
}

/// Whether a frame whose destination `p` is full should wait (stay in the sender's ring) or,
/// having waited `retry_cycles` already, be dropped toward `p`, which is then marked stalled:
/// frames to it drop without waiting until it takes one again.
fn keep_waiting(cx: &Ctx, dv: &mut Delivery, p: u16, blocked_since: &mut Option<u64>) -> bool {
    let now = cycles();
    let since = *blocked_since.get_or_insert(now);
    if now.wrapping_sub(since) < cx.retry_cycles {
        return true;
    }
    dv.stalled[p as usize] = true;
    *blocked_since = None;
    false
}

/// The first port a flow's actions name explicitly (output:PORT, in_port) whose guest RX ring
/// has no free buffer.
fn full_output(env: &Env, path: &[u32], in_port: u16) -> Option<u16> {
    let mut full = None;
    let actions = path.iter().filter(|&&fi| fi != NO_MATCH).flat_map(|&fi| env.flows.actions(fi));
    for a in actions {
        let p = match *a {
            Action::Output(p) if p != in_port => p,
            Action::InPort => in_port,
            _ => continue,
        };
        if full.is_none() && Open::new(env, p).is_some_and(|mut o| !o.has_room(1)) {
            full = Some(p);
        }
    }
    full
}

/// Runs a flow's action list on one frame (or the lists of the flows its walk through the
/// tables met, `path`): each output sends the frame as the header rewrites before it left
/// it. Best effort, like flooding: a full or absent port misses it.
fn run_actions(env: &Env, f: &Frame, path: &[u32], in_port: u16, dv: &mut Delivery) {
    const MAX: usize = ethernet::MAX_EMIT_LEN + 2;
    let mut raw = [0u8; MAX];
    let n = f.read_at(0, &mut raw);
    let Ok((hdr, covered)) = EthernetRepr::parse(&raw[..n]) else { return };
    execute_path(path, &|fi| env.flows.actions(fi), &hdr, |emit, h| {
        let mut buf = [0u8; ethernet::MAX_EMIT_LEN];
        let len = h.emit(&mut buf);
        let shape = Shape { prefix: &buf[..len], skip: covered as u32, take: u32::MAX, patch: None };
        match emit {
            Emit::Port(p) if p != in_port => send_one(env, p, f, shape, dv, true),
            Emit::Port(_) => {}
            Emit::InPort => send_one(env, in_port, f, shape, dv, true),
            Emit::Flood | Emit::All => {
                for id in env.ports.flood_all_from(in_port) {
                    send_one(env, id, f, shape, dv, false);
                }
            }
            Emit::Normal if env.ports.vlans => normal_by_vlan(env, f, h, covered as u32, in_port, dv),
            Emit::Normal => match normal(env, in_port, 0, &h.dst, &h.src) {
                Out::Port(p) => send_one(env, p, f, shape, dv, true),
                Out::Flood => {
                    for id in env.ports.flood_all_from(in_port) {
                        send_one(env, id, f, shape, dv, false);
                    }
                }
                _ => {}
            },
        }
    });
}

/// A flow's NORMAL action on a switch with VLANs: the rewritten header `h` (which replaced the
/// frame's first `skip` bytes) decides the VLAN at the input port, and each destination gets
/// it tagged or not as it sends that VLAN.
fn normal_by_vlan(env: &Env, f: &Frame, h: &EthernetRepr, skip: u32, in_port: u16, dv: &mut Delivery) {
    let vid = match header_vlan(&env.ports.policy[in_port as usize].vlan, h) {
        Ok(vid) => vid,
        Err(why) => return env.cx.stats.ports[in_port as usize].drop(why, 1),
    };
    let send = |p: u16, dv: &mut Delivery, named: bool| {
        let Some(h) = header_for(&env.ports.policy[p as usize].vlan, vid, h) else { return };
        let mut buf = [0u8; ethernet::MAX_EMIT_LEN];
        let len = h.emit(&mut buf);
        send_one(env, p, f, Shape { prefix: &buf[..len], skip, take: u32::MAX, patch: None }, dv, named);
    };
    match normal(env, in_port, vid, &h.dst, &h.src) {
        Out::Port(p) => send(p, dv, true),
        Out::Flood => {
            for &id in env.ports.flood_list_from(vid, in_port).iter().filter(|&&id| id != in_port) {
                send(id, dv, false);
            }
        }
        _ => {}
    }
}

/// What frame `f`, shaped by `e`, costs on a wire: a TSO frame is the segments it stands for,
/// each with its own copy of the headers.
#[inline]
fn wire_cost(f: &Frame, e: Shape) -> Cost {
    let len = (e.body_len(f) + e.prefix.len() as u32) as u64;
    let mut c = Cost::default();
    c.add_frame(len, f.off.tso.map(|t| (t.hdr_len, t.mss)));
    c
}

/// Sends one frame to port `p`; a port that is down counts a drop only if `named` (an
/// explicit output, not a flood, which reaches whoever is up).
fn send_one(env: &Env, p: u16, f: &Frame, shape: Shape, dv: &mut Delivery, named: bool) {
    if firewall::admits(env, p, f) {
        write_alone(env, p, f, shape, dv, named);
    }
}

/// Writes `f` as `shape` makes it to port `p`, opened for it alone; a port that is not there
/// (or not running) counts the frame as `port_down` if `named` (a flood's copy is not missed).
fn write_alone(env: &Env, p: u16, f: &Frame, shape: Shape, dv: &mut Delivery, named: bool) {
    let pc = &env.cx.stats.ports[p as usize];
    match Open::new(env, p) {
        Some(mut o) => {
            if let Err(why) = o.write(f, shape, dv) {
                pc.drop(why, 1);
            }
            o.close(pc, dv);
        }
        None if named => pc.drop(DropReason::PortDown, 1),
        None => {}
    }
}

fn o_close(open: Option<Open>, env: &Env, dv: &mut Delivery) {
    if let Some(o) = open {
        let pc = &env.cx.stats.ports[o.port.id as usize];
        o.close(pc, dv);
    }
}
