//! Walking a descriptor chain the guest made available into a segment array (`walk`, with
//! the one-descriptor fast path `take_simple`), and prefetching the chains ahead of the one
//! being walked (`prefetch_ahead`). Every index and length the guest wrote is read once and
//! checked here (head, next, chain length, indirect tables); see the header of `vring` and
//! DESIGN.md's table of `unsafe`.

use super::*;

/// A split-ring descriptor, decoded from the 16 little-endian bytes the guest wrote (read once).
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

impl Desc {
    /// Reads the descriptor at `p` once. An 8-aligned table (every ring's own table, and the
    /// indirect tables drivers allocate) is read as two 8-byte loads; `read_volatile` of the
    /// byte array compiles to sixteen one-byte loads.
    ///
    /// # Safety
    /// `p` must point at 16 readable bytes.
    #[inline(always)]
    unsafe fn read(p: *const [u8; 16]) -> Desc {
        if (p as usize).is_multiple_of(8) {
            let w = p as *const u64;
            // SAFETY: 16 readable bytes (caller), 8-aligned (checked): two aligned u64 reads.
            let (a, b) = unsafe { (u64::from_le(ptr::read_volatile(w)), u64::from_le(ptr::read_volatile(w.add(1)))) };
            return Desc { addr: a, len: b as u32, flags: (b >> 32) as u16, next: (b >> 48) as u16 };
        }
        // SAFETY: 16 readable bytes (caller); a byte array needs no alignment.
        let raw = unsafe { ptr::read_volatile(p) };
        Desc {
            addr: u64::from_le_bytes(raw[0..8].try_into().unwrap()),
            len: u32::from_le_bytes(raw[8..12].try_into().unwrap()),
            flags: u16::from_le_bytes(raw[12..14].try_into().unwrap()),
            next: u16::from_le_bytes(raw[14..16].try_into().unwrap()),
        }
    }
}

