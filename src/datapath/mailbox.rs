//! How the control thread hands a poll thread its `Plan`s: the first as the thread starts
//! (`ThreadStart`, given to the `Spawner`), each later one through the thread's `Mailbox`. The
//! thread adopts a posted plan between two loop iterations, at a point where it holds no ring,
//! and acknowledges it. Nothing in the data path ever waits for the control thread: checking
//! the mailbox is one relaxed load per loop iteration, and the mailbox's mutex is only shared by
//! the control thread and that one poll thread, and only taken on a change.
#![forbid(unsafe_code)]

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::datapath::plan::Plan;

/// What a new poll thread is started with (by the spawner pvswitchd gives the control thread).
pub struct ThreadStart {
    pub index: usize,
    pub core: usize,
    pub stats: Arc<crate::datapath::counters::ThreadStats>,
    pub mailbox: Arc<Mailbox>,
    pub plan: Plan,
    /// Adaptive polling: sleep after this many idle microseconds; None: busy polling.
    pub sleep_after_us: Option<u32>,
}

pub type Spawner = Box<dyn FnMut(ThreadStart) -> std::io::Result<std::thread::JoinHandle<()>>>;

/// One poll thread's inbox. `posted` and `taken` count plans; the thread adopts a plan when
/// `posted` moves past what it has, and stores the generation it adopted in `taken`. `wake`
/// is an eventfd a sleeping thread (adaptive polling) also waits on, so a plan, or shutdown,
/// reaches it at once.
pub struct Mailbox {
    posted: AtomicU64,
    taken: AtomicU64,
    slot: Mutex<Option<Box<Plan>>>,
    wake: EventFd,
    /// TSC when the last wake-up was written (for the wake-up latency histogram).
    pub woken_at: AtomicU64,
    /// Set when the thread is to exit (shutdown, or its poll core removed by a reload).
    retire: AtomicBool,
}

impl Default for Mailbox {
    fn default() -> Mailbox {
        Mailbox {
            posted: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            slot: Mutex::new(None),
            wake: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            woken_at: AtomicU64::new(0),
            retire: AtomicBool::new(false),
        }
    }
}

impl Mailbox {
    /// Control side: replaces whatever plan is waiting, and wakes the thread if it sleeps.
    /// Returns the plan's generation.
    pub fn post(&self, plan: Plan) -> u64 {
        let mut slot = self.slot.lock().unwrap();
        *slot = Some(Box::new(plan));
        let generation = self.posted.fetch_add(1, Ordering::Release) + 1;
        drop(slot);
        self.wake();
        generation
    }

    /// Asks the thread to exit (it finishes its current iteration first) and wakes it.
    pub fn retire(&self) {
        self.retire.store(true, Ordering::Release);
        self.wake();
    }

    #[inline]
    pub fn retired(&self) -> bool {
        self.retire.load(Ordering::Relaxed)
    }

    /// Wakes the thread if it sleeps (a plan, or shutdown).
    pub fn wake(&self) {
        self.woken_at.store(crate::datapath::counters::cycles(), Ordering::Relaxed);
        // A full counter (2^64 - 2 wake-ups unread) already wakes the thread.
        let _ = self.wake.write(1);
    }

    /// The eventfd a sleeping thread waits on.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// Resets the wake-up eventfd (a woken thread drains it).
    pub fn drain_wake(&self) {
        let _ = self.wake.read();
    }

    /// Whether a plan is waiting that the thread (at generation `have`) has not adopted.
    pub fn pending(&self, have: u64) -> bool {
        self.posted.load(Ordering::Acquire) != have
    }

    /// Poll-thread side: the newest plan, if one was posted since `have`.
    #[inline]
    pub fn check(&self, have: u64) -> Option<(u64, Box<Plan>)> {
        if self.posted.load(Ordering::Relaxed) == have {
            return None;
        }
        // The generation is read under the slot's lock, where `post` stores a plan and counts
        // it together: read before, it could name an older plan than the one taken (a post in
        // between), and the thread would acknowledge the wrong one and look for a plan on
        // every iteration until the next post.
        let mut slot = self.slot.lock().unwrap();
        let generation = self.posted.load(Ordering::Acquire);
        let plan = slot.take()?;
        Some((generation, plan))
    }

    /// Poll-thread side: the thread no longer uses anything the plans before `generation` held.
    pub fn ack(&self, generation: u64) {
        self.taken.store(generation, Ordering::Release);
    }

    /// Control side: waits until the thread adopted plan `generation` (or a later one), or `timeout`.
    pub fn wait(&self, generation: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        while self.taken.load(Ordering::Acquire) < generation {
            if Instant::now() >= deadline {
                return false;
            }
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::Mailbox;
    use crate::datapath::plan::{Plan, PortTable};

    /// The generation a thread takes a plan with is that plan's, however posts and checks
    /// interleave: else it acknowledges an older plan than it adopted (the control thread then
    /// waits for the newer one in vain) and looks for a plan on every iteration.
    #[test]
    fn a_plan_is_taken_with_its_own_generation() {
        let mb = Arc::new(Mailbox::default());
        let done = Arc::new(AtomicBool::new(false));
        let checker = {
            let (mb, done) = (mb.clone(), done.clone());
            std::thread::spawn(move || {
                let (mut have, mut taken) = (0, Vec::new());
                loop {
                    let finished = done.load(Ordering::Acquire);
                    if let Some((g, plan)) = mb.check(have) {
                        taken.push((g, Arc::as_ptr(&plan.ports) as usize));
                        have = g;
                    } else if finished {
                        return (have, taken);
                    }
                }
            })
        };
        // Every table stays alive to the end, so no two plans share an address.
        let (mut posted, mut keep) = (HashMap::new(), Vec::new());
        for _ in 0..200_000 {
            let ports = Arc::new(PortTable::default());
            posted.insert(
                mb.post(Plan { ports: ports.clone(), flows: Default::default(), rxqs: Vec::new(), tuning: None }),
                Arc::as_ptr(&ports) as usize,
            );
            keep.push(ports);
        }
        done.store(true, Ordering::Release);
        let (have, taken) = checker.join().unwrap();
        let wrong = taken.iter().filter(|(g, at)| posted[g] != *at).count();
        assert_eq!(wrong, 0, "{wrong} of {} plans taken under another plan's generation", taken.len());
        assert!(!mb.pending(have), "the thread ended at generation {have}, behind what was posted");
    }
}
