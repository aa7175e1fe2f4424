//! Port rx: one visit to a receive queue. A visit takes bursts of frames from its source until
//! the queue's packet or byte budget is spent, hands each burst to classification and delivery,
//! and completes on the source what delivery consumed. The same loop serves both kinds of
//! receive queue, through [`Source`]: a guest's TX virtqueue (frames can wait in its ring when a
//! destination is full: backpressure) and a NIC receive queue (they cannot).
#![forbid(unsafe_code)]

use super::classify::{Recent, Sender, classify_burst, lookup_flows};
use super::counters::{DropReason, bump, cycles};
use super::delivery::Delivery;
use super::frame::Frame;
use super::nic_io::NicRx;
use super::output::deliver;
use super::plan::RxqSpec;
use super::sched::{Deficit, Quantum};
use super::stages::Stages;
use super::vxlan::VtepRx;
use super::{Env, FlowState, Out, Work, ring_broke};
use crate::port::nic::NicPort;
use crate::port::rate::Cost;
use crate::port::{Port, PortKind, VhostQueues};
use crate::vring::{Ahead, RingError, RingLoan, Vring};
use crate::wire::MacAddr;
use crate::wire::arp::rarp_announcement;
use crate::wire::gso::Negotiated;

/// A receive queue: queue pair `qpair` of `port` (a guest's TX virtqueue 2*qpair+1, or NIC
/// receive queue `qpair`), and the poll thread's state for it, which survives plan changes that
/// keep the queue on this thread.
pub(super) struct Rxq {
    pub spec: RxqSpec,
    pub state: RxqState,
}

/// What a poll thread keeps for a receive queue between visits.
#[derive(Default)]
pub(super) struct RxqState {
    /// When this queue's head frame first found its destination full (TSC), while it waits.
    blocked_since: Option<u64>,
    /// Its credit in the thread's deficit round robin.
    deficit: Deficit,
    /// Names the queue for as long as it stays on this thread (its kick fd's registration).
    pub id: u64,
    /// When it last had frames (TSC): empty for `park_after_us`, it is parked.
    pub last_busy: u64,
    /// Parked (`park`): not polled, its kicks watched; and its ring's epoch then.
    pub parked: Option<u64>,
}

impl Rxq {
    /// A queue new to this thread, as busy at `now` (so it is not parked at once).
    pub fn new(spec: RxqSpec, now: u64) -> Rxq {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Rxq { spec, state: RxqState { id, last_busy: now, ..Default::default() } }
    }
}

/// Where a visit's frames come from, borrowed for `'a` (a guest's ring through its lock guard).
pub(super) trait Source<'a> {
    /// Whether frames delivery cannot place yet may stay in the source (backpressure).
    const CAN_WAIT: bool;
    /// Bytes in front of each frame (the sender's virtio-net header; 0 for a NIC).
    fn hdr_len(&self) -> u32;
    /// The offloads its frames may ask for (a guest's CSUM/HOST_TSO; none for a NIC).
    fn offloads(&self) -> Negotiated;
    /// How many frames (at most `max`) the next `take` will find; an error if the source broke.
    fn ready(&mut self, max: usize) -> Result<usize, RingError>;
    /// Takes as many frames as `frames` holds (`ready` said they are there) into `frames`
    /// (their `segs` and `head`); returns how many, and the error that broke the source after
    /// them, if one did.
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's;
    /// Puts back the last `n` frames taken: delivery could not place them yet.
    fn give_back(&mut self, n: usize);
    /// Completes the frames delivery consumed (`frames` is every frame taken, in order); an
    /// interrupt the guest asked for is owed in `dv.irqs`.
    fn complete(&mut self, frames: &[Frame<'_>], consumed: usize, dv: &mut Delivery);
    /// Descriptors walked since the last call.
    fn walked(&mut self) -> u32;
    /// The source broke with `e`; it is not visited again until reset.
    fn broke(&mut self, e: RingError);
    /// The port the frames `ready` found come from, if not the queue's own (a VTEP's underlay
    /// hands out runs of frames from each remote endpoint's tunnel port).
    #[inline]
    fn sender(&self) -> Option<u16> {
        None
    }
}

/// A guest's TX virtqueue, locked for the visit.
struct GuestTx<'a> {
    port: &'a Port,
    vq_index: usize,
    ring: RingLoan<'a>,
    broken: &'a mut Option<RingError>,
    hdr_len: u32,
    offloads: Negotiated,
}