impl ActiveRing {
    /// The walk's fast path: whether chain `head` is one direct descriptor of the right
    /// direction whose buffer lies in one region (what virtio-net drivers post for frames that
    /// fit one buffer), and if so its buffer, in `segs`. Anything else takes the general walk,
    /// which reads the descriptor again and checks everything.
    #[inline(always)]
    pub(super) fn take_simple(&self, head: u16, segs: &mut Segs<'_>, writable: bool) -> bool {
        if head >= self.size {
            return false;
        }
        // SAFETY: mem_ptr comes from the Arc this ring holds, alive as long as `self`.
        let mem = unsafe { &*self.mem_ptr };
        // SAFETY: head < size and the table was validated to hold size entries.
        let Desc { addr, len, flags, .. } = unsafe { Desc::read(self.desc.add(head as usize)) };
        let write = if writable { VRING_DESC_F_WRITE } else { 0 };
        if flags & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE) != write {
            return false;
        }
        if len == 0 {
            return false; // the general walk reports it
        }
        let Some(p) = mem.translate(addr, len as u64) else { return false };
        // SAFETY: `translate` checked `[addr, addr + len)` lies in one mapped region of this
        // ring's memory, which stays mapped while the ring is borrowed; `pop`'s callers tie
        // `segs` to such a borrow (`RingLoan::pop`).
        unsafe { segs.set_one(p, len) };
        true
    }

    pub(super) fn walk(&mut self, head: u16, segs: &mut Segs<'_>, writable: bool) -> Result<(), RingError> {
        // SAFETY: mem_ptr comes from the Arc this ring holds, alive as long as `self`.
        let mem = unsafe { &*self.mem_ptr };
        let mut table = self.desc;
        let mut table_len = self.size as u32;
        let mut idx = head as u32;
        // `seen`: descriptors of the current table (a loop in it is longer than the table);
        // `total`: every descriptor of the chain (the bound on its work).
        let mut seen = 0u32;
        let mut total = 0u32;
        let mut indirect = false;
        if self.take_simple(head, segs, writable) {
            self.walked += 1;
            return Ok(());
        }
        // The fast path sets the segments whole; the walk appends to them.
        segs.clear();
        loop {
            if idx >= table_len {
                return Err(RingError::NextOutOfRange);
            }
            seen += 1;
            total += 1;
            if seen > table_len || total > MAX_CHAIN_DESCS {
                // Charged for the descriptors read: not this one, which is refused unread.
                self.walked += total - 1;
                return Err(RingError::ChainTooLong);
            }
            // SAFETY: idx < table_len and the table was validated to hold table_len entries.
            let Desc { addr, len, flags, next } = unsafe { Desc::read(table.add(idx as usize)) };
            if flags & VRING_DESC_F_INDIRECT != 0 {
                if indirect || flags & VRING_DESC_F_NEXT != 0 || len == 0 || len % 16 != 0 || len / 16 > 65536 {
                    return Err(RingError::BadIndirect);
                }
                let p = mem.translate(addr, len as u64).ok_or(RingError::BadIndirect)?;
                if !(p as usize).is_multiple_of(8) && addr % 16 != 0 {
                    return Err(RingError::BadIndirect);
                }
                table = p as *const [u8; 16];
                table_len = len / 16;
                idx = 0;
                seen = 0;
                indirect = true;
                continue;
            }
            if (flags & VRING_DESC_F_WRITE != 0) != writable {
                return Err(RingError::WrongDirection);
            }
            let mut a = addr;
            let mut left = len as u64;
            while left > 0 {
                let (p, n) = mem.translate_prefix(a, left).ok_or(RingError::BadAddress)?;
                // SAFETY: as in `take_simple`: `n` bytes at `p` lie in a mapped region.
                unsafe { segs.push(p, n as u32) }.map_err(|_| RingError::TooManySegments)?;
                a += n;
                left -= n;
            }
            if flags & VRING_DESC_F_NEXT == 0 {
                self.walked += total;
                if writable && segs.is_empty() {
                    return Err(RingError::EmptyBuffer);
                }
                return Ok(());
            }
            idx = next as u32;
        }
    }

    /// Starts loading what the next pops will touch, so their cache misses overlap with the
    /// current frame's work: the descriptor of the chain four ahead, and the first buffer of the
    /// chain two ahead (whose descriptor an earlier call prefetched); twice as far ahead in a
    /// receive ring, whose buffers are written, each write waiting for its line to come from
    /// the guest's core (measured in docs/benchmark-history.md: it helped NIC -> VM -> NIC, was
    /// within noise VM-to-VM, and the longer distance in transmit rings too cost VM-to-VM a
    /// little). Only available entries are looked at, and
    /// prefetches never fault, so a hostile guest gains nothing here.
    ///
    /// `Ahead::Read(from)` is for buffers we will read (a TX queue): the line at offset
    /// `from` is fetched, 0 when the virtio-net header is read, past the header when it is
    /// not (a sender that negotiated no offloads: its header is never looked at).
    /// `Ahead::Write(from)` is for receive buffers, `from` the offset where the frame will
    /// start (after the virtio-net header): the lines from
    /// there are fetched for ownership, to be written; the header's line only for reading:
    /// the header usually already holds the bytes we would write, and then `Segs::update_words`
    /// leaves it alone, so the guest's copy of that line stays valid. Not so for a guest
    /// that sends its received buffers back out (a forwarding VM): its transmit header, left
    /// in the buffer, differs from ours. When most of the last eight headers had to be written
    /// ([`ActiveRing::header_written`]), the header's line is fetched for ownership too.
    ///
    /// Near the end of what the guest had made available when we last looked, the avail index
    /// is read again, so the first chains the guest added since are prefetched too instead of
    /// each missing in turn after `avail` finds the shadow empty.
    #[inline(always)]
    pub fn prefetch_ahead(&mut self, ahead: Ahead) {
        let (desc_ahead, buf_ahead): (u16, u16) = match ahead {
            Ahead::Write(_) => (8, 4),
            Ahead::Read(_) => (4, 2),
        };
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            let mut ready = self.avail_shadow.wrapping_sub(self.last_avail);
            if ready <= desc_ahead {
                // A jump past the ring size is left for `avail` to report.
                ready = self.refresh_avail().unwrap_or(ready);
            }
            let head_at = |k: u16| {
                let slot = (self.last_avail.wrapping_add(k) & self.mask as u16) as usize;
                // SAFETY: ring[slot] lies in the validated avail ring.
                self.read_u16(unsafe { self.avail.add(4 + 2 * slot) })
            };
            if ready > desc_ahead {
                let head = head_at(desc_ahead);
                if head < self.size {
                    // SAFETY: head < size: inside the validated descriptor table; a hint only.
                    unsafe { _mm_prefetch(self.desc.add(head as usize) as *const i8, _MM_HINT_T0) };
                }
            }
            if ready > buf_ahead {
                let head = head_at(buf_ahead);
                if head < self.size {
                    // SAFETY: as above; the descriptor is read once into a local.
                    let addr = unsafe { Desc::read(self.desc.add(head as usize)) }.addr;
                    // SAFETY: mem_ptr comes from the Arc this ring holds.
                    let mem = unsafe { &*self.mem_ptr };
                    if let Some((p, _)) = mem.translate_prefix(addr, 1) {
                        match ahead {
                            Ahead::Read(from) => {
                                // The frame's first 64 bytes, which classify copies (its
                                // front): two lines when the frame starts inside one, as
                                // after a virtio-net header in the same buffer.
                                let frame = p.wrapping_add(from as usize);
                                // SAFETY: prefetch hints (wrapping arithmetic, never
                                // dereferenced: past a short buffer they are harmless).
                                unsafe {
                                    _mm_prefetch(frame as *const i8, _MM_HINT_T0);
                                    _mm_prefetch(frame.wrapping_add(63) as *const i8, _MM_HINT_T0);
                                }
                            }
                            Ahead::Write(from) => {
                                if self.hdr_stores.count_ones() > 4 {
                                    prefetch_for_write(p);
                                } else {
                                    // SAFETY: a prefetch hint on a translated, mapped address.
                                    unsafe { _mm_prefetch(p as *const i8, _MM_HINT_T0) };
                                }
                                // The first two lines from the frame's start: a 64-byte frame's.
                                // Hints: wrapping pointer arithmetic, never dereferenced here.
                                let frame = p.wrapping_add(from as usize);
                                prefetch_for_write(frame);
                                prefetch_for_write(frame.wrapping_add(63));
                            }
                        }
                    }
                }
            }
        }
    }
}
