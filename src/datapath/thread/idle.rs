//! Adaptive polling: a poll thread that found nothing on any of its polled queues for
//! `idle_before_sleep_us` goes to sleep on its watch of kick eventfds (`kicks`: the polled
//! queues', its parked queues', and its mailbox's), and wakes on the first kick, plan or
//! shutdown.
//!
//! Going to sleep without losing a frame: for each polled queue, under its ring lock, ask the
//! guest to kick again (`ActiveRing::enable_kicks`, which ends with a full fence) and then
//! re-read the avail index. A frame the guest adds after that re-read sees kicks enabled and
//! kicks; a frame added before it is found by the re-read, and the thread does not sleep.
//! Parked queues already ask for kicks (`park`). After waking, kicks are suppressed again on
//! every polled queue before polling resumes, and the caller unparks the parked queues whose
//! kicks woke it.
//!
//! The control thread wakes a sleeping thread when one of its rings changes (a vhost-user
//! request) or a plan is posted, so a newly started ring is never missed.
//!
//! A NIC queue whose driver has receive interrupts (`NicPort::rx_interrupt`: net_tap, and
//! NICs bound to vfio) wakes the thread by its interrupt, watched with the kicks (DPDK's
//! l3fwd-power does the same with its own epoll). A driver whose interrupt must be armed
//! (a NIC's register) is armed just before the sleep and disarmed after it; a frame that came
//! between the last poll and the arming may raise none, so such a thread also sleeps at most
//! `nic_poll_max_us`. net_tap's interrupt is its queue's file itself, readable while frames
//! wait, watched level-triggered: nothing to arm, and a frame that came before the sleep ends
//! it at once (the looks at parked queues share the epoll set and may take an edge), so no
//! timer.
//!
//! Other NIC queues cannot wake the thread: it sleeps on a timer, first for
//! `nic_poll_interval_us`, then twice as long each time it woke and found nothing, up to
//! `nic_poll_max_us` (OVS's `pmd-sleep-max`); the first frame starts it over. A thread that
//! woke and found nothing sleeps again at once, without polling `idle_before_sleep_us` first:
//! before, every 100 us sleep was followed by a full idle period of polling, and an idle
//! host with a NIC spun at 91% of a core.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use vmm_sys_util::epoll::EpollEvent;

use super::kicks::{Kicks, TIMER, WAKE};
use crate::datapath::counters::{ThreadStats, bump, cycles, cycles_per_sec};
use crate::datapath::mailbox::Mailbox;
use crate::port::nic::NicPort;
use crate::vring::VringLock;

/// Events a sleep ended with: queue ids (kicks), [`WAKE`], [`TIMER`].
pub struct Woken {
    pub events: [EpollEvent; 16],
    pub n: usize,
}

impl Woken {
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.events[..self.n].iter().map(|e| e.data())
    }
}

/// One poll thread's sleeping state. Only that thread uses it.
pub struct Sleeper {
    idle_since: Option<u64>,
    threshold: u64,
    /// The NIC timer's first and longest sleep, and the next one's.
    nic_first: Duration,
    nic_max: Duration,
    nic_next: Duration,
}

impl Sleeper {
    pub fn new(idle_before_sleep_us: u32, nic_poll_interval_us: u32, nic_poll_max_us: u32) -> Sleeper {
        let first = Duration::from_micros(nic_poll_interval_us.max(1) as u64);
        Sleeper {
            idle_since: None,
            threshold: idle_before_sleep_us as u64 * cycles_per_sec() / 1_000_000,
            nic_first: first,
            nic_max: Duration::from_micros(nic_poll_max_us as u64).max(first),
            nic_next: first,
        }
    }

    /// Forgets how long the thread has been idle (its queue list changed).
    pub fn reset(&mut self) {
        self.idle_since = None;
        self.nic_next = self.nic_first;
    }

    /// The thread moved frames: it is busy.
    #[inline]
    pub fn busy(&mut self) {
        self.idle_since = None;
        self.nic_next = self.nic_first;
    }

    /// How long the next sleep on the NIC timer lasts.
    pub fn nic_next(&self) -> Duration {
        self.nic_next
    }

    /// Watches the receive interrupts of the NIC queues `nics` (id, port, queue) and says
    /// which timer a sleep needs: backing off (`nic_next`) while some queue has no interrupt,
    /// the ceiling as the safety net of interrupts that must be armed, none if every queue
    /// signals by itself. Returns (the timer, whether it backs off, whether to arm).
    fn nic_watch<'a>(
        &self,
        nics: impl Iterator<Item = (u64, &'a NicPort, usize)>,
        kicks: &mut Kicks,
    ) -> (Option<Duration>, bool, bool) {
        let (mut backoff, mut armed) = (false, false);
        for (id, nic, q) in nics {
            match nic.rx_interrupt(q) {
                Some(i) if kicks.watch_interrupt(id, &i.fd, !i.needs_arming) => armed |= i.needs_arming,
                _ => backoff = true,
            }
        }
        let timer = match (backoff, armed) {
            (true, _) => Some(self.nic_next),
            (false, true) => Some(self.nic_max),
            (false, false) => None,
        };
        (timer, backoff, armed)
    }

