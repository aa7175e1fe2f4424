//! A guest's call eventfd, as the data path signals it: without ever blocking a poll thread.
//!
//! The frontend owns the eventfd and shares its open file with us, so it can do two things to
//! it: raise the counter to its maximum (then a write of 1 would wait for the guest to read), and
//! clear O_NONBLOCK on the shared file (so that write would block instead of failing). Linux
//! vhost-net signals from the kernel and cannot block; DPDK's vhost library can. pvswitchd:
//!
//! - accepts only eventfds (`CallFd::new` checks the fd's kind) and sets O_NONBLOCK on them;
//! - signals with no ring lock held (the poll thread gathers interrupts during a visit and sends
//!   them after it, `datapath::tx::delivery::Interrupts`), so a stuck write never holds up another
//!   thread or the control thread;
//! - treats EAGAIN as success: a counter at its maximum already means "interrupt pending";
//! - marks its thread "in a call write" (`ThreadStats::in_call`); if one lasts, the control
//!   thread's watchdog interrupts it with SIGUSR1 (installed without SA_RESTART), the write
//!   returns EINTR, and if the eventfd is then still not writable the call is `stuck`: the ring
//!   is stopped and reported ("interrupts blocked"), and this VM gets no more interrupts until it
//!   resets the device. Nobody else loses anything.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// A call eventfd and what signalling it came to.
pub struct CallFd {
    file: File,
    /// The write would block even after the watchdog's signal: no more interrupts.
    stuck: AtomicBool,
    /// The port it belongs to (for counting).
    pub port: u16,
}

/// What `CallFd::signal` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The guest has an interrupt pending (we wrote, or its counter was full already).
    Sent,
    /// The eventfd cannot take a write: interrupts to this ring are over.
    Stuck,
}

/// Whether `f` is an eventfd (the kernel names its open files `anon_inode:[eventfd]`).
pub fn is_eventfd(f: &File) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.as_os_str() == "anon_inode:[eventfd]")
}

impl CallFd {
    /// Takes `file` as port `port`'s call eventfd: it must be one, and is made non-blocking.
    pub fn new(file: File, port: u16) -> Result<CallFd, String> {
        if !is_eventfd(&file) {
            return Err("call fd is not an eventfd".into());
        }
        set_nonblocking(&file)?;
        Ok(CallFd { file, stuck: AtomicBool::new(false), port })
    }

    pub fn is_stuck(&self) -> bool {
        self.stuck.load(Relaxed)
    }

    /// Signals the guest. `in_call` is the calling thread's marker for the watchdog: the TSC at
    /// which the write started, 0 when none is under way.
    pub fn signal(&self, in_call: &AtomicU64) -> Signal {
        if self.is_stuck() {
            return Signal::Stuck;
        }
        let one = 1u64.to_ne_bytes();
        loop {
            in_call.store(crate::counter::cycles().max(1), Relaxed);
            // SAFETY: writing 8 bytes from a local buffer to an eventfd we hold open.
            let r = unsafe { libc::write(self.file.as_raw_fd(), one.as_ptr() as *const libc::c_void, 8) };
            let err = std::io::Error::last_os_error().raw_os_error();
            in_call.store(0, Relaxed);
            match (r, err) {
                (8, _) => return Signal::Sent,
                // The counter is at its maximum: the guest has more than one interrupt pending.
                (_, Some(libc::EAGAIN)) => return Signal::Sent,
                // The watchdog's signal (or another): if the eventfd can take a write now, it
                // was a passing wait; if not, the frontend made it block.
                (_, Some(libc::EINTR)) if writable(&self.file) => continue,
                _ => {
                    self.stuck.store(true, Relaxed);
                    return Signal::Stuck;
                }
            }
        }
    }
}

fn set_nonblocking(f: &File) -> Result<(), String> {
    // SAFETY: fcntl on an fd we hold open.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(format!("call eventfd: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Whether a write to `f` would not block now.
fn writable(f: &File) -> bool {
    let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one pollfd of ours, no waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLOUT != 0 }
}

/// The watchdog's signal: it only interrupts a system call (no SA_RESTART). Installed once.
pub fn install_interrupt_handler() -> std::io::Result<()> {
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: a handler that does nothing (async-signal-safe), on a zeroed sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as *const () as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Interrupts thread `t`'s system call (the watchdog's SIGUSR1).
pub fn interrupt_thread(t: libc::pthread_t) {
    // SAFETY: signalling a thread of ours that is still running (the caller holds its handle).
    unsafe { libc::pthread_kill(t, libc::SIGUSR1) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;
    use std::sync::Arc;

    fn eventfd(flags: i32) -> File {
        // SAFETY: a fresh eventfd, owned by the File.
        unsafe { File::from_raw_fd(libc::eventfd(0, flags)) }
    }

    #[test]
    fn only_eventfds() {
        assert!(CallFd::new(eventfd(0), 0).is_ok());
        let (r, _w) = std::io::pipe().unwrap();
        assert!(CallFd::new(File::from(std::os::fd::OwnedFd::from(r)), 0).is_err());
        assert!(CallFd::new(File::open("/dev/null").unwrap(), 0).is_err());
    }

    /// A frontend saturates its eventfd: a non-blocking write says EAGAIN, which is an
    /// interrupt pending. Then it clears O_NONBLOCK: the write blocks until the watchdog's
    /// signal, after which the call is stuck, and stays so without another write.
    #[test]
    fn a_saturated_eventfd_never_blocks_for_long() {
        install_interrupt_handler().unwrap();
        let f = eventfd(0);
        let frontend = f.try_clone().unwrap();
        let call = Arc::new(CallFd::new(f, 0).unwrap());
        let max = (u64::MAX - 1).to_ne_bytes();
        // SAFETY: writing 8 bytes from a local buffer to our eventfd.
        assert_eq!(unsafe { libc::write(frontend.as_raw_fd(), max.as_ptr() as *const libc::c_void, 8) }, 8);
        let marker = Arc::new(AtomicU64::new(0));
        assert_eq!(call.signal(&marker), Signal::Sent, "EAGAIN is an interrupt pending");
        // SAFETY: fcntl on our own fd (the frontend's side of the shared file).
        unsafe { libc::fcntl(frontend.as_raw_fd(), libc::F_SETFL, 0) };
        let (c, m) = (call.clone(), marker.clone());
        let t = std::thread::spawn(move || c.signal(&m));
        use std::os::unix::thread::JoinHandleExt;
        let tid = t.as_pthread_t();
        // The watchdog: the thread is in its write; interrupt it.
        let t0 = std::time::Instant::now();
        while marker.load(Relaxed) == 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the write never started");
            std::thread::yield_now();
        }
        while !t.is_finished() {
            interrupt_thread(tid);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(t.join().unwrap(), Signal::Stuck);
        assert!(call.is_stuck());
        assert_eq!(call.signal(&marker), Signal::Stuck);
    }
}
