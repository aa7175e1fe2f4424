//! A guest's memory as the vhost-user frontend shared it: the regions of one SET_MEM_TABLE,
//! mapped into pvswitchd, and bounds-checked translation from guest addresses to host pointers.
//!
//! This is one of the two modules where `unsafe` lives (the other is `vring`). The rules:
//! - A `GuestMem` owns its mappings (vm-memory's `MmapRegion` unmaps on drop). Every user holds an
//!   `Arc<GuestMem>`, so a mapping outlives every pointer derived from it; a new memory table
//!   replaces the `Arc` in each ring under that ring's lock (see `vring::VringLock`).
//! - Guest memory is shared with a process we do not trust. We never create Rust references into
//!   it: only raw pointers, and every value we interpret (indices, descriptors) is read once into
//!   a local before it is checked and used, so a guest changing it concurrently can only hurt
//!   itself. Frame bytes are copied with `copy_nonoverlapping`, as DPDK and vm-memory do; a guest
//!   racing with that copy gets garbage in its own frame, never access outside its regions.
//! - `translate` returns a pointer only for a range that lies entirely inside one mapped region.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use vm_memory::{FileOffset, MmapRegion};

/// One region of the memory table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDesc {
    pub guest_phys_addr: u64,
    pub size: u64,
    /// The frontend's own virtual address for the region (rings are given in these).
    pub user_addr: u64,
    pub mmap_offset: u64,
}

struct Region {
    gpa: u64,
    uva: u64,
    size: u64,
    host: *mut u8,
    /// Known to the SIGBUS handler while mapped (dropped before `map`: fields drop in order).
    _fault_reg: crate::mem::fault::Registration,
    map: MmapRegion,
}

/// Mapped guest memory. Immutable once built; replaced whole on SET_MEM_TABLE.
pub struct GuestMem {
    regions: Vec<Region>,
    /// Address space the mappings take (their page-aligned windows), charged to the process
    /// budget until they are unmapped (declared after `regions`, so released after them).
    reserved: Reservation,
}

// SAFETY: `GuestMem` only hands out raw pointers into mappings it owns; the mappings are
// process-wide and stay valid until drop, so moving or sharing the owner between threads is fine.
unsafe impl Send for GuestMem {}
// SAFETY: see `Send`; nothing in `GuestMem` is mutated after construction.
unsafe impl Sync for GuestMem {}

#[derive(Debug)]
pub enum MemError {
    /// Regions in the table, and the most the port allows.
    TooManyRegions(usize, usize),
    /// Bytes of address space the table needs, and the most the port allows.
    TooLarge(u64, u64),
    /// Bytes the table needs, bytes every other table holds, and the most the process allows.
    ProcessFull(u64, u64, u64),
    EmptyRegion(usize),
    Overflow(usize),
    Overlap(usize),
    Map(usize, String),
    ShortFile(usize, u64, u64),
    /// A region's file has pages of this size, which the SIGBUS handler cannot replace.
    PageSize(usize, u64),
    /// Every slot of the SIGBUS handler's registry is taken.
    Unprotected(usize),
}

impl std::fmt::Display for MemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |n: u64| n.div_ceil(1 << 20);
        match self {
            MemError::TooManyRegions(n, max) => {
                write!(f, "memory table of {n} regions: the port allows at most {max} (max_memory_regions)")
            }
            MemError::TooLarge(n, max) => write!(
                f,
                "memory table of {} MiB: the port allows at most {} MiB (max_guest_memory_mib)",
                mib(*n),
                max >> 20
            ),
            MemError::ProcessFull(n, used, max) => write!(
                f,
                "memory table of {} MiB: pvswitchd maps {} MiB of guest memory already and allows at most {} MiB \
                 in all (max_total_guest_memory_mib)",
                mib(*n),
                mib(*used),
                max >> 20
            ),
            MemError::EmptyRegion(i) => write!(f, "memory region {i} is empty"),
            MemError::Overflow(i) => write!(f, "memory region {i} wraps the address space"),
            MemError::Overlap(i) => write!(f, "memory region {i} overlaps another"),
            MemError::Map(i, e) => write!(f, "mapping memory region {i}: {e}"),
            MemError::ShortFile(i, have, need) => {
                write!(f, "memory region {i} needs {need} bytes of its file, which has {have}")
            }
            MemError::PageSize(i, p) => {
                write!(f, "memory region {i}: its file has pages of {p} bytes; pvswitchd supports pages of up to 1 GiB")
            }
            MemError::Unprotected(i) => {
                write!(f, "memory region {i}: too many guest memory mappings in pvswitchd to guard another")
            }
        }
    }
}

