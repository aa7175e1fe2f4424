//! A poll thread's watch on its guests' kick eventfds: one epoll set holding the kick fd of
//! every queue it may stop polling (a parked queue, or every queue of a thread about to sleep),
//! the receive interrupt of each of its NIC queues that has one, its mailbox's wake-up
//! eventfd, and a timer for NIC queues without interrupts. Parking
//! (`park`) looks at it without waiting, every check interval; adaptive polling (`idle`) sleeps
//! on it. One set for both, so a kick on a parked queue also wakes a sleeping thread.
//!
//! A kick fd is the guest's file: we hold the ring's own `Arc<File>` (no descriptor of our
//! own) and watch it edge-triggered, so it is never read (a kick is an edge; the guest's
//! counter can stay at any value). A registration is for one start of its ring (the ring's
//! `epoch`): after a restart, possibly with another kick fd, it is made again. A registration
//! is removed before the last handle on its file could be dropped, so a file number reused by
//! the process is never mistaken for a registered one. A NIC queue's interrupt is watched the
//! same way, never read, through the port's duplicate of DPDK's descriptor: level-triggered when
//! the file is the queue itself (readable while frames wait), edge-triggered for an eventfd.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;

use crate::datapath::mailbox::Mailbox;
use crate::vring::Vring;

/// Event data of the mailbox's wake-up (a plan, shutdown, or a vhost-user request touching
/// one of the thread's ports).
pub const WAKE: u64 = u64::MAX;
/// Event data of the NIC poll timer.
pub const TIMER: u64 = u64::MAX - 1;

/// Kick fds watched, by the id of the receive queue they belong to.
pub struct Kicks {
    epoll: Epoll,
    regs: HashMap<u64, Reg>,
    /// A sleeping thread with NIC queues wakes at most one NIC poll interval later. Disarming it
    /// also resets its expirations, so it is never read.
    timer: TimerFd,
}

/// The kick fd of one start of a ring, watched.
struct Reg {
    epoch: u64,
    kick: Option<Arc<File>>,
    /// A NIC queue's receive interrupt rather than a guest's kick.
    interrupt: bool,
}

impl Kicks {
    pub fn new(mailbox: &Mailbox) -> std::io::Result<Kicks> {
        let k = Kicks { epoll: Epoll::new()?, regs: HashMap::new(), timer: TimerFd::new()? };
        k.epoll.ctl(ControlOperation::Add, mailbox.wake_fd(), EpollEvent::new(EventSet::IN, WAKE))?;
        k.epoll.ctl(ControlOperation::Add, k.timer.as_raw_fd(), EpollEvent::new(EventSet::IN, TIMER))?;
        Ok(k)
    }

    /// Makes sure the kick fd of `ring` (receive queue `id`, locked by the caller) is watched,
    /// for the ring's current start. Returns whether it has one: a ring without one cannot
    /// wake us. Its first call for a start of the ring makes one `epoll_ctl` call (a syscall
    /// under the ring lock, but no wait: the control thread is the only other taker).
    pub fn watch(&mut self, id: u64, ring: &Vring) -> bool {
        if let Some(r) = self.regs.get(&id)
            && r.epoch == ring.epoch
            && !r.interrupt
        {
            return r.kick.is_some();
        }
        self.forget(id);
        let kick = ring.kick.clone();
        if let Some(k) = &kick {
            let ev = EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, id);
            if self.epoll.ctl(ControlOperation::Add, k.as_raw_fd(), ev).is_err() {
                self.regs.insert(id, Reg { epoch: ring.epoch, kick: None, interrupt: false });
                return false;
            }
        }
        let has = kick.is_some();
        self.regs.insert(id, Reg { epoch: ring.epoch, kick, interrupt: false });
        has
    }

    /// Makes sure NIC queue `id`'s receive interrupt `fd` is watched; false if epoll refused
    /// it (the queue is then looked at on the NIC timer). One `epoll_ctl` the first time.
    /// `level`: a file readable while frames wait (net_tap's queue) is watched level-triggered,
    /// so a frame that arrived before the sleep wakes it at once, even if a look at the parked
    /// queues took the edge meanwhile; an eventfd the driver signals (never read here) is
    /// watched edge-triggered.
    pub fn watch_interrupt(&mut self, id: u64, fd: &Arc<File>, level: bool) -> bool {
        if let Some(r) = self.regs.get(&id)
            && r.interrupt
        {
            return r.kick.is_some();
        }
        self.forget(id);
        let set = if level { EventSet::IN } else { EventSet::IN | EventSet::EDGE_TRIGGERED };
        let ev = EpollEvent::new(set, id);
        let kick = self.epoll.ctl(ControlOperation::Add, fd.as_raw_fd(), ev).is_ok().then(|| fd.clone());
        let has = kick.is_some();
        self.regs.insert(id, Reg { epoch: 0, kick, interrupt: true });
        has
    }

    /// Whether event `id` is a NIC queue's receive interrupt.
    pub fn is_interrupt(&self, id: u64) -> bool {
        self.regs.get(&id).is_some_and(|r| r.interrupt)
    }

    /// Stops watching queue `id` (it left the thread).
    pub fn forget(&mut self, id: u64) {
        if let Some(Reg { kick: Some(k), .. }) = self.regs.remove(&id) {
            let _ = self.epoll.ctl(ControlOperation::Delete, k.as_raw_fd(), EpollEvent::default());
        }
    }

    /// Stops watching every queue not in `keep`.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        let gone: Vec<u64> = self.regs.keys().copied().filter(|&id| !keep(id)).collect();
        for id in gone {
            self.forget(id);
        }
    }

    /// Waits up to `timeout_ms` (0: not at all, -1: until an event) and returns how many events
    /// `evs` got: queue ids, [`WAKE`] or [`TIMER`].
    pub fn wait(&self, timeout_ms: i32, evs: &mut [EpollEvent]) -> usize {
        self.epoll.wait(timeout_ms, evs).unwrap_or(0)
    }

    /// Arms the NIC poll timer (a sleeping thread with NIC queues).
    pub fn arm_timer(&mut self, after: Duration) {
        let _ = self.timer.reset(after, None);
    }

    /// Disarms it, forgetting an expiry nobody read.
    pub fn disarm_timer(&mut self) {
        let _ = self.timer.clear();
    }

    /// How many queues' kick fds are watched (for tests).
    #[cfg(test)]
    pub fn watched(&self) -> usize {
        self.regs.values().filter(|r| r.kick.is_some()).count()
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
        let mut k = Kicks::new(&mb).unwrap();
        k.arm_timer(Duration::from_micros(100));
        let mut evs = [EpollEvent::default(); 4];
        assert_eq!(k.wait(1000, &mut evs), 1);
        assert_eq!(evs[0].data(), TIMER);
        k.disarm_timer();
        assert_eq!(k.wait(50, &mut evs), 0, "a cleared timer still reads as expired");
    }
}
