//! The device side of a split virtqueue, over guest memory we do not trust.
//!
//! Why not virtio-queue: its `add_used` publishes `used->idx` once per element and it has no
//! batch API, while a burst here must publish once; and walking chains into a fixed segment
//! array (no allocation) is the hot loop itself. Layout and rules follow the virtio 1.2 spec,
//! section 2.7. This module and `mem` hold the data path's `unsafe`; see DESIGN.md.
//!
//! Concurrency: a `VringLock` guards one ring. The poll thread that owns a guest TX queue
//! takes it for a visit; any poll thread that delivers into a guest RX queue takes it for a burst;
//! the control thread takes it to start, stop or remap the ring. Nobody holds two ring locks of
//! the same kind, and the control thread holds one at a time, so there is no lock-order cycle.
//! The lock is a spin lock (`lock`): holders never block or sleep while holding it.

use std::fs::File;
use std::ptr;
use std::sync::Arc;
#[cfg(not(target_arch = "x86_64"))]
use std::sync::atomic::fence;
use std::sync::atomic::{AtomicU16, Ordering};

use crate::mem::GuestMem;

pub use crate::mem::Segs;
pub use crate::mem::segs::MAX_SEGS;
pub mod call;
mod chain;
mod lock;
pub mod log;

#[cfg(target_arch = "x86_64")]
use crate::mem::segs::prefetch_for_write;
pub use call::CallFd;
pub use lock::{VringGuard, VringLock};

const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;
const VRING_DESC_F_INDIRECT: u16 = 4;
const VRING_USED_F_NO_NOTIFY: u16 = 1;
const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Largest ring the spec allows for split queues.
pub const MAX_QUEUE_SIZE: u16 = 32768;
/// Most descriptors one chain may have, counting every one walked (zero-length ones, the
/// indirect one and its table's entries): DPDK vhost's BUF_VECTOR_MAX. Linux drivers use at
/// most MAX_SKB_FRAGS + 2 (19). A longer chain stops its queue: walking it is bounded work.
pub const MAX_CHAIN_DESCS: u32 = 256;

/// Why a queue was stopped. Shown in `pvswitchctl ports` and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    AvailJump,
    HeadOutOfRange,
    NextOutOfRange,
    ChainTooLong,
    /// A receive buffer of no bytes (it could never hold anything; a ring of them would make
    /// every frame walk the whole ring).
    EmptyBuffer,
    /// The guest's call eventfd cannot take a write (the frontend saturated it and made it
    /// blocking): interrupts stopped.
    CallBlocked,
    BadAddress,
    BadIndirect,
    WrongDirection,
    TooManySegments,
}

impl RingError {
    /// Every error, in order: `ALL[i]` is the one whose `code` is `i + 1`.
    pub const ALL: [RingError; 10] = [
        RingError::AvailJump,
        RingError::HeadOutOfRange,
        RingError::NextOutOfRange,
        RingError::ChainTooLong,
        RingError::EmptyBuffer,
        RingError::CallBlocked,
        RingError::BadAddress,
        RingError::BadIndirect,
        RingError::WrongDirection,
        RingError::TooManySegments,
    ];

    /// A number for an atomic hint: 1 and up (0: no error).
    pub fn code(self) -> u8 {
        Self::ALL.iter().position(|&e| e == self).map_or(0, |i| i as u8 + 1)
    }

    pub fn from_code(c: u8) -> Option<RingError> {
        Self::ALL.get((c as usize).checked_sub(1)?).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RingError::AvailJump => "avail index moved past the ring size",
            RingError::HeadOutOfRange => "descriptor head index out of range",
            RingError::NextOutOfRange => "descriptor next index out of range",
            RingError::ChainTooLong => "descriptor chain longer than 256 descriptors (or a loop)",
            RingError::EmptyBuffer => "receive buffer of length zero",
            RingError::CallBlocked => "interrupts blocked: the call eventfd would not take a write",
            RingError::BadAddress => "descriptor address outside guest memory",
            RingError::BadIndirect => "malformed indirect descriptor table",
            RingError::WrongDirection => "descriptor direction wrong for this queue (e.g. read-only receive buffer)",
            RingError::TooManySegments => "descriptor chain has too many segments",
        }
    }
}