/// QEMU's limit for vhost-user memory slots.
pub const MAX_REGIONS: usize = 509;

/// The most guest memory one memory table may map into pvswitchd: every page of it is one
/// pvswitchd may come to touch (and, for a page the guest never touched, be charged for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemLimits {
    /// Address space the table's mappings take: the sum of the regions' windows of their
    /// files, each aligned out to the file's page size.
    pub max_bytes: u64,
    pub max_regions: usize,
}

impl MemLimits {
    pub const NONE: MemLimits = MemLimits { max_bytes: u64::MAX, max_regions: MAX_REGIONS };
}

/// The default of `max_total_guest_memory_mib`: 64 TiB, half of x86-64's 128 TiB of user
/// address space, which leaves the other half to pvswitchd itself (DPDK reserves its own).
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 64 << 40;

/// Address space guest mappings hold, and the most they may: one for the process (`PROCESS`);
/// tests make their own.
pub struct Budget {
    reserved: AtomicU64,
    limit: AtomicU64,
}

impl Budget {
    pub const fn new(limit: u64) -> Budget {
        Budget { reserved: AtomicU64::new(0), limit: AtomicU64::new(limit) }
    }

    /// Bytes held now.
    pub fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed)
    }

    fn take(&'static self, bytes: u64) -> Result<Reservation, MemError> {
        let limit = self.limit.load(Ordering::Relaxed);
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| used.checked_add(bytes).filter(|&t| t <= limit))
            .map(|_| Reservation { bytes, budget: self })
            .map_err(|used| MemError::ProcessFull(bytes, used, limit))
    }
}

/// Every guest mapping of the process: one port cannot take so much address space that
/// another's memory table no longer maps.
pub static PROCESS: Budget = Budget::new(DEFAULT_MAX_TOTAL_BYTES);

/// Sets the most address space every guest mapping of the process together may take
/// (`[switch] max_total_guest_memory_mib`). Mappings already made stay; lowered below what
/// they hold, no new table maps until enough are gone.
pub fn set_total_limit(bytes: u64) {
    PROCESS.limit.store(bytes, Ordering::Relaxed);
}

/// Bytes of a budget one `GuestMem` holds; given back on drop.
struct Reservation {
    bytes: u64,
    budget: &'static Budget,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// hugetlbfs's `f_type` (linux/magic.h).
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
/// The base page size (x86-64, aarch64 with 4 KiB pages).
const BASE_PAGE: u64 = 4096;

/// The page size of a file's mappings: the huge page size on hugetlbfs (whose mmap offsets and
/// lengths must be multiples of it), else the base page.
fn page_size(file: &File) -> std::io::Result<u64> {
    // SAFETY: statfs is plain integers, for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into `st`, which we own, about an fd we own.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(if st.f_type as i64 == HUGETLBFS_MAGIC { (st.f_bsize as u64).max(BASE_PAGE) } else { BASE_PAGE })
}

/// The part of a file region `d` maps: `[mmap_offset, mmap_offset + size)` aligned out to
/// `page`. Returns (file offset of the window, its length); None if it overflows.
fn window(d: &RegionDesc, page: u64) -> Option<(u64, u64)> {
    let start = d.mmap_offset & !(page - 1);
    let end = d.mmap_offset.checked_add(d.size)?.checked_next_multiple_of(page)?;
    // mmap takes a signed offset.
    (end <= i64::MAX as u64).then_some((start, end - start))
}

impl GuestMem {
    /// Maps every region of a memory table. `files[i]` backs `descs[i]`.
    /// A table over `limits`, or over what the process has left, is refused before anything is
    /// mapped. Only each region's own window of its file is mapped, so a huge `mmap_offset`
    /// costs no address space.
    pub fn map(descs: &[RegionDesc], files: Vec<File>, limits: &MemLimits) -> Result<GuestMem, MemError> {
        GuestMem::map_in(descs, files, limits, &PROCESS)
    }

