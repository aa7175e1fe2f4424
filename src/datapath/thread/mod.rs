//! The poll thread: its loop over its receive queues (`PollThread::run`), adopting the plans
//! the control thread posts, parking idle queues (`park`), sleeping when nothing comes in
//! adaptive mode (`idle`) on the kick eventfds and timer it watches (`kicks`). One visit to one
//! queue is `rx::visit`.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use self::idle::{Sleeper, Woken};
use self::kicks::{Kicks, TIMER, WAKE};
use self::park::{Parking, SWEEP};
use crate::datapath::counters::{RunningTuning, ThreadStats, bump, cycles};
use crate::datapath::frame::Frames;
use crate::datapath::plan::Plan;
use crate::datapath::rx::nic::NicRx;
use crate::datapath::rx::{Rxq, visit};
use crate::datapath::tx::delivery::Delivery;
use crate::datapath::{Ctx, Env, Work};
use crate::flow::Emc;

pub mod idle;
pub mod kicks;
pub mod park;

pub struct PollThread {
    pub(in crate::datapath) cx: Ctx,
    pub(in crate::datapath) plan: Box<Plan>,
    /// Generation of `plan` (see `Mailbox`).
    generation: u64,
    pub(in crate::datapath) rxqs: Vec<Rxq>,
    /// Indices in `rxqs` of the queues visited every iteration: all but the parked ones.
    pub(in crate::datapath) polled: Vec<usize>,
    /// Index in `rxqs` by queue id (`RxqState::id`), for the kicks that name them.
    by_id: std::collections::HashMap<u64, usize>,
    pub(in crate::datapath) work: Work,
    /// Mbufs received from a NIC queue while they are switched.
    nic_rx: NicRx,
    /// The kick fds of parked queues (and of all polled ones while asleep), with the mailbox;
    /// present when parking or adaptive polling is on.
    pub(in crate::datapath) kicks: Option<Kicks>,
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
                    let nics = self.polled.iter().filter_map(|&i| {
                        let r = &rxqs[i];
                        r.spec.port.nic().map(|n| (r.state.id, n, r.spec.qpair))
                    });
                    let still = || !mb.pending(have) && !shutdown.load(Relaxed) && !mb.retired();
                    if let Some(w) = s.idle(queues, nics, kicks, &st, mb, still) {
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
pub(in crate::datapath) fn park_queue(rxq: &mut Rxq, kicks: &mut Kicks, st: &ThreadStats) -> bool {
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