impl<'a> Source<'a> for GuestTx<'a> {
    const CAN_WAIT: bool = true;

    fn hdr_len(&self) -> u32 {
        self.hdr_len
    }

    fn offloads(&self) -> Negotiated {
        self.offloads
    }

    #[inline]
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok((self.ring.avail()? as usize).min(max))
    }

    #[inline]
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        // A header that is never read (no offloads negotiated) is not fetched either.
        let ahead = Ahead::Read(if self.offloads.any() { 0 } else { self.hdr_len });
        for (got, f) in frames.iter_mut().enumerate() {
            self.ring.prefetch_ahead(ahead);
            match self.ring.pop(f.source_mut(), false) {
                Ok(head) => f.head = head,
                Err(e) => return (got, Some(e)),
            }
            f.valid = false;
        }
        (frames.len(), None)
    }

    fn give_back(&mut self, n: usize) {
        self.ring.unpop(n as u16);
    }

    #[inline]
    fn complete(&mut self, frames: &[Frame<'_>], consumed: usize, dv: &mut Delivery) {
        for f in &frames[..consumed] {
            self.ring.push_used(f.head, 0);
        }
        if self.ring.publish()
            && let Some(call) = self.ring.call()
        {
            if call.is_stuck() {
                ring_broke(self.port, self.vq_index, self.broken, RingError::CallBlocked);
            } else {
                dv.irqs.owe(call);
            }
        }
    }

    #[inline]
    fn walked(&mut self) -> u32 {
        self.ring.take_walked()
    }

    fn broke(&mut self, e: RingError) {
        ring_broke(self.port, self.vq_index, self.broken, e);
    }
}

/// A NIC receive queue: frames are the mbufs of one burst, freed once delivered.
struct NicQueue<'a> {
    nic: &'a NicPort,
    queue: usize,
    rx: &'a mut NicRx,
}

impl<'a> Source<'a> for NicQueue<'a> {
    const CAN_WAIT: bool = false;

    fn hdr_len(&self) -> u32 {
        0
    }

    fn offloads(&self) -> Negotiated {
        Negotiated::default()
    }

    #[inline]
    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok(self.rx.receive(self.nic, self.queue, max).unwrap_or(0))
    }

    #[inline]
    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        for (i, f) in frames.iter_mut().enumerate() {
            f.valid = self.rx.source(i, f.source_mut());
            f.head = i as u16;
        }
        (frames.len(), None)
    }

    fn give_back(&mut self, _: usize) {
        unreachable!("a NIC's frames never wait: delivery consumes them all")
    }

    #[inline]
    fn complete(&mut self, _: &[Frame<'_>], _: usize, _: &mut Delivery) {
        self.rx.clear();
    }

    fn walked(&mut self) -> u32 {
        0
    }

    fn broke(&mut self, _: RingError) {}
}

/// An announcement the switch sends on a port's behalf (the RARP of a migrated guest): one
/// frame of the switch's own, entering as if the port had sent it.
struct Announcement<'a> {
    frame: &'a [u8],
    sent: bool,
}

impl<'a> Source<'a> for Announcement<'a> {
    const CAN_WAIT: bool = false;

    fn hdr_len(&self) -> u32 {
        0
    }

    fn offloads(&self) -> Negotiated {
        Negotiated::default()
    }

    fn ready(&mut self, max: usize) -> Result<usize, RingError> {
        Ok(if self.sent { 0 } else { max.min(1) })
    }

    fn take<'s>(&mut self, frames: &mut [Frame<'s>]) -> (usize, Option<RingError>)
    where
        'a: 's,
    {
        frames[0].source_bytes(self.frame);
        frames[0].head = 0;
        frames[0].valid = false;
        (1, None)
    }

    fn give_back(&mut self, _: usize) {
        unreachable!("an announcement never waits: delivery consumes it")
    }

    fn complete(&mut self, _: &[Frame<'_>], consumed: usize, _: &mut Delivery) {
        self.sent |= consumed > 0;
    }

    fn walked(&mut self) -> u32 {
        0
    }

    fn broke(&mut self, _: RingError) {}
}

/// Sends the RARP that announces `mac` from the port of `spec` into the switch: classified as
/// the port's own frames are (port security, VLANs, flows, its ingress caps) and delivered
/// like them, its counters the port's.
#[cold]
fn announce(env: &Env, work: &mut Work, spec: &RxqSpec, queues: &VhostQueues, mac: MacAddr) {
    let frame = rarp_announcement(mac);
    let mut src = Announcement { frame: &frame, sent: false };
    visit_source(env, work, spec, &mut RxqState::default(), &mut src);
    if src.sent {
        queues.announcer.sent_one();
    } else {
        // Held by the port's ingress cap: it goes out on a later visit.
        queues.announcer.request(mac);
    }
}

