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

mod memory;
pub use memory::*;

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