    /// `map`, charging the address space to `budget`.
    pub fn map_in(
        descs: &[RegionDesc],
        files: Vec<File>,
        limits: &MemLimits,
        budget: &'static Budget,
    ) -> Result<GuestMem, MemError> {
        let max = limits.max_regions.min(MAX_REGIONS);
        if descs.len() > max || descs.len() != files.len() {
            return Err(MemError::TooManyRegions(descs.len(), max));
        }
        let mut windows = Vec::with_capacity(descs.len());
        for (i, (d, file)) in descs.iter().zip(&files).enumerate() {
            let page = page_size(file).map_err(|e| MemError::Map(i, e.to_string()))?;
            if !page.is_power_of_two() || page > crate::mem::fault::MAX_PAGE as u64 {
                return Err(MemError::PageSize(i, page));
            }
            if d.size == 0 {
                return Err(MemError::EmptyRegion(i));
            }
            let (off, len) = window(d, page).ok_or(MemError::Overflow(i))?;
            windows.push((page, off, len));
        }
        // Every byte of address space the table takes counts, not only the regions' sizes.
        let total = windows.iter().try_fold(0u64, |t, w| t.checked_add(w.2));
        let total = match total {
            Some(t) if t <= limits.max_bytes => t,
            _ => return Err(MemError::TooLarge(total.unwrap_or(u64::MAX), limits.max_bytes)),
        };
        for (i, (d, file)) in descs.iter().zip(&files).enumerate() {
            let (Some(_), Some(_), Some(file_end)) = (
                d.guest_phys_addr.checked_add(d.size),
                d.user_addr.checked_add(d.size),
                d.mmap_offset.checked_add(d.size),
            ) else {
                return Err(MemError::Overflow(i));
            };
            for e in &descs[..i] {
                let gpa_overlap =
                    d.guest_phys_addr < e.guest_phys_addr + e.size && e.guest_phys_addr < d.guest_phys_addr + d.size;
                let uva_overlap = d.user_addr < e.user_addr + e.size && e.user_addr < d.user_addr + d.size;
                if gpa_overlap || uva_overlap {
                    return Err(MemError::Overlap(i));
                }
            }
            let meta = file.metadata().map_err(|e| MemError::Map(i, e.to_string()))?;
            // Touching a mapping past the end of its file raises SIGBUS, which would take the
            // whole switch down: the file must hold the region the frontend describes.
            if meta.is_file() && meta.len() < file_end {
                return Err(MemError::ShortFile(i, meta.len(), file_end));
            }
        }
        // Everything above is checked before any address space is reserved: a refused table
        // never holds any of the budget, even for a moment.
        let reserved = budget.take(total)?;
        let mut regions: Vec<Region> = Vec::with_capacity(descs.len());
        for (i, ((d, file), &(page, off, len))) in descs.iter().zip(files).zip(&windows).enumerate() {
            // The file must keep holding the region (checked above): memfds that allow sealing
            // (QEMU seals its own) are sealed against shrinking; see DESIGN.md for files that
            // cannot be sealed.
            // SAFETY: fcntl on an fd we own; failure (EINVAL, EPERM) leaves it unchanged.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
            // Map the region's window only: from mmap_offset aligned down to the file's page
            // size (hugetlbfs wants offsets and lengths aligned to its page, which the
            // frontend's offset need not be) to its end aligned up.
            let len_us = usize::try_from(len).map_err(|_| MemError::Overflow(i))?;
            let map = MmapRegion::from_file(FileOffset::new(file, off), len_us)
                .map_err(|e| MemError::Map(i, e.to_string()))?;
            // SAFETY: off <= mmap_offset and mmap_offset + size <= off + len (the window's
            // construction): the pointer, and the region's `size` bytes after it, stay inside
            // the map.
            let host = unsafe { map.as_ptr().add((d.mmap_offset - off) as usize) };
            let _fault_reg = crate::mem::fault::register(map.as_ptr() as usize, len_us, page as usize)
                .ok_or(MemError::Unprotected(i))?;
            regions.push(Region { gpa: d.guest_phys_addr, uva: d.user_addr, size: d.size, host, _fault_reg, map });
        }
        Ok(GuestMem { regions, reserved })
    }

