//! Surviving a frontend that shrinks the file behind its guest memory.
//!
//! Touching a shared mapping past the end of its file raises SIGBUS, whose default action kills
//! the whole switch. `GuestMem` refuses files shorter than their regions and seals memfds
//! against shrinking where it can, but a frontend can still truncate a file that cannot be
//! sealed (a hugetlbfs file, a memfd created without MFD_ALLOW_SEALING) after handing it over.
//!
//! So every guest mapping is registered here with its file's page size, and a SIGBUS handler
//! that finds the faulting address inside one replaces the faulting page (a whole huge page for
//! hugetlbfs: 2 MiB or 1 GiB) with anonymous zeroed memory, so the interrupted copy completes
//! harmlessly, and tells the control thread through an eventfd. The
//! control thread then disconnects the port whose memory it was. A SIGBUS anywhere else is a
//! real bug: the handler restores the default action and the process dies as it would have.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

const SLOTS: usize = 4096;
/// The least the handler replaces: 2 MiB (aligned, clipped to the mapping). For a file of base
/// pages any multiple of 4 KiB would do; 2 MiB lets one replacement absorb a whole copy's
/// faults instead of one signal per 4 KiB page. A huge page is replaced whole.
const MIN_GRANULE: usize = 2 << 20;
/// The largest page the handler replaces: a hugetlbfs page larger than this (none on x86-64)
/// is refused at SET_MEM_TABLE (`GuestMem::map`).
pub const MAX_PAGE: usize = 1 << 30;

struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    /// The replacement granule: the file's page size, at least MIN_GRANULE (a power of two).
    granule: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot { start: AtomicUsize::new(0), len: AtomicUsize::new(0), granule: AtomicUsize::new(0) };
static MAPPINGS: [Slot; SLOTS] = [EMPTY; SLOTS];
static FAULTS: AtomicU64 = AtomicU64::new(0);
static LAST_FAULT: AtomicUsize = AtomicUsize::new(0);
static NOTIFY_FD: AtomicI32 = AtomicI32::new(-1);

/// A guest mapping known to the SIGBUS handler; unregistered on drop (before the unmap).
pub struct Registration(usize);

/// Registers `[start, start + len)`, a mapping of a file whose pages are `page` bytes (a power
/// of two up to MAX_PAGE; `start` and `len` multiples of it). Returns None when every slot is
/// taken: the caller refuses the memory table then, as a truncated file there would be fatal.
pub fn register(start: usize, len: usize, page: usize) -> Option<Registration> {
    debug_assert!(page.is_power_of_two() && page <= MAX_PAGE);
    debug_assert!(start.is_multiple_of(page) && len.is_multiple_of(page));
    for (i, s) in MAPPINGS.iter().enumerate() {
        if s.start.compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            // The handler reads len (and granule) after start; a zero len matches no address.
            s.granule.store(page.max(MIN_GRANULE), Ordering::Release);
            s.len.store(len, Ordering::Release);
            return Some(Registration(i));
        }
    }
    None
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = &MAPPINGS[self.0];
        s.len.store(0, Ordering::Release);
        s.start.store(0, Ordering::Release);
    }
}

/// The address of the last guest-memory fault, and how many there were.
pub fn last_fault() -> (usize, u64) {
    (LAST_FAULT.load(Ordering::Acquire), FAULTS.load(Ordering::Acquire))
}

/// Installs the SIGBUS handler; `notify_fd` (an eventfd) is written on each guest fault.
pub fn install(notify_fd: RawFd) -> io::Result<()> {
    NOTIFY_FD.store(notify_fd, Ordering::Release);
    // SAFETY: installing a handler that only uses async-signal-safe operations (atomics, mmap,
    // write, signal) on a zeroed, then filled, sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &MAPPINGS {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        if start == 0 || addr < start || addr >= start + len {
            continue;
        }
        // The page (at least MIN_GRANULE) holding the address, clipped to the mapping: a huge
        // page's mapping starts and ends on its page size, so a huge page is never clipped, and
        // a hugetlb VMA may be split there (it refuses a split inside a huge page).
        let granule = s.granule.load(Ordering::Acquire).max(MIN_GRANULE);
        let base = addr & !(granule - 1);
        let lo = base.max(start);
        let hi = base.saturating_add(granule).min(start + len);
        // SAFETY: replaces part of a guest mapping we own (registered, so not yet unmapped)
        // with private zeroed memory; the mapping's owner unmaps the whole range later.
        // NORESERVE: a 1 GiB replacement costs nothing until touched, and is then charged as
        // the pages touched, 4 KiB at a time.
        let r = unsafe {
            libc::mmap(
                lo as *mut libc::c_void,
                hi - lo,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            break;
        }
        LAST_FAULT.store(addr, Ordering::Release);
        FAULTS.fetch_add(1, Ordering::AcqRel);
        let one = 1u64.to_ne_bytes();
        // SAFETY: write(2) of a local buffer to our eventfd; async-signal-safe.
        unsafe { libc::write(NOTIFY_FD.load(Ordering::Acquire), one.as_ptr() as *const libc::c_void, 8) };
        return;
    }
    // Not guest memory: restore the default action; the access faults again and we die.
    // SAFETY: signal(2) is async-signal-safe.
    unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
}
