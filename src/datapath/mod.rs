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
//! Beside the stages: `delivery` (what delivery keeps between frames and bursts), `vlan` (a
//! frame's VLAN as it enters and as it leaves each port), `sched`
//! (the visit budget), `park` (idle queues out of the loop), `idle` (adaptive polling's sleep),
//! `kicks` (the kick eventfds both watch), `plan` (what
//! a thread works from, and how it gets a new one), `mac_table`, `counters`, `nic_io` (the
//! thread's NIC bursts), and `stages` (the cycles of each stage, with the `stage-profile`
//! feature only).

mod classify;
pub mod counters;
mod delivery;
mod frame;
pub mod idle;
mod input;
pub mod kicks;
pub mod mac_table;
pub mod nic_io;
mod offload;
#[cfg(test)]
pub(crate) use offload::for_fuzzing as offload_for_fuzzing;
mod output;
pub mod park;
pub mod plan;
pub mod sched;
mod stages;
#[cfg(test)]
mod tests;
pub mod vlan;
pub(crate) mod vxlan;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use log::error;

use self::counters::{DropReason, RunningTuning, ThreadStats, bump, cycles};
use self::delivery::Delivery;
use self::frame::Frames;
use self::idle::{Sleeper, Woken};
use self::input::{Rxq, visit};
use self::kicks::{Kicks, TIMER, WAKE};
use self::mac_table::MacTable;
use self::nic_io::NicRx;
use self::park::{Parking, SWEEP};
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
    /// Adaptive polling: a thread with NIC queues (which cannot kick) sleeps this long first,
    /// backing off to `nic_poll_max_us` while it finds nothing.
    pub nic_poll_interval_us: u32,
    pub nic_poll_max_us: u32,
    /// Parking: a queue empty this long is parked (0: never); parked queues' kicks are looked
    /// at every `park_check_us`.
    pub park_after_us: u32,
    pub park_check_us: u32,
}

/// The current plan's tables, borrowed for one loop iteration.
struct Env<'a> {
    cx: &'a Ctx,
    ports: &'a PortTable,
    flows: &'a FlowTable,
    /// The iteration's start (TSC): what delivery compares its timed skips against.
    now: u64,
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
    /// Indices in `rxqs` of the queues visited every iteration: all but the parked ones.
    polled: Vec<usize>,
    /// Index in `rxqs` by queue id (`RxqState::id`), for the kicks that name them.
    by_id: std::collections::HashMap<u64, usize>,
    work: Work,
    /// Mbufs received from a NIC queue while they are switched.
    nic_rx: NicRx,
    /// The kick fds of parked queues (and of all polled ones while asleep), with the mailbox;
    /// present when parking or adaptive polling is on.
    kicks: Option<Kicks>,
    /// Present in adaptive polling mode.
    sleeper: Option<Sleeper>,
    parking: Parking,
    /// When the frames floods skipped were last counted, and how often they are (1 ms).
    flushed_at: u64,
    flush_every: u64,
}

