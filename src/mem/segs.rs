//! The segments of one descriptor chain as host pointers, and the copies between them: the one
//! copy a frame takes from a sender's buffer into a receiver's. Like the ring walk, this is the
//! data path's `unsafe` over guest memory; see DESIGN.md.
//!
//! **Why the pointers are valid.** A `Segs<'m>` borrows, for `'m`, the memory its pointers lie
//! in: segments are made by a ring's walk (`vring::RingLoan::pop`), which lends them for as long
//! as it borrows the running ring, and so the lock guard the ring is reached through; the ring
//! keeps its guest memory mapped (`Arc<GuestMem>`) and nothing can stop or replace it while it
//! is borrowed. The compiler then rejects any use of a chain's segments after its ring's lock
//! is released. The one other source is [`Segs::set_host`] (a NIC's mbuf), whose caller
//! promises the same. Storage reused between borrows is a [`SegsSlot`], which holds no
//! pointer anyone can read between two loans.

use std::marker::PhantomData;
use std::ptr;

/// Most buffer segments one chain may have after translation. Linux needs at most
/// MAX_SKB_FRAGS + 2 (19); more is treated as malformed.
pub const MAX_SEGS: usize = 64;

/// A chain has more segments than [`MAX_SEGS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegsFull;

/// Buffer segments of one descriptor chain, translated to host pointers into memory borrowed
/// for `'m` (see the module's comment).
pub struct Segs<'m> {
    ptrs: [(*mut u8, u32); MAX_SEGS],
    n: usize,
    total: u32,
    mem: PhantomData<&'m [u8]>,
}

impl Default for Segs<'_> {
    fn default() -> Self {
        Segs { ptrs: [(ptr::null_mut(), 0); MAX_SEGS], n: 0, total: 0, mem: PhantomData }
    }
}

/// Segments' storage, reused from one borrow of memory to the next (a poll thread's receive
/// buffers, its burst's frames): between loans it holds no pointer anyone can read.
#[derive(Default)]
#[repr(transparent)]
pub struct SegsSlot(Segs<'static>);

impl SegsSlot {
    /// Empties the slot and lends it as segments for `'m`.
    #[inline(always)]
    pub fn lend<'m>(&'m mut self) -> &'m mut Segs<'m> {
        self.0.clear();
        // SAFETY: `Segs<'static>` and `Segs<'m>` differ only in the lifetime of a
        // `PhantomData`, so they have one layout. The segments are empty: no pointer from an
        // earlier loan survives into this one, and the slot cannot be read except through
        // `lend`, so pointers stored during this loan (valid for `'m`) are never read after it.
        unsafe { Segs::relend(&mut self.0) }
    }
}

impl<'m> Segs<'m> {
    /// These segments, as segments of a shorter or longer borrow.
    ///
    /// # Safety
    /// Every pointer they hold must stay valid for `'n` (empty segments hold none), and the
    /// caller must not read through `self` after `'n` what was stored during it.
    #[inline(always)]
    pub(crate) unsafe fn relend<'n>(&mut self) -> &mut Segs<'n> {
        // SAFETY: the same type but for a PhantomData's lifetime; the caller upholds validity.
        // The cast changes only a lifetime, which clippy does not see.
        #[allow(clippy::unnecessary_cast)]
        unsafe {
            &mut *(self as *mut Segs<'m> as *mut Segs<'n>)
        }
    }

