//! The guest side of a frontend's memory: the memfd shared with the switch (`GuestMemory`),
//! where its rings and buffers lie (`Layout`, `RingAt`), descriptors (`Desc`), and a ring's
//! driver-side state with raw access to it (`RawRing`), for writing anything a guest could.

use super::*;

/// The test layout's guest memory size.
pub const MEM_SIZE: u64 = 16 << 20;
/// The test layout's queue size.
pub const QSIZE: u16 = 256;
pub const HDR_LEN: usize = 12;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;
pub(super) const AVAIL_F_NO_INTERRUPT: u16 = 1;

pub(super) const VERSION_1: u64 = 1 << 32;
pub(super) const PROTOCOL_FEATURES: u64 = 1 << 30;
pub(super) const INDIRECT_DESC: u64 = 1 << 28;
/// The features this driver acks by default.
pub const FEATURES: u64 = VERSION_1 | PROTOCOL_FEATURES | INDIRECT_DESC;
pub const MRG_RXBUF: u64 = 1 << 15;
/// Checksum offload from the guest (a partial checksum), and TCP segmentation offload of IPv4
/// frames by the device: what a TSO sender negotiates.
pub const CSUM: u64 = 1 << 0;
pub const HOST_TSO4: u64 = 1 << 11;
pub const EVENT_IDX: u64 = 1 << 29;
pub const IN_ORDER: u64 = 1 << 35;
pub const INDIRECT: u64 = INDIRECT_DESC;
/// vhost's "log all writes" bit: the VMM is migrating the VM and the switch must mark every
/// page it writes in the dirty log (given with SET_LOG_BASE).
pub const LOG_ALL: u64 = 1 << 26;

/// Guest physical addresses of one split virtqueue's three parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingAt {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Test layout. Queue 0 is the guest's RX queue (the switch writes into it), queue 1 its TX
/// queue (the switch reads from it).
pub const RX_RING: RingAt = RingAt { desc: 0x0000, avail: 0x1000, used: 0x2000 };
pub const TX_RING: RingAt = RingAt { desc: 0x4000, avail: 0x5000, used: 0x6000 };
/// Test layout: RX descriptor `i` always points at `RX_BUFS + i * BUF_SLOT`.
pub const RX_BUFS: u64 = 0x10_0000;
/// Test layout: TX descriptor `i` always points at `TX_BUFS + i * BUF_SLOT`.
pub const TX_BUFS: u64 = 0x20_0000;
pub const BUF_SLOT: u64 = 4096;
/// Test layout: free for tests (indirect tables and the like).
pub const SCRATCH: u64 = 0x40_0000;

/// Where everything lives in a VM's guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Entries per virtqueue (a power of two, at most 32768).
    pub qsize: u16,
    /// Queue 0 (guest RX) and queue 1 (guest TX).
    pub rings: [RingAt; 2],
    /// RX buffer `i` is at `rx_bufs + i * buf_slot`; TX buffers likewise at `tx_bufs`.
    pub rx_bufs: u64,
    pub tx_bufs: u64,
    pub buf_slot: u64,
    /// Size of the guest memory region.
    pub mem_size: u64,
}

impl Layout {
    /// The fixed layout the tests' raw descriptors refer to: 16 MiB, 256 entries, rings at
    /// `RX_RING`/`TX_RING`, 4 KiB buffer slots at `RX_BUFS`/`TX_BUFS`, `SCRATCH` free.
    pub const TEST: Layout = Layout {
        qsize: QSIZE,
        rings: [RX_RING, TX_RING],
        rx_bufs: RX_BUFS,
        tx_bufs: TX_BUFS,
        buf_slot: BUF_SLOT,
        mem_size: MEM_SIZE,
    };