impl PollThread {
    pub fn new(cx: Ctx, plan: Plan) -> PollThread {
        // Room for the largest burst a reload may set.
        let room = crate::config::MAX_BURST.max(cx.burst) as usize;
        let parking = Parking::new(cx.park_after_us, cx.park_check_us);
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
            polled: Vec::new(),
            by_id: Default::default(),
            work: Work { frames: Frames::new(room), emc: Box::new(Emc::default()), delivery: Delivery::default() },
            nic_rx: NicRx::default(),
            kicks: None,
            sleeper: None,
            parking,
            flushed_at: 0,
            flush_every: crate::counter::cycles_per_sec() / 1000,
        };
        t.set_polling();
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
        r.nic_poll_max_us.store(self.cx.nic_poll_max_us as u64, Relaxed);
        let park = if self.parking.on() { self.cx.park_after_us as u64 } else { 0 };
        r.park_after_us.store(park, Relaxed);
        r.park_check_us.store(self.cx.park_check_us as u64, Relaxed);
    }

    /// Makes the kick watch, the sleeper and the parking the settings ask for (adaptive polling
    /// and parking need the watch; without it, the thread polls busily and parks nothing).
    fn set_polling(&mut self) {
        let wanted = self.cx.sleep_after_us.is_some() || self.cx.park_after_us > 0;
        if self.kicks.is_none() && wanted {
            self.kicks = Kicks::new(&self.cx.mailbox)
                .map_err(|e| log::warn!("poll thread {}: cannot watch kicks ({e}); polling busily", self.cx.index))
                .ok();
        }
        self.sleeper = match (self.cx.sleep_after_us, &self.kicks) {
            (Some(us), Some(_)) => Some(Sleeper::new(us, self.cx.nic_poll_interval_us, self.cx.nic_poll_max_us)),
            _ => None,
        };
        self.parking = match &self.kicks {
            Some(_) => Parking::new(self.cx.park_after_us, self.cx.park_check_us),
            None => Parking::new(0, self.cx.park_check_us),
        };
        if !self.parking.on() {
            self.unpark_all(cycles(), |_| true);
        }
    }

    /// Takes a plan's polling settings; a changed polling mode gets a new sleeper (or none),
    /// changed parking settings new parking.
    fn tune(&mut self, t: crate::datapath::plan::Tuning) {
        let room = self.work.frames.capacity() as u32;
        self.cx.burst = t.burst.min(room);
        self.cx.retry_cycles = t.retry_cycles;
        let cx = &mut self.cx;
        let polling =
            (cx.sleep_after_us, (cx.nic_poll_interval_us, cx.nic_poll_max_us), cx.park_after_us, cx.park_check_us);
        let wanted = (t.sleep_after_us, (t.nic_poll_interval_us, t.nic_poll_max_us), t.park_after_us, t.park_check_us);
        if polling != wanted {
            (cx.sleep_after_us, (cx.nic_poll_interval_us, cx.nic_poll_max_us), cx.park_after_us, cx.park_check_us) =
                wanted;
            self.set_polling();
        }
        self.show_tuning();
    }

    /// Switches to a new plan. Queues that stay keep their state (parked or not); the plan's
    /// tables replace the old ones whole. Called between loop iterations, holding no ring.
    fn adopt(&mut self, plan: Box<Plan>) {
        if let Some(t) = plan.tuning {
            self.tune(t);
        }
        let now = cycles();
        let mut old = std::mem::take(&mut self.rxqs);
        self.rxqs = plan
            .rxqs
            .iter()
            .map(|spec| {
                let kept = old.iter().position(|r| Arc::ptr_eq(&r.spec.port, &spec.port) && r.spec.qpair == spec.qpair);
                match kept.map(|i| old.swap_remove(i)) {
                    Some(r) => Rxq { spec: spec.clone(), state: r.state },
                    None => Rxq::new(spec.clone(), now),
                }
            })
            .collect();
        // The queues that left: no longer counted parked, nor watched.
        let gone = old.iter().filter(|r| r.state.parked.is_some()).count() as u64;
        self.cx.stats.parked.fetch_sub(gone, Relaxed);
        for r in old.iter().filter(|r| r.state.parked.is_some()) {
            r.spec.stats.unparks.fetch_add(1, Relaxed);
        }
        self.by_id = self.rxqs.iter().enumerate().map(|(i, r)| (r.state.id, i)).collect();
        if let Some(k) = self.kicks.as_mut() {
            k.retain(|id| self.by_id.contains_key(&id));
        }
        self.polled = (0..self.rxqs.len()).filter(|&i| self.rxqs[i].state.parked.is_none()).collect();
        self.work.delivery.new_plan(plan.ports.by_id.len(), &self.cx.stats);
        if !Arc::ptr_eq(&plan.flows, &self.plan.flows) {
            self.work.emc.clear();
        }
        if let Some(s) = self.sleeper.as_mut() {
            s.reset();
        }
        self.plan = plan;
    }

    /// One loop iteration: adopts a plan the control thread posted, visits every polled
    /// receive queue once (parking those empty for long enough), sends what waits for NIC
    /// ports, and looks at the parked queues' kicks when that is due. Returns the frames taken.
    pub fn run_once(&mut self) -> u32 {
        self.run_once_at(cycles())
    }

    /// `run_once` for an iteration that starts at `now` (TSC): the loop reads the clock once an
    /// iteration, for its busy/idle accounting, and passes it on.
    fn run_once_at(&mut self, now: u64) -> u32 {
        if let Some((generation, plan)) = self.cx.mailbox.check(self.generation) {
            self.adopt(plan);
            self.generation = generation;
            self.cx.mailbox.ack(generation);
        }
        let env =
            Env { cx: &self.cx, ports: &self.plan.ports, flows: &self.plan.flows, now, src_q: Default::default() };
        let mut got = 0;
        let mut k = 0;
        while k < self.polled.len() {
            let rxq = &mut self.rxqs[self.polled[k]];
            let n = visit(&env, &mut self.work, &mut self.nic_rx, rxq);
            got += n;
            if n > 0 {
                rxq.state.last_busy = now;
            } else if self.parking.due(rxq.state.last_busy, now)
                && let Some(kicks) = self.kicks.as_mut()
                && park_queue(rxq, kicks, &self.cx.stats)
            {
                self.polled.swap_remove(k);
                continue;
            }
            k += 1;
        }
        let nic_tx = &mut self.work.delivery.nic_tx;
        if !nic_tx.is_empty() {
            nic_tx.flush(env.ports, self.cx.index, &self.cx.stats);
        }
        if self.parking.check_due(now, got == 0) && self.polled.len() < self.rxqs.len() {
            self.check_parked(now);
        }
        if self.work.delivery.flood_missed() && now.wrapping_sub(self.flushed_at) > self.flush_every {
            self.work.delivery.flush_flood_missed(&self.cx.stats);
            self.flushed_at = now;
        }
        got
    }

    /// Looks at the parked queues without waiting: those kicked since the last look, or
    /// (after a control wake-up) whose ring restarted or that have an announcement to send,
    /// are polled again; and the sweep looks at a few parked queues' avail index.
    fn check_parked(&mut self, now: u64) {
        let Some(kicks) = self.kicks.as_ref() else { return };
        bump(&self.cx.stats.loops.park_checks, 1);
        let mut w = Woken { events: [Default::default(); 16], n: 0 };
        w.n = kicks.wait(0, &mut w.events);
        self.woken(&w, now);
        // The sweep: a frontend that never kicks is still served, every few milliseconds.
        let n = self.rxqs.len();
        let mut looked = 0;
        for _ in 0..n.min(64) {
            let i = self.parking.sweep_at % n;
            self.parking.sweep_at = i + 1;
            if self.rxqs[i].state.parked.is_some() {
                looked += 1;
                if has_frames(&self.rxqs[i]) {
                    bump(&self.cx.stats.loops.unparks_sweep, 1);
                    self.unpark(i, now);
                }
                if looked == SWEEP {
                    break;
                }
            }
        }
    }

    /// Handles what a look at the kick watch (or a sleep) ended with: kicked queues are polled
    /// again; a control wake-up is drained, and the parked queues it concerns are polled again.
    fn woken(&mut self, w: &Woken, now: u64) {
        let mut control = false;
        for id in w.ids() {
            match id {
                WAKE => control = true,
                TIMER => {}
                id => {
                    if let Some(&i) = self.by_id.get(&id)
                        && self.rxqs[i].state.parked.is_some()
                    {
                        bump(&self.cx.stats.loops.unparks_kick, 1);
                        self.unpark(i, now);
                    }
                }
            }
        }
        if control {
            // A sleeper already drained it; draining twice is harmless.
            self.cx.mailbox.drain_wake();
            let before = self.polled.len();
            self.unpark_all(now, ring_changed);
            bump(&self.cx.stats.loops.unparks_control, (self.polled.len() - before) as u64);
        }
    }

    /// Polls again the parked queues `which` picks.
    fn unpark_all(&mut self, now: u64, which: impl Fn(&Rxq) -> bool) {
        for i in 0..self.rxqs.len() {
            if self.rxqs[i].state.parked.is_some() && which(&self.rxqs[i]) {
                self.unpark(i, now);
            }
        }
    }

    /// Polls queue `i` again: its kicks suppressed, visited from the next iteration on.
    fn unpark(&mut self, i: usize, now: u64) {
        let r = &mut self.rxqs[i];
        if r.state.parked.take().is_none() {
            return;
        }
        if let Some(q) = r.spec.port.queues() {
            let mut g = q.guest_tx(r.spec.qpair).lock();
            if let Some(ring) = g.active.as_mut() {
                ring.disable_kicks();
            }
        }
        r.state.last_busy = now;
        r.spec.stats.unparks.fetch_add(1, Relaxed);
        self.cx.stats.parked.fetch_sub(1, Relaxed);
        self.polled.push(i);
    }

    /// Polls until shutdown. Busy and idle cycles are charged per loop iteration.
    pub fn run(&mut self) {
        let st = self.cx.stats.clone();
        let mut t0 = cycles();
        while !self.cx.shutdown.load(Relaxed) && !self.cx.mailbox.retired() {
            let got = self.run_once_at(t0);
            let t1 = cycles();
            bump(if got > 0 { &st.loops.busy_cycles } else { &st.loops.idle_cycles }, t1.wrapping_sub(t0));
            bump(&st.loops.iterations, 1);
            t0 = t1;
            if let (Some(s), Some(kicks)) = (self.sleeper.as_mut(), self.kicks.as_mut()) {
                if got > 0 {
                    s.busy();
                } else {
                    let (mb, have, shutdown) = (&self.cx.mailbox, self.generation, &self.cx.shutdown);
                    let rxqs = &self.rxqs;
                    let queues = self.polled.iter().filter_map(|&i| {
                        let r = &rxqs[i];
                        r.spec.port.queues().map(|q| (r.state.id, q.guest_tx(r.spec.qpair)))
                    });
                    let nic = self.polled.iter().any(|&i| rxqs[i].spec.port.nic().is_some());
                    let still = || !mb.pending(have) && !shutdown.load(Relaxed) && !mb.retired();
                    if let Some(w) = s.idle(queues, kicks, nic, &st, mb, still) {
                        // Time asleep is neither busy nor idle polling.
                        t0 = cycles();
                        self.woken(&w, t0);
                    }
                }
            }
            if self.rxqs.is_empty() {
                std::hint::spin_loop();
            }
        }
    }
}