    pub fn len(&self) -> u32 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The segments, as (host pointer, length) pairs: where they lie (the dirty log turns them
    /// back into guest addresses; tests check them).
    pub(crate) fn pieces(&self) -> &[(*mut u8, u32)] {
        &self.ptrs[..self.n]
    }

    pub(crate) fn clear(&mut self) {
        self.n = 0;
        self.total = 0;
    }

    /// Makes these segments the one buffer `[p, p + len)` (the walk's fast path).
    ///
    /// # Safety
    /// `p` must point at `len` bytes of memory valid for `'m`, readable, and writable if the
    /// segments are written through.
    #[inline(always)]
    pub(crate) unsafe fn set_one(&mut self, p: *mut u8, len: u32) {
        self.ptrs[0] = (p, len);
        self.n = 1;
        self.total = len;
    }

    /// Appends the buffer `[p, p + len)`.
    ///
    /// # Safety
    /// As for [`Segs::set_one`].
    pub(crate) unsafe fn push(&mut self, p: *mut u8, len: u32) -> Result<(), SegsFull> {
        if self.n == MAX_SEGS {
            return Err(SegsFull);
        }
        self.ptrs[self.n] = (p, len);
        self.n += 1;
        self.total = self.total.saturating_add(len);
        Ok(())
    }

    /// Calls `f(pointer, done, n)` for each piece of the `len` bytes at offset `off`, where
    /// `done` bytes came before the piece; returns the bytes covered (less if the chain is short).
    #[inline]
    fn spans(&self, mut off: u32, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) -> usize {
        let mut done = 0;
        for &(p, seg) in &self.ptrs[..self.n] {
            if done == len {
                break;
            }
            if off >= seg {
                off -= seg;
                continue;
            }
            let n = ((seg - off) as usize).min(len - done);
            // SAFETY: off < seg, so the pointer stays inside the segment.
            f(unsafe { p.add(off as usize) }, done, n);
            done += n;
            off = 0;
        }
        done
    }

    /// Makes these segments one span of host memory (a received mbuf's data), to be used as a
    /// frame's source like a guest buffer: `read_at`, `prefetch`, and as `src` of `copy_from`.
    ///
    /// # Safety
    /// `p` must point at `len` readable bytes that stay valid, and are not written by anyone
    /// else, for `'m` or for as long as these segments are used, whichever ends first (until
    /// the next `set_host` or `pop` into them). The segments must not be written through
    /// (`write_at`, or as `copy_from`'s destination): the memory may be read-only to us.
    pub unsafe fn set_host(&mut self, p: *const u8, len: u32) {
        self.ptrs[0] = (p as *mut u8, len);
        self.n = 1;
        self.total = len;
    }

    /// Where `[off, off + len)` lies in one piece, if it does in the first segment or in the
    /// second: the common layouts, one buffer per frame, or a virtio-net header in a
    /// descriptor of its own and the frame in the next (a frontend may lay a frame out either
    /// way). Small reads and writes, and a frame's copy, then skip the segment walk.
    #[inline(always)]
    fn contiguous(&self, off: u32, len: usize) -> Option<*mut u8> {
        let (p, seg) = self.ptrs[0];
        let end = (off as usize).saturating_add(len);
        if self.n > 0 && end <= seg as usize {
            // SAFETY: off + len <= seg, so the pointer stays inside the first segment.
            return Some(unsafe { p.add(off as usize) });
        }
        let (q, seg1) = self.ptrs[1];
        let o = (off as usize).checked_sub(seg as usize)?;
        // SAFETY: seg <= off and (off - seg) + len <= seg1: inside the second segment.
        (self.n > 1 && o.saturating_add(len) <= seg1 as usize).then(|| unsafe { q.add(o) })
    }

    /// The `N` bytes at `off`, if the chain holds them; read straight from guest memory (no
    /// copy through a buffer) when they lie in one segment (`contiguous`).
    #[inline(always)]
    pub fn read_array<const N: usize>(&self, off: u32) -> Option<[u8; N]> {
        if let Some(p) = self.contiguous(off, N) {
            // SAFETY: N bytes inside one segment (the type's invariant: valid for 'm); an unaligned read into a local.
            return Some(unsafe { ptr::read_unaligned(p as *const [u8; N]) });
        }
        let mut out = [0u8; N];
        (self.read_at(off, &mut out) == N).then_some(out)
    }

    /// Copies up to `out.len()` bytes starting at `off` into `out`; returns how many.
    #[inline(always)]
    pub fn read_at(&self, off: u32, out: &mut [u8]) -> usize {
        if let Some(p) = self.contiguous(off, out.len()) {
            // SAFETY: as in `read_spans`, for one piece inside one segment.
            unsafe { copy_bytes(p, out.as_mut_ptr(), out.len()) };
            return out.len();
        }
        self.read_spans(off, out)
    }

    /// [`Segs::read_at`] across segments. Out of line, as are the other accessors' walks: each
    /// accessor's one-segment case is inlined where the data path uses it (a call a frame was
    /// part of every copy's cost), the walk is not.
    #[inline(never)]
    fn read_spans(&self, off: u32, out: &mut [u8]) -> usize {
        let dst = out.as_mut_ptr();
        // SAFETY: each piece lies in memory valid for 'm (the type's
        // invariant) and within its segment; `out` is our own buffer, `done + n <= out.len()`.
        self.spans(off, out.len(), |p, done, n| unsafe { copy_bytes(p, dst.add(done), n) })
    }

    /// Writes `src` at offset `off` of these (device-writable) segments; returns bytes written.
    #[inline(always)]
    pub fn write_at(&self, off: u32, src: &[u8]) -> usize {
        if let Some(p) = self.contiguous(off, src.len()) {
            // SAFETY: as in `write_spans`, for one piece inside one segment.
            unsafe { copy_bytes(src.as_ptr(), p, src.len()) };
            return src.len();
        }
        self.write_spans(off, src)
    }

    /// [`Segs::write_at`] across segments.
    #[inline(never)]
    fn write_spans(&self, off: u32, src: &[u8]) -> usize {
        // SAFETY: as in `read_spans`, in the other direction.
        self.spans(off, src.len(), |p, done, n| unsafe { copy_bytes(src.as_ptr().add(done), p, n) })
    }

    /// Adds the `len` bytes at `off` (fewer if the chain is short) to the Internet checksum sum
    /// `s`, as if they followed what it holds: read through a local buffer, never as a slice of
    /// guest memory (a software offload's pass).
    pub fn add_to_sum(&self, s: &mut crate::wire::checksum::Sum, off: u32, len: u32) {
        let mut buf = [0u8; 512];
        let (mut at, end) = (off, off.saturating_add(len));
        while at < end {
            let n = ((end - at) as usize).min(buf.len());
            let got = self.read_at(at, &mut buf[..n]);
            s.add_bytes(&buf[..got]);
            if got < n {
                break;
            }
            at += n as u32;
        }
    }

    /// Stores a 10- or 12-byte value (a virtio-net header) at `off` unless the bytes there
    /// already equal it: a line that is only read stays shared with the guest's core, where a
    /// store, even of the same bytes, would take it away. The value comes as the little-endian
    /// words of its bytes `0..8` (`lo`) and `8..len` (`hi`, its low half for 10 bytes), and the
    /// guest's bytes are loaded and compared as two words in registers, never through a byte
    /// array on the stack: a word loaded from an array just built by narrow stores cannot be
    /// forwarded from the store buffer, and waits for every older store to reach the cache,
    /// such as the frame's copy just made into lines still on their way from the guest's core
    /// (docs/benchmark-history.md, "The header compare in registers"). Returns whether it
    /// stored. Across segments (a header split over descriptors) the bytes are written without
    /// looking.
    #[inline(always)]
    pub fn update_words(&self, off: u32, lo: u64, hi: u32, len: u32) -> bool {
        debug_assert!(len == 10 || len == 12);
        if let Some(p) = self.contiguous(off, len as usize) {
            // SAFETY: `len` bytes inside one segment (the type's invariant: valid for 'm):
            // unaligned loads of bytes 0..8 and 8..len into registers, then, if they differ,
            // unaligned stores of the same ranges.
            unsafe {
                let cur_lo = u64::from_le(ptr::read_unaligned(p as *const u64));
                let q = p.add(8);
                let cur_hi = if len == 12 {
                    u32::from_le(ptr::read_unaligned(q as *const u32))
                } else {
                    u16::from_le(ptr::read_unaligned(q as *const u16)) as u32 | (hi & 0xffff_0000)
                };
                if cur_lo == lo && cur_hi == hi {
                    return false;
                }
                ptr::write_unaligned(p as *mut u64, lo.to_le());
                if len == 12 {
                    ptr::write_unaligned(q as *mut u32, hi.to_le());
                } else {
                    ptr::write_unaligned(q as *mut u16, (hi as u16).to_le());
                }
            }
            return true;
        }
        let mut b = [0u8; 12];
        b[..8].copy_from_slice(&lo.to_le_bytes());
        b[8..].copy_from_slice(&hi.to_le_bytes());
        self.write_at(off, &b[..len as usize]);
        true
    }

    /// Copies `len` bytes from `src` (starting at `src_off`) into these segments (starting at
    /// `dst_off`): the one copy a frame takes from one guest to another. Returns bytes copied.
    #[inline(always)]
    pub fn copy_from(&self, dst_off: u32, src: &Segs<'_>, src_off: u32, len: u32) -> u32 {
        if let (Some(d), Some(s)) = (self.contiguous(dst_off, len as usize), src.contiguous(src_off, len as usize)) {
            // SAFETY: as in `copy_spans`, for one piece inside one segment of each.
            unsafe { copy_bytes(s, d, len as usize) };
            return len;
        }
        self.copy_spans(dst_off, src, src_off, len)
    }

    /// [`Segs::copy_from`] across segments.
    #[inline(never)]
    fn copy_spans(&self, dst_off: u32, src: &Segs<'_>, src_off: u32, len: u32) -> u32 {
        let (mut di, mut doff) = self.locate(dst_off);
        let (mut si, mut soff) = src.locate(src_off);
        let mut left = len;
        while left > 0 && di < self.n && si < src.n {
            let (dp, dl) = self.ptrs[di];
            let (sp, sl) = src.ptrs[si];
            let n = (dl - doff).min(sl - soff).min(left);
            // SAFETY: both ranges lie in memory valid while both segments' borrows last
            // (the type's invariant); they may belong to the same guest but to different buffers,
            // and a guest that aliases its own buffers only corrupts its own data.
            unsafe { copy_bytes(sp.add(soff as usize), dp.add(doff as usize), n as usize) };
            left -= n;
            doff += n;
            soff += n;
            if doff == dl {
                di += 1;
                doff = 0;
            }
            if soff == sl {
                si += 1;
                soff = 0;
            }
        }
        len - left
    }

    /// Starts loading the 64 bytes at `off` (the frame's front, which classify copies) ahead
    /// of their use: the lines holding its first and last byte.
    #[inline]
    pub fn prefetch(&self, off: u32) {
        if self.n > 0 && off < self.ptrs[0].1 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint: it never faults, whatever the address (wrapping
            // arithmetic: the pointer is never dereferenced).
            unsafe {
                let p = self.ptrs[0].0.wrapping_add(off as usize) as *const i8;
                core::arch::x86_64::_mm_prefetch(p, core::arch::x86_64::_MM_HINT_T0);
                core::arch::x86_64::_mm_prefetch(p.wrapping_add(63), core::arch::x86_64::_MM_HINT_T0);
            };
        }
    }

    fn locate(&self, mut off: u32) -> (usize, u32) {
        for (i, &(_, len)) in self.ptrs[..self.n].iter().enumerate() {
            if off < len {
                return (i, off);
            }
            off -= len;
        }
        (self.n, 0)
    }
}

/// Copies `src` into `dst` (of the same length: panics otherwise) with the data path's own
/// small copies (`copy_bytes`) instead of a call to `memcpy`, whose dispatch on the length
/// costs more than a 64-byte frame's copy itself.
#[inline(always)]
pub fn copy_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    // SAFETY: two slices of the same length: `src` readable and `dst` writable for all of it.
    unsafe { copy_bytes(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Copies `n` bytes; correct even if the ranges overlap (a hostile VMM may give two ports the
/// same memory). Small copies, the common case for headers and 64-byte frames, are inlined:
/// every byte is loaded before any is stored.
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes.
#[inline(always)]
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, n: usize) {
    use std::ptr::{read_unaligned as rd, write_unaligned as wr};
    // SAFETY (for each branch): the loads and stores below stay within [0, n) of both ranges.
    unsafe {
        match n {
            0 => {}
            1..=3 => {
                let (a, b, c) = (*src, *src.add(n / 2), *src.add(n - 1));
                *dst = a;
                *dst.add(n / 2) = b;
                *dst.add(n - 1) = c;
            }
            4..=7 => {
                let (a, b) = (rd(src as *const u32), rd(src.add(n - 4) as *const u32));
                wr(dst as *mut u32, a);
                wr(dst.add(n - 4) as *mut u32, b);
            }
            8..=16 => {
                let (a, b) = (rd(src as *const u64), rd(src.add(n - 8) as *const u64));
                wr(dst as *mut u64, a);
                wr(dst.add(n - 8) as *mut u64, b);
            }
            17..=32 => {
                let (a, b) = (rd(src as *const u128), rd(src.add(n - 16) as *const u128));
                wr(dst as *mut u128, a);
                wr(dst.add(n - 16) as *mut u128, b);
            }
            33..=64 => {
                let a = rd(src as *const [u128; 2]);
                let b = rd(src.add(n - 32) as *const [u128; 2]);
                wr(dst as *mut [u128; 2], a);
                wr(dst.add(n - 32) as *mut [u128; 2], b);
            }
            _ => ptr::copy(src, dst, n),
        }
    }
}

/// Starts fetching the cache line at `p` for ownership (PREFETCHW), so a store to it soon does
/// not wait for the line to be taken from the core that last wrote it. `_mm_prefetch` with
/// `_MM_HINT_ET0` silently compiles to a read prefetch unless the crate is built for a CPU with
/// `prfchw`, so the instruction is written out; CPUs without it execute it as a NOP.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_for_write(p: *const u8) {
    // SAFETY: PREFETCHW only hints the cache; it reads no register but `p`, writes nothing, and
    // never faults.
    unsafe { core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly)) };
}

