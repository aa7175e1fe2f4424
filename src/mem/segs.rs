//! The segments of one descriptor chain as host pointers, and the copies between them: the one
//! copy a frame takes from a sender's buffer into a receiver's. Like the ring walk, this is the
//! data path's `unsafe` over guest memory; see DESIGN.md.

use std::ptr;

/// Most buffer segments one chain may have after translation. Linux needs at most
/// MAX_SKB_FRAGS + 2 (19); more is treated as malformed.
pub const MAX_SEGS: usize = 64;

/// A chain has more segments than [`MAX_SEGS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegsFull;

/// Buffer segments of one descriptor chain, translated to host pointers. Valid only while the
/// lock of the ring they came from is held (the ring's `GuestMem` keeps them mapped).
pub struct Segs {
    ptrs: [(*mut u8, u32); MAX_SEGS],
    n: usize,
    total: u32,
}

impl Default for Segs {
    fn default() -> Self {
        Segs { ptrs: [(ptr::null_mut(), 0); MAX_SEGS], n: 0, total: 0 }
    }
}

impl Segs {
    pub fn len(&self) -> u32 {
        self.total
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub(crate) fn clear(&mut self) {
        self.n = 0;
        self.total = 0;
    }

    /// Makes these segments the one buffer `[p, p + len)` (the walk's fast path).
    #[inline(always)]
    pub(crate) fn set_one(&mut self, p: *mut u8, len: u32) {
        self.ptrs[0] = (p, len);
        self.n = 1;
        self.total = len;
    }

    pub(crate) fn push(&mut self, p: *mut u8, len: u32) -> Result<(), SegsFull> {
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
    /// else, for as long as these segments are used (until the next `set_host` or `pop` into
    /// them). The segments must not be written through (`write_at`, or as `copy_from`'s
    /// destination): the memory may be read-only to us.
    pub unsafe fn set_host(&mut self, p: *const u8, len: u32) {
        self.ptrs[0] = (p as *mut u8, len);
        self.n = 1;
        self.total = len;
    }

    /// The first segment's pointer, if it holds `[off, off + len)` (the common case: one
    /// buffer per frame), so small reads and writes skip the segment walk.
    #[inline(always)]
    fn in_first(&self, off: u32, len: usize) -> Option<*mut u8> {
        let (p, seg) = self.ptrs[0];
        // SAFETY: off + len <= seg, so the pointer stays inside the first segment.
        (self.n > 0 && (off as usize).saturating_add(len) <= seg as usize).then(|| unsafe { p.add(off as usize) })
    }

    /// The `N` bytes at `off`, if the chain holds them; read straight from guest memory (no
    /// copy through a buffer) when they lie in the first segment.
    #[inline(always)]
    pub fn read_array<const N: usize>(&self, off: u32) -> Option<[u8; N]> {
        if let Some(p) = self.in_first(off, N) {
            // SAFETY: N bytes inside the first segment (type invariant: mapped while the ring
            // lock is held); an unaligned read into a local.
            return Some(unsafe { ptr::read_unaligned(p as *const [u8; N]) });
        }
        let mut out = [0u8; N];
        (self.read_at(off, &mut out) == N).then_some(out)
    }

    /// Copies up to `out.len()` bytes starting at `off` into `out`; returns how many.
    #[inline]
    pub fn read_at(&self, off: u32, out: &mut [u8]) -> usize {
        if let Some(p) = self.in_first(off, out.len()) {
            // SAFETY: as below, for one piece inside the first segment.
            unsafe { copy_bytes(p, out.as_mut_ptr(), out.len()) };
            return out.len();
        }
        let dst = out.as_mut_ptr();
        // SAFETY: each piece lies in mapped guest memory while the ring lock is held (type
        // invariant) and within its segment; `out` is our own buffer, `done + n <= out.len()`.
        self.spans(off, out.len(), |p, done, n| unsafe { copy_bytes(p, dst.add(done), n) })
    }

    /// Writes `src` at offset `off` of these (device-writable) segments; returns bytes written.
    #[inline]
    pub fn write_at(&self, off: u32, src: &[u8]) -> usize {
        if let Some(p) = self.in_first(off, src.len()) {
            // SAFETY: as below, for one piece inside the first segment.
            unsafe { copy_bytes(src.as_ptr(), p, src.len()) };
            return src.len();
        }
        // SAFETY: as in `read_at`, in the other direction.
        self.spans(off, src.len(), |p, done, n| unsafe { copy_bytes(src.as_ptr().add(done), p, n) })
    }

    /// The Internet checksum sum of the `len` bytes at `off` (fewer if the chain is short): read
    /// through a local buffer, never as a slice of guest memory (a software offload's pass).
    pub fn sum(&self, off: u32, len: u32) -> crate::wire::checksum::Sum {
        let mut s = crate::wire::checksum::Sum::new();
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
        s
    }

    /// Like `write_at`, but leaves the bytes alone when they already equal `src` (for small
    /// `src` in the first segment): a line that is only read stays shared with the guest's
    /// core, where a store, even of the same bytes, would take it away. Returns whether it
    /// stored (else the bytes already read as `src`).
    #[inline]
    pub fn update_at(&self, off: u32, src: &[u8]) -> bool {
        const MAX: usize = 16;
        if src.len() <= MAX
            && let Some(p) = self.in_first(off, src.len())
        {
            let mut cur = [0u8; MAX];
            // SAFETY: src.len() bytes inside the first segment (type invariant: mapped while
            // the ring lock is held), copied into a local; then, if they differ, the other way.
            unsafe {
                copy_bytes(p, cur.as_mut_ptr(), src.len());
                if same_bytes(&cur, src) {
                    return false;
                }
                copy_bytes(src.as_ptr(), p, src.len());
            }
            return true;
        }
        self.write_at(off, src);
        true
    }

    /// Copies `len` bytes from `src` (starting at `src_off`) into these segments (starting at
    /// `dst_off`): the one copy a frame takes from one guest to another. Returns bytes copied.
    #[inline]
    pub fn copy_from(&self, dst_off: u32, src: &Segs, src_off: u32, len: u32) -> u32 {
        if let (Some(d), Some(s)) = (self.in_first(dst_off, len as usize), src.in_first(src_off, len as usize)) {
            // SAFETY: as below, for one piece inside each first segment.
            unsafe { copy_bytes(s, d, len as usize) };
            return len;
        }
        let (mut di, mut doff) = self.locate(dst_off);
        let (mut si, mut soff) = src.locate(src_off);
        let mut left = len;
        while left > 0 && di < self.n && si < src.n {
            let (dp, dl) = self.ptrs[di];
            let (sp, sl) = src.ptrs[si];
            let n = (dl - doff).min(sl - soff).min(left);
            // SAFETY: both ranges lie in mapped guest memory while both ring locks are held
            // (type invariant); they may belong to the same guest but to different buffers,
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

    /// Starts loading the cache line at `off` (the Ethernet header) ahead of its use.
    #[inline]
    pub fn prefetch(&self, off: u32) {
        if self.n > 0 && off < self.ptrs[0].1 {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a prefetch is a hint: it never faults, whatever the address.
            unsafe {
                core::arch::x86_64::_mm_prefetch(
                    self.ptrs[0].0.add(off as usize) as *const i8,
                    core::arch::x86_64::_MM_HINT_T0,
                )
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

/// Whether `a` starts with `b` (`b` at most 16 bytes): two overlapping word compares instead
/// of a call to memcmp.
#[inline(always)]
fn same_bytes(a: &[u8; 16], b: &[u8]) -> bool {
    let n = b.len();
    let word = |s: &[u8], i: usize| u64::from_ne_bytes(s[i..i + 8].try_into().unwrap());
    if n >= 8 { word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8) } else { a[..n] == *b }
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
    fn update_at_writes_only_bytes_that_differ() {
        // A read-only page: a store into it would fault, so equal bytes must not be stored.
        // SAFETY: a fresh anonymous mapping of one page, unmapped at the end of the test.
        let page = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(page, libc::MAP_FAILED);
        let mut ro = Segs::default();
        ro.set_one(page as *mut u8, 4096);
        for n in [1, 7, 8, 10, 12, 16] {
            assert!(!ro.update_at(100, &[0u8; 16][..n]), "{n} equal bytes: nothing stored");
        }
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(page, 4096) };

        let mut buf = [0u8; 64];
        let mut rw = Segs::default();
        rw.set_one(buf.as_mut_ptr(), 64);
        let mut hdr = [0u8; 12];
        hdr[10] = 1;
        assert!(rw.update_at(20, &hdr[..12]), "bytes that differ are stored");
        assert!(!rw.update_at(20, &hdr[..10]), "and then read the same");
        assert_eq!(&buf[20..32], &hdr);
        hdr[0] = 9;
        assert!(rw.update_at(20, &hdr[..4]));
        assert_eq!(buf[20], 9);
    }
}
