//! Port rx: one visit to a receive queue. A visit takes bursts of frames from its source until
//! the queue's packet or byte budget (`sched`) is spent, hands each burst to classification and
//! delivery, and completes on the source what delivery consumed. The same loop serves every
//! kind of receive queue, through [`Source`] (`source`): a guest's TX virtqueue (`guest`: frames
//! can wait in its ring when a destination is full, backpressure), a NIC receive queue (`nic`:
//! they cannot), an announcement of the switch's own (`announce`), and a VTEP's underlay, whose
//! frames are decapsulated (`vxlan`).

mod announce;
mod guest;
pub mod nic;
pub mod sched;
mod source;
pub(crate) mod vxlan;

use self::announce::Announcement;
use self::guest::GuestTx;
use self::nic::{NicQueue, NicRx};
use self::sched::{Deficit, Quantum};
use self::source::Source;
use self::vxlan::VtepRx;
use crate::datapath::classify::{Recent, Sender, classify_burst, lookup_flows};
use crate::datapath::counters::{DropReason, PortCounters, bump, cycles};
use crate::datapath::firewall::filter_burst;
use crate::datapath::frame::{FlowState, Frame, Out};
use crate::datapath::pipeline::pipeline_burst;
use crate::datapath::plan::{PortPolicy, RxqSpec};
use crate::datapath::profile::Stages;
use crate::datapath::tap;
use crate::datapath::tx::delivery::Delivery;
use crate::datapath::tx::{deliver, mirror};
use crate::datapath::{Env, Work};
use crate::port::rate::Cost;
use crate::port::{PortKind, VhostQueues};
use crate::vring::Vring;
use crate::wire::MacAddr;
use crate::wire::arp::rarp_announcement;

/// A receive queue: queue pair `qpair` of `port` (a guest's TX virtqueue 2*qpair+1, or NIC
/// receive queue `qpair`), and the poll thread's state for it, which survives plan changes that
/// keep the queue on this thread.
pub(in crate::datapath) struct Rxq {
    pub spec: RxqSpec,
    pub state: RxqState,
}

/// What a poll thread keeps for a receive queue between visits.
#[derive(Default)]
pub(in crate::datapath) struct RxqState {
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
    pub(in crate::datapath) static BETWEEN_STAGES: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
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
pub(in crate::datapath) fn visit(env: &Env, work: &mut Work, nic_rx: &mut NicRx, rxq: &mut Rxq) -> u32 {
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

/// The visit loop, for every kind of source: bursts until the budget is spent, each taken,
/// classified, delivered, counted and completed. Longer than most functions here on purpose:
/// it is the data path's inner loop, and one body keeps a burst's state (the sender, its
/// counters, the budget, the profile marks) in registers across the stages; what could leave
/// without cost has (`count_consumed`, inlined back).
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
            if env.flows.has_pipeline() {
                pipeline_burst(env, &mut recent, port.id, sender.policy(), &mut frames[..got]);
            }
        }
        if let Some(ct) = env.ports.conntrack.as_deref() {
            filter_burst(env, ct, port.id, &mut frames[..got]);
        }
        stages.mark(3);
        #[cfg(test)]
        BETWEEN_STAGES.with_borrow_mut(|f| f.as_mut().map(|f| f()));
        dv.dropped_full = false;
        dv.segment_room = budget.burst_limit();
        // (A traced burst's notes are cleared once told, in `watched`.)
        dv.traced = sender.policy().traced;
        let consumed = deliver(env, &frames[..got], dv, port.id, blocked_since, S::CAN_WAIT);
        stages.mark(4);
        if consumed < got {
            // Backpressure: the rest stays in the source for the next visit.
            src.give_back(got - consumed);
        }
        let bytes = count_consumed(env, &frames[..consumed], pc);
        if sender.policy().watched_src {
            watched(env, dv, port.id, sender.policy(), &frames[..consumed]);
        }
        if let Some(x) = env.ports.export.as_deref() {
            tap::exported(x, cx.index, port.id, &frames[..consumed]);
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

/// A watched port's consumed frames offered to its captures and copied to its mirrors.
#[cold]
#[inline(never)]
fn watched(env: &Env, dv: &mut Delivery, port: u16, policy: &PortPolicy, frames: &[Frame]) {
    if !policy.taps.0.is_empty() {
        // A tunnel's frames are captured as it sent them, without the tag decapsulation put
        // in for its VNI's VLAN.
        let missed: &[_] = if policy.traced { &dv.missed } else { &[] };
        tap::received(env.cx.index, &policy.taps.0, frames, env.ports.is_tunnel(port), missed);
        if policy.traced {
            dv.missed = Default::default();
        }
    }
    if !policy.mirrors.as_src.is_empty() {
        mirror::as_src(env, dv, &policy.mirrors.as_src, frames);
    }
}

/// One pass over a burst's consumed frames: their bytes (returned) and drops, and (with a flow
/// table) the flow counters, once per run of frames that hit the same flow.
#[inline(always)]
fn count_consumed(env: &Env, frames: &[Frame], pc: &PortCounters) -> u64 {
    let mut bytes = 0u64;
    if env.flows.is_normal() {
        for f in frames {
            bytes += f.len as u64;
            if let Out::Drop(why) = f.out {
                pc.drop(why, 1);
            }
        }
        return bytes;
    }
    let mut run = (FlowState::Unmatched, 0u64, 0u64);
    for f in frames {
        bytes += f.len as u64;
        if let Out::Drop(why) = f.out {
            pc.drop(why, 1);
        }
        if f.flow != run.0 {
            if let FlowState::Hit(i) = run.0 {
                env.flows.count(env.cx.index, i, run.1, run.2);
            }
            run = (f.flow, 0, 0);
        }
        run.1 += 1;
        run.2 += f.len as u64;
    }
    if let FlowState::Hit(i) = run.0 {
        env.flows.count(env.cx.index, i, run.1, run.2);
    }
    bytes
}
