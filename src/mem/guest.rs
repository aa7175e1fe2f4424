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
use std::os::unix::fs::MetadataExt;

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
    _fault_reg: Option<crate::mem::fault::Registration>,
    map: MmapRegion,
}

/// Mapped guest memory. Immutable once built; replaced whole on SET_MEM_TABLE.
pub struct GuestMem {
    regions: Vec<Region>,
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
    /// Bytes in the table, and the most the port allows.
    TooLarge(u64, u64),
    EmptyRegion(usize),
    Overflow(usize),
    Overlap(usize),
    Map(usize, String),
    ShortFile(usize, u64, u64),
}

impl std::fmt::Display for MemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemError::TooManyRegions(n, max) => {
                write!(f, "memory table of {n} regions: the port allows at most {max} (max_memory_regions)")
            }
            MemError::TooLarge(n, max) => write!(
                f,
                "memory table of {} MiB: the port allows at most {} MiB (max_guest_memory_mib)",
                n.div_ceil(1 << 20),
                max >> 20
            ),
            MemError::EmptyRegion(i) => write!(f, "memory region {i} is empty"),
            MemError::Overflow(i) => write!(f, "memory region {i} wraps the address space"),
            MemError::Overlap(i) => write!(f, "memory region {i} overlaps another"),
            MemError::Map(i, e) => write!(f, "mapping memory region {i}: {e}"),
            MemError::ShortFile(i, have, need) => {
                write!(f, "memory region {i} needs {need} bytes of its file, which has {have}")
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
    /// Sum of the regions' sizes.
    pub max_bytes: u64,
    pub max_regions: usize,
}

impl MemLimits {
    pub const NONE: MemLimits = MemLimits { max_bytes: u64::MAX, max_regions: MAX_REGIONS };
}

impl GuestMem {
    /// Maps every region of a memory table. `files[i]` backs `descs[i]`.
    /// A table over `limits` is refused before anything is mapped.
    pub fn map(descs: &[RegionDesc], files: Vec<File>, limits: &MemLimits) -> Result<GuestMem, MemError> {
        let max = limits.max_regions.min(MAX_REGIONS);
        if descs.len() > max || descs.len() != files.len() {
            return Err(MemError::TooManyRegions(descs.len(), max));
        }
        let total = descs.iter().try_fold(0u64, |t, d| t.checked_add(d.size));
        match total {
            Some(t) if t <= limits.max_bytes => {}
            _ => return Err(MemError::TooLarge(total.unwrap_or(u64::MAX), limits.max_bytes)),
        }
        let mut regions: Vec<Region> = Vec::with_capacity(descs.len());
        for (i, (d, file)) in descs.iter().zip(files).enumerate() {
            if d.size == 0 {
                return Err(MemError::EmptyRegion(i));
            }
            let (Some(_), Some(_), Some(map_len)) = (
                d.guest_phys_addr.checked_add(d.size),
                d.user_addr.checked_add(d.size),
                d.mmap_offset.checked_add(d.size),
            ) else {
                return Err(MemError::Overflow(i));
            };
            for r in &regions {
                let gpa_overlap = d.guest_phys_addr < r.gpa + r.size && r.gpa < d.guest_phys_addr + d.size;
                let uva_overlap = d.user_addr < r.uva + r.size && r.uva < d.user_addr + d.size;
                if gpa_overlap || uva_overlap {
                    return Err(MemError::Overlap(i));
                }
            }
            // Map from file offset 0 and add mmap_offset ourselves: hugetlbfs wants offsets and
            // lengths aligned to its page size, which the frontend's offset need not be.
            let meta = file.metadata().map_err(|e| MemError::Map(i, e.to_string()))?;
            // Touching a mapping past the end of its file raises SIGBUS, which would take the
            // whole switch down: the file must hold the region the frontend describes.
            if meta.is_file() && meta.len() < map_len {
                return Err(MemError::ShortFile(i, meta.len(), map_len));
            }
            // And it must stay that way. memfds that allow sealing (QEMU seals its own) are
            // sealed against shrinking; see DESIGN.md for files that cannot be sealed.
            // SAFETY: fcntl on an fd we own; failure (EINVAL, EPERM) leaves it unchanged.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
            let block = meta.blksize().max(4096);
            let len = map_len.div_ceil(block) * block;
            let len = usize::try_from(len).map_err(|_| MemError::Overflow(i))?;
            let map =
                MmapRegion::from_file(FileOffset::new(file, 0), len).map_err(|e| MemError::Map(i, e.to_string()))?;
            // SAFETY: mmap_offset + size <= len, checked above; the pointer stays inside the map.
            let host = unsafe { map.as_ptr().add(d.mmap_offset as usize) };
            let _fault_reg = crate::mem::fault::register(map.as_ptr() as usize, len);
            regions.push(Region { gpa: d.guest_phys_addr, uva: d.user_addr, size: d.size, host, _fault_reg, map });
        }
        Ok(GuestMem { regions })
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

    /// Like `translate`, but returns the longest prefix (<= len) contiguous in one region, so a
    /// buffer that spans two regions can be walked piece by piece.
    #[inline]
    pub fn translate_prefix(&self, gpa: u64, len: u64) -> Option<(*mut u8, u64)> {
        let (r, off) = self.find(gpa, |r| r.gpa)?;
        // SAFETY: off < r.size and the prefix length is at most r.size - off: inside the mapping.
        Some((unsafe { r.host.add(off as usize) }, len.min(r.size - off)))
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

    /// Total bytes of guest memory mapped.
    pub fn total_size(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
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
        // Sizes that overflow when summed are over any limit.
        let e = GuestMem::map(&[r(0, u64::MAX), r(1, 4096)], vec![memfd(4096), memfd(4096)], &MemLimits::NONE);
        assert!(matches!(e, Err(MemError::TooLarge(u64::MAX, _))));
    }
}