#[cfg(test)]
thread_local! {
    /// Tests only: runs between classify and delivery, as a guest's second vCPU rewriting the
    /// buffers it posted could at that moment.
    pub(super) static BETWEEN_STAGES: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
        const { std::cell::RefCell::new(None) };
}

/// What frames taken from a port cost against its ingress caps: a TSO frame is the segments it
/// stands for.
#[cold]
fn ingress_cost(frames: &[Frame]) -> Cost {
    let mut c = Cost::default();
    for f in frames {
        c.add_frame(f.len as u64, f.off.tso.map(|t| (t.hdr_len, t.mss)));
    }
    c
}

/// One visit to a receive queue. Returns the number of frames taken from it.
pub(super) fn visit(env: &Env, work: &mut Work, nic_rx: &mut NicRx, rxq: &mut Rxq) -> u32 {
    let Rxq { spec, state } = rxq;
    env.src_q.set(spec.qpair);
    let got = visit_queue(env, work, nic_rx, spec, state);
    // Every ring lock is released: now the interrupts owed can go out.
    work.delivery.irqs.send(&env.cx.stats);
    got
}

fn visit_queue(env: &Env, work: &mut Work, nic_rx: &mut NicRx, spec: &RxqSpec, state: &mut RxqState) -> u32 {
    let port = &*spec.port;
    match &port.kind {
        PortKind::VhostUser(queues) => {
            if spec.qpair == 0
                && let Some(mac) = queues.announcer.take()
            {
                announce(env, work, spec, queues, mac);
            }
            let vq = queues.guest_tx(spec.qpair);
            if !vq.is_ready() {
                return 0;
            }
            let mut g = vq.lock();
            let Vring { active, broken, hdr_len, offloads, .. } = &mut *g;
            let (hdr_len, offloads) = (*hdr_len, *offloads);
            let (Some(ring), None) = (active.as_mut(), *broken) else { return 0 };
            let vq_index = 2 * spec.qpair + 1;
            let ring = ring.lend();
            visit_source(env, work, spec, state, &mut GuestTx { port, vq_index, ring, broken, hdr_len, offloads })
        }
        PortKind::Nic(nic) => {
            let queue = spec.qpair;
            if let Some(under) = env.ports.underlay(port.id) {
                let mut src = VtepRx::new(env, nic, queue, nic_rx, under);
                let got = visit_source(env, work, spec, state, &mut src);
                src.finish(&mut work.delivery);
                return got;
            }
            visit_source(env, work, spec, state, &mut NicQueue { nic, queue, rx: nic_rx })
        }
        PortKind::Failed | PortKind::Tunnel(_) => 0,
    }
}