/// Host addresses of a started ring, validated by the control plane against `mem`.
pub struct RingAddrs {
    pub size: u16,
    pub desc: *mut u8,
    pub avail: *mut u8,
    pub used: *mut u8,
}

/// What [`ActiveRing::prefetch_ahead`] prepares the buffers ahead for, and from which offset.
#[derive(Clone, Copy, Debug)]
pub enum Ahead {
    /// Buffers to be read (a TX queue's), from this offset.
    Read(u32),
    /// Buffers to be written (an RX queue's), the frame from this offset.
    Write(u32),
}

/// A ring that is running: its layout, our indices, and what keeps its memory alive.
pub struct ActiveRing {
    size: u16,
    /// `size - 1`, what the hot indexing masks with, in a word of its own: read as `size - 1`
    /// it was loaded as a 4-byte word that also covered `last_avail`, just stored by `pop`, so
    /// the load could not be forwarded from the store buffer and waited for the frame's copy
    /// into the guest's lines to reach the cache (docs/benchmark-history.md, "The header
    /// compare in registers").
    mask: u32,
    desc: *const [u8; 16],
    avail: *mut u8,
    used: *mut u8,
    /// Next avail entry we will consume.
    last_avail: u16,
    /// Avail index as last read (entries up to it may be consumed without re-reading).
    avail_shadow: u16,
    /// Next used entry we will write; published to `used->idx` by `publish`.
    used_idx: u16,
    /// `used->idx` as last published.
    used_published: u16,
    event_idx: bool,
    call: Option<Arc<CallFd>>,
    /// Descriptors walked by `pop` since the last `take_walked` (the visit budget charges them).
    walked: u32,
    /// Whether each of the last eight receive buffers' virtio-net headers had to be written (bit
    /// 0 the latest): `prefetch_ahead` fetches the header's line for ownership when most did.
    hdr_stores: u8,
    /// The dirty log, while the frontend migrates the VM (None: nothing is logged).
    log: Option<log::RingLog>,
    _mem: Arc<GuestMem>,
    mem_ptr: *const GuestMem,
}

/// A running ring borrowed for `'g`, from the lock guard it was reached through: the chains it
/// pops lend their segments for (at most) `'g`, so the compiler rejects a use of them after the
/// lock is released. It reads as the ring (`Deref`) and forwards the ring's other operations,
/// but never hands out `&mut ActiveRing`: swapping the ring out from under the segments (and
/// with it the memory they point into) is impossible.
pub struct RingLoan<'g>(&'g mut ActiveRing);

