//! A minimal vhost-user frontend for tests: one "VM" with queue pair 0 of a virtio-net device.
//!
//! Guest memory is a 16 MiB memfd mapped into the test process and shared with pvswitchd as a
//! single region (guest physical 0, user address = our mapping). The split virtqueues are laid
//! out here by hand, so a test can write anything into them, including what no driver would.
//! The vhost-user messages are sent with the `vhost` crate's `Frontend`.
//!
//! Features: VERSION_1 (12-byte virtio-net header), INDIRECT_DESC and PROTOCOL_FEATURES; no
//! MRG_RXBUF or EVENT_IDX. Protocol features: REPLY_ACK (so a refused request is an error here)
//! and MQ. The switch busy-polls, so kicks and interrupts are not used.
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

pub const MEM_SIZE: u64 = 16 << 20;
pub const QSIZE: u16 = 256;
pub const HDR_LEN: usize = 12;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;
const AVAIL_F_NO_INTERRUPT: u16 = 1;

const VERSION_1: u64 = 1 << 32;
const PROTOCOL_FEATURES: u64 = 1 << 30;
const INDIRECT_DESC: u64 = 1 << 28;

/// Guest physical addresses of one split virtqueue's three parts.
#[derive(Clone, Copy, Debug)]
pub struct RingAt {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// Guest memory map. Queue 0 is the guest's RX queue (the switch writes into it), queue 1 its
/// TX queue (the switch reads from it).
pub const RX_RING: RingAt = RingAt { desc: 0x0000, avail: 0x1000, used: 0x2000 };
pub const TX_RING: RingAt = RingAt { desc: 0x4000, avail: 0x5000, used: 0x6000 };
/// RX descriptor `i` always points at `RX_BUFS + i * BUF_SLOT`.
pub const RX_BUFS: u64 = 0x10_0000;
/// TX descriptor `i` always points at `TX_BUFS + i * BUF_SLOT`.
pub const TX_BUFS: u64 = 0x20_0000;
pub const BUF_SLOT: u64 = 4096;
/// Free for tests: indirect tables and the like.
pub const SCRATCH: u64 = 0x40_0000;

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
    /// Bytes of the file behind the mapping (MEM_SIZE unless a test shrinks it); touching the
    /// mapping past it would be SIGBUS.
    file_len: Cell<u64>,
}