    /// The region holding `addr` in the address space `base` picks (guest-physical or the
    /// frontend's virtual), and the offset into it.
    #[inline]
    fn find(&self, addr: u64, base: impl Fn(&Region) -> u64) -> Option<(&Region, u64)> {
        self.regions.iter().find_map(|r| addr.checked_sub(base(r)).filter(|&off| off < r.size).map(|off| (r, off)))
    }

    /// Host pointer for `len` bytes at guest physical address `gpa`, if they lie in one region.
    #[inline]
    pub fn translate(&self, gpa: u64, len: u64) -> Option<*mut u8> {
        let (r, off) = self.find(gpa, |r| r.gpa)?;
        // SAFETY: off + len <= r.size, so the range lies inside the mapping.
        (len <= r.size - off).then(|| unsafe { r.host.add(off as usize) })
    }

    /// The guest address of host pointer `p` (which `translate` gave), if it lies in a region:
    /// where a buffer the data path wrote into is, for the dirty log.
    pub fn gpa_of_host(&self, p: *const u8) -> Option<u64> {
        let a = p as usize;
        self.regions.iter().find_map(|r| {
            let start = r.host as usize;
            (a >= start && a - start < r.size as usize).then(|| r.gpa + (a - start) as u64)
        })
    }

    /// Like `translate`, but returns the longest prefix (<= len) contiguous in one region, so a
    /// buffer that spans two regions can be walked piece by piece.
    #[inline]
    pub fn translate_prefix(&self, gpa: u64, len: u64) -> Option<(*mut u8, u64)> {
        let (r, off) = self.find(gpa, |r| r.gpa)?;
        // SAFETY: off < r.size and the prefix length is at most r.size - off: inside the mapping.
        Some((unsafe { r.host.add(off as usize) }, len.min(r.size - off)))
    }

    /// ORs `bits` into the byte at guest address `gpa` with one atomic instruction (a dirty
    /// log's bitmap, which the frontend reads and clears while we set bits in it, as the
    /// vhost-user protocol requires). False if the byte lies in no region.
    #[inline]
    pub fn fetch_or_byte(&self, gpa: u64, bits: u8) -> bool {
        let Some(p) = self.translate(gpa, 1) else { return false };
        // SAFETY: `translate` checked that the byte lies in a mapping this `GuestMem` owns,
        // mapped while `self` lives; `AtomicU8` has a u8's size and alignment. The frontend is
        // meant to touch the byte with atomics only; one that does not can only corrupt its
        // own log.
        unsafe { AtomicU8::from_ptr(p) }.fetch_or(bits, Ordering::Relaxed);
        true
    }

    /// Host pointer for `len` bytes at the frontend's virtual address `uva` (ring addresses).
    pub fn translate_user(&self, uva: u64, len: u64) -> Option<*mut u8> {
        let (r, off) = self.find(uva, |r| r.uva)?;
        // SAFETY: as in `translate`.
        (len <= r.size - off).then(|| unsafe { r.host.add(off as usize) })
    }

    /// Whether a host address lies in one of these mappings (to attribute a memory fault).
    pub fn contains_host(&self, addr: usize) -> bool {
        self.regions.iter().any(|r| {
            let start = r.map.as_ptr() as usize;
            addr >= start && addr < start + r.map.size()
        })
    }

    /// The NUMA node holding the page at the frontend's virtual address `uva` (a ring's
    /// address), as the kernel reports it; None where it cannot tell (no NUMA support).
    pub fn numa_node_of(&self, uva: u64) -> Option<usize> {
        let host = self.translate_user(uva, 1)?;
        let mut node: libc::c_int = -1;
        const MPOL_F_NODE: libc::c_ulong = 1;
        const MPOL_F_ADDR: libc::c_ulong = 2;
        // SAFETY: get_mempolicy writes one int to `node`; `host` lies inside one of our live
        // mappings (translate_user checked it), and the kernel only looks the page up (it
        // faults it in like a read if it was never touched, which a ring always has been).
        let r = unsafe {
            libc::syscall(
                libc::SYS_get_mempolicy,
                &mut node as *mut libc::c_int,
                std::ptr::null_mut::<libc::c_ulong>(),
                0 as libc::c_ulong,
                host as *mut libc::c_void,
                MPOL_F_NODE | MPOL_F_ADDR,
            )
        };
        (r == 0 && node >= 0).then_some(node as usize)
    }