impl<'g> RingLoan<'g> {
    /// Takes the next available chain into `segs` (all device-readable if `!writable`, all
    /// device-writable if `writable`) and returns its head. Call only when `avail() > 0`.
    #[inline(always)]
    pub fn pop<'s>(&mut self, segs: &mut Segs<'s>, writable: bool) -> Result<u16, RingError>
    where
        'g: 's,
    {
        self.0.pop(segs, writable)
    }

    /// Marks in the dirty log, while the VM migrates, the `len` bytes at offset `off` of a
    /// receive buffer this ring lent (`segs`), just written: what was written, not the whole
    /// buffer (DESIGN.md, "Live migration"). A ring without a log pays this branch.
    #[inline(always)]
    pub fn log_written(&self, segs: &Segs<'_>, off: u32, len: u32) {
        if self.0.log.is_some() {
            self.0.log_written(segs, off, len);
        }
    }

    /// See [`ActiveRing::avail`].
    #[inline(always)]
    pub fn avail(&mut self) -> Result<u16, RingError> {
        self.0.avail()
    }

    /// See [`ActiveRing::prefetch_ahead`].
    #[inline(always)]
    pub fn prefetch_ahead(&mut self, ahead: Ahead) {
        self.0.prefetch_ahead(ahead)
    }

    /// See [`ActiveRing::push_used`].
    #[inline(always)]
    pub fn push_used(&mut self, head: u16, len: u32) {
        self.0.push_used(head, len)
    }

    /// See [`ActiveRing::unpop`].
    #[inline(always)]
    pub fn unpop(&mut self, k: u16) {
        self.0.unpop(k)
    }

    /// See [`ActiveRing::unpush`].
    #[inline(always)]
    pub fn unpush(&mut self, k: u16) {
        self.0.unpush(k)
    }

    /// See [`ActiveRing::publish`].
    #[inline(always)]
    pub fn publish(&mut self) -> bool {
        self.0.publish()
    }

    /// See [`ActiveRing::header_written`].
    #[inline(always)]
    pub fn header_written(&mut self, stored: bool) {
        self.0.header_written(stored)
    }

    /// See [`ActiveRing::take_walked`].
    #[inline(always)]
    pub fn take_walked(&mut self) -> u32 {
        self.0.take_walked()
    }
}

impl std::ops::Deref for RingLoan<'_> {
    type Target = ActiveRing;
    fn deref(&self) -> &ActiveRing {
        self.0
    }
}

/// The state under a `VringLock`.
#[derive(Default)]
pub struct Vring {
    pub active: Option<ActiveRing>,
    /// Set when the guest broke the ring; the ring is not touched again until reset.
    pub broken: Option<RingError>,
    /// virtio-net header length (12 with VERSION_1 or MRG_RXBUF, else 10).
    pub hdr_len: u32,
    /// Whether a received frame may span several buffers (MRG_RXBUF).
    pub mrg_rxbuf: bool,
    /// Offloads negotiated for this queue's direction (what a TX queue's frames may ask for,
    /// what an RX queue's guest takes).
    pub offloads: crate::wire::virtio_net::Negotiated,
    /// The guest's kick eventfd, which a poll thread watches for a parked queue or while it
    /// sleeps (shared with the port's backend: no descriptor of its own).
    pub kick: Option<Arc<File>>,
    /// Counts starts, so a poll thread can tell that `kick` may have changed.
    pub epoch: u64,
    /// The port's dirty log and the guest address of this ring's used ring (if it is to be
    /// logged), for the ring's next start: set while the frontend migrates the VM.
    pub log: Option<(Arc<log::DirtyLog>, Option<u64>)>,
}

impl Vring {
    pub fn is_ready(&self) -> bool {
        self.active.is_some() && self.broken.is_none()
    }

    /// Starts the ring. `addrs` must have been checked against `mem` with `ring_addrs`.
    pub fn start(
        &mut self,
        addrs: RingAddrs,
        base: u16,
        event_idx: bool,
        (call, kick): (Option<Arc<CallFd>>, Option<Arc<File>>),
        mem: Arc<GuestMem>,
    ) {
        let mem_ptr = Arc::as_ptr(&mem);
        self.broken = None;
        self.kick = kick;
        self.epoch += 1;
        self.active = Some(ActiveRing {
            size: addrs.size,
            mask: addrs.size as u32 - 1,
            desc: addrs.desc as *const [u8; 16],
            avail: addrs.avail,
            used: addrs.used,
            last_avail: base,
            avail_shadow: base,
            // We complete every chain before the visit ends, so nothing is in flight: the used
            // index equals the avail base handed over by SET_VRING_BASE (as DPDK's vhost does).
            used_idx: base,
            used_published: base,
            event_idx,
            call,
            walked: 0,
            hdr_stores: 0,
            log: self.log.as_ref().map(|(l, used)| log::RingLog::new(l.clone(), *used, addrs.size)),
            _mem: mem,
            mem_ptr,
        });
        if let Some(a) = self.active.as_mut() {
            a.suppress_kicks();
        }
    }