impl GuestMemory {
    fn new(file_len: u64) -> GuestMemory {
        // SAFETY: memfd_create with a valid C string; the fd is owned by the File below.
        let fd = unsafe { libc::memfd_create(c"pvs-test-vm".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(file_len).unwrap();
        // SAFETY: a new shared mapping of a file we own, at an address the kernel picks; it is
        // unmapped in Drop and never handed out as a Rust reference except to atomics.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MEM_SIZE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        assert!(p != libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        GuestMemory { file, base: p as *mut u8, file_len: Cell::new(file_len) }
    }

    /// The address of guest physical 0 in this process (the region's user address).
    pub fn uva(&self) -> u64 {
        self.base as u64
    }

    fn check(&self, gpa: u64, len: usize) {
        assert!(
            gpa.checked_add(len as u64).is_some_and(|end| end <= MEM_SIZE.min(self.file_len.get())),
            "test bug: {gpa:#x}+{len} is outside the test VM's memory"
        );
    }

    /// Copies `bytes` into guest memory. pvswitchd reads and writes this memory concurrently,
    /// but only buffers we handed it through a ring, which we do not touch until it gives them
    /// back (ordered by the atomic ring indices).
    pub fn write(&self, gpa: u64, bytes: &[u8]) {
        self.check(gpa, bytes.len());
        // SAFETY: the range lies inside our mapping (checked); `bytes` is our own memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(gpa as usize), bytes.len()) };
    }

    pub fn read(&self, gpa: u64, len: usize) -> Vec<u8> {
        self.check(gpa, len);
        let mut v = vec![0u8; len];
        // SAFETY: as in `write`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(gpa as usize), v.as_mut_ptr(), len) };
        v
    }

    /// A ring index shared with pvswitchd (avail->idx, used->idx, flags).
    fn u16_at(&self, gpa: u64) -> &AtomicU16 {
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

    fn u32_at(&self, gpa: u64) -> u32 {
        u32::from_le_bytes(self.read(gpa, 4).try_into().unwrap())
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no references into it outlive
        // `self` (atomics borrowed from `u16_at` are tied to `&self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, MEM_SIZE as usize) };
    }
}

/// Our side of one split virtqueue.
struct Ring {
    at: RingAt,
    /// Next avail index we will publish.
    avail_idx: u16,
    /// Used entries we have consumed.
    last_used: u16,
}

/// Direct access to one of a VM's rings, for writing what a hostile guest would.
pub struct RawRing<'a> {
    mem: &'a GuestMemory,
    ring: &'a mut Ring,
}

impl RawRing<'_> {
    /// Writes descriptor `i` of the ring's table (`i` may be anything below QSIZE).
    pub fn desc(&mut self, i: u16, d: Desc) {
        assert!(i < QSIZE);
        write_descs(self.mem, self.ring.at.desc + 16 * i as u64, &[d]);
    }

    /// Puts `head` in the next avail slot and publishes it (avail->idx += 1).
    pub fn push(&mut self, head: u16) {
        let slot = self.ring.avail_idx % QSIZE;
        self.mem.write(self.ring.at.avail + 4 + 2 * slot as u64, &head.to_le_bytes());
        self.set_avail_idx(self.ring.avail_idx.wrapping_add(1));
    }

    /// Stores avail->idx as given (release: everything written before is visible first).
    pub fn set_avail_idx(&mut self, idx: u16) {
        self.ring.avail_idx = idx;
        self.mem.u16_at(self.ring.at.avail + 2).store(idx.to_le(), Ordering::Release);
    }

    pub fn avail_idx(&self) -> u16 {
        self.ring.avail_idx
    }

    pub fn used_idx(&self) -> u16 {
        u16::from_le(self.mem.u16_at(self.ring.at.used + 2).load(Ordering::Acquire))
    }
}

/// Writes a descriptor table (or part of one) at `gpa`: ring tables and indirect tables alike.
pub fn write_descs(mem: &GuestMemory, gpa: u64, descs: &[Desc]) {
    let bytes: Vec<u8> = descs.iter().flat_map(|d| d.bytes()).collect();
    mem.write(gpa, &bytes);
}

/// SET_VRING_ADDR for queue `q` with its parts at guest-physical `at` in `mem`.
fn set_ring_addr(fe: &mut Frontend, q: usize, mem: &GuestMemory, at: RingAt) -> Result<(), vhost::Error> {
    let uva = |gpa: u64| mem.uva().wrapping_add(gpa);
    fe.set_vring_addr(
        q,
        &VringConfigData {
            queue_max_size: QSIZE,
            queue_size: QSIZE,
            flags: 0,
            desc_table_addr: uva(at.desc),
            used_ring_addr: uva(at.used),
            avail_ring_addr: uva(at.avail),
            log_addr: None,
        },
    )
}

/// One test VM: a vhost-user connection plus guest memory and queue pair 0.
pub struct Vm {
    // Field order is drop order: close the connection before unmapping our side of memory.
    fe: Frontend,
    _fds: Vec<EventFd>,
    pub mem: GuestMemory,
    rx: Ring,
    tx: Ring,
}

impl Vm {
    /// Connects and sets up queue pair 0; panics if pvswitchd refuses anything.
    pub fn connect(sock: &str) -> Vm {
        Vm::try_connect(sock, [RX_RING, TX_RING]).unwrap_or_else(|e| panic!("vhost-user setup on {sock}: {e}"))
    }

