//! A poll-mode thread: it owns a set of receive queues (guests' TX virtqueues, from any ports)
//! and visits them in turn. One visit reads bursts of frames until the queue's packet or byte
//! budget is spent, classifies each frame, and copies it once, straight from the sender's
//! buffer into the receiver's, then completes the burst with one used-index store and at most
//! one interrupt per queue.
//!
//! The data path reads in one direction:
//! `visit` (port rx) -> burst of `Frame`s -> `classify` -> `deliver` (actions) -> `write_frame` (port tx).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use log::error;

use crate::flow::{Action, Emc, Emit, EthHeader, FlowKey, execute};
use crate::flow_table::{FlowTable, NO_MATCH, Verdict};
use crate::idle::Sleeper;
use crate::mac_table::MacTable;
use crate::nic::{NicRx, TxBatches};
use crate::plan::{Mailbox, Plan, PortPolicy, PortTable, RxqSpec};
use crate::port::Port;
use crate::sched::{Deficit, Quantum};
use crate::stats::{self, Drop, PortCounters, ThreadStats, bump, cycles};
use crate::vring::{ActiveRing, RingError, Segs, Vring, VringGuard};

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
                got += if rxq.spec.port.nic.is_some() {
                    visit_nic(&env, &mut self.emc, &mut self.frames, &mut self.rx, &mut self.nic_rx, rxq)
                } else {
                    visit(&env, &mut self.emc, &mut self.frames, &mut self.rx, rxq)
                };
            }
            if !self.rx.nic_tx.is_empty() {
                self.rx.nic_tx.flush(env.ports, self.cx.index, &st);
            }
            let t1 = cycles();
            bump(if got > 0 { &st.busy_cycles } else { &st.idle_cycles }, t1.wrapping_sub(t0));
            bump(&st.iterations, 1);
            t0 = t1;
            if let Some(s) = self.sleeper.as_mut() {
                if got > 0 {
                    s.busy();
                } else {
                    let (mb, have, shutdown) = (&self.cx.mailbox, self.generation, &self.cx.shutdown);
                    let queues = self
                        .rxqs
                        .iter()
                        .filter(|r| r.spec.port.nic.is_none())
                        .map(|r| &r.spec.port.vrings[2 * r.spec.qpair + 1]);
                    let nic = self.rxqs.iter().any(|r| r.spec.port.nic.is_some());
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
    let vq = &port.vrings[vq_index];
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
            ring.prefetch_ahead(false);
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
        let mut bytes = 0u64;
        for f in &mut frames[..got] {
            classify(env, emc, port, policy, f, hdr_len);
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
    if empty {
        // An idle queue saves up no credit.
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
    let Some(nic) = port.nic.as_ref() else { return 0 };
    let pc = &cx.stats.ports[port.id as usize];
    let policy = &env.ports.policy[port.id as usize];
    let t0 = cycles();
    let mut budget = deficit.start_visit(Quantum { packets: spec.weight_packets, bytes: spec.weight_bytes });
    let (mut total, mut total_bytes, mut empty) = (0u32, 0u64, false);
    while budget.allows() {
        let max = cx.burst.min(budget.burst_limit()) as usize;
        let Some(got) = nic.rx(spec.qpair, nic_rx, max.min(frames.len())) else { break };
        if got == 0 {
            empty = total == 0;
            break;
        }
        for (i, f) in frames[..got].iter_mut().enumerate() {
            nic_rx.source(i, &mut f.segs);
            f.head = i as u16;
            f.segs.prefetch(0);
        }
        let mut bytes = 0u64;
        for f in &mut frames[..got] {
            classify(env, emc, port, policy, f, 0);
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

/// Decides where a frame goes. With no flow table: MAC learning on the source, lookup on the
/// destination, flooding for broadcast, multicast and unknown unicast (OVS's NORMAL). With
/// one: the exact-match cache, then the classifier, then the flow's actions.
#[inline]
fn classify(env: &Env, emc: &mut Emc, in_port: &Port, policy: &PortPolicy, f: &mut Frame, hdr_len: u32) {
    f.data_off = hdr_len;
    f.len = f.segs.len().saturating_sub(hdr_len);
    f.out = Out::Nowhere;
    f.flow = UNCLASSIFIED;
    let mut eth = [0u8; 64];
    let want = if env.flows.is_normal() { 12 } else { (f.len as usize).min(64) };
    if f.len < 14 || f.segs.read_at(hdr_len, &mut eth[..want]) < want {
        f.out = Out::Drop(Drop::Runt);
        return;
    }
    if f.len > in_port.max_frame() {
        f.out = Out::Drop(Drop::Mtu);
        return;
    }
    let dst: [u8; 6] = eth[0..6].try_into().unwrap();
    let src: [u8; 6] = eth[6..12].try_into().unwrap();
    if !policy.allows(&src) {
        f.out = Out::Drop(Drop::PortSecurity);
        return;
    }
    if env.flows.is_normal() {
        f.out = normal(env, in_port.id, &dst, &src);
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
        Verdict::Normal => normal(env, in_port.id, &dst, &src),
        // As in OpenFlow, output to the input port is a no-op; `in_port` is how to send back.
        Verdict::Output(p) if p == in_port.id => Out::Nowhere,
        Verdict::Output(p) => Out::Port(p),
        Verdict::InPort => Out::Port(in_port.id),
        Verdict::Flood => Out::Flood,
        Verdict::Drop => Out::Drop(Drop::FlowDrop),
        Verdict::Actions => Out::Actions(i),
    };
}

/// The NORMAL action: learn the source, forward to where the destination was learned, flood
/// broadcast, multicast and unknown unicast.
#[inline]
fn normal(env: &Env, in_port: u16, dst: &[u8; 6], src: &[u8; 6]) -> Out {
    if src[0] & 1 == 0 {
        env.cx.mac.learn(src, in_port);
    }
    if dst[0] & 1 != 0 {
        return Out::Flood;
    }
    match env.cx.mac.lookup(dst) {
        Some(p) if p == in_port => Out::Nowhere,
        Some(p) if env.ports.get(p).is_some() => Out::Port(p),
        _ => Out::Flood,
    }
}

/// A guest RX queue held open while consecutive frames go to the same port, so a burst to one
/// destination costs one lock, one used-index store and at most one interrupt.
struct Open<'a> {
    cx: &'a Ctx,
    port: &'a Port,
    vq_index: usize,
    /// The guest RX queue; None for a NIC port (frames go to the thread's TX batch for it).
    guard: Option<VringGuard<'a>>,
    packets: u64,
    bytes: u64,
}

impl<'a> Open<'a> {
    fn new(env: &'a Env, p: u16) -> Option<Open<'a>> {
        let port = &**env.ports.get(p)?;
        if port.nic.is_some() {
            return Some(Open { cx: env.cx, port, vq_index: 0, guard: None, packets: 0, bytes: 0 });
        }
        let (vq_index, vq) = port.rx_queue_for(env.src_q.get())?;
        let guard = vq.lock();
        guard.is_ready().then_some(Open { cx: env.cx, port, vq_index, guard: Some(guard), packets: 0, bytes: 0 })
    }

    /// Whether the guest has at least one receive buffer free.
    fn has_room(&mut self) -> bool {
        // A NIC never makes a sender wait: a full TX ring drops (nic_tx_full).
        let Some(guard) = self.guard.as_mut() else { return true };
        let Vring { active, broken, .. } = &mut **guard;
        matches!(active.as_mut().filter(|_| broken.is_none()).map(|r| r.avail()), Some(Ok(n)) if n > 0)
    }

    fn write(&mut self, f: &Frame, e: Shape, rx: &mut RxScratch) -> Result<(), Drop> {
        let Some(guard) = self.guard.as_mut() else {
            // A NIC port: copy into an mbuf of the thread's TX batch (counted when sent).
            let nic = self.port.nic.as_ref().ok_or(Drop::PortDown)?;
            let pc = &self.cx.stats.ports[self.port.id as usize];
            let (off, len) = (f.data_off + e.skip, f.len - e.skip);
            return rx.nic_tx.write(self.port.id, nic, self.cx.index, pc, &f.segs, off, len, e.prefix).map(|_| ());
        };
        let Vring { active, broken, hdr_len, mrg_rxbuf, .. } = &mut **guard;
        let Some(ring) = active.as_mut().filter(|_| broken.is_none()) else { return Err(Drop::PortDown) };
        match write_frame(ring, *hdr_len, *mrg_rxbuf, f, e, rx) {
            Ok(()) => {
                self.packets += 1;
                self.bytes += (f.len - e.skip + e.prefix.len() as u32) as u64;
                Ok(())
            }
            Err(WriteError::Drop(why)) => Err(why),
            Err(WriteError::Ring(e)) => {
                ring_broke(self.port, self.vq_index, broken, e);
                Err(Drop::Malformed)
            }
        }
    }

    /// Publishes what was written with one used-index store; interrupts the guest if it asked.
    fn close(mut self, pc: &PortCounters) {
        let Some(guard) = self.guard.as_mut() else { return };
        bump(&pc.tx_batches, (self.packets > 0) as u64);
        bump(&pc.tx_packets, self.packets);
        bump(&pc.tx_bytes, self.bytes);
        if let Some(ring) = guard.active.as_mut()
            && ring.publish()
            && ring.notify()
        {
            bump(&pc.interrupts, 1);
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
fn deliver(
    env: &Env,
    frames: &[Frame],
    rx: &mut RxScratch,
    in_port: u16,
    blocked_since: &mut Option<u64>,
    wait: bool,
) -> usize {
    let n = deliver_in_order(env, frames, rx, in_port, blocked_since, wait);
    if !rx.nic_tx.is_empty() {
        rx.nic_tx.flush(env.ports, env.cx.index, &env.cx.stats);
    }
    n
}

fn deliver_in_order(
    env: &Env,
    frames: &[Frame],
    rx: &mut RxScratch,
    in_port: u16,
    blocked_since: &mut Option<u64>,
    wait: bool,
) -> usize {
    let cx = env.cx;
    let mut open: Option<Open> = None;
    let mut i = 0;
    while i < frames.len() {
        let f = &frames[i];
        match f.out {
            Out::Nowhere | Out::Drop(_) => {}
            Out::Port(p) => {
                if open.as_ref().map(|o| o.port.id) != Some(p) {
                    o_close(open.take(), env);
                    open = Open::new(env, p);
                }
                let pc = &cx.stats.ports[p as usize];
                match open.as_mut().map(|o| o.write(f, AS_IS, rx)) {
                    None => pc.drop(Drop::PortDown, 1),
                    Some(Ok(())) => rx.stalled[p as usize] = false,
                    Some(Err(Drop::RxRingFull)) if wait && !rx.stalled[p as usize] => {
                        if keep_waiting(cx, rx, p, blocked_since) {
                            o_close(open, env);
                            return i;
                        }
                        pc.drop(Drop::RxRingFull, 1);
                    }
                    Some(Err(why)) => {
                        rx.dropped_full |= why == Drop::RxRingFull;
                        pc.drop(why, 1)
                    }
                }
            }
            Out::Actions(fi) => {
                o_close(open.take(), env);
                // Backpressure as for a single output, checked before any copy goes out so a
                // retried frame is never sent twice: wait while a port it names is full.
                if wait
                    && let Some(p) = full_output(env, fi, in_port)
                    && !rx.stalled[p as usize]
                    && keep_waiting(cx, rx, p, blocked_since)
                {
                    return i;
                }
                run_actions(env, f, fi, in_port, rx);
            }
            Out::Flood => {
                o_close(open.take(), env);
                // A run of consecutive flooded frames goes to each port as one batch. Best
                // effort, as broadcast is: a full or absent port misses the frame.
                let run = frames[i..].iter().take_while(|f| f.out == Out::Flood).count();
                for dp in env.ports.live.iter().filter(|dp| dp.id != in_port) {
                    let pc = &cx.stats.ports[dp.id as usize];
                    if let Some(mut o) = Open::new(env, dp.id) {
                        for f in &frames[i..i + run] {
                            if let Err(why) = o.write(f, AS_IS, rx) {
                                pc.drop(why, 1);
                            }
                        }
                        o.close(pc);
                    }
                }
                i += run;
                continue;
            }
        }
        i += 1;
    }
    o_close(open, env);
    *blocked_since = None;
    frames.len()
}

/// Whether a frame whose destination `p` is full should wait (stay in the sender's ring) or,
/// having waited `retry_cycles` already, be dropped toward `p`, which is then marked stalled:
/// frames to it drop without waiting until it takes one again.
fn keep_waiting(cx: &Ctx, rx: &mut RxScratch, p: u16, blocked_since: &mut Option<u64>) -> bool {
    let now = cycles();
    let since = *blocked_since.get_or_insert(now);
    if now.wrapping_sub(since) < cx.retry_cycles {
        return true;
    }
    rx.stalled[p as usize] = true;
    *blocked_since = None;
    false
}

/// The first port a flow's actions name explicitly (output:PORT, in_port) whose guest RX ring
/// has no free buffer.
fn full_output(env: &Env, fi: u32, in_port: u16) -> Option<u16> {
    let mut full = None;
    for a in env.flows.actions(fi) {
        let p = match *a {
            Action::Output(p) if p != in_port => p,
            Action::InPort => in_port,
            _ => continue,
        };
        if full.is_none() && Open::new(env, p).is_some_and(|mut o| !o.has_room()) {
            full = Some(p);
        }
    }
    full
}

/// Runs a flow's action list on one frame: each output sends the frame as the header
/// rewrites before it left it. Best effort, like flooding: a full or absent port misses it.
fn run_actions(env: &Env, f: &Frame, fi: u32, in_port: u16, rx: &mut RxScratch) {
    let mut raw = [0u8; 22];
    let n = f.segs.read_at(f.data_off, &mut raw[..(f.len as usize).min(22)]);
    let Some((hdr, covered)) = EthHeader::parse(&raw[..n]) else { return };
    execute(env.flows.actions(fi), &hdr, |emit, h| {
        let mut buf = [0u8; 20];
        let len = h.write(&mut buf);
        let shape = Shape { prefix: &buf[..len], skip: covered as u32 };
        match emit {
            Emit::Port(p) if p != in_port => send_one(env, p, f, shape, rx, true),
            Emit::Port(_) => {}
            Emit::InPort => send_one(env, in_port, f, shape, rx, true),
            Emit::Flood | Emit::All => {
                for dp in env.ports.live.iter().filter(|dp| dp.id != in_port) {
                    send_one(env, dp.id, f, shape, rx, false);
                }
            }
            Emit::Normal => match normal(env, in_port, &h.dst, &h.src) {
                Out::Port(p) => send_one(env, p, f, shape, rx, true),
                Out::Flood => {
                    for dp in env.ports.live.iter().filter(|dp| dp.id != in_port) {
                        send_one(env, dp.id, f, shape, rx, false);
                    }
                }
                _ => {}
            },
        }
    });
}

/// Sends one frame to port `p`; a port that is down counts a drop only if `named` (an
/// explicit output, not a flood, which reaches whoever is up).
fn send_one(env: &Env, p: u16, f: &Frame, shape: Shape, rx: &mut RxScratch, named: bool) {
    let pc = &env.cx.stats.ports[p as usize];
    match Open::new(env, p) {
        Some(mut o) => {
            match o.write(f, shape, rx) {
                Ok(()) => rx.stalled[p as usize] = false,
                Err(why) => pc.drop(why, 1),
            }
            o.close(pc);
        }
        None if named => pc.drop(Drop::PortDown, 1),
        None => {}
    }
}

fn o_close(open: Option<Open>, env: &Env) {
    if let Some(o) = open {
        let pc = &env.cx.stats.ports[o.port.id as usize];
        o.close(pc);
    }
}

enum WriteError {
    Drop(stats::Drop),
    Ring(RingError),
}

impl From<RingError> for WriteError {
    fn from(e: RingError) -> Self {
        WriteError::Ring(e)
    }
}

/// A frame as it leaves the switch: `prefix` (rewritten Ethernet addresses and VLAN tags, or
/// nothing) followed by the sender's frame from byte `skip` on.
#[derive(Clone, Copy)]
struct Shape<'a> {
    prefix: &'a [u8],
    skip: u32,
}

const AS_IS: Shape = Shape { prefix: &[], skip: 0 };

/// Copies one frame into the guest's receive buffers: the virtio-net header, then the frame,
/// spread over several buffers when MRG_RXBUF allows (num_buffers says how many).
#[inline]
fn write_frame(
    ring: &mut ActiveRing,
    hdr_len: u32,
    mrg: bool,
    f: &Frame,
    e: Shape,
    rx: &mut RxScratch,
) -> Result<(), WriteError> {
    let pre = e.prefix.len() as u32;
    let (body_off, body_len) = (f.data_off + e.skip, f.len - e.skip);
    let need = hdr_len + pre + body_len;
    if ring.avail()? == 0 {
        return Err(WriteError::Drop(Drop::RxRingFull));
    }
    ring.prefetch_ahead(true);
    let head = ring.pop(&mut rx.first, true)?;
    let first_room = rx.first.len();
    if first_room < hdr_len + pre || (!mrg && first_room < need) {
        ring.push_used(head, 0);
        return Err(WriteError::Drop(Drop::RxBufferTooSmall));
    }
    if pre > 0 {
        rx.first.write_at(hdr_len, e.prefix);
    }
    let mut copied = (first_room - hdr_len - pre).min(body_len);
    rx.first.copy_from(hdr_len + pre, &f.segs, body_off, copied);
    ring.push_used(head, hdr_len + pre + copied);
    let mut nbufs: u16 = 1;
    while copied < body_len {
        if ring.avail()? == 0 {
            ring.unpop(nbufs);
            ring.unpush(nbufs);
            return Err(WriteError::Drop(Drop::RxRingFull));
        }
        let h = ring.pop(&mut rx.more, true)?;
        let c = rx.more.len().min(body_len - copied);
        rx.more.copy_from(0, &f.segs, body_off + copied, c);
        ring.push_used(h, c);
        copied += c;
        nbufs += 1;
    }
    let mut hdr = [0u8; 12];
    hdr[10..12].copy_from_slice(&nbufs.to_le_bytes());
    rx.first.write_at(0, &hdr[..hdr_len as usize]);
    Ok(())
}
