//! A minimal vhost-user frontend: one "VM" with queue pair 0 of a virtio-net device. Used by
//! the traffic generator (many of these per process) and by pvswitch's integration tests
//! (`tests/frontend/mod.rs` re-exports this module), which write raw descriptors with it.
//!
//! Guest memory is a memfd mapped into this process and shared with the switch as a single
//! region (guest physical 0, user address = our mapping). The split virtqueues are laid out
//! here by hand (`Layout`), so a caller can write anything into them, including what no driver
//! would. The vhost-user messages are sent with the `vhost` crate's `Frontend`.
//!
//! Features: VERSION_1 (12-byte virtio-net header), INDIRECT_DESC and PROTOCOL_FEATURES; no
//! MRG_RXBUF or EVENT_IDX. Protocol features: REPLY_ACK (so a refused request is an error here)
//! and MQ. The switch busy-polls, and so do we: kicks and interrupts are not used
//! (`VRING_AVAIL_F_NO_INTERRUPT` is set on both rings).
#![allow(dead_code)]

use std::cell::Cell;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::VhostUserHeaderFlag;
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::dirty_log::DirtyLog;

/// The test layout's guest memory size.
pub const MEM_SIZE: u64 = 16 << 20;
/// The test layout's queue size.
pub const QSIZE: u16 = 256;
pub const HDR_LEN: usize = 12;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;

const VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;
const INDIRECT_DESC: u64 = 1 << 28;
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
    fn bytes(&self) -> [u8; 16] {
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
    file: File,
    base: *mut u8,
    /// The region's size.
    size: u64,
    /// Size of the mapping: `size` rounded up to the file's page size.
    map_len: u64,
    /// Bytes of the file behind the mapping (`size` unless a test shrinks it); touching the
    /// mapping past it would be SIGBUS.
    file_len: Cell<u64>,
}

// SAFETY: the mapping is owned by this value and only reached through its methods, which copy
// bytes or use atomics; moving it to another thread moves that ownership. (Not Sync: `file_len`
// is a Cell.)
unsafe impl Send for GuestMemory {}

