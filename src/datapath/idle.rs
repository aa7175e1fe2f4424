//! Adaptive polling: a poll thread that found nothing on any of its queues for
//! `idle_before_sleep_us` goes to sleep on its queues' kick eventfds and its mailbox's eventfd,
//! and wakes on the first kick, plan or shutdown.
//!
//! Going to sleep without losing a frame: for each queue, under its ring lock, ask the guest to
//! kick again (`ActiveRing::enable_kicks`, which ends with a full fence) and then re-read the
//! avail index. A frame the guest adds after that re-read sees kicks enabled and kicks; a frame
//! added before it is found by the re-read, and the thread does not sleep. After waking, kicks
//! are suppressed again on every queue before polling resumes.
//!
//! The kick fds are the guest's; we register our own duplicate of each in our epoll set
//! (edge-triggered, so it need not be drained), replaced whenever its ring restarts (the ring's
//! `epoch` changes). The control thread wakes a sleeping thread when one of its rings changes
//! (a vhost-user request) or a plan is posted, so a newly started ring is never missed.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use crate::datapath::counters::{ThreadStats, bump, cycles, cycles_per_sec};
use crate::datapath::plan::Mailbox;
use crate::vring::VringLock;

const WAKE_TOKEN: u64 = u64::MAX;
const TIMER_TOKEN: u64 = u64::MAX - 1;

/// One poll thread's sleeping state. Only that thread uses it.
pub struct Sleeper {
    epoll: Epoll,
    /// Per receive queue (index in the thread's list): the ring epoch our registration is for,
    /// and our duplicate of its kick fd (None: the ring has none, or is not running).
    regs: Vec<Option<(u64, Option<File>)>>,
    idle_since: Option<u64>,
    threshold: u64,
    /// A thread with NIC queues (which cannot kick) sleeps at most `nic_interval`, timed by this
    /// timerfd in the epoll set. Disarming it also resets its expirations, so it is never read.
    timer: TimerFd,
    nic_interval: Duration,
}

impl Sleeper {
    pub fn new(mailbox: &Mailbox, idle_before_sleep_us: u32, nic_poll_interval_us: u32) -> std::io::Result<Sleeper> {
        let s = Sleeper {
            epoll: Epoll::new()?,
            regs: Vec::new(),
            idle_since: None,
            threshold: idle_before_sleep_us as u64 * cycles_per_sec() / 1_000_000,
            timer: TimerFd::new()?,
            nic_interval: Duration::from_micros(nic_poll_interval_us.max(1) as u64),
        };
        s.watch(mailbox.wake_fd(), EventSet::IN, WAKE_TOKEN)?;
        s.watch(s.timer.as_raw_fd(), EventSet::IN, TIMER_TOKEN)?;
        Ok(s)
    }

    fn watch(&self, fd: std::os::fd::RawFd, events: EventSet, token: u64) -> std::io::Result<()> {
        self.epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))
    }

    fn unwatch(&self, fd: std::os::fd::RawFd) {
        let _ = self.epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
    }

    /// Forgets every queue registration (the thread's queue list changed).
    pub fn reset(&mut self) {
        for (_, f) in self.regs.drain(..).flatten() {
            if let Some(f) = f {
                let _ = self.epoll.ctl(ControlOperation::Delete, f.as_raw_fd(), EpollEvent::default());
            }
        }
        self.idle_since = None;
    }
    /// The thread moved frames: it is busy.
    #[inline]
    pub fn busy(&mut self) {
        self.idle_since = None;
    }

    /// The thread found nothing this iteration. Once that has lasted the threshold, sleeps
    /// until a kick, a plan or shutdown (`still_wanted` says whether to sleep at all: false
    /// once a plan is pending or shutdown was asked). `nic`: the thread also has NIC queues,
    /// which cannot wake it, so it sleeps at most the NIC poll interval.
    pub fn idle<'a>(
        &mut self,
        queues: impl Iterator<Item = &'a VringLock> + Clone,
        nic: bool,
        st: &ThreadStats,
        mailbox: &Mailbox,
        still_wanted: impl Fn() -> bool,
    ) {
        let now = cycles();
        let since = *self.idle_since.get_or_insert(now);
        if now.wrapping_sub(since) < self.threshold {
            return;
        }
        self.idle_since = None;
        let mut work = false;
        let mut unkickable = false;
        for (i, vq) in queues.clone().enumerate() {
            if self.regs.len() <= i {
                self.regs.resize_with(i + 1, || None);
            }
            let mut g = vq.lock();
            let epoch = g.epoch;
            if self.regs[i].as_ref().map(|(e, _)| *e) != Some(epoch) {
                if let Some((_, Some(old))) = self.regs[i].take() {
                    self.unwatch(old.as_raw_fd());
                }
                let dup = g.kick.as_ref().and_then(|k| k.try_clone().ok());
                if let Some(d) = &dup {
                    let _ = self.watch(d.as_raw_fd(), EventSet::IN | EventSet::EDGE_TRIGGERED, i as u64);
                }
                self.regs[i] = Some((epoch, dup));
            }
            let has_kick = self.regs[i].as_ref().is_some_and(|(_, f)| f.is_some());
            let broken = g.broken.is_some();
            if let Some(ring) = g.active.as_mut().filter(|_| !broken) {
                unkickable |= !has_kick;
                ring.enable_kicks();
                work |= !matches!(ring.avail(), Ok(0));
            }
        }
        if !work && still_wanted() {
            // A ring without a kick fd cannot wake us: look again every millisecond.
            let timeout = if unkickable { 1 } else { -1 };
            if nic {
                let _ = self.timer.reset(self.nic_interval, None);
            }
            let t0 = cycles();
            bump(&st.loops.sleeps, 1);
            st.sleeping.store(1, Relaxed);
            let mut evs = [EpollEvent::default(); 8];
            let n = self.epoll.wait(timeout, &mut evs).unwrap_or(0);
            let t1 = cycles();
            st.sleeping.store(0, Relaxed);
            bump(&st.loops.asleep_cycles, t1.wrapping_sub(t0));
            let evs = &evs[..n];
            if evs.iter().any(|e| e.data() == WAKE_TOKEN) {
                mailbox.drain_wake();
                bump(&st.loops.wakeups_control, 1);
                let posted = mailbox.woken_at.load(Relaxed);
                st.record_wake_latency(t1.saturating_sub(posted));
            }
            if nic {
                let _ = self.timer.clear();
            }
            if evs.iter().any(|e| e.data() != WAKE_TOKEN && e.data() != TIMER_TOKEN) {
                bump(&st.loops.wakeups_kick, 1);
            }
            if evs.iter().all(|e| e.data() == TIMER_TOKEN) {
                bump(&st.loops.wakeups_timeout, 1);
            }
        }
        for vq in queues {
            let mut g = vq.lock();
            if let Some(ring) = g.active.as_mut() {
                ring.disable_kicks();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Disarming the NIC timer also forgets an expiry nobody read, so a sleeping thread is not
    /// woken by it again (the timer is never read).
    #[test]
    fn a_cleared_timer_does_not_wake_again() {
        let mb = Mailbox::default();
        let mut s = Sleeper::new(&mb, 0, 1000).unwrap();
        s.timer.reset(Duration::from_micros(100), None).unwrap();
        let mut evs = [EpollEvent::default(); 4];
        assert_eq!(s.epoll.wait(1000, &mut evs).unwrap(), 1);
        assert_eq!(evs[0].data(), TIMER_TOKEN);
        s.timer.clear().unwrap();
        assert_eq!(s.epoll.wait(50, &mut evs).unwrap(), 0, "a cleared timer still reads as expired");
    }
}