    /// A compact layout for `qsize` entries per ring and buffers of `buf_slot` bytes: each
    /// ring part 4 KiB aligned, then `qsize` RX buffers, then `qsize` TX buffers.
    pub fn packed(qsize: u16, buf_slot: u64) -> Layout {
        assert!(qsize.is_power_of_two() && qsize <= 32768, "queue size {qsize} is not a power of two up to 32768");
        assert!(buf_slot >= 64 && buf_slot.is_multiple_of(64));
        let page = |n: u64| n.div_ceil(4096) * 4096;
        let q = qsize as u64;
        let (desc, avail, used) = (page(16 * q), page(6 + 2 * q), page(6 + 8 * q));
        let ring = |base: u64| RingAt { desc: base, avail: base + desc, used: base + desc + avail };
        let span = desc + avail + used;
        let rx_bufs = page(2 * span);
        let tx_bufs = rx_bufs + q * buf_slot;
        Layout {
            qsize,
            rings: [ring(0), ring(span)],
            rx_bufs,
            tx_bufs,
            buf_slot,
            mem_size: page(tx_bufs + q * buf_slot),
        }
    }

    pub fn rx_buf(&self, i: u16) -> u64 {
        self.rx_bufs + i as u64 * self.buf_slot
    }

    pub fn tx_buf(&self, i: u16) -> u64 {
        self.tx_bufs + i as u64 * self.buf_slot
    }
}

/// One split-ring descriptor.
#[derive(Clone, Copy, Debug, Default)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl Desc {
    pub(super) fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }
}

/// The memfd behind a VM's memory, mapped shared into this process.
pub struct GuestMemory {
    pub(super) file: File,
    pub(super) base: *mut u8,
    /// The region's size.
    pub(super) size: u64,
    /// Size of the mapping: `size` rounded up to the file's page size.
    pub(super) map_len: u64,
    /// Bytes of the file behind the mapping (`size` unless a test shrinks it); touching the
    /// mapping past it would be SIGBUS.
    pub(super) file_len: Cell<u64>,
}

// SAFETY: the mapping is owned by this value and only reached through its methods, which copy
// bytes or use atomics; moving it to another thread moves that ownership. (Not Sync: `file_len`
// is a Cell.)
unsafe impl Send for GuestMemory {}

impl GuestMemory {
    pub(super) fn new(size: u64, file_len: u64) -> GuestMemory {
        GuestMemory::new_memfd(size, file_len, 0, 4096).unwrap()
    }