    /// Connects and sets up queue pair 0 with the rings at `rings` (guest physical addresses,
    /// which may lie outside guest memory for hostile tests). Returns the first error.
    pub fn try_connect(sock: &str, rings: [RingAt; 2]) -> Result<Vm, vhost::Error> {
        Vm::try_connect_with(sock, rings, MEM_SIZE)
    }

    /// Like `try_connect`, but the memfd behind the MEM_SIZE region is only `file_len` bytes.
    pub fn try_connect_with(sock: &str, rings: [RingAt; 2], file_len: u64) -> Result<Vm, vhost::Error> {
        let mem = GuestMemory::new(file_len);
        let mut fe = Frontend::connect(sock, 2)?;
        fe.set_owner()?;
        let want = VERSION_1 | PROTOCOL_FEATURES | INDIRECT_DESC;
        let offered = fe.get_features()?;
        assert_eq!(offered & want, want, "pvswitchd offers {offered:#x}");
        fe.set_features(want)?;
        let pf = fe.get_protocol_features()?;
        fe.set_protocol_features(pf & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::MQ))?;
        if pf.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            // Every request from here on is acked, so a refusal shows up as an error.
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        fe.set_mem_table(&[VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_SIZE,
            userspace_addr: mem.uva(),
            mmap_offset: 0,
            mmap_handle: mem.file.as_raw_fd(),
        }])?;
        let mut fds = Vec::new();
        for (q, at) in rings.iter().enumerate() {
            if at.avail + 2 <= file_len {
                // We poll the used ring; ask for no interrupts.
                mem.u16_at(at.avail).store(AVAIL_F_NO_INTERRUPT.to_le(), Ordering::Relaxed);
            }
            fe.set_vring_num(q, QSIZE)?;
            fe.set_vring_base(q, 0)?;
            set_ring_addr(&mut fe, q, &mem, *at)?;
            let kick = EventFd::new(EFD_NONBLOCK).unwrap();
            let call = EventFd::new(EFD_NONBLOCK).unwrap();
            fe.set_vring_kick(q, &kick)?;
            fe.set_vring_call(q, &call)?;
            fds.extend([kick, call]);
            fe.set_vring_enable(q, true)?;
        }
        let ring = |at: RingAt| Ring { at, avail_idx: 0, last_used: 0 };
        Ok(Vm { fe, _fds: fds, mem, rx: ring(rings[0]), tx: ring(rings[1]) })
    }

    /// Moves this VM's memory, as a VMM may at any time: a new memfd with the same contents,
    /// mapped at a new address, announced with SET_MEM_TABLE, then SET_VRING_ADDR for both rings
    /// at their new addresses. Call it when no frame is in flight. Every request is acked
    /// (REPLY_ACK) before this returns; then the old memory is overwritten with 0xff (garbage
    /// indices and descriptors) and unmapped, so a switch still using it would break the
    /// queues or deliver garbage.
    pub fn remap_memory(&mut self) {
        assert_eq!(self.tx_pending(), 0, "test bug: remap_memory with frames in flight on the TX ring");
        let new = GuestMemory::new(MEM_SIZE);
        // SAFETY: two distinct MEM_SIZE mappings we own.
        unsafe { std::ptr::copy_nonoverlapping(self.mem.base, new.base, MEM_SIZE as usize) };
        self.fe
            .set_mem_table(&[VhostUserMemoryRegionInfo {
                guest_phys_addr: 0,
                memory_size: MEM_SIZE,
                userspace_addr: new.uva(),
                mmap_offset: 0,
                mmap_handle: new.file.as_raw_fd(),
            }])
            .expect("SET_MEM_TABLE refused");
        for (q, at) in [self.rx.at, self.tx.at].into_iter().enumerate() {
            set_ring_addr(&mut self.fe, q, &new, at).expect("SET_VRING_ADDR refused");
        }
        let old = std::mem::replace(&mut self.mem, new);
        // SAFETY: our own MEM_SIZE mapping.
        unsafe { std::ptr::write_bytes(old.base, 0xff, MEM_SIZE as usize) };
        drop(old); // unmaps it and closes the old memfd
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
    /// then the frame. Avail slot `s` uses descriptors 2(s mod 128) and 2(s mod 128)+1, so at
    /// most 128 frames may be in flight; waits (bounded) for the switch to make room.
    pub fn send(&mut self, frame: &[u8]) {
        assert!(frame.len() as u64 <= BUF_SLOT);
        let pairs = QSIZE / 2;
        let start = Instant::now();
        while self.tx.avail_idx.wrapping_sub(self.tx_completed()) >= pairs {
            assert!(start.elapsed() < Duration::from_secs(30), "the switch stopped consuming this VM's TX ring");
            std::thread::sleep(Duration::from_millis(1));
        }
        let d = 2 * (self.tx.avail_idx % pairs);
        let (hdr_at, frame_at) = (TX_BUFS + d as u64 * BUF_SLOT, TX_BUFS + (d + 1) as u64 * BUF_SLOT);
        self.mem.write(hdr_at, &[0u8; HDR_LEN]);
        self.mem.write(frame_at, frame);
        let mut tx = self.raw_tx();
        tx.desc(d, Desc { addr: hdr_at, len: HDR_LEN as u32, flags: F_NEXT, next: d + 1 });
        tx.desc(d + 1, Desc { addr: frame_at, len: frame.len() as u32, flags: 0, next: 0 });
        tx.push(d);
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
    /// slot `s` uses descriptor `s mod 256`, so at most 256 may be posted and not yet `recv`d.
    pub fn post_rx_buffers(&mut self, n: u16, size: u32) {
        assert!(size as u64 <= BUF_SLOT);
        let outstanding = self.rx.avail_idx.wrapping_sub(self.rx.last_used);
        assert!(outstanding as u32 + n as u32 <= QSIZE as u32, "test bug: more than {QSIZE} RX buffers posted");
        let mut idx = self.rx.avail_idx;
        for _ in 0..n {
            let d = idx % QSIZE;
            let slot = self.rx.at.avail + 4 + 2 * d as u64;
            write_descs(
                &self.mem,
                self.rx.at.desc + 16 * d as u64,
                &[Desc { addr: RX_BUFS + d as u64 * BUF_SLOT, len: size, flags: F_WRITE, next: 0 }],
            );
            self.mem.write(slot, &d.to_le_bytes());
            idx = idx.wrapping_add(1);
        }
        self.raw_rx().set_avail_idx(idx);
    }

    /// Frames the switch has put in our RX ring since the last call, header stripped.
    pub fn recv(&mut self) -> Vec<Vec<u8>> {
        let used = self.raw_rx().used_idx();
        let mut out = Vec::new();
        while self.rx.last_used != used {
            let e = self.rx.at.used + 4 + 8 * (self.rx.last_used % QSIZE) as u64;
            let (id, len) = (self.mem.u32_at(e), self.mem.u32_at(e + 4));
            self.rx.last_used = self.rx.last_used.wrapping_add(1);
            assert!(id < QSIZE as u32, "switch returned RX descriptor {id}");
            if len == 0 {
                continue; // a buffer given back unused (e.g. too small for a frame)
            }
            let d = self.mem.read(self.rx.at.desc + 16 * id as u64, 16);
            let (addr, cap) =
                (u64::from_le_bytes(d[0..8].try_into().unwrap()), u32::from_le_bytes(d[8..12].try_into().unwrap()));
            assert!(len as usize >= HDR_LEN && len <= cap, "switch wrote {len} bytes into a {cap}-byte RX buffer");
            let buf = self.mem.read(addr, len as usize);
            out.push(buf[HDR_LEN..].to_vec());
        }
        out
    }
}