#[cfg(test)]
mod tests {
    use super::{Segs, copy_bytes};

    #[test]
    fn copy_bytes_all_sizes_and_overlaps() {
        for n in 0..200usize {
            for shift in [0usize, 1, 7, 16, 33] {
                let mut buf: Vec<u8> = (0..400).map(|i| i as u8).collect();
                let want: Vec<u8> = buf[..n].to_vec();
                // SAFETY: both ranges lie inside `buf`; copy_bytes allows overlap.
                unsafe { copy_bytes(buf.as_ptr(), buf.as_mut_ptr().add(shift), n) };
                assert_eq!(&buf[shift..shift + n], &want[..], "n {n} shift {shift}");
                let mut dst = vec![0u8; n];
                // SAFETY: distinct buffers of n bytes.
                unsafe { copy_bytes(want.as_ptr(), dst.as_mut_ptr(), n) };
                assert_eq!(dst, want);
            }
        }
    }

    #[test]
    fn update_words_writes_only_bytes_that_differ() {
        // A read-only page: a store into it would fault, so equal bytes must not be stored.
        // SAFETY: a fresh anonymous mapping of one page, unmapped at the end of the test.
        let page = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(page, libc::MAP_FAILED);
        let mut ro = Segs::default();
        // SAFETY: the page is mapped until the munmap below, after the last use of `ro`.
        unsafe { ro.set_one(page as *mut u8, 4096) };
        assert!(!ro.update_words(100, 0, 0, 12), "12 equal bytes: nothing stored");
        assert!(!ro.update_words(4086, 0, 0, 10), "10 equal bytes at the page's end: nothing stored");
        assert!(!ro.update_words(100, 0, 0xabcd_0000, 10), "a 10-byte value ignores hi's upper half");
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(page, 4096) };