/// The visit loop, for either kind of source.
#[inline]
fn visit_source<'a, S: Source<'a>>(
    env: &Env,
    work: &mut Work,
    spec: &RxqSpec,
    state: &mut RxqState,
    src: &mut S,
) -> u32 {
    let cx = env.cx;
    let Work { frames, emc, delivery: dv } = work;
    let RxqState { blocked_since, deficit, .. } = state;
    let mut port = &*spec.port;
    let mut pc = &cx.stats.ports[port.id as usize];
    let hdr_len = src.hdr_len();
    let negotiated = src.offloads();
    let mut sender = Sender::new(port, &env.ports.policy[port.id as usize], hdr_len, &negotiated);
    let t0 = cycles();
    // Deficit round robin in packets and bytes: the visit ends when either credit is spent.
    let mut budget = deficit.start_visit(Quantum { packets: spec.weight_packets, bytes: spec.weight_bytes });
    let (mut total, mut total_bytes, mut empty) = (0u32, 0u64, false);
    let mut recent = Recent::default();
    let mut capped = port.rates.ingress_capped();
    while budget.allows() {
        let mut max = cx.burst.min(budget.burst_limit()) as usize;
        if capped {
            // Over its cap, the port's frames stay where they are (its ring untouched).
            max = port.rates.ingress_allows(max as u32) as usize;
            if max == 0 {
                bump(&pc.rate_held, 1);
                break;
            }
        }
        let mut stages = Stages::default();
        stages.mark(0);
        let ready = match src.ready(max) {
            Ok(n) => n,
            Err(e) => {
                src.broke(e);
                pc.drop(DropReason::Malformed, 1);
                break;
            }
        };
        if ready == 0 {
            empty = total == 0;
            break;
        }
        if let Some(id) = src.sender()
            && id != port.id
            && let Some(p) = env.ports.get(id)
        {
            // A run from another port (a tunnel, behind an underlay): its policy, its counters.
            port = p;
            pc = &cx.stats.ports[id as usize];
            sender = Sender::new(port, &env.ports.policy[id as usize], hdr_len, &negotiated);
            capped = port.rates.ingress_capped();
            recent = Recent::default();
        }
        let frames = frames.lend(ready);
        let (got, err) = src.take(frames);
        if got == 0 {
            if let Some(e) = err {
                src.broke(e);
                pc.drop(DropReason::Malformed, 1);
            }
            break;
        }
        for f in &frames[..got] {
            f.prefetch(hdr_len);
        }
        stages.mark(1);
        recent.new_burst();
        classify_burst(env, emc, &mut recent, &sender, &mut frames[..got]);
        stages.mark(2);
        if !env.flows.is_normal() {
            lookup_flows(env, emc, &mut recent, port.id, sender.policy(), &mut frames[..got]);
        }
        stages.mark(3);
        #[cfg(test)]
        BETWEEN_STAGES.with_borrow_mut(|f| f.as_mut().map(|f| f()));
        dv.dropped_full = false;
        dv.segment_room = budget.burst_limit();
        let consumed = deliver(env, &frames[..got], dv, port.id, blocked_since, S::CAN_WAIT);
        stages.mark(4);
        if consumed < got {
            // Backpressure: the rest stays in the source for the next visit.
            src.give_back(got - consumed);
        }
        // One pass over the consumed frames: their bytes and drops, and (with a flow table)
        // the flow counters, once per run of frames that hit the same flow.
        let mut bytes = 0u64;
        if env.flows.is_normal() {
            for f in &frames[..consumed] {
                bytes += f.len as u64;
                if let Out::Drop(why) = f.out {
                    pc.drop(why, 1);
                }
            }
        } else {
            let mut run = (FlowState::Unmatched, 0u64, 0u64);
            for f in &frames[..consumed] {
                bytes += f.len as u64;
                if let Out::Drop(why) = f.out {
                    pc.drop(why, 1);
                }
                if f.flow != run.0 {
                    if let FlowState::Hit(i) = run.0 {
                        env.flows.count(cx.index, i, run.1, run.2);
                    }
                    run = (f.flow, 0, 0);
                }
                run.1 += 1;
                run.2 += f.len as u64;
            }
            if let FlowState::Hit(i) = run.0 {
                env.flows.count(cx.index, i, run.1, run.2);
            }
        }
        if capped {
            port.rates.charge_ingress(ingress_cost(&frames[..consumed]));
        }
        bump(&pc.rx_bursts, (consumed > 0) as u64);
        bump(&spec.stats.bursts, (consumed > 0) as u64);
        bump(&pc.rx_packets, consumed as u64);
        bump(&pc.rx_bytes, bytes);
        src.complete(frames, consumed, dv);
        stages.mark(5);
        stages.done(S::CAN_WAIT, got); // the sources that can wait are the guests
        // The budget charges work, not frames alone: a frame's first three descriptors (its
        // chain and the receive buffer) are part of its cost, more count one in three.
        // Segments made in software count as the frames they are.
        let walked = src.walked() + std::mem::take(&mut dv.walked);
        let segments = std::mem::take(&mut dv.extra_segments);
        budget.charge((consumed as u32).max(walked / 3) + segments, bytes);
        total += consumed as u32;
        total_bytes += bytes;
        if let Some(e) = err {
            src.broke(e);
            pc.drop(DropReason::Malformed, 1);
            break;
        }
        if blocked_since.is_some() {
            break;
        }
        if dv.dropped_full && !S::CAN_WAIT {
            // A guest is not keeping up with a NIC: rather than spend the rest of the budget
            // dropping toward it, let the other queues (its own among them) have the thread.
            break;
        }
    }
    if empty {
        deficit.idle();
    }
    let qs = &spec.stats;
    bump(&qs.visits, 1);
    if total > 0 {
        bump(&qs.packets, total as u64);
        bump(&qs.bytes, total_bytes);
        bump(&qs.cycles, cycles().wrapping_sub(t0));
    }
    total
}