impl GuestMemory {
    fn new(size: u64, file_len: u64) -> GuestMemory {
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
    fn check(&self, gpa: u64, len: usize) {
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
struct Ring {
    at: RingAt,
    qsize: u16,
    /// Next avail index we will publish.
    avail_idx: u16,
    /// Used entries we have consumed.
    last_used: u16,
    /// The ring's kick eventfd: written after a publish when the switch asks for kicks (it
    /// clears VRING_USED_F_NO_NOTIFY, or sets avail_event, before its poll thread sleeps).
    kick: Option<std::os::fd::RawFd>,
    /// EVENT_IDX negotiated: kicks follow avail_event, interrupts used_event.
    event_idx: bool,
}

/// Direct access to one of a VM's rings: for a driver's fast path, and for writing what a
/// hostile guest would.
pub struct RawRing<'a> {
    mem: &'a GuestMemory,
    ring: &'a mut Ring,
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

/// SET_VRING_ADDR for queue `q` of `qsize` entries with its parts at guest-physical `at`; with
/// `log`, its used ring's writes are to be logged (VRING_F_LOG) at its guest address.
fn set_ring_addr(
    fe: &mut Frontend,
    q: usize,
    qsize: u16,
    mem: &GuestMemory,
    at: RingAt,
    log: bool,
) -> Result<(), vhost::Error> {
    let uva = |gpa: u64| mem.uva().wrapping_add(gpa);
    fe.set_vring_addr(
        q,
        &VringConfigData {
            queue_max_size: qsize,
            queue_size: qsize,
            flags: log as u32,
            desc_table_addr: uva(at.desc),
            used_ring_addr: uva(at.used),
            avail_ring_addr: uva(at.avail),
            log_addr: log.then_some(at.used),
        },
    )
}

/// One VM: a vhost-user connection plus the driver side of queue pair 0 (`Guest`, which it
/// dereferences to).
pub struct Vm {
    // Field order is drop order: close the connection before unmapping our side of memory.
    fe: Frontend,
    guest: Guest,
    /// The dirty log, for a VM acked with LOG_ALL (as if its VMM were migrating it).
    pub log: Option<std::sync::Arc<DirtyLog>>,
}

impl std::ops::Deref for Vm {
    type Target = Guest;
    fn deref(&self) -> &Guest {
        &self.guest
    }
}

impl std::ops::DerefMut for Vm {
    fn deref_mut(&mut self) -> &mut Guest {
        &mut self.guest
    }
}

impl Vm {
    /// Connects with the test layout and sets up queue pair 0; panics if the switch refuses
    /// anything.
    pub fn connect(sock: &str) -> Vm {
        Vm::try_connect(sock, [RX_RING, TX_RING]).unwrap_or_else(|e| panic!("vhost-user setup on {sock}: {e}"))
    }

    /// Connects and sets up queue pair 0 with the test layout but rings at `rings` (guest
    /// physical addresses, which may lie outside guest memory for hostile tests). Returns the
    /// first error.
    pub fn try_connect(sock: &str, rings: [RingAt; 2]) -> Result<Vm, vhost::Error> {
        Vm::try_connect_with(sock, rings, MEM_SIZE)
    }

    /// Like `try_connect`, but the memfd behind the MEM_SIZE region is only `file_len` bytes.
    pub fn try_connect_with(sock: &str, rings: [RingAt; 2], file_len: u64) -> Result<Vm, vhost::Error> {
        Vm::connect_layout_with(sock, Layout { rings, ..Layout::TEST }, file_len)
    }

    /// Connects with guest memory laid out as `layout`.
    pub fn connect_layout(sock: &str, layout: Layout) -> Result<Vm, vhost::Error> {
        Vm::connect_layout_with(sock, layout, layout.mem_size)
    }

    fn connect_layout_with(sock: &str, layout: Layout, file_len: u64) -> Result<Vm, vhost::Error> {
        Vm::setup(Frontend::connect(sock, 2)?, layout, file_len, FEATURES)
    }

    /// Connects with the test layout over `mem` (say a hugetlbfs memfd from
    /// `GuestMemory::new_memfd`, which a hostile VM may truncate).
    pub fn connect_memory(sock: &str, mem: GuestMemory) -> Result<Vm, vhost::Error> {
        assert_eq!(mem.size(), MEM_SIZE);
        Vm::setup_guest(Frontend::connect(sock, 2)?, Guest::with_memory(Layout::TEST, mem), FEATURES)
    }

    /// Connects `guest` (made by the caller, who can tell which resource failed), acking
    /// `features`.
    pub fn connect_guest(sock: &str, guest: Guest, features: u64) -> Result<Vm, vhost::Error> {
        Vm::setup_guest(Frontend::connect(sock, 2)?, guest, features)
    }

    /// Connects with guest memory laid out as `layout`, acking `features` (VERSION_1 and
    /// PROTOCOL_FEATURES are always acked).
    pub fn connect_features(sock: &str, layout: Layout, features: u64) -> Result<Vm, vhost::Error> {
        Vm::setup(Frontend::connect(sock, 2)?, layout, layout.mem_size, features)
    }

    /// Sets up a VM with the test layout over an already connected stream.
    pub fn on_stream(stream: std::os::unix::net::UnixStream) -> Result<Vm, vhost::Error> {
        Vm::setup(Frontend::from_stream(stream, 2), Layout::TEST, MEM_SIZE, FEATURES)
    }

    fn setup(fe: Frontend, layout: Layout, file_len: u64, features: u64) -> Result<Vm, vhost::Error> {
        Vm::setup_guest(fe, Guest::new(layout, file_len), features)
    }

    fn setup_guest(mut fe: Frontend, mut guest: Guest, features: u64) -> Result<Vm, vhost::Error> {
        let layout = guest.layout;
        let qsize = layout.qsize;
        guest.set_features(features | VERSION_1 | PROTOCOL_FEATURES);
        let mem = &guest.mem;
        fe.set_owner()?;
        let want = guest.features;
        let offered = fe.get_features()?;
        assert_eq!(offered & want, want, "the switch offers {offered:#x}");
        fe.set_features(want)?;
        let pf = fe.get_protocol_features()?;
        let logging = want & LOG_ALL != 0;
        let mut proto = VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MQ;
        if logging {
            proto |= VhostUserProtocolFeatures::LOG_SHMFD;
        }
        fe.set_protocol_features(pf & proto)?;
        if pf.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            // Every request from here on is acked, so a refusal shows up as an error.
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: layout.mem_size,
            userspace_addr: mem.uva(),
            mmap_offset: 0,
            mmap_handle: mem.file.as_raw_fd(),
        }])?;
        let log = logging.then(|| std::sync::Arc::new(DirtyLog::new(layout.mem_size)));
        if let Some(l) = &log {
            let region =
                vhost::VhostUserDirtyLogRegion { mmap_size: l.len, mmap_offset: 0, mmap_handle: l.file.as_raw_fd() };
            fe.set_log_base(0, Some(region))?;
        }
        for (q, at) in layout.rings.iter().enumerate() {
            fe.set_vring_num(q, qsize)?;
            fe.set_vring_base(q, 0)?;
            set_ring_addr(&mut fe, q, qsize, mem, *at, logging)?;
            fe.set_vring_kick(q, guest.kick(q))?;
            fe.set_vring_call(q, guest.call(q))?;
            fe.set_vring_enable(q, true)?;
        }
        Ok(Vm { fe, guest, log })
    }