        let mut buf = [0u8; 64];
        let mut rw = Segs::default();
        // SAFETY: `buf` outlives `rw`; the test reads `buf` only between uses of `rw`.
        unsafe { rw.set_one(buf.as_mut_ptr(), 64) };
        let (lo, hi) = (u64::from_le_bytes([1, 2, 3, 4, 5, 6, 7, 8]), u32::from_le_bytes([9, 10, 11, 12]));
        assert!(rw.update_words(20, lo, hi, 12), "bytes that differ are stored");
        assert!(!rw.update_words(20, lo, hi, 12), "and then read the same");
        assert_eq!(&buf[20..32], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(buf[32], 0, "nothing past the value");
        assert!(rw.update_words(20, lo, 0x0b0b_0a0a, 10), "one byte of the tail differs");
        assert_eq!(&buf[28..33], &[0x0a, 0x0a, 11, 12, 0], "10 bytes: the tail's low half only");
        assert!(rw.update_words(20, lo ^ 1 << 56, hi, 12));
        assert_eq!(buf[27], 9, "the last byte of lo");
    }

    /// Segments over `buf` cut at `cuts` (ascending offsets), with the pieces laid out in
    /// `buf` in reverse order, so a read that crossed a cut without the walk would read the
    /// wrong bytes.
    /// The segments point into `buf` without borrowing it (the test reads and writes `buf`
    /// between their uses): it must outlive them.
    fn segs_over(buf: &mut [u8], cuts: &[usize], total: usize) -> (Segs<'static>, Vec<usize>) {
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(total);
        let pieces: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
        let mut segs = Segs::default();
        // Where frame offset i lives in `buf`.
        let mut at = vec![0usize; total];
        let mut base = 0;
        for &(start, len) in pieces.iter().rev() {
            for i in 0..len {
                at[start + i] = base + i;
            }
            base += len + 3;
        }
        let mut base = 0;
        let mut ptrs = Vec::new();
        for &(_, len) in pieces.iter().rev() {
            ptrs.push((base, len));
            base += len + 3;
        }
        for &(b, len) in ptrs.iter().rev() {
            // SAFETY: inside `buf`, which the caller keeps alive while it uses the segments.
            unsafe { segs.push(buf[b..].as_mut_ptr(), len as u32) }.unwrap();
        }
        (segs, at)
    }