    /// Stops the ring and returns the index the next backend should start from.
    pub fn stop(&mut self) -> Option<u16> {
        self.kick = None;
        self.epoch += 1;
        self.active.take().map(|a| a.last_avail)
    }

    /// Replaces the call eventfd of a running ring.
    pub fn set_call(&mut self, call: Option<Arc<CallFd>>) {
        if let Some(a) = self.active.as_mut() {
            a.call = call;
        }
    }
}

/// Computes host addresses of a ring from the frontend's virtual addresses and checks that
/// each part lies inside guest memory and is aligned as the spec requires.
pub fn ring_addrs(mem: &GuestMem, size: u16, desc: u64, avail: u64, used: u64) -> Option<RingAddrs> {
    if size == 0 || size > MAX_QUEUE_SIZE || !size.is_power_of_two() {
        return None;
    }
    let n = size as u64;
    if !desc.is_multiple_of(16) || !avail.is_multiple_of(2) || !used.is_multiple_of(4) {
        return None;
    }
    let a = RingAddrs {
        size,
        desc: mem.translate_user(desc, 16 * n)?,
        avail: mem.translate_user(avail, 6 + 2 * n)?,
        used: mem.translate_user(used, 6 + 8 * n)?,
    };
    // The host pointers too: a region's mmap_offset is the frontend's to choose, and the
    // indices are read and written as aligned u16s.
    ((a.desc as usize).is_multiple_of(16)
        && (a.avail as usize).is_multiple_of(2)
        && (a.used as usize).is_multiple_of(4))
    .then_some(a)
}

/// A full memory barrier: our stores before it are visible to the guest before our loads after
/// it read guest memory (the store-load order the notification protocol needs). On x86 this is
/// a locked no-op on the stack, as Linux's `smp_mb` and DPDK's `rte_smp_mb` are, because that
/// is cheaper than the MFENCE `fence(SeqCst)` compiles to.
#[inline(always)]
fn full_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a locked OR of zero into the word at the stack pointer, which is ours and keeps
    // its value; the asm may touch memory, so the compiler keeps memory accesses on their side.
    unsafe {
        core::arch::asm!("lock or dword ptr [rsp], 0", options(nostack))
    };
    #[cfg(not(target_arch = "x86_64"))]
    fence(Ordering::SeqCst);
}

impl ActiveRing {
    #[inline]
    fn avail_idx_ptr(&self) -> &AtomicU16 {
        // SAFETY: avail ring validated in `ring_addrs` (6 + 2n bytes, 2-aligned); idx at offset 2.
        unsafe { &*(self.avail.add(2) as *const AtomicU16) }
    }

    #[inline]
    fn used_idx_ptr(&self) -> &AtomicU16 {
        // SAFETY: used ring validated (6 + 8n bytes, 4-aligned); idx at offset 2.
        unsafe { &*(self.used.add(2) as *const AtomicU16) }
    }

    #[inline]
    fn read_u16(&self, p: *const u8) -> u16 {
        // SAFETY: callers pass pointers inside validated ring areas; guest memory may change,
        // so read it once, volatile, into a local.
        u16::from_le(unsafe { ptr::read_volatile(p as *const u16) })
    }

    /// Asks the guest to kick again (before a poll thread sleeps): with EVENT_IDX by setting
    /// avail_event to the next entry we will consume, else by clearing NO_NOTIFY. The fence
    /// orders this store before the caller's re-check of the avail index, so a frame the guest
    /// adds after that check is always kicked.
    pub fn enable_kicks(&mut self) {
        if self.event_idx {
            // avail_event is used->ring[size], at offset 4 + 8*size.
            let p = (4 + 8 * self.size as usize) as isize;
            // SAFETY: the validated used ring is 6 + 8n bytes; offset 4 + 8n is its last u16.
            unsafe { ptr::write_volatile(self.used.offset(p) as *mut u16, self.last_avail.to_le()) };
        } else {
            // SAFETY: used->flags at offset 0 of the validated used ring.
            unsafe { ptr::write_volatile(self.used as *mut u16, 0) };
        }
        if let Some(l) = &self.log {
            l.used_written();
        }
        full_fence();
    }

