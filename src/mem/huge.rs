//! Large tables every poll thread reads (the connection tracker's), backed by transparent huge
//! pages where the kernel gives them: a lookup of a random connection in a table of gigabytes
//! misses the TLB at every 4 KiB page, and walks the page tables for it; at 2 MiB pages the
//! walk is mostly cached. The one `unsafe` is the `madvise` call.

/// A boxed slice of `n` values made by `f`, its memory advised to be backed by huge pages
/// before anything is written to it (so the first touch faults huge pages in, not 4 KiB ones).
/// Where the kernel has transparent huge pages off, or refuses, it is an ordinary slice.
pub fn filled<T>(n: usize, mut f: impl FnMut() -> T) -> Box<[T]> {
    let mut v: Vec<T> = Vec::with_capacity(n);
    advise_huge(v.as_mut_ptr() as usize, n.saturating_mul(std::mem::size_of::<T>()));
    v.extend((0..n).map(|_| f()));
    v.into_boxed_slice()
}

/// Advises the whole pages of `[addr, addr + len)` to be backed by huge pages.
fn advise_huge(addr: usize, len: usize) {
    const PAGE: usize = 4096;
    let (start, end) = (addr.next_multiple_of(PAGE), (addr + len) / PAGE * PAGE);
    if end <= start || end - start < (2 << 20) {
        return;
    }
    // SAFETY: `[start, end)` lies inside one allocation this function's caller owns (a Vec's
    // capacity, not yet written); MADV_HUGEPAGE changes only which pages the kernel backs it
    // with, never its contents, its mapping or its protection, so no Rust value is affected.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    if r != 0 {
        log::debug!("madvise(MADV_HUGEPAGE): {}", std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn filled_holds_what_f_made() {
        let mut i = 0u64;
        let v = super::filled(1 << 20, || {
            i += 1;
            i
        });
        assert_eq!((v.len(), v[0], v[(1 << 20) - 1]), (1 << 20, 1, 1 << 20));
    }
}