    /// Each region's guest-visible bytes `[host, host + size)` and its whole mapping
    /// `[start, start + len)` (for tests that check where pointers lie, or fence the bytes of
    /// the mapping that lie outside the region).
    #[cfg(test)]
    pub(crate) fn host_ranges(&self) -> Vec<((usize, usize), (usize, usize))> {
        self.regions
            .iter()
            .map(|r| ((r.host as usize, r.size as usize), (r.map.as_ptr() as usize, r.map.size())))
            .collect()
    }

    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    /// The end of the highest region, as a guest-physical address (what a dirty log covers).
    pub fn gpa_end(&self) -> u64 {
        self.regions.iter().map(|r| r.gpa + r.size).max().unwrap_or(0)
    }

    /// Total bytes of guest memory mapped (the regions' sizes).
    pub fn total_size(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    /// Address space the mappings take (the regions' page-aligned windows of their files).
    pub fn mapped_size(&self) -> u64 {
        self.reserved.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(size: usize) -> File {
        let f = tempfile_in_shm();
        f.set_len(size as u64).unwrap();
        f
    }

    fn tempfile_in_shm() -> File {
        // SAFETY: memfd_create with a valid C string; the fd is owned by the returned File.
        let fd = unsafe { libc::memfd_create(c"pvs-test".as_ptr(), 0) };
        assert!(fd >= 0);
        use std::os::fd::FromRawFd;
        // SAFETY: fd is a fresh, valid descriptor we own.
        unsafe { File::from_raw_fd(fd) }
    }

    #[test]
    fn translate_checks_bounds() {
        let mut f = memfd(8192);
        f.write_all(b"hello").unwrap();
        let d = RegionDesc { guest_phys_addr: 0x1000, size: 8192, user_addr: 0x7000_0000, mmap_offset: 0 };
        let m = GuestMem::map(&[d], vec![f], &MemLimits::NONE).unwrap();
        let p = m.translate(0x1000, 5).unwrap();
        // SAFETY: p points at 5 mapped bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(p, 5) }, b"hello");
        assert!(m.translate(0x1000, 8193).is_none());
        assert!(m.translate(0xfff, 1).is_none());
        assert!(m.translate(0x1000 + 8191, 1).is_some());
        assert!(m.translate(0x1000 + 8191, 2).is_none());
        assert!(m.translate(u64::MAX, 2).is_none());
        assert_eq!(m.translate_prefix(0x1000 + 8000, 500).unwrap().1, 192);
        assert!(m.translate_user(0x7000_0000, 16).is_some());
        assert!(m.translate_user(0x6fff_ffff, 16).is_none());
    }

    #[test]
    fn rejects_overlap_and_overflow() {
        let d1 = RegionDesc { guest_phys_addr: 0, size: 4096, user_addr: 0, mmap_offset: 0 };
        let d2 = RegionDesc { guest_phys_addr: 2048, size: 4096, user_addr: 1 << 20, mmap_offset: 0 };
        assert!(matches!(
            GuestMem::map(&[d1, d2], vec![memfd(4096), memfd(4096)], &MemLimits::NONE),
            Err(MemError::Overlap(1))
        ));
        let d3 = RegionDesc { guest_phys_addr: u64::MAX - 10, size: 4096, user_addr: 0, mmap_offset: 0 };
        assert!(matches!(GuestMem::map(&[d3], vec![memfd(4096)], &MemLimits::NONE), Err(MemError::Overflow(0))));
    }

    /// A table over the port's limits is refused whole, before anything is mapped: a sparse
    /// file of any size costs nothing until then.
    #[test]
    fn refuses_tables_over_the_limits() {
        let lim = MemLimits { max_bytes: 1 << 20, max_regions: 2 };
        let r = |i: u64, size: u64| RegionDesc { guest_phys_addr: i << 32, size, user_addr: i << 32, mmap_offset: 0 };
        assert!(GuestMem::map(&[r(0, 1 << 19), r(1, 1 << 19)], vec![memfd(1 << 19), memfd(1 << 19)], &lim).is_ok());
        let e = GuestMem::map(&[r(0, 1 << 19), r(1, (1 << 19) + 4096)], vec![memfd(1 << 19), memfd(1 << 20)], &lim);
        assert!(matches!(e, Err(MemError::TooLarge(n, m)) if n == (1 << 20) + 4096 && m == 1 << 20));
        let e = GuestMem::map(&[r(0, 4096), r(1, 4096), r(2, 4096)], (0..3).map(|_| memfd(4096)).collect(), &lim);
        assert!(matches!(e, Err(MemError::TooManyRegions(3, 2))));
        // A region that wraps is refused; sizes that overflow when summed are over any limit.
        let e = GuestMem::map(&[r(0, u64::MAX), r(1, 4096)], vec![memfd(4096), memfd(4096)], &MemLimits::NONE);
        assert!(matches!(e, Err(MemError::Overflow(0))));
        let e = GuestMem::map(
            &(0..4).map(|i| r(i, 1 << 62)).collect::<Vec<_>>(),
            (0..4).map(|_| memfd(4096)).collect(),
            &MemLimits::NONE,
        );
        assert!(matches!(e, Err(MemError::TooLarge(u64::MAX, _))));
    }

    /// VmSize of this process, in bytes.
    fn vm_size() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let l = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
        l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
    }

    /// Regions of 4 KiB at offsets of tens of TiB into sparse memfds: only each region's page
    /// is mapped, only those pages count against the limits, and addresses translate to the
    /// right bytes of the file, whether the offset is page-aligned or not.
    #[test]
    fn maps_only_the_regions_window_of_its_file() {
        use std::os::unix::fs::FileExt;
        static B: Budget = Budget::new(u64::MAX);
        let offs = [30u64 << 40, (40u64 << 40) + 0x123, (50u64 << 40) + 4096 - 8];
        let mut descs = Vec::new();
        let mut files = Vec::new();
        for (i, &off) in offs.iter().enumerate() {
            let f = memfd(0);
            f.set_len(off + 4096).unwrap();
            f.write_all_at(&[i as u8 + 1; 16], off).unwrap();
            descs.push(RegionDesc {
                guest_phys_addr: (i as u64) << 20,
                size: 16,
                user_addr: (i as u64) << 20,
                mmap_offset: off,
            });
            files.push(f);
        }
        let before = vm_size();
        // A 4 KiB page each, except the one that straddles a page boundary.
        let m = GuestMem::map_in(&descs, files, &MemLimits { max_bytes: 4 * 4096, max_regions: 8 }, &B).unwrap();
        assert_eq!(m.mapped_size(), 4 * 4096);
        assert_eq!(B.reserved(), 4 * 4096);
        assert!(vm_size() < before + (1 << 20), "VmSize grew from {before} to {}", vm_size());
        for i in 0..3u64 {
            let p = m.translate(i << 20, 16).unwrap();
            // SAFETY: 16 mapped bytes.
            assert_eq!(unsafe { std::slice::from_raw_parts(p, 16) }, &[i as u8 + 1; 16]);
            assert!(m.translate(i << 20, 17).is_none());
        }
        // One byte under the windows: refused before anything is mapped.
        let files = offs.iter().map(|&o| memfd(o as usize + 4096)).collect();
        let e = GuestMem::map_in(&descs, files, &MemLimits { max_bytes: 4 * 4096 - 1, max_regions: 8 }, &B);
        assert!(matches!(e, Err(MemError::TooLarge(n, _)) if n == 4 * 4096), "{:?}", e.err());
        drop(m);
        assert_eq!(B.reserved(), 0);
        // Still checked against the file's size.
        let d = RegionDesc { guest_phys_addr: 0, size: 4096, user_addr: 0, mmap_offset: 1 << 40 };
        let e = GuestMem::map(&[d], vec![memfd((1 << 40) + 4095)], &MemLimits::NONE);
        assert!(matches!(e, Err(MemError::ShortFile(0, _, _))));
        // An offset whose window would pass i64::MAX (mmap's offset is signed) wraps.
        let d = RegionDesc { guest_phys_addr: 0, size: 4096, user_addr: 0, mmap_offset: i64::MAX as u64 - 100 };
        assert!(matches!(GuestMem::map(&[d], vec![memfd(4096)], &MemLimits::NONE), Err(MemError::Overflow(0))));
    }

    /// The process budget: a table that would take it past its limit is refused, whatever its
    /// port allows, and what a `GuestMem` held is given back when it is dropped.
    #[test]
    fn process_budget_is_reserved_and_released() {
        static B: Budget = Budget::new(3 << 20);
        let d = |i: u64| RegionDesc { guest_phys_addr: i << 30, size: 1 << 20, user_addr: i << 30, mmap_offset: 0 };
        let map = |n: u64| {
            GuestMem::map_in(
                &(0..n).map(d).collect::<Vec<_>>(),
                (0..n).map(|_| memfd(1 << 20)).collect(),
                &MemLimits::NONE,
                &B,
            )
        };
        let a = map(2).unwrap();
        assert_eq!(B.reserved(), 2 << 20);
        let msg = map(2).err().unwrap().to_string();
        assert_eq!(
            msg,
            "memory table of 2 MiB: pvswitchd maps 2 MiB of guest memory already and allows at most 3 MiB in all \
             (max_total_guest_memory_mib)"
        );
        assert_eq!(B.reserved(), 2 << 20, "a refused table holds nothing");
        // A table refused later (a short file) gives its reservation back too.
        let e = GuestMem::map_in(&[d(0)], vec![memfd(4096)], &MemLimits::NONE, &B);
        assert!(matches!(e, Err(MemError::ShortFile(0, _, _))));
        assert_eq!(B.reserved(), 2 << 20);
        drop(a);
        assert_eq!(B.reserved(), 0);
        let b = map(3).unwrap();
        assert_eq!(B.reserved(), 3 << 20);
        drop(b);
        assert_eq!(B.reserved(), 0);
    }

    /// A 2 MiB hugetlbfs memfd: the window is aligned out to the huge page, and an unaligned
    /// offset still translates to the right bytes. Skipped (said so) without free huge pages.
    #[test]
    fn hugetlb_window_is_aligned_to_its_page() {
        use std::os::fd::FromRawFd;
        // SAFETY: memfd_create with a valid C string.
        let fd = unsafe { libc::memfd_create(c"pvs-huge".as_ptr(), libc::MFD_HUGETLB | libc::MFD_HUGE_2MB) };
        if fd < 0 {
            eprintln!(
                "hugetlb_window_is_aligned_to_its_page: NOT RUN: memfd_create(MFD_HUGETLB): {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: a fresh fd we own.
        let f = unsafe { File::from_raw_fd(fd) };
        assert_eq!(page_size(&f).unwrap(), 2 << 20);
        f.set_len(4 << 20).unwrap();
        let d = RegionDesc { guest_phys_addr: 0, size: 4096, user_addr: 0, mmap_offset: (2 << 20) + 0x1000 };
        let m = match GuestMem::map(&[d], vec![f.try_clone().unwrap()], &MemLimits::NONE) {
            Ok(m) => m,
            Err(e) => panic!("mapping a hugetlb region: {e}"),
        };
        assert_eq!(m.mapped_size(), 2 << 20);
        let p = m.translate(0, 8).unwrap();
        // SAFETY: 8 mapped bytes; touching them may fail only for want of a huge page, which
        // the kernel reports as SIGBUS: check the pool first.
        let free: u64 = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if free == 0 {
            eprintln!("hugetlb_window_is_aligned_to_its_page: no free 2 MiB page: not touching the memory");
            return;
        }
        unsafe { p.write_bytes(0xab, 8) };
        let mut b = [0u8; 8];
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut b, (2 << 20) + 0x1000).unwrap();
        assert_eq!(b, [0xab; 8]);
    }
}