    /// Stops asking for kicks (polling again).
    pub fn disable_kicks(&mut self) {
        self.suppress_kicks();
    }

    fn suppress_kicks(&mut self) {
        // With EVENT_IDX the guest kicks only when its avail index crosses avail_event; leaving
        // that stale suppresses kicks. Without it, the NO_NOTIFY flag does.
        if !self.event_idx {
            // SAFETY: used->flags at offset 0 of the validated used ring.
            unsafe { ptr::write_volatile(self.used as *mut u16, VRING_USED_F_NO_NOTIFY.to_le()) };
        }
    }

    /// Number of chains the guest has made available and we have not consumed.
    #[inline]
    pub fn avail(&mut self) -> Result<u16, RingError> {
        let n = self.avail_shadow.wrapping_sub(self.last_avail);
        if n > 0 {
            return Ok(n);
        }
        self.refresh_avail().ok_or(RingError::AvailJump)
    }

    /// Chains available, at least `want` of them if the guest made that many available: the
    /// guest's index is read again when the shadow shows fewer.
    #[inline]
    pub fn avail_at_least(&mut self, want: u16) -> Result<u16, RingError> {
        let n = self.avail_shadow.wrapping_sub(self.last_avail);
        if n >= want {
            return Ok(n);
        }
        self.refresh_avail().ok_or(RingError::AvailJump)
    }

    /// Reads the guest's avail index into the shadow and returns how many chains are ready;
    /// None (shadow unchanged) if the index jumped past the ring size.
    #[inline]
    fn refresh_avail(&mut self) -> Option<u16> {
        let idx = u16::from_le(self.avail_idx_ptr().load(Ordering::Acquire));
        let n = idx.wrapping_sub(self.last_avail);
        (n <= self.size).then(|| {
            self.avail_shadow = idx;
            n
        })
    }

