//! A poll-mode thread: it owns a set of receive queues (guests' TX virtqueues, from any ports)
//! and visits them in turn. One visit reads bursts of frames until the queue's packet or byte
//! budget is spent, classifies each frame, and copies it once, straight from the sender's
//! buffer into the receiver's, then completes the burst with one used-index store and at most
//! one interrupt per queue.
//!
//! The data path reads in one direction:
//! `visit` (port rx) -> burst of `Frame`s -> `classify` -> `deliver` (actions) -> `write_frame` (port tx).

pub mod counters;
pub mod idle;
pub mod mac_table;
pub mod nic_io;
mod output;
pub mod plan;
pub mod sched;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use log::error;

use self::idle::Sleeper;
use crate::flow::table::{FlowTable, NO_MATCH, Verdict};
use crate::flow::{Action, Emc, Emit, FlowKey, execute};

use self::counters::{Drop, PortCounters, ThreadStats, bump, cycles};
use self::mac_table::MacTable;
use self::nic_io::{NicRx, TxBatches};
use self::output::deliver;
use self::plan::{Mailbox, Plan, PortPolicy, PortTable, RxqSpec};
use self::sched::{Deficit, Quantum};
use crate::port::{Port, PortKind};
use crate::vring::{ActiveRing, RingError, Segs, Vring, VringGuard};
use crate::wire::{EthernetFrame, EthernetRepr, MacAddr};

/// A receive queue: queue pair `qpair` of `port` (its guest TX virtqueue is 2*qpair+1), and
/// the poll thread's state for it, which survives plan changes that keep the queue here.
struct Rxq {
    spec: RxqSpec,
    /// When this queue's head frame first found its destination full (TSC), while it waits.
    blocked_since: Option<u64>,
    /// Its credit in the thread's deficit round robin.
    deficit: Deficit,
}

/// What a poll thread is given at start and never changes.
pub struct Ctx {
    pub index: usize,
    pub mac: Arc<MacTable>,
    pub stats: Arc<ThreadStats>,
    pub burst: u32,
    /// How long a frame may wait for room in a full guest RX ring before it is dropped.
    pub retry_cycles: u64,
    pub shutdown: Arc<AtomicBool>,
    pub mailbox: Arc<Mailbox>,
    /// Adaptive polling: sleep after this long without frames. None: busy polling.
    pub sleep_after_us: Option<u32>,
    /// Adaptive polling: a thread with NIC queues (which cannot kick) sleeps at most this long.
    pub nic_poll_interval_us: u32,
}

/// The current plan's tables, borrowed for one loop iteration.
struct Env<'a> {
    cx: &'a Ctx,
    ports: &'a PortTable,
    flows: &'a FlowTable,
    /// Queue pair of the queue being visited: frames from it go to the same-numbered receive
    /// queue of their destination (modulo its count), whichever thread polls it, so moving a
    /// queue between threads never splits a flow over two of the receiver's queues.
    src_q: std::cell::Cell<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Goes nowhere, and that is no drop (its destination is the port it came from).
    Nowhere,
    /// Dropped, counted for this reason once the frame is consumed.
    Drop(Drop),
    Port(u16),
    Flood,
    /// Run flow `.0`'s action list.
    Actions(u32),
}

struct Frame {
    head: u16,
    segs: Segs,
    /// Offset of the Ethernet frame in `segs` (the sender's virtio-net header length).
    data_off: u32,
    /// Ethernet frame length.
    len: u32,
    out: Out,
    /// The flow it hit (or NO_MATCH), counted once the frame is consumed; UNCLASSIFIED when
    /// there is no flow table.
    flow: u32,
}

const UNCLASSIFIED: u32 = NO_MATCH - 1;

/// Receive-side scratch: segments of the buffers being filled, and per-port state.
struct RxScratch {
    first: Segs,
    more: Segs,
    /// Ports whose guest let a frame time out on a full ring: dropped toward without waiting
    /// until they have room again.
    stalled: Vec<bool>,
    /// Frames waiting to be sent to NIC ports, one burst per port.
    nic_tx: TxBatches,
    /// Set when `deliver` dropped a frame on a full guest ring (a NIC's visit then ends).
    dropped_full: bool,
}