/// Parks `rxq` (a guest's TX queue found empty for long enough): asks its guest for kicks,
/// watches its kick fd, and reads its avail index once more after a full fence, so a frame
/// made available meanwhile is either seen (the queue is not parked) or kicked. A ring that is
/// not running is parked too (the control thread's wake-up brings it back when it starts).
/// False if it cannot be parked: a NIC queue, or a ring without a kick fd.
fn park_queue(rxq: &mut Rxq, kicks: &mut Kicks, st: &ThreadStats) -> bool {
    let Some(q) = rxq.spec.port.queues() else { return false };
    let mut g = q.guest_tx(rxq.spec.qpair).lock();
    if g.is_ready() {
        if !kicks.watch(rxq.state.id, &g) {
            return false;
        }
        let Some(ring) = g.active.as_mut() else { return false };
        ring.enable_kicks();
        if !matches!(ring.avail(), Ok(0)) {
            ring.disable_kicks();
            return false;
        }
    }
    rxq.state.parked = Some(g.epoch);
    // Atomic adds: a queue moving between threads is counted by both for a moment.
    rxq.spec.stats.parks.fetch_add(1, Relaxed);
    bump(&st.loops.parks, 1);
    st.parked.fetch_add(1, Relaxed);
    true
}

/// Whether a parked queue must be polled again after a control wake-up: its ring started or
/// stopped since it was parked (a started ring suppresses kicks, maybe with another kick fd),
/// or its port has an announcement to send (taken on a visit of its first queue).
fn ring_changed(r: &Rxq) -> bool {
    let Some(q) = r.spec.port.queues() else { return true };
    r.state.parked != Some(q.guest_tx(r.spec.qpair).epoch()) || (r.spec.qpair == 0 && q.announcer.pending())
}

/// Whether a parked queue's guest has made frames available (the sweep's look).
fn has_frames(r: &Rxq) -> bool {
    let Some(q) = r.spec.port.queues() else { return true };
    let mut g = q.guest_tx(r.spec.qpair).lock();
    let broken = g.broken.is_some();
    g.active.as_mut().filter(|_| !broken).is_some_and(|ring| !matches!(ring.avail(), Ok(0)))
}
