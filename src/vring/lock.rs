//! The spin lock around one ring's state (`Vring`), and the hints readable without it.
//!
//! Holders never block or sleep while holding it (see the parent module on who takes it).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use super::RingError;

use super::Vring;

/// A ring plus the spin lock that guards it. `ready`, `epoch` and `broken` are hints readable
/// without the lock, stored when a guard is dropped: the control thread shows them without
/// taking a lock a poll thread may hold (on a host whose poll threads share their CPUs, a
/// holder can be preempted for a time slice).
pub struct VringLock {
    locked: AtomicBool,
    ready: AtomicBool,
    epoch: AtomicU64,
    broken: AtomicU8,
    inner: UnsafeCell<Vring>,
}

// SAFETY: the `Vring` inside is only reached through `VringGuard`, which exists only while
// `locked` is held, so at most one thread touches it at a time. The raw pointers in `ActiveRing`
// point into the `GuestMem` it keeps alive, which is `Send + Sync`.
unsafe impl Sync for VringLock {}
// SAFETY: as above.
unsafe impl Send for VringLock {}

impl Default for VringLock {
    fn default() -> Self {
        VringLock {
            locked: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            broken: AtomicU8::new(0),
            inner: UnsafeCell::new(Vring::default()),
        }
    }
}

pub struct VringGuard<'a> {
    lock: &'a VringLock,
}

impl VringLock {
    /// True when the ring is running and not broken (a hint; re-check under the lock).
    #[inline]
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The ring's `epoch` (how many times it started or stopped) as of the last unlock: a
    /// parked queue whose ring changed since it was parked is polled again.
    #[inline]
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// What stopped the ring (`Vring::broken`) as of the last unlock.
    pub fn broken(&self) -> Option<RingError> {
        RingError::from_code(self.broken.load(Ordering::Acquire))
    }

    #[inline]
    pub fn lock(&self) -> VringGuard<'_> {
        loop {
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return VringGuard { lock: self };
            }
            while self.locked.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }
    }
}

impl Drop for VringGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: we hold the lock, so no other guard exists.
        let (ready, epoch, broken) = unsafe {
            let v = &*self.lock.inner.get();
            (v.is_ready(), v.epoch, v.broken)
        };
        self.lock.ready.store(ready, Ordering::Release);
        self.lock.epoch.store(epoch, Ordering::Release);
        self.lock.broken.store(broken.map_or(0, |e| e.code()), Ordering::Release);
        self.lock.locked.store(false, Ordering::Release);
    }
}

impl std::ops::Deref for VringGuard<'_> {
    type Target = Vring;
    fn deref(&self) -> &Vring {
        // SAFETY: the guard exists only while the lock is held (see `VringLock::lock`).
        unsafe { &*self.lock.inner.get() }
    }
}

impl std::ops::DerefMut for VringGuard<'_> {
    fn deref_mut(&mut self) -> &mut Vring {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.inner.get() }
    }
}