    #[test]
    fn every_access_agrees_with_a_flat_model_over_any_layout() {
        // One segment; a 12-byte header in a descriptor of its own; the frame cut in three; an
        // empty first segment (a frontend may send a zero-length descriptor).
        let layouts: [&[usize]; 5] = [&[], &[12], &[12, 40], &[5, 12, 13, 70], &[0, 12]];
        for cuts in layouts {
            let total = 100;
            let mut buf = vec![0u8; 2 * total + 64];
            let (segs, at) = segs_over(&mut buf, cuts, total);
            for (i, &a) in at.iter().enumerate() {
                buf[a] = i as u8;
            }
            let model: Vec<u8> = (0..total).map(|i| i as u8).collect();
            for off in 0..total as u32 + 2 {
                let o = off as usize;
                let want4 = model.get(o..o + 4).map(|s| <[u8; 4]>::try_from(s).unwrap());
                assert_eq!(segs.read_array::<4>(off), want4, "cuts {cuts:?} off {off}");
                let want14 = model.get(o..o + 14).map(|s| <[u8; 14]>::try_from(s).unwrap());
                assert_eq!(segs.read_array::<14>(off), want14, "cuts {cuts:?} off {off}");
                let mut out = [0u8; 30];
                let n = segs.read_at(off, &mut out);
                let want = &model[o.min(total)..(o + 30).min(total)];
                assert_eq!(&out[..n], want, "cuts {cuts:?} off {off}");
            }
            // Writes, and a copy into a one-segment buffer, land where the model says.
            let (mut w, wat) = segs_over(&mut buf, cuts, total);
            for off in [0u32, 10, 11, 12, 13, 39, 40, 41, 90] {
                let v = [0xa0u8, 0xa1, 0xa2, 0xa3, 0xa4];
                assert_eq!(w.write_at(off, &v), v.len());
                for (k, &b) in v.iter().enumerate() {
                    assert_eq!(buf[wat[off as usize + k]], b, "cuts {cuts:?} write at {off}");
                }
                if off + 12 <= total as u32 {
                    let (lo, hi) = (0x5a5a_5a5a_5a5a_5a5a_u64, 0x5a5a_5a5a_u32);
                    assert!(w.update_words(off, lo, hi, 12));
                    // Equal bytes in the first or second segment are left alone; elsewhere
                    // (across a cut, or further on) they are written.
                    let (o, end) = (off as usize, off as usize + 12);
                    let c0 = cuts.first().copied().unwrap_or(total);
                    let c1 = cuts.get(1).copied().unwrap_or(total);
                    let fast = end <= c0 || (o >= c0 && end <= c1);
                    assert_eq!(w.update_words(off, lo, hi, 12), !fast, "cuts {cuts:?} update at {off}");
                    for k in 0..12 {
                        assert_eq!(buf[wat[off as usize + k]], 0x5a, "cuts {cuts:?} update at {off}");
                    }
                }
                let mut flat = [0u8; 64];
                let mut dst = Segs::default();
                // SAFETY: `flat` outlives `dst`.
                unsafe { dst.set_one(flat.as_mut_ptr(), 64) };
                assert_eq!(dst.copy_from(0, &w, off, 8), 8);
                let mut want = [0u8; 8];
                for (k, b) in want.iter_mut().enumerate() {
                    *b = buf[wat[off as usize + k]];
                }
                assert_eq!(&flat[..8], &want, "cuts {cuts:?} copy from {off}");
            }
            w.clear();
        }
    }
}