    /// Stops both rings as a VMM does before it disconnects or migrates (GET_VRING_BASE) and
    /// returns where the switch says each would resume: (RX, TX).
    pub fn stop(&mut self) -> Result<(u16, u16), vhost::Error> {
        Ok((self.fe.get_vring_base(0)? as u16, self.fe.get_vring_base(1)? as u16))
    }

    /// Moves this VM's memory, as a VMM may at any time: a new memfd with the same contents,
    /// mapped at a new address, announced with SET_MEM_TABLE, then SET_VRING_ADDR for both rings
    /// at their new addresses. Call it when no frame is in flight. Every request is acked
    /// (REPLY_ACK) before this returns; then the old memory is overwritten with 0xff (garbage
    /// indices and descriptors) and unmapped, so a switch still using it would break the
    /// queues or deliver garbage.
    pub fn remap_memory(&mut self) {
        assert_eq!(self.tx_pending(), 0, "remap_memory with frames in flight on the TX ring");
        let size = self.guest.layout.mem_size;
        let new = GuestMemory::new(size, size);
        // SAFETY: two distinct `size`-byte mappings we own.
        unsafe { std::ptr::copy_nonoverlapping(self.guest.mem.base, new.base, size as usize) };
        self.fe
            .set_mem_table(&[VhostUserMemoryRegionInfo {
                guest_phys_addr: 0,
                memory_size: size,
                userspace_addr: new.uva(),
                mmap_offset: 0,
                mmap_handle: new.file.as_raw_fd(),
            }])
            .expect("SET_MEM_TABLE refused");
        for (q, at) in [self.guest.rx.at, self.guest.tx.at].into_iter().enumerate() {
            let log = self.log.is_some();
            set_ring_addr(&mut self.fe, q, self.guest.layout.qsize, &new, at, log).expect("SET_VRING_ADDR refused");
        }
        let old = std::mem::replace(&mut self.guest.mem, new);
        // SAFETY: our own `size`-byte mapping.
        unsafe { std::ptr::write_bytes(old.base, 0xff, size as usize) };
        drop(old); // unmaps it and closes the old memfd
    }
}

/// The driver side of one VM's virtio-net device, queue pair 0: its guest memory, its two
/// rings and their kick and call eventfds. No connection: `Vm` adds the vhost-user one, and
/// pvswitch's in-process data-path tests hand the memory and rings to a backend directly.
pub struct Guest {
    pub mem: GuestMemory,
    layout: Layout,
    /// What the driver acks.
    features: u64,
    rx: Ring,
    tx: Ring,
    /// Kick and call eventfds of queue 0 (RX) and 1 (TX).
    kicks: [EventFd; 2],
    calls: [EventFd; 2],
}