pub struct PollThread {
    cx: Ctx,
    plan: Box<Plan>,
    /// Generation of `plan` (see `Mailbox`).
    generation: u64,
    rxqs: Vec<Rxq>,
    frames: Vec<Frame>,
    rx: RxScratch,
    /// Mbufs received from a NIC queue while they are switched.
    nic_rx: NicRx,
    /// Exact-match cache in front of the flow table's classifier.
    emc: Box<Emc>,
    /// Present in adaptive polling mode.
    sleeper: Option<Sleeper>,
}

impl PollThread {
    pub fn new(cx: Ctx, plan: Plan) -> PollThread {
        let burst = cx.burst as usize;
        let mut t = PollThread {
            cx,
            plan: Box::new(Plan { ports: Default::default(), flows: Default::default(), rxqs: Vec::new() }),
            generation: 0,
            rxqs: Vec::new(),
            frames: (0..burst)
                .map(|_| Frame {
                    head: 0,
                    segs: Segs::default(),
                    data_off: 0,
                    len: 0,
                    out: Out::Nowhere,
                    flow: UNCLASSIFIED,
                })
                .collect(),
            rx: RxScratch {
                first: Segs::default(),
                more: Segs::default(),
                stalled: Vec::new(),
                nic_tx: TxBatches::default(),
                dropped_full: false,
            },
            nic_rx: NicRx::default(),
            emc: Box::new(Emc::default()),
            sleeper: None,
        };
        if let Some(us) = t.cx.sleep_after_us {
            match Sleeper::new(&t.cx.mailbox, us, t.cx.nic_poll_interval_us) {
                Ok(s) => t.sleeper = Some(s),
                Err(e) => log::warn!("poll thread {}: cannot sleep ({e}); polling busily", t.cx.index),
            }
        }
        t.adopt(Box::new(plan));
        t
    }

    /// Switches to a new plan. Queues that stay keep their state; the plan's tables replace
    /// the old ones whole. Called between loop iterations, holding no ring.
    fn adopt(&mut self, plan: Box<Plan>) {
        let mut old = std::mem::take(&mut self.rxqs);
        self.rxqs = plan
            .rxqs
            .iter()
            .map(|spec| {
                let kept = old.iter().position(|r| Arc::ptr_eq(&r.spec.port, &spec.port) && r.spec.qpair == spec.qpair);
                let (blocked_since, deficit) = match kept.map(|i| old.swap_remove(i)) {
                    Some(r) => (r.blocked_since, r.deficit),
                    None => (None, Deficit::new()),
                };
                Rxq { spec: spec.clone(), blocked_since, deficit }
            })
            .collect();
        self.rx.stalled.clear();
        self.rx.stalled.resize(plan.ports.by_id.len(), false);
        if !Arc::ptr_eq(&plan.flows, &self.plan.flows) {
            self.emc.clear();
        }
        if let Some(s) = self.sleeper.as_mut() {
            s.reset();
        }
        self.plan = plan;
    }