    /// The thread found nothing this iteration. Once that has lasted the threshold, sleeps
    /// until a kick, a plan or shutdown (`still_wanted` says whether to sleep at all: false
    /// once a plan is pending or shutdown was asked), and returns what woke it. `queues` are
    /// the polled guest queues, with their ids; `nics` the polled NIC queues (id, port, queue):
    /// those with a receive interrupt wake the thread by it, the others cannot wake it, so it
    /// sleeps at most the NIC timer's current interval. A thread that slept stays idle: if its
    /// next iteration finds nothing, it sleeps again at once.
    pub fn idle<'a>(
        &mut self,
        queues: impl Iterator<Item = (u64, &'a VringLock)> + Clone,
        nics: impl Iterator<Item = (u64, &'a NicPort, usize)> + Clone,
        kicks: &mut Kicks,
        st: &ThreadStats,
        mailbox: &Mailbox,
        still_wanted: impl Fn() -> bool,
    ) -> Option<Woken> {
        let now = cycles();
        let since = *self.idle_since.get_or_insert(now);
        if now.wrapping_sub(since) < self.threshold {
            return None;
        }
        let mut work = false;
        let mut unkickable = false;
        for (id, vq) in queues.clone() {
            let mut g = vq.lock();
            let has_kick = kicks.watch(id, &g);
            let broken = g.broken.is_some();
            if let Some(ring) = g.active.as_mut().filter(|_| !broken) {
                unkickable |= !has_kick;
                ring.enable_kicks();
                work |= !matches!(ring.avail(), Ok(0));
            }
        }
        let (timer, backoff, armed) = self.nic_watch(nics.clone(), kicks);
        let mut woken = None;
        if !work && still_wanted() {
            // A ring without a kick fd cannot wake us: look again every millisecond.
            let timeout = if unkickable { 1 } else { -1 };
            if let Some(t) = timer {
                kicks.arm_timer(t);
            }
            st.running.nic_sleep_us.store(timer.map_or(0, |t| t.as_micros() as u64), Relaxed);
            if armed {
                nics.clone().for_each(|(_, nic, q)| nic.arm_rx_interrupt(q, true));
            }
            let t0 = cycles();
            bump(&st.loops.sleeps, 1);
            st.sleeping.store(1, Relaxed);
            let mut w = Woken { events: [EpollEvent::default(); 16], n: 0 };
            w.n = kicks.wait(timeout, &mut w.events);
            let t1 = cycles();
            st.sleeping.store(0, Relaxed);
            bump(&st.loops.asleep_cycles, t1.wrapping_sub(t0));
            if armed {
                nics.for_each(|(_, nic, q)| nic.arm_rx_interrupt(q, false));
            }
            if timer.is_some() {
                kicks.disarm_timer();
            }
            let timer_only = count_wake(&w, kicks, st, mailbox, t1);
            // Woken by the timer alone: the NIC may stay quiet longer; anything else starts
            // the backoff over (a kick, an interrupt, a plan: work may follow).
            self.nic_next = match timer_only && backoff {
                true => (self.nic_next * 2).min(self.nic_max),
                false => self.nic_first,
            };
            woken = Some(w);
        } else {
            self.idle_since = None;
        }
        for (_, vq) in queues {
            let mut g = vq.lock();
            if let Some(ring) = g.active.as_mut() {
                ring.disable_kicks();
            }
        }
        woken
    }
}

/// Counts what ended a sleep (`w`, the thread running again at TSC `t1`): a plan or the
/// control thread (its latency recorded), NIC interrupts, guests' kicks, the timer. Returns
/// whether the timer alone woke it.
fn count_wake(w: &Woken, kicks: &Kicks, st: &ThreadStats, mailbox: &Mailbox, t1: u64) -> bool {
    if w.ids().any(|e| e == WAKE) {
        mailbox.drain_wake();
        bump(&st.loops.wakeups_control, 1);
        let posted = mailbox.woken_at.load(Relaxed);
        st.record_wake_latency(t1.saturating_sub(posted));
    }
    let other = |e: u64| e != WAKE && e != TIMER;
    if w.ids().any(|e| other(e) && kicks.is_interrupt(e)) {
        bump(&st.loops.wakeups_interrupt, 1);
    }
    if w.ids().any(|e| other(e) && !kicks.is_interrupt(e)) {
        bump(&st.loops.wakeups_kick, 1);
    }
    let timer_only = w.ids().all(|e| e == TIMER);
    if timer_only {
        bump(&st.loops.wakeups_timeout, 1);
    }
    timer_only
}