    /// A memfd created with `flags` (MFD_HUGETLB | MFD_HUGE_2MB, ...) whose pages are `page`
    /// bytes; `file_len` is rounded up to a page. Fails where the kernel has no such pages.
    pub fn new_memfd(size: u64, file_len: u64, flags: libc::c_uint, page: u64) -> std::io::Result<GuestMemory> {
        // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
        let fd = unsafe { libc::memfd_create(c"pvs-vm".as_ptr(), libc::MFD_CLOEXEC | flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(file_len.next_multiple_of(page))?;
        let map_len = size.next_multiple_of(page);
        // SAFETY: a new shared mapping of a file we own, at an address the kernel picks; it is
        // unmapped in Drop and never handed out as a Rust reference except to atomics.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(GuestMemory { file, base: p as *mut u8, size, map_len, file_len: Cell::new(file_len) })
    }

    /// The address of guest physical 0 in this process (the region's user address).
    pub fn uva(&self) -> u64 {
        self.base as u64
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether `len` bytes at `gpa` lie inside the memory (and its file).
    pub fn contains(&self, gpa: u64, len: usize) -> bool {
        gpa.checked_add(len as u64).is_some_and(|end| end <= self.size.min(self.file_len.get()))
    }

    #[inline]
    pub(super) fn check(&self, gpa: u64, len: usize) {
        assert!(
            gpa.checked_add(len as u64).is_some_and(|end| end <= self.size.min(self.file_len.get())),
            "{gpa:#x}+{len} is outside the VM's memory"
        );
    }

    /// Copies `bytes` into guest memory. The switch reads and writes this memory concurrently,
    /// but only buffers we handed it through a ring, which we do not touch until it gives them
    /// back (ordered by the atomic ring indices).
    #[inline]
    pub fn write(&self, gpa: u64, bytes: &[u8]) {
        self.check(gpa, bytes.len());
        // SAFETY: the range lies inside our mapping (checked); `bytes` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(gpa as usize), bytes.len()) };
    }

    /// Copies guest memory at `gpa` into `out`.
    #[inline]
    pub fn read_into(&self, gpa: u64, out: &mut [u8]) {
        self.check(gpa, out.len());
        // SAFETY: as in `write`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(gpa as usize), out.as_mut_ptr(), out.len()) };
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read_into(gpa, &mut v);
        v
    }

    /// A ring index shared with the switch (avail->idx, used->idx, flags).
    #[inline]
    pub fn u16_at(&self, gpa: u64) -> &AtomicU16 {
        self.check(gpa, 2);
        assert!(gpa.is_multiple_of(2));
        // SAFETY: 2 aligned bytes inside the mapping, which lives as long as `self`; AtomicU16
        // has u16's layout, and every access to ring indices here goes through atomics.
        unsafe { &*(self.base.add(gpa as usize) as *const AtomicU16) }
    }

    /// Shrinks (or grows) the file behind guest memory, as a hostile VM may at any time.
    pub fn set_file_len(&self, len: u64) {
        self.file.set_len(len).unwrap();
        self.file_len.set(len);
    }

    #[inline]
    pub fn u32_at(&self, gpa: u64) -> u32 {
        let mut b = [0u8; 4];
        self.read_into(gpa, &mut b);
        u32::from_le_bytes(b)
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no references into it outlive
        // `self` (atomics borrowed from `u16_at` are tied to `&self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len as usize) };
    }
}

/// Our side of one split virtqueue.
pub(super) struct Ring {
    pub(super) at: RingAt,
    pub(super) qsize: u16,
    /// Next avail index we will publish.
    pub(super) avail_idx: u16,
    /// Used entries we have consumed.
    pub(super) last_used: u16,
    /// The ring's kick eventfd: written after a publish when the switch asks for kicks (it
    /// clears VRING_USED_F_NO_NOTIFY, or sets avail_event, before its poll thread sleeps).
    pub(super) kick: Option<std::os::fd::RawFd>,
    /// EVENT_IDX negotiated: kicks follow avail_event, interrupts used_event.
    pub(super) event_idx: bool,
}

/// Direct access to one of a VM's rings: for a driver's fast path, and for writing what a
/// hostile guest would.
pub struct RawRing<'a> {
    pub(super) mem: &'a GuestMemory,
    pub(super) ring: &'a mut Ring,
}

impl RawRing<'_> {
    /// Writes descriptor `i` of the ring's table (`i` may be anything below the queue size).
    #[inline]
    pub fn desc(&mut self, i: u16, d: Desc) {
        assert!(i < self.ring.qsize);
        write_descs(self.mem, self.ring.at.desc + 16 * i as u64, &[d]);
    }

    /// Puts `head` in the next avail slot without publishing it (see `publish`).
    #[inline]
    pub fn stage(&mut self, head: u16) {
        let slot = self.ring.avail_idx % self.ring.qsize;
        self.mem.write(self.ring.at.avail + 4 + 2 * slot as u64, &head.to_le_bytes());
        self.ring.avail_idx = self.ring.avail_idx.wrapping_add(1);
    }

    /// Publishes every staged head: one avail->idx store (release), then a kick if the switch
    /// asked for one (used->flags without NO_NOTIFY), as a driver does.
    #[inline]
    pub fn publish(&mut self) {
        let old = u16::from_le(self.mem.u16_at(self.ring.at.avail + 2).load(Ordering::Relaxed));
        let idx = self.ring.avail_idx;
        self.set_avail_idx(idx);
        let used = self.ring.at.used;
        let q = self.ring.qsize as u64;
        let readable = self.mem.contains(used, 6 + 8 * q as usize) && used.is_multiple_of(2);
        if let Some(fd) = self.ring.kick.filter(|_| readable) {
            // What the switch asked for must be read after our idx store is visible (it
            // re-checks the idx after asking, with a full fence in between).
            std::sync::atomic::fence(Ordering::SeqCst);
            let want = if self.ring.event_idx {
                // avail_event is used->ring[qsize]: kick when the index passes it.
                let event = u16::from_le(self.mem.u16_at(used + 4 + 8 * q).load(Ordering::Relaxed));
                idx.wrapping_sub(event).wrapping_sub(1) < idx.wrapping_sub(old)
            } else {
                u16::from_le(self.mem.u16_at(self.ring.at.used).load(Ordering::Relaxed)) & 1 == 0
            };
            if want {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writing 8 bytes from a local buffer to our own eventfd.
                unsafe { libc::write(fd, one.as_ptr() as *const libc::c_void, 8) };
            }
        }
    }

    /// Puts `head` in the next avail slot and publishes it (avail->idx += 1).
    pub fn push(&mut self, head: u16) {
        self.stage(head);
        self.publish();
    }

    /// Asks for an interrupt when the switch uses the entry after `last_used` (EVENT_IDX: sets
    /// used_event; else clears NO_INTERRUPT), or, with `on` false, for none. Then a full fence,
    /// so the caller's next look at the used index is not reordered before it.
    pub fn want_interrupts(&mut self, on: bool) {
        let q = self.ring.qsize as u64;
        if self.ring.event_idx {
            // used_event is avail->ring[qsize]; 'behind by a whole ring' suppresses.
            let at = if on { self.ring.last_used } else { self.ring.last_used.wrapping_sub(1) };
            self.mem.u16_at(self.ring.at.avail + 4 + 2 * q).store(at.to_le(), Ordering::Relaxed);
            if !on {
                self.mem.u16_at(self.ring.at.avail).store(0, Ordering::Relaxed);
            }
        } else {
            let flags = if on { 0 } else { AVAIL_F_NO_INTERRUPT };
            self.mem.u16_at(self.ring.at.avail).store(flags.to_le(), Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Stores avail->idx as given (release: everything written before is visible first).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.ring.avail_idx = idx;
        self.mem.u16_at(self.ring.at.avail + 2).store(idx.to_le(), Ordering::Release);
    }

    pub fn avail_idx(&self) -> u16 {
        self.ring.avail_idx
    }

    /// The switch's used->idx (acquire: the entries and buffers before it are visible).
    #[inline]
    pub fn used_idx(&self) -> u16 {
        u16::from_le(self.mem.u16_at(self.ring.at.used + 2).load(Ordering::Acquire))
    }

    /// Used entries we have consumed (see `next_used`).
    pub fn last_used(&self) -> u16 {
        self.ring.last_used
    }

    /// The next used entry (descriptor id, bytes written) if the switch published one since;
    /// consumes it. Call `used_idx` once per batch instead when draining many.
    #[inline]
    pub fn next_used(&mut self, used_idx: u16) -> Option<(u32, u32)> {
        if self.ring.last_used == used_idx {
            return None;
        }
        let e = self.ring.at.used + 4 + 8 * (self.ring.last_used % self.ring.qsize) as u64;
        let mut b = [0u8; 8];
        self.mem.read_into(e, &mut b);
        self.ring.last_used = self.ring.last_used.wrapping_add(1);
        Some((u32::from_le_bytes(b[0..4].try_into().unwrap()), u32::from_le_bytes(b[4..8].try_into().unwrap())))
    }
}

/// Writes a descriptor table (or part of one) at `gpa`: ring tables and indirect tables alike.
pub fn write_descs(mem: &GuestMemory, gpa: u64, descs: &[Desc]) {
    if let [d] = descs {
        mem.write(gpa, &d.bytes());
        return;
    }
    let bytes: Vec<u8> = descs.iter().flat_map(|d| d.bytes()).collect();
    mem.write(gpa, &bytes);
}