impl Guest {
    /// Guest memory laid out as `layout` (the memfd behind it only `file_len` bytes long), rings
    /// empty, interrupts suppressed on both rings (we poll the used rings).
    pub fn new(layout: Layout, file_len: u64) -> Guest {
        Guest::try_new(layout, file_len).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like `new`, saying which resource it could not get (memory, an eventfd: the process's
    /// open files may run out with hundreds of VMs).
    pub fn try_new(layout: Layout, file_len: u64) -> Result<Guest, String> {
        let mem = GuestMemory::new_memfd(layout.mem_size, file_len, 0, 4096)
            .map_err(|e| format!("guest memory (a memfd of {} bytes): {e}", layout.mem_size))?;
        Guest::try_with_memory(layout, mem)
    }

    /// Like `new`, over memory the caller made (`mem.size()` is `layout.mem_size`).
    pub fn with_memory(layout: Layout, mem: GuestMemory) -> Guest {
        Guest::try_with_memory(layout, mem).unwrap_or_else(|e| panic!("{e}"))
    }

    fn try_with_memory(layout: Layout, mem: GuestMemory) -> Result<Guest, String> {
        let file_len = mem.file_len.get();
        for at in &layout.rings {
            if at.avail.checked_add(2).is_some_and(|end| end <= file_len.min(layout.mem_size)) {
                mem.u16_at(at.avail).store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Relaxed);
            }
        }
        let efd = |what: &str| EventFd::new(EFD_NONBLOCK).map_err(|e| format!("the {what} eventfd: {e}"));
        let (kicks, calls) = ([efd("RX kick")?, efd("TX kick")?], [efd("RX call")?, efd("TX call")?]);
        let ring = |at: RingAt, kick: &EventFd| Ring {
            at,
            qsize: layout.qsize,
            avail_idx: 0,
            last_used: 0,
            kick: Some(kick.as_raw_fd()),
            event_idx: false,
        };
        let (rx, tx) = (ring(layout.rings[0], &kicks[0]), ring(layout.rings[1], &kicks[1]));
        Ok(Guest { mem, layout, features: FEATURES, rx, tx, kicks, calls })
    }

    /// The features the driver acks (before it connects).
    pub fn set_features(&mut self, features: u64) {
        self.features = features;
        let event_idx = features & EVENT_IDX != 0;
        self.rx.event_idx = event_idx;
        self.tx.event_idx = event_idx;
    }

    pub fn features(&self) -> u64 {
        self.features
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The file behind guest memory (one region, guest physical 0 at `mem.uva()`).
    pub fn memfd(&self) -> &File {
        &self.mem.file
    }

    /// Queue `q`'s kick eventfd (the driver writes it when the device asks for kicks).
    pub fn kick(&self, q: usize) -> &EventFd {
        &self.kicks[q]
    }

    /// Queue `q`'s call eventfd (the device writes it to interrupt the driver).
    pub fn call(&self, q: usize) -> &EventFd {
        &self.calls[q]
    }

    /// A driver that never kicks its TX ring, whatever the switch asks (a frontend that
    /// relies on being polled): a parked queue of its must still be served, by the sweep.
    pub fn never_kick_tx(&mut self) {
        self.tx.kick = None;
    }

    /// Raw access to the guest RX ring (queue 0).
    pub fn raw_rx(&mut self) -> RawRing<'_> {
        RawRing { mem: &self.mem, ring: &mut self.rx }
    }

    /// Raw access to the guest TX ring (queue 1).
    pub fn raw_tx(&mut self) -> RawRing<'_> {
        RawRing { mem: &self.mem, ring: &mut self.tx }
    }

    /// Transmits one frame as a two-descriptor chain: a zeroed 12-byte virtio-net header,
    /// then the frame. Avail slot `s` uses descriptors 2(s mod qsize/2) and 2(s mod qsize/2)+1,
    /// so at most qsize/2 frames may be in flight; waits (bounded) for the switch to make room.
    pub fn send(&mut self, frame: &[u8]) {
        self.send_all(&[frame]);
    }

    /// Transmits frames as `send` does, but makes them available with one avail index store,
    /// so the switch sees them all at once (at most qsize/2).
    pub fn send_all<F: AsRef<[u8]>>(&mut self, frames: &[F]) {
        self.send_frames(frames, false);
    }

    /// Transmits frames as `send_all` does, but each as one descriptor holding the zeroed
    /// header and the frame after it (virtio-user's layout, and a Linux guest's when the
    /// packet has room in front for the header).
    pub fn send_all_one_desc<F: AsRef<[u8]>>(&mut self, frames: &[F]) {
        self.send_frames(frames, true);
    }

