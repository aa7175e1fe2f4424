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

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;

use crate::datapath::counters::{ThreadStats, bump, cycles, cycles_per_sec};
use crate::datapath::plan::Mailbox;
use crate::vring::VringLock;

const WAKE_TOKEN: u64 = u64::MAX;
const TIMER_TOKEN: u64 = u64::MAX - 1;

/// One poll thread's sleeping state. Only that thread uses it.
pub struct Sleeper {
    epoll: RawFd,
    /// Per receive queue (index in the thread's list): the ring epoch our registration is for,
    /// and our duplicate of its kick fd (None: the ring has none, or is not running).
    regs: Vec<Option<(u64, Option<File>)>>,
    idle_since: Option<u64>,
    threshold: u64,
    wake_fd: RawFd,
    /// A thread with NIC queues (which cannot kick) sleeps at most `nic_interval_ns`, timed
    /// by this timerfd in the epoll set.
    timer: File,
    nic_interval_ns: u64,
}

impl Sleeper {
    pub fn new(mailbox: &Mailbox, idle_before_sleep_us: u32, nic_poll_interval_us: u32) -> std::io::Result<Sleeper> {
        // SAFETY: creating a timerfd; checked below and owned by a File.
        let tfd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if tfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let timer = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(tfd) };
        // SAFETY: creating an epoll instance; checked below and owned by the Sleeper.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = Sleeper {
            epoll,
            regs: Vec::new(),
            idle_since: None,
            threshold: idle_before_sleep_us as u64 * cycles_per_sec() / 1_000_000,
            wake_fd: mailbox.wake_fd(),
            timer,
            nic_interval_ns: nic_poll_interval_us.max(1) as u64 * 1000,
        };
        s.ctl(libc::EPOLL_CTL_ADD, s.wake_fd, libc::EPOLLIN as u32, WAKE_TOKEN);
        s.ctl(libc::EPOLL_CTL_ADD, s.timer.as_raw_fd(), libc::EPOLLIN as u32, TIMER_TOKEN);
        Ok(s)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: our epoll fd, a valid fd the caller owns, and a local event struct.
        unsafe { libc::epoll_ctl(self.epoll, op, fd, &mut ev) };
    }

    /// Forgets every queue registration (the thread's queue list changed).
    pub fn reset(&mut self) {
        for (_, f) in self.regs.drain(..).flatten() {
            if let Some(f) = f {
                // SAFETY: removing our own duplicate fd (still open) from our epoll set.
                unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_DEL, f.as_raw_fd(), std::ptr::null_mut()) };
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
                    self.ctl(libc::EPOLL_CTL_DEL, old.as_raw_fd(), 0, 0);
                }
                let dup = g.kick.as_ref().and_then(|k| k.try_clone().ok());
                if let Some(d) = &dup {
                    self.ctl(libc::EPOLL_CTL_ADD, d.as_raw_fd(), (libc::EPOLLIN | libc::EPOLLET) as u32, i as u64);
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
                self.arm_timer(self.nic_interval_ns);
            }
            let t0 = cycles();
            bump(&st.loops.sleeps, 1);
            st.sleeping.store(1, Relaxed);
            let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
            // SAFETY: our epoll fd and a local event buffer of the given length.
            let n = unsafe { libc::epoll_wait(self.epoll, evs.as_mut_ptr(), evs.len() as i32, timeout) };
            let t1 = cycles();
            st.sleeping.store(0, Relaxed);
            bump(&st.loops.asleep_cycles, t1.wrapping_sub(t0));
            let evs = &evs[..n.max(0) as usize];
            if evs.iter().any(|e| e.u64 == WAKE_TOKEN) {
                let mut buf = [0u8; 8];
                // SAFETY: draining our own non-blocking eventfd into a local buffer.
                unsafe { libc::read(self.wake_fd, buf.as_mut_ptr() as *mut libc::c_void, 8) };
                bump(&st.loops.wakeups_control, 1);
                let posted = mailbox.woken_at.load(Relaxed);
                st.record_wake_latency(t1.saturating_sub(posted));
            }
            if nic {
                self.arm_timer(0);
                let mut buf = [0u8; 8];
                // SAFETY: draining our own non-blocking timerfd into a local buffer.
                unsafe { libc::read(self.timer.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, 8) };
            }
            if evs.iter().any(|e| e.u64 != WAKE_TOKEN && e.u64 != TIMER_TOKEN) {
                bump(&st.loops.wakeups_kick, 1);
            }
            if evs.iter().all(|e| e.u64 == TIMER_TOKEN) {
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

impl Sleeper {
    /// Arms the timer to fire once after `ns` (0 disarms it).
    fn arm_timer(&self, ns: u64) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: (ns / 1_000_000_000) as i64, tv_nsec: (ns % 1_000_000_000) as i64 },
        };
        // SAFETY: our own timerfd and a local itimerspec.
        unsafe { libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.reset();
        // SAFETY: closing the epoll fd this struct created.
        unsafe { libc::close(self.epoll) };
    }
}