    /// Polls until shutdown. Busy and idle cycles are charged per loop iteration.
    pub fn run(&mut self) {
        let st = self.cx.stats.clone();
        let mut t0 = cycles();
        while !self.cx.shutdown.load(Relaxed) && !self.cx.mailbox.retired() {
            if let Some((generation, plan)) = self.cx.mailbox.check(self.generation) {
                self.adopt(plan);
                self.generation = generation;
                self.cx.mailbox.ack(generation);
            }
            let env = Env { cx: &self.cx, ports: &self.plan.ports, flows: &self.plan.flows, src_q: Default::default() };
            let mut got = 0;
            for rxq in self.rxqs.iter_mut() {
                got += match &rxq.spec.port.kind {
                    PortKind::Nic(_) => {
                        visit_nic(&env, &mut self.emc, &mut self.frames, &mut self.rx, &mut self.nic_rx, rxq)
                    }
                    PortKind::VhostUser(_) => visit(&env, &mut self.emc, &mut self.frames, &mut self.rx, rxq),
                    PortKind::Failed => 0,
                };
            }
            if !self.rx.nic_tx.is_empty() {
                self.rx.nic_tx.flush(env.ports, self.cx.index, &st);
            }
            let t1 = cycles();
            bump(if got > 0 { &st.loops.busy_cycles } else { &st.loops.idle_cycles }, t1.wrapping_sub(t0));
            bump(&st.loops.iterations, 1);
            t0 = t1;
            if let Some(s) = self.sleeper.as_mut() {
                if got > 0 {
                    s.busy();
                } else {
                    let (mb, have, shutdown) = (&self.cx.mailbox, self.generation, &self.cx.shutdown);
                    let queues =
                        self.rxqs.iter().filter_map(|r| r.spec.port.queues().map(|q| q.guest_tx(r.spec.qpair)));
                    let nic = self.rxqs.iter().any(|r| r.spec.port.nic().is_some());
                    s.idle(queues, nic, &st, mb, || !mb.pending(have) && !shutdown.load(Relaxed) && !mb.retired());
                    // Time asleep is neither busy nor idle polling.
                    t0 = cycles();
                }
            }
            if self.rxqs.is_empty() {
                std::hint::spin_loop();
            }
        }
    }
}

fn ring_broke(port: &Port, vq: usize, broken: &mut Option<RingError>, e: RingError) {
    if broken.is_none() {
        error!("port {} queue {vq}: {}; queue stopped until the guest resets it", port.name(), e.as_str());
        *broken = Some(e);
    }
}

