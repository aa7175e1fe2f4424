//! The data path: poll-mode threads. Each owns a set of receive queues (guests' TX virtqueues
//! and NIC receive queues, from any ports) and visits them in turn. One visit reads bursts of
//! frames until the queue's packet or byte budget is spent, classifies each frame, and copies it
//! once, straight from the sender's buffer into the receiver's, then completes the burst with
//! one used-index store and at most one interrupt per queue.
//!
//! The data path reads in one direction, one stage per file:
//! `input` (port rx: a visit takes a burst of `Frame`s from its source; `frame` holds a frame's
//! bytes, the switch's copy of its front among them) -> `classify` (where
//! each goes) -> `output` (actions, then port tx: `deliver`, `write_frame`; a destination's ring
//! is completed there, the source's back in `input`).
//!
//! Beside the stages: `vlan` (a frame's VLAN as it enters and as it leaves each port), `sched` (the visit budget), `idle` (adaptive polling's sleep), `plan` (what
//! a thread works from, and how it gets a new one), `mac_table`, `counters`, `nic_io` (the
//! thread's NIC bursts), and `stages` (the cycles of each stage, with the `stage-profile`
//! feature only).

mod classify;
pub mod counters;
mod frame;
pub mod idle;
mod input;
pub mod mac_table;
pub mod nic_io;
mod offload;
#[cfg(test)]
pub(crate) use offload::for_fuzzing as offload_for_fuzzing;
mod output;
pub mod plan;
pub mod sched;
mod stages;
#[cfg(test)]
mod tests;
pub mod vlan;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use log::error;

use self::counters::{DropReason, RunningTuning, ThreadStats, bump, cycles};
use self::frame::Frames;
use self::idle::Sleeper;
use self::input::{Rxq, visit};
use self::mac_table::MacTable;
use self::nic_io::NicRx;
use self::output::Delivery;
use self::plan::{Mailbox, Plan, PortTable};
use crate::flow::Emc;
use crate::flow::table::FlowTable;
use crate::port::Port;
use crate::vring::RingError;

/// What a poll thread is given at start. Its polling (`burst`, `retry_cycles`,
/// `sleep_after_us`, `nic_poll_interval_us`) follows each plan's `Tuning`.
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
    Drop(DropReason),
    Port(u16),
    Flood,
    /// Run flow `.0`'s action list.
    Actions(u32),
}

/// What a poll thread reuses from burst to burst, lent to each visit: the burst's frames, the
/// exact-match cache in front of the flow table's classifier, and delivery's state.
struct Work {
    frames: Frames,
    emc: Box<Emc>,
    delivery: Delivery,
}

/// Where a frame stands with the flow table, from classify's first pass to its counting.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FlowState {
    /// No flow decides it: there is no flow table (NORMAL), or it was dropped before a
    /// lookup. Nothing is counted on a flow.
    Unmatched,
    /// Between classify's two passes: its key (`Frame::key`, `Frame::hash`) waits for the lookup.
    Pending,
    /// Between classify's two passes: its key is the previous pending frame's (not stored
    /// again), so it takes that frame's flow.
    Repeat,
    /// It hit the table's flow `.0`, or none (`NO_MATCH`, counted as a miss).
    Hit(u32),
}

/// Logs a queue's first error and stops it (`broken`), until the guest resets it.
pub(super) fn ring_broke(port: &Port, vq: usize, broken: &mut Option<RingError>, e: RingError) {
    if broken.is_none() {
        error!("port {} queue {vq}: {}; queue stopped until the guest resets it", port.name(), e.as_str());
        *broken = Some(e);
    }
}

pub struct PollThread {
    cx: Ctx,
    plan: Box<Plan>,
    /// Generation of `plan` (see `Mailbox`).
    generation: u64,
    rxqs: Vec<Rxq>,
    work: Work,
    /// Mbufs received from a NIC queue while they are switched.
    nic_rx: NicRx,
    /// Present in adaptive polling mode.
    sleeper: Option<Sleeper>,
}

impl PollThread {
    pub fn new(cx: Ctx, plan: Plan) -> PollThread {
        // Room for the largest burst a reload may set.
        let room = crate::config::MAX_BURST.max(cx.burst) as usize;
        let mut t = PollThread {
            cx,
            plan: Box::new(Plan {
                ports: Default::default(),
                flows: Default::default(),
                rxqs: Vec::new(),
                tuning: None,
            }),
            generation: 0,
            rxqs: Vec::new(),
            work: Work { frames: Frames::new(room), emc: Box::new(Emc::default()), delivery: Delivery::default() },
            nic_rx: NicRx::default(),
            sleeper: None,
        };
        t.sleeper = t.new_sleeper();
        t.adopt(Box::new(plan));
        t.show_tuning();
        t
    }

