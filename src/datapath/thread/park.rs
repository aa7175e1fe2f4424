//! Parking idle queues: a guest TX queue that a poll thread found empty for `park_after_us`
//! leaves the set it polls every iteration. Its kicks are asked for again, and the thread
//! watches its kick fd (`kicks`) instead of reading its avail index (a line its guest writes,
//! which misses in cache whenever an idle guest sent anything since: timers, ARP, DHCP). Every
//! `park_check_us` (and at most once every [`CHECK_ITERATIONS`] iterations, so well under one
//! syscall an iteration; a thread whose last iteration found nothing looks 8 times as often)
//! one non-blocking `epoll_wait` collects the kicks, and a kicked queue is polled again from
//! the next iteration.
//!
//! Parking without losing a frame is adaptive polling's sleep for one queue: under the ring
//! lock, ask for kicks (`ActiveRing::enable_kicks`, ending with a full fence) and then read the
//! avail index again. A frame the guest adds after that read sees kicks enabled and kicks; one
//! added before it is found, and the queue is not parked. A frame is then delayed by at most
//! one check interval, plus the wait for the iteration that sees the kick.
//!
//! What else brings a queue back: a control wake-up (a vhost-user request touched one of the
//! thread's ports) unparks each parked queue whose ring restarted since it was parked (its
//! kicks are suppressed again at a start, maybe with another kick fd) or that has an
//! announcement to send (a migrated guest's RARP); and a slow sweep looks at a few parked
//! queues' avail index every check, so a frontend that never kicks is still served, late.
//! NIC queues cannot kick and are never parked.
#![forbid(unsafe_code)]

use crate::datapath::counters::cycles_per_sec;

/// A check looks at the kicks at most once every this many loop iterations.
pub const CHECK_ITERATIONS: u32 = 8;
/// Parked queues the sweep looks at in each check (at 50 us a check, 1,000 parked queues are
/// each seen every 25 ms).
pub const SWEEP: usize = 2;

/// When a poll thread parks a queue and looks at the parked ones.
pub struct Parking {
    /// TSC cycles a queue must have been empty to be parked; 0: never park.
    after: u64,
    /// TSC cycles between two checks of the parked queues' kicks.
    every: u64,
    /// TSC of the last check, and iterations since.
    last: u64,
    iterations: u32,
    /// Where the sweep goes on (an index in the thread's queues).
    pub sweep_at: usize,
}

impl Parking {
    /// Parks queues empty for `after_us` (0: never), looks at their kicks every `check_us`.
    pub fn new(after_us: u32, check_us: u32) -> Parking {
        let per_us = cycles_per_sec() / 1_000_000;
        Parking {
            after: after_us as u64 * per_us,
            every: check_us.max(1) as u64 * per_us,
            last: 0,
            iterations: 0,
            sweep_at: 0,
        }
    }

    /// Whether queues are parked at all.
    #[inline]
    pub fn on(&self) -> bool {
        self.after > 0
    }

    /// Whether a queue that last had frames at `last_busy` is due to be parked at `now`.
    #[inline]
    pub fn due(&self, last_busy: u64, now: u64) -> bool {
        self.after > 0 && now.wrapping_sub(last_busy) >= self.after
    }

    /// Whether the parked queues' kicks are due to be looked at (counts the iteration). A
    /// thread whose last iteration found nothing looks 8 times as often: it has nothing else to
    /// do, and a parked queue's first frame then waits a few microseconds, not the interval.
    #[inline]
    pub fn check_due(&mut self, now: u64, idle: bool) -> bool {
        self.iterations += 1;
        let every = if idle { self.every / 8 } else { self.every };
        if self.iterations < CHECK_ITERATIONS || now.wrapping_sub(self.last) < every {
            return false;
        }
        self.iterations = 0;
        self.last = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_wait_for_both_the_interval_and_the_iterations() {
        // 1000 cycles to park, a check every 100 cycles (set directly: no TSC calibration).
        let mut p = Parking { after: 1000, every: 100, last: 0, iterations: 0, sweep_at: 0 };
        let t0 = 1_000_000u64;
        let first = (0..CHECK_ITERATIONS).position(|_| p.check_due(t0, false));
        assert_eq!(first, Some(CHECK_ITERATIONS as usize - 1), "the first check waits for its iterations");
        assert!(!(0..100).any(|i| p.check_due(t0 + i, false)), "within the interval");
        // The interval passed, but not CHECK_ITERATIONS iterations since the last check.
        p.iterations = 0;
        let later = t0 + 150;
        assert!(!(0..CHECK_ITERATIONS - 1).any(|_| p.check_due(later, false)));
        assert!(p.check_due(later, false), "both the interval and the iterations passed");
        assert!(!p.check_due(later + 1, false), "a check starts the next interval");
        // Idle, an eighth of the interval will do (still after CHECK_ITERATIONS iterations).
        p.iterations = 0;
        assert!(!(0..CHECK_ITERATIONS - 1).any(|_| p.check_due(later + 13, true)));
        assert!(p.check_due(later + 13, true), "an idle thread looks after 100 / 8 cycles");
        assert!(p.due(t0, t0 + 1000) && !p.due(t0, t0 + 999));
        assert!(!Parking::new(0, 50).due(0, u64::MAX / 2), "0: never parks");
    }
}