/// One visit to a receive queue. Returns the number of frames taken from it.
fn visit(env: &Env, emc: &mut Emc, frames: &mut [Frame], rx: &mut RxScratch, rxq: &mut Rxq) -> u32 {
    let cx = env.cx;
    let Rxq { spec, blocked_since, deficit } = rxq;
    let (port, qpair) = (&spec.port, spec.qpair);
    env.src_q.set(qpair);
    let vq_index = 2 * qpair + 1;
    let Some(queues) = port.queues() else { return 0 };
    let vq = queues.guest_tx(qpair);
    if !vq.is_ready() {
        return 0;
    }
    let mut g = vq.lock();
    let Vring { active, broken, hdr_len, .. } = &mut *g;
    let hdr_len = *hdr_len;
    let (Some(ring), None) = (active.as_mut(), *broken) else { return 0 };
    let pc = &cx.stats.ports[port.id as usize];
    let t0 = cycles();
    let policy = &env.ports.policy[port.id as usize];
    // Deficit round robin in packets and bytes: the visit ends when either credit is spent.
    let mut budget = deficit.start_visit(Quantum { packets: spec.weight_packets, bytes: spec.weight_bytes });
    let mut total = 0;
    let mut total_bytes = 0u64;
    let mut empty = false;
    while budget.allows() {
        let n = match ring.avail() {
            Ok(n) => (n as u32).min(cx.burst).min(budget.burst_limit()) as usize,
            Err(e) => {
                ring_broke(port, vq_index, broken, e);
                pc.drop(Drop::Malformed, 1);
                break;
            }
        };
        if n == 0 {
            empty = total == 0;
            break;
        }
        let mut got = 0;
        let mut err = None;
        while got < n {
            let f = &mut frames[got];
            ring.prefetch_ahead(None);
            match ring.pop(&mut f.segs, false) {
                Ok(head) => {
                    f.head = head;
                    got += 1;
                }
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        for f in &frames[..got] {
            f.segs.prefetch(hdr_len);
        }
        let (mut bytes, mut recent) = (0u64, None);
        for f in &mut frames[..got] {
            classify(env, emc, &mut recent, port, policy, f, hdr_len);
            bytes += f.len as u64;
        }
        let consumed = deliver(env, &frames[..got], rx, port.id, blocked_since, true);
        if consumed < got {
            // Backpressure: the rest stays in the guest's TX ring for the next visit.
            ring.unpop((got - consumed) as u16);
            bytes = frames[..consumed].iter().map(|f| f.len as u64).sum();
        }
        let got = consumed;
        bump(&pc.rx_bursts, (got > 0) as u64);
        bump(&spec.stats.bursts, (got > 0) as u64);
        bump(&pc.rx_packets, got as u64);
        bump(&pc.rx_bytes, bytes);
        for f in &frames[..got] {
            ring.push_used(f.head, 0);
            if let Out::Drop(why) = f.out {
                pc.drop(why, 1);
            }
            if f.flow != UNCLASSIFIED {
                env.flows.count(cx.index, f.flow, f.len);
            }
        }
        if ring.publish() && ring.notify() {
            bump(&pc.interrupts, 1);
        }
        budget.charge(got as u32, bytes);
        total += got as u32;
        total_bytes += bytes;
        if let Some(e) = err {
            ring_broke(port, vq_index, broken, e);
            pc.drop(Drop::Malformed, 1);
            break;
        }
        if blocked_since.is_some() {
            break;
        }
    }
    end_visit(deficit, spec, empty, total, total_bytes, t0)
}

/// Closes a visit: an idle queue saves up no credit; the queue's counters take what it moved
/// and the cycles it cost.
#[inline]
fn end_visit(deficit: &mut Deficit, spec: &RxqSpec, empty: bool, total: u32, bytes: u64, t0: u64) -> u32 {
    if empty {
        deficit.idle();
    }
    let qs = &spec.stats;
    bump(&qs.visits, 1);
    if total > 0 {
        bump(&qs.packets, total as u64);
        bump(&qs.bytes, bytes);
        bump(&qs.cycles, cycles().wrapping_sub(t0));
    }
    total
}

/// One visit to a NIC receive queue: bursts of mbufs, each classified and delivered like a
/// guest's frames (the frame's source is the mbuf's data), then freed. A NIC cannot be made to
/// wait, so frames toward a full guest ring are dropped (`rx_ring_full`) rather than held.
/// Returns the number of frames taken.
fn visit_nic(
    env: &Env,
    emc: &mut Emc,
    frames: &mut [Frame],
    rx: &mut RxScratch,
    nic_rx: &mut NicRx,
    rxq: &mut Rxq,
) -> u32 {
    let cx = env.cx;
    let Rxq { spec, blocked_since, deficit } = rxq;
    let port = &spec.port;
    let Some(nic) = port.nic() else { return 0 };
    let pc = &cx.stats.ports[port.id as usize];
    let policy = &env.ports.policy[port.id as usize];
    let t0 = cycles();
    let mut budget = deficit.start_visit(Quantum { packets: spec.weight_packets, bytes: spec.weight_bytes });
    let (mut total, mut total_bytes, mut empty) = (0u32, 0u64, false);
    while budget.allows() {
        let max = cx.burst.min(budget.burst_limit()) as usize;
        let Some(got) = nic_rx.receive(nic, spec.qpair, max.min(frames.len())) else { break };
        if got == 0 {
            empty = total == 0;
            break;
        }
        for (i, f) in frames[..got].iter_mut().enumerate() {
            nic_rx.source(i, &mut f.segs);
            f.head = i as u16;
            f.segs.prefetch(0);
        }
        let (mut bytes, mut recent) = (0u64, None);
        for f in &mut frames[..got] {
            classify(env, emc, &mut recent, port, policy, f, 0);
            bytes += f.len as u64;
        }
        rx.dropped_full = false;
        deliver(env, &frames[..got], rx, port.id, blocked_since, false);
        nic_rx.clear();
        bump(&pc.rx_bursts, 1);
        bump(&spec.stats.bursts, 1);
        bump(&pc.rx_packets, got as u64);
        bump(&pc.rx_bytes, bytes);
        for f in &frames[..got] {
            if let Out::Drop(why) = f.out {
                pc.drop(why, 1);
            }
            if f.flow != UNCLASSIFIED {
                env.flows.count(cx.index, f.flow, f.len);
            }
        }
        budget.charge(got as u32, bytes);
        total += got as u32;
        total_bytes += bytes;
        if rx.dropped_full {
            // A guest is not keeping up: rather than spend the rest of the budget dropping
            // toward it, let the other queues (its own among them) have the thread.
            break;
        }
    }
    end_visit(deficit, spec, empty, total, total_bytes, t0)
}

/// Decides where a frame goes. With no flow table: MAC learning on the source, lookup on the
/// destination, flooding for broadcast, multicast and unknown unicast (OVS's NORMAL). With
/// one: the exact-match cache, then the classifier, then the flow's actions.
#[inline]
fn classify(
    env: &Env,
    emc: &mut Emc,
    recent: &mut Recent,
    in_port: &Port,
    policy: &PortPolicy,
    f: &mut Frame,
    hdr_len: u32,
) {
    f.data_off = hdr_len;
    f.len = f.segs.len().saturating_sub(hdr_len);
    f.out = Out::Nowhere;
    f.flow = UNCLASSIFIED;
    if f.len < 14 {
        f.out = Out::Drop(Drop::Runt);
        return;
    }
    if f.len > in_port.max_frame() {
        f.out = Out::Drop(Drop::Mtu);
        return;
    }
    if env.flows.is_normal() {
        // Only the two addresses are read, straight into registers.
        let Some(addrs) = f.segs.read_array::<12>(hdr_len) else {
            f.out = Out::Drop(Drop::Runt);
            return;
        };
        f.out = if policy.allows(&MacAddr::from_bytes(&addrs[6..12])) {
            normal_in_burst(env, recent, in_port.id, &addrs)
        } else {
            Out::Drop(Drop::PortSecurity)
        };
        return;
    }
    let mut eth = [0u8; 64];
    let want = (f.len as usize).min(64);
    if f.segs.read_at(hdr_len, &mut eth[..want]) < want {
        f.out = Out::Drop(Drop::Runt);
        return;
    }
    // At least the 14-byte header: shorter frames were dropped as runts above.
    if !policy.allows(&EthernetFrame::new_unchecked(&eth[..want]).src_addr()) {
        f.out = Out::Drop(Drop::PortSecurity);
        return;
    }
    let key = FlowKey::extract(in_port.id, &eth[..want]);
    let i = env.flows.classify(emc, &key);
    f.flow = i;
    if i == NO_MATCH {
        f.out = Out::Drop(Drop::NoMatch);
        return;
    }
    f.out = match env.flows.verdict(i) {
        Verdict::Normal => normal_in_burst(env, recent, in_port.id, eth[..12].try_into().unwrap()),
        // As in OpenFlow, output to the input port is a no-op; `in_port` is how to send back.
        Verdict::Output(p) if p == in_port.id => Out::Nowhere,
        Verdict::Output(p) => Out::Port(p),
        Verdict::InPort => Out::Port(in_port.id),
        Verdict::Flood => Out::Flood,
        Verdict::Drop => Out::Drop(Drop::FlowDrop),
        Verdict::Actions => Out::Actions(i),
    };
}

/// The addresses (destination, source) of the last frame of a burst that went through NORMAL,
/// and where it went.
type Recent = Option<([u8; 12], Out)>;

/// NORMAL for a frame of a burst: frames of one burst mostly share their addresses, and a
/// repeat of the previous frame's pair goes where that frame went without learning (already
/// learned) or looking up again. A burst is switched as of one moment.
#[inline]
fn normal_in_burst(env: &Env, recent: &mut Recent, in_port: u16, addrs: &[u8; 12]) -> Out {
    if let Some((a, out)) = *recent
        && a == *addrs
    {
        return out;
    }
    let out = normal(env, in_port, &MacAddr::from_bytes(&addrs[0..6]), &MacAddr::from_bytes(&addrs[6..12]));
    *recent = Some((*addrs, out));
    out
}

/// The NORMAL action: learn the source, forward to where the destination was learned, flood
/// broadcast, multicast and unknown unicast.
#[inline]
fn normal(env: &Env, in_port: u16, dst: &MacAddr, src: &MacAddr) -> Out {
    if src.is_unicast() {
        env.cx.mac.learn(src, in_port);
    }
    if dst.is_multicast() {
        return Out::Flood;
    }
    match env.cx.mac.lookup(dst) {
        Some(p) if p == in_port => Out::Nowhere,
        Some(p) if env.ports.get(p).is_some() => Out::Port(p),
        _ => Out::Flood,
    }
}