    /// Stores the polling settings this thread runs with where `stats` reads them.
    fn show_tuning(&self) {
        let r = &self.cx.stats.running;
        r.burst.store(self.cx.burst as u64, Relaxed);
        r.retry_cycles.store(self.cx.retry_cycles, Relaxed);
        let sleep = match (&self.sleeper, self.cx.sleep_after_us) {
            (Some(_), Some(us)) => us as u64,
            _ => RunningTuning::BUSY,
        };
        r.sleep_after_us.store(sleep, Relaxed);
        r.nic_poll_interval_us.store(self.cx.nic_poll_interval_us as u64, Relaxed);
    }

    /// The sleeper adaptive polling needs (None: busy polling, or it cannot be made).
    fn new_sleeper(&self) -> Option<Sleeper> {
        let us = self.cx.sleep_after_us?;
        Sleeper::new(&self.cx.mailbox, us, self.cx.nic_poll_interval_us)
            .map_err(|e| log::warn!("poll thread {}: cannot sleep ({e}); polling busily", self.cx.index))
            .ok()
    }

    /// Takes a plan's polling settings; a changed polling mode gets a new sleeper (or none).
    fn tune(&mut self, t: crate::datapath::plan::Tuning) {
        let room = self.work.frames.capacity() as u32;
        self.cx.burst = t.burst.min(room);
        self.cx.retry_cycles = t.retry_cycles;
        let sleeping = (self.cx.sleep_after_us, self.cx.nic_poll_interval_us);
        if sleeping != (t.sleep_after_us, t.nic_poll_interval_us) {
            (self.cx.sleep_after_us, self.cx.nic_poll_interval_us) = (t.sleep_after_us, t.nic_poll_interval_us);
            self.sleeper = None;
            self.sleeper = self.new_sleeper();
        }
        self.show_tuning();
    }

    /// Switches to a new plan. Queues that stay keep their state; the plan's tables replace
    /// the old ones whole. Called between loop iterations, holding no ring.
    fn adopt(&mut self, plan: Box<Plan>) {
        if let Some(t) = plan.tuning {
            self.tune(t);
        }
        let mut old = std::mem::take(&mut self.rxqs);
        self.rxqs = plan
            .rxqs
            .iter()
            .map(|spec| {
                let kept = old.iter().position(|r| Arc::ptr_eq(&r.spec.port, &spec.port) && r.spec.qpair == spec.qpair);
                match kept.map(|i| old.swap_remove(i)) {
                    Some(r) => Rxq { spec: spec.clone(), state: r.state },
                    None => Rxq::new(spec.clone()),
                }
            })
            .collect();
        self.work.delivery.new_plan(plan.ports.by_id.len());
        if !Arc::ptr_eq(&plan.flows, &self.plan.flows) {
            self.work.emc.clear();
        }
        if let Some(s) = self.sleeper.as_mut() {
            s.reset();
        }
        self.plan = plan;
    }

    /// One loop iteration: adopts a plan the control thread posted, visits every receive queue
    /// once, and sends what waits for NIC ports. Returns the frames taken.
    pub fn run_once(&mut self) -> u32 {
        if let Some((generation, plan)) = self.cx.mailbox.check(self.generation) {
            self.adopt(plan);
            self.generation = generation;
            self.cx.mailbox.ack(generation);
        }
        let env = Env { cx: &self.cx, ports: &self.plan.ports, flows: &self.plan.flows, src_q: Default::default() };
        let mut got = 0;
        for rxq in self.rxqs.iter_mut() {
            got += visit(&env, &mut self.work, &mut self.nic_rx, rxq);
        }
        let nic_tx = &mut self.work.delivery.nic_tx;
        if !nic_tx.is_empty() {
            nic_tx.flush(env.ports, self.cx.index, &self.cx.stats);
        }
        got
    }

    /// Polls until shutdown. Busy and idle cycles are charged per loop iteration.
    pub fn run(&mut self) {
        let st = self.cx.stats.clone();
        let mut t0 = cycles();
        while !self.cx.shutdown.load(Relaxed) && !self.cx.mailbox.retired() {
            let got = self.run_once();
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