    /// Lends the ring for popping chains: their segments borrow it (and so the lock guard it
    /// was reached through) for as long as they are used.
    #[inline(always)]
    pub fn lend(&mut self) -> RingLoan<'_> {
        RingLoan(self)
    }

    /// Takes the next available chain into `segs` (see [`RingLoan::pop`]); the caller ties
    /// `segs` to a borrow of this ring.
    #[inline]
    fn pop(&mut self, segs: &mut Segs<'_>, writable: bool) -> Result<u16, RingError> {
        let slot = (self.last_avail & self.mask as u16) as usize;
        // SAFETY: ring[slot] is inside the validated avail ring (offset 4 + 2*slot).
        let head = self.read_u16(unsafe { self.avail.add(4 + 2 * slot) });
        if head >= self.size {
            return Err(RingError::HeadOutOfRange);
        }
        self.last_avail = self.last_avail.wrapping_add(1);
        self.walk(head, segs, writable)?;
        Ok(head)
    }

    /// Marks the pages of bytes `[off, off + len)` of `segs` (a receive buffer of this ring,
    /// just written) in the ring's log, by guest address (found from the host pointers the
    /// walk translated them to). Bounded by what was written: a page per 4 KiB plus one per
    /// piece, however long the buffer's descriptors are.
    #[cold]
    fn log_written(&self, segs: &Segs<'_>, off: u32, len: u32) {
        // SAFETY: mem_ptr comes from the Arc this ring holds, alive as long as `self`.
        let mem = unsafe { &*self.mem_ptr };
        let Some(l) = &self.log else { return };
        let (mut skip, mut left, mut last) = (off as u64, len as u64, u64::MAX);
        for &(p, n) in segs.pieces() {
            if left == 0 {
                break;
            }
            let n = n as u64;
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(left);
            if let Some(gpa) = mem.gpa_of_host(p) {
                l.log.mark(gpa + skip, take, &mut last);
            }
            left -= take;
            skip = 0;
        }
    }

    /// Records whether a receive buffer's virtio-net header had to be written (it did not
    /// already hold what we wrote), for `prefetch_ahead`.
    #[inline]
    pub fn header_written(&mut self, stored: bool) {
        self.hdr_stores = (self.hdr_stores << 1) | stored as u8;
    }

    /// Records a finished chain; not visible to the guest until `publish`.
    #[inline]
    pub fn push_used(&mut self, head: u16, len: u32) {
        let slot = (self.used_idx & self.mask as u16) as usize;
        let mut e = [0u8; 8];
        e[0..4].copy_from_slice(&(head as u32).to_le_bytes());
        e[4..8].copy_from_slice(&len.to_le_bytes());
        // SAFETY: used->ring[slot] (offset 4 + 8*slot) lies in the validated used ring.
        unsafe { ptr::write_volatile(self.used.add(4 + 8 * slot) as *mut [u8; 8], e) };
        self.used_idx = self.used_idx.wrapping_add(1);
    }

    /// Gives back the last `k` chains taken by `pop` (a frame that did not fit).
    pub fn unpop(&mut self, k: u16) {
        self.last_avail = self.last_avail.wrapping_sub(k);
    }

    /// Forgets the last `k` unpublished used entries.
    pub fn unpush(&mut self, k: u16) {
        self.used_idx = self.used_idx.wrapping_sub(k);
    }

    /// Makes all pushed entries visible with one `used->idx` store, and returns whether the
    /// guest wants an interrupt for them (EVENT_IDX used_event, or the NO_INTERRUPT flag).
    #[inline]
    pub fn publish(&mut self) -> bool {
        let old = self.used_published;
        let new = self.used_idx;
        if old == new {
            return false;
        }
        self.used_idx_ptr().store(new.to_le(), Ordering::Release);
        self.used_published = new;
        if let Some(l) = &self.log {
            l.used_written();
        }
        // The guest's used_event / flags must be read after our idx store is visible.
        full_fence();
        if self.event_idx {
            // used_event is avail->ring[size].
            // SAFETY: offset 4 + 2*size is inside the validated avail ring (6 + 2n bytes).
            let event = self.read_u16(unsafe { self.avail.add(4 + 2 * self.size as usize) });
            new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
        } else {
            // SAFETY: avail->flags at offset 0.
            self.read_u16(self.avail) & VRING_AVAIL_F_NO_INTERRUPT == 0
        }
    }

    /// The guest's call eventfd, to signal (with no ring lock held) when `publish` says so.
    #[inline]
    pub fn call(&self) -> Option<&Arc<CallFd>> {
        self.call.as_ref()
    }

    /// Descriptors walked so far (since the last `take_walked`).
    #[inline]
    pub fn walked(&self) -> u32 {
        self.walked
    }

    pub fn size(&self) -> u16 {
        self.size
    }

    /// The guest memory this ring is in (for tests that check where segments lie).
    #[cfg(test)]
    pub(crate) fn mem(&self) -> &GuestMem {
        &self._mem
    }

    /// Descriptors walked since the last call (popped chains, every descriptor counted).
    #[inline]
    pub fn take_walked(&mut self) -> u32 {
        std::mem::take(&mut self.walked)
    }

    /// Takes `n` descriptors walked off the count (a walk the budget must not charge).
    #[inline]
    pub fn forget_walked(&mut self, n: u32) {
        self.walked = self.walked.saturating_sub(n);
    }

    /// The guest's avail index as it stands now (read again); None if it jumped past the ring.
    #[inline]
    pub fn avail_index(&mut self) -> Option<u16> {
        self.refresh_avail().map(|_| self.avail_shadow)
    }
}