    fn send_frames<F: AsRef<[u8]>>(&mut self, frames: &[F], one_desc: bool) {
        let pairs = self.layout.qsize / 2;
        assert!(frames.len() <= pairs as usize, "more than {pairs} frames at once");
        let start = Instant::now();
        while self.tx.avail_idx.wrapping_sub(self.tx_completed()) as usize + frames.len() > pairs as usize {
            assert!(start.elapsed() < Duration::from_secs(30), "the switch stopped consuming this VM's TX ring");
            std::thread::sleep(Duration::from_millis(1));
        }
        let layout = self.layout;
        let mut tx = self.raw_tx();
        for frame in frames {
            let frame = frame.as_ref();
            assert!(frame.len() as u64 <= layout.buf_slot);
            let d = 2 * (tx.avail_idx() % pairs);
            let hdr_at = layout.tx_buf(d);
            tx.mem.write(hdr_at, &[0u8; HDR_LEN]);
            if one_desc {
                assert!((HDR_LEN + frame.len()) as u64 <= layout.buf_slot);
                tx.mem.write(hdr_at + HDR_LEN as u64, frame);
                tx.desc(d, Desc { addr: hdr_at, len: (HDR_LEN + frame.len()) as u32, flags: 0, next: 0 });
            } else {
                let frame_at = layout.tx_buf(d + 1);
                tx.mem.write(frame_at, frame);
                tx.desc(d, Desc { addr: hdr_at, len: HDR_LEN as u32, flags: F_NEXT, next: d + 1 });
                tx.desc(d + 1, Desc { addr: frame_at, len: frame.len() as u32, flags: 0, next: 0 });
            }
            tx.stage(d);
        }
        tx.publish();
    }

    /// The TX ring's used index: how many chains the switch has completed.
    pub fn tx_completed(&mut self) -> u16 {
        self.raw_tx().used_idx()
    }

    /// Frames sent whose chains the switch has not completed yet.
    pub fn tx_pending(&mut self) -> u16 {
        self.tx.avail_idx.wrapping_sub(self.tx_completed())
    }

    /// Posts `n` device-writable receive buffers of `size` bytes (header included). Avail
    /// slot `s` uses descriptor `s mod qsize`, so at most qsize may be posted and not yet
    /// `recv`d.
    pub fn post_rx_buffers(&mut self, n: u16, size: u32) {
        assert!(size as u64 <= self.layout.buf_slot);
        let qsize = self.layout.qsize;
        let outstanding = self.rx.avail_idx.wrapping_sub(self.rx.last_used);
        assert!(outstanding as u32 + n as u32 <= qsize as u32, "more than {qsize} RX buffers posted");
        let layout = self.layout;
        let mut rx = self.raw_rx();
        for _ in 0..n {
            let d = rx.avail_idx() % qsize;
            rx.desc(d, Desc { addr: layout.rx_buf(d), len: size, flags: F_WRITE, next: 0 });
            rx.stage(d);
        }
        rx.publish();
    }

    /// Frames the switch has put in our RX ring since the last call, header stripped.
    pub fn recv(&mut self) -> Vec<Vec<u8>> {
        let qsize = self.layout.qsize;
        let mut rx = self.raw_rx();
        let used = rx.used_idx();
        let mut out = Vec::new();
        while let Some((id, len)) = rx.next_used(used) {
            assert!(id < qsize as u32, "switch returned RX descriptor {id}");
            if len == 0 {
                continue; // a buffer given back unused (e.g. too small for a frame)
            }
            let d = rx.mem.read(rx.ring.at.desc + 16 * id as u64, 16);
            let (addr, cap) =
                (u64::from_le_bytes(d[0..8].try_into().unwrap()), u32::from_le_bytes(d[8..12].try_into().unwrap()));
            assert!(len as usize >= HDR_LEN && len <= cap, "switch wrote {len} bytes into a {cap}-byte RX buffer");
            let buf = rx.mem.read(addr, len as usize);
            out.push(buf[HDR_LEN..].to_vec());
        }
        out
    }
}
