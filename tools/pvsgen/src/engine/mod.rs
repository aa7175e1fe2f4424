//! The generator's data path: per-VM TX and RX rings, driven by one busy-polling thread per
//! CPU, each serving many VMs. What its frames look like is `probe`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use crate::config::Driver;
use crate::free_ids::FreeIds;
use crate::frontend::{Desc, F_INDIRECT, F_NEXT, F_WRITE, HDR_LEN, Vm};
use crate::probe::*;
use crate::stats::{FlowRx, Histogram};

mod rx;

/// An interrupt-driven driver looks at a ring this long after its last interrupt even without
/// one; finding work then is a missed interrupt (`Counters::missed_interrupts`).
const IRQ_TIMEOUT_NS: u64 = 500_000_000;
/// Bytes at the end of each TX buffer slot for the frame's indirect table (3 descriptors).
pub const TABLE_LEN: u64 = 48;

/// A received frame whose later buffers (MRG_RXBUF) are still to come.
struct Partial {
    h: [u8; PROBE_LEN],
    /// Frame bytes so far.
    len: usize,
    /// Buffers still to come.
    left: u16,
    corrupt: bool,
    /// A TCP/IPv4 frame (a segment): `h` holds the probe fields found after its TCP header, in
    /// their usual places.
    segment: bool,
}

/// How often an unanswered hello is repeated, and how long a ping waits for its pong.
const HELLO_EVERY_NS: u64 = 50_000_000;
const PING_TIMEOUT_NS: u64 = 100_000_000;
/// Give up waiting for hellos, or for the switch to complete TX buffers at the end.
pub const HELLO_DEADLINE_NS: u64 = 10_000_000_000;
const DRAIN_DEADLINE_NS: u64 = 5_000_000_000;

/// CLOCK_MONOTONIC in nanoseconds (vDSO: no system call).
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to `cpu`.
pub fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; CPU_SET stays inside it for cpu < CPU_SETSIZE (checked);
    // sched_setaffinity reads the set we pass.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(format!("CPU {cpu} out of range"));
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sends its stream (if it has a destination) and receives.
    Stream,
    /// Ping-pong: sends one ping at a time, measures round trips.
    Ping,
    /// Ping-pong: echoes pings.
    Pong,
}

/// Counters of one VM (frames are Ethernet frames; bytes exclude the virtio-net header).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Counters {
    /// Data frames put on the TX ring during the measurement.
    pub sent: u64,
    pub sent_bytes: u64,
    /// Data frames received from flows addressed to this VM.
    pub received: u64,
    pub received_bytes: u64,
    /// Frames received that were not addressed to this VM or not ours at all.
    pub foreign: u64,
    pub hellos_sent: u64,
    pub hellos_received: u64,
    pub pings_sent: u64,
    pub pongs_received: u64,
    pub ping_timeouts: u64,
    pub pings_received: u64,
    pub pongs_sent: u64,
    /// Every frame put on the TX ring (data, hellos, pings, pongs).
    pub tx_frames: u64,
    /// Every frame taken from the RX ring.
    pub rx_frames: u64,
    /// TX buffers the switch had not completed when the generator gave up waiting.
    pub tx_incomplete: u64,
    /// Frames whose payload did not match what was sent (verify mode), or whose header was
    /// malformed (num_buffers 0, a frame in part).
    pub corrupt: u64,
    /// Used entries out of avail order with IN_ORDER negotiated, or unknown descriptor ids.
    pub misordered: u64,
    /// Times an interrupt-driven driver found work without an interrupt (after waiting
    /// `IRQ_TIMEOUT_NS`).
    pub missed_interrupts: u64,
    pub interrupts: u64,
    /// TCP/IPv4 frames received (segments of a TSO sender's frames); their bytes are in
    /// `received_bytes`, and the first of each frame's segments counts in `received`.
    pub segments: u64,
}

/// One VM as a generator thread drives it.
pub struct Port {
    pub id: u16,
    pub vm: Vm,
    pub mac: [u8; 6],
    /// Where the stream goes (None: it sends no stream).
    pub dst_mac: Option<[u8; 6]>,
    pub size: usize,
    pub rate: Option<f64>,
    pub role: Role,
    /// VMs whose hello must arrive before the measurement starts (so the switch knows their
    /// MACs).
    pub needs: Vec<u16>,
    have_hello: Vec<bool>,
    ready: bool,
    pub driver: Driver,
    /// Descriptor ids not in the switch's hands.
    tx_free: FreeIds,
    rx_free: FreeIds,
    /// The ids of each chain, by head id (its first `chain_len` entries).
    tx_chain: Vec<[u16; 3]>,
    rx_chain: Vec<[u16; 3]>,
    /// With `driver.rx_chain`: the ids of each receive chain, by head.
    rx_long: Vec<Vec<u16>>,
    /// Padded indirect tables (a hostile driver's) already written, by head: a head's table
    /// never changes, and writing 4 KiB per frame would make the generator the bottleneck.
    tx_table_done: Vec<bool>,
    /// Heads in the order they were made available (checked against used order with IN_ORDER).
    tx_order: VecDeque<u16>,
    rx_order: VecDeque<u16>,
    /// Receive buffer size.
    rx_buf: u32,
    rx_partial: Option<Partial>,
    /// Interrupt mode: when each ring (0 RX, 1 TX) was last looked at.
    irq_at: [u64; 2],
    /// Sequence and send time of the ping in flight.
    ping: Option<(u64, u64)>,
    /// When the last ping was sent (a pinger with a `rate` paces its pings by it).
    last_ping_at: u64,
    pub c: Counters,
    /// Receive state of each source VM whose stream comes here (indexed by VM).
    pub flows: Vec<Option<FlowRx>>,
    /// One-way latency of received data frames.
    pub latency: Histogram,
    /// Ping round trips (pinger only).
    pub rtt: Histogram,
}

/// What the thread is doing: it decides what received frames trigger.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hello,
    Measure,
    Drain,
}

impl Port {
    /// A port for `vm`, with its RX ring stocked with `qsize` buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u16,
        vm: Vm,
        dst_mac: Option<[u8; 6]>,
        size: usize,
        rate: Option<f64>,
        role: Role,
        needs: Vec<u16>,
        sources: &[bool],
    ) -> Port {
        Port::with_driver(id, vm, dst_mac, size, rate, role, needs, sources, Driver::default())
    }

    /// A port whose driver behaves as `driver` says (`vm` acked its features).
    #[allow(clippy::too_many_arguments)]
    pub fn with_driver(
        id: u16,
        vm: Vm,
        dst_mac: Option<[u8; 6]>,
        size: usize,
        rate: Option<f64>,
        role: Role,
        needs: Vec<u16>,
        sources: &[bool],
        driver: Driver,
    ) -> Port {
        let l = *vm.layout();
        let rx_buf = driver.rx_buf.unwrap_or((l.buf_slot - TABLE_LEN) as u32).min(l.buf_slot as u32);
        let mut p = Port {
            id,
            vm,
            mac: mac_of(id),
            dst_mac,
            size,
            rate,
            role,
            needs,
            have_hello: vec![false; sources.len()],
            ready: false,
            driver,
            tx_free: FreeIds::new(l.qsize, driver.reuse, 0x9e37_79b9 + id as u64),
            rx_free: FreeIds::new(l.qsize, driver.reuse, 0x7f4a_7c15 + id as u64),
            tx_chain: vec![[0; 3]; l.qsize as usize],
            rx_chain: vec![[0; 3]; l.qsize as usize],
            rx_long: if driver.rx_chain > 1 { vec![Vec::new(); l.qsize as usize] } else { Vec::new() },
            tx_table_done: vec![false; l.qsize as usize],
            tx_order: VecDeque::new(),
            rx_order: VecDeque::new(),
            rx_buf,
            rx_partial: None,
            irq_at: [now_ns(); 2],
            ping: None,
            last_ping_at: 0,
            c: Counters::default(),
            flows: sources.iter().map(|&s| s.then(FlowRx::default)).collect(),
            latency: Histogram::new(),
            rtt: Histogram::new(),
        };
        let interrupts = driver.interrupts;
        p.vm.raw_rx().want_interrupts(interrupts);
        p.vm.raw_tx().want_interrupts(interrupts);
        p.post_rx();
        if driver.block_call {
            p.block_call();
        }
        p
    }

    /// A hostile driver: raises the RX call eventfd's counter to its maximum, clears
    /// O_NONBLOCK on it (the flag lives on the open file the switch shares) and asks for RX
    /// interrupts; it never reads the eventfd.
    fn block_call(&mut self) {
        use std::os::fd::AsRawFd;
        let fd = self.vm.call(0).as_raw_fd();
        let max = (u64::MAX - 1).to_ne_bytes();
        // SAFETY: an 8-byte write from a local buffer to our own eventfd, and fcntl on it.
        unsafe {
            libc::write(fd, max.as_ptr() as *const libc::c_void, 8);
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        self.vm.raw_rx().want_interrupts(true);
    }

    /// Descriptors a TX frame takes from the free list (one with an indirect table).
    fn tx_descs(&self) -> usize {
        if self.driver.indirect { 1 } else { self.driver.chain() as usize }
    }

    /// Descriptors a receive buffer takes (`Driver::rx_descs`).
    fn rx_descs(&self) -> usize {
        self.driver.rx_descs() as usize
    }

    fn in_flight(&self) -> usize {
        self.vm.layout().qsize as usize - self.tx_free.len()
    }

    /// Frames that can be put on the TX ring now.
    fn tx_room(&self) -> usize {
        self.tx_free.len() / self.tx_descs()
    }

    /// Interrupt mode: whether to look at ring `q` now (it was interrupted, or a timeout
    /// passed); polling mode: always.
    #[inline]
    fn look_at(&mut self, q: usize, now: u64) -> bool {
        if !self.driver.interrupts {
            return true;
        }
        if self.vm.call(q).read().is_ok() {
            self.c.interrupts += 1;
            self.irq_at[q] = now;
            return true;
        }
        if now.saturating_sub(self.irq_at[q]) < IRQ_TIMEOUT_NS {
            return false;
        }
        self.irq_at[q] = now;
        let pending = if q == 0 {
            let r = self.vm.raw_rx();
            r.used_idx() != r.last_used()
        } else {
            let r = self.vm.raw_tx();
            r.used_idx() != r.last_used()
        };
        self.c.missed_interrupts += pending as u64;
        pending
    }

    /// Stages one frame on the TX ring (publish with `self.vm.raw_tx().publish()`); false if
    /// no TX buffer is free.
    #[inline]
    fn put(&mut self, dst: [u8; 6], kind: u8, seq: u64, ts: u64) -> bool {
        if self.tx_free.len() < self.tx_descs() {
            return false;
        }
        let head = self.tx_free.take().unwrap();
        let l = *self.vm.layout();
        let at = l.tx_buf(head);
        let mut h = [0u8; PROBE_LEN];
        h[0..6].copy_from_slice(&dst);
        h[6..12].copy_from_slice(&self.mac);
        if kind == KIND_DATA && self.driver.src_macs > 0 {
            // A hostile driver: the frame's source is one of src_macs made-up addresses.
            let k = (seq % self.driver.src_macs as u64) as u32;
            h[6..12].copy_from_slice(&[0x06, 0xaa, (k >> 24) as u8, (k >> 16) as u8, (k >> 8) as u8, k as u8]);
        }
        h[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        h[14..18].copy_from_slice(&MAGIC.to_le_bytes());
        h[18] = kind;
        h[20..22].copy_from_slice(&self.id.to_le_bytes());
        h[24..32].copy_from_slice(&seq.to_le_bytes());
        h[32..40].copy_from_slice(&ts.to_le_bytes());
        if self.driver.tso > 0 {
            // A TSO sender: data frames are TCP/IPv4 with the probe fields after the headers,
            // under a header asking for segmentation; other frames as usual, under a zero
            // header (the slot may have held a data frame).
            if kind == KIND_DATA {
                let (vh, hdrs) = tso_headers(self.driver.tso, self.size);
                let mut t = [0u8; TSO_PROBE_END];
                t[..12].copy_from_slice(&h[..12]);
                t[12..TSO_HDRS].copy_from_slice(&hdrs[12..]);
                t[TSO_HDRS..].copy_from_slice(&h[14..PROBE_LEN]);
                self.vm.mem.write(at, &vh);
                self.vm.mem.write(at + HDR_LEN as u64, &t);
            } else {
                self.vm.mem.write(at, &[0u8; HDR_LEN]);
                self.vm.mem.write(at + HDR_LEN as u64, &h);
            }
        } else {
            // The 12-byte virtio-net header before it stays zero (the memfd starts zeroed).
            self.vm.mem.write(at + HDR_LEN as u64, &h);
        }
        if self.driver.verify && self.size > PROBE_LEN {
            let body: Vec<u8> = (PROBE_LEN..self.size).map(|i| pattern(seq, i)).collect();
            self.vm.mem.write(at + (HDR_LEN + PROBE_LEN) as u64, &body);
        }
        // A TSO sender's other frames (hellos, pings, pongs) are plain 64-byte ones: a frame as
        // long as its data frames would exceed any MTU.
        let size = if self.driver.tso > 0 && kind != KIND_DATA { 64 } else { self.size };
        let frame = (HDR_LEN + size) as u32;
        if self.driver.chain() == 1 && !self.driver.indirect {
            // The fast driver: one descriptor, header and frame.
            let mut tx = self.vm.raw_tx();
            tx.desc(head, Desc { addr: at, len: frame, flags: 0, next: 0 });
            tx.stage(head);
        } else {
            // Pieces: the header apart (chain >= 2), the frame in two (chain 3).
            let half = (size / 2) as u32;
            let pieces: Vec<(u64, u32)> = match self.driver.chain() {
                1 => vec![(at, frame)],
                2 => vec![(at, HDR_LEN as u32), (at + HDR_LEN as u64, size as u32)],
                _ => vec![
                    (at, HDR_LEN as u32),
                    (at + HDR_LEN as u64, half),
                    (at + (HDR_LEN as u32 + half) as u64, size as u32 - half),
                ],
            };
            if self.driver.indirect {
                let table = at + l.buf_slot - TABLE_LEN.max(self.driver.table_len());
                // A hostile driver pads the chain with zero-length descriptors after the first
                // (its tables never change: each is written once).
                let pad = self.driver.pad as usize;
                let entries = pieces.len() + pad;
                if pad == 0 || !self.tx_table_done[head as usize] {
                    let padded: Vec<(u64, u32)> = pieces[..1]
                        .iter()
                        .copied()
                        .chain(std::iter::repeat_n((at, 0), pad))
                        .chain(pieces[1..].iter().copied())
                        .collect();
                    let descs: Vec<Desc> = padded
                        .iter()
                        .enumerate()
                        .map(|(k, &(addr, len))| {
                            let last = k + 1 == padded.len();
                            Desc { addr, len, flags: if last { 0 } else { F_NEXT }, next: k as u16 + 1 }
                        })
                        .collect();
                    crate::frontend::write_descs(&self.vm.mem, table, &descs);
                    self.tx_table_done[head as usize] = pad > 0;
                }
                let mut tx = self.vm.raw_tx();
                tx.desc(head, Desc { addr: table, len: 16 * entries as u32, flags: F_INDIRECT, next: 0 });
                tx.stage(head);
                self.tx_chain[head as usize][0] = head;
            } else {
                let mut ids = [head; 3];
                for id in ids.iter_mut().take(pieces.len()).skip(1) {
                    *id = self.tx_free.take().unwrap();
                }
                let mut tx = self.vm.raw_tx();
                for (k, &(addr, len)) in pieces.iter().enumerate() {
                    let last = k + 1 == pieces.len();
                    let next = if last { 0 } else { ids[k + 1] };
                    tx.desc(ids[k], Desc { addr, len, flags: if last { 0 } else { F_NEXT }, next });
                }
                tx.stage(head);
                self.tx_chain[head as usize] = ids;
            }
        }
        if self.driver.in_order {
            self.tx_order.push_back(head);
        }
        self.c.tx_frames += 1;
        true
    }

    /// Takes back TX buffers the switch completed.
    #[inline]
    fn reclaim(&mut self, now: u64) {
        if !self.look_at(1, now) {
            return;
        }
        let qsize = self.vm.layout().qsize;
        let n = self.tx_descs();
        loop {
            let mut tx = self.vm.raw_tx();
            let used = tx.used_idx();
            while let Some((id, _)) = tx.next_used(used) {
                assert!(id < qsize as u32, "the switch completed TX descriptor {id}");
                let head = id as u16;
                if self.driver.in_order && self.tx_order.pop_front() != Some(head) {
                    self.c.misordered += 1;
                }
                if n == 1 {
                    self.tx_free.give(head);
                } else {
                    for &d in &self.tx_chain[head as usize][..n] {
                        self.tx_free.give(d);
                    }
                }
                tx = self.vm.raw_tx();
            }
            if !self.driver.interrupts {
                return;
            }
            // Ask for the next interrupt, then look once more: an entry used before the ask
            // would otherwise wait for an interrupt that never comes.
            let mut tx = self.vm.raw_tx();
            tx.want_interrupts(true);
            if tx.used_idx() == tx.last_used() {
                return;
            }
        }
    }

    /// Puts what is due on the TX ring. `elapsed` is the time since the measurement started.
    #[inline]
    fn transmit(&mut self, elapsed: u64, burst: usize) {
        match self.role {
            Role::Stream => {
                let Some(dst) = self.dst_mac else { return };
                let mut n = burst.min(self.tx_room()) as u64;
                if let Some(rate) = self.rate {
                    // Each VM's sends are spread over the period by its id, as idle guests'
                    // timers are: a thousand VMs at 10 frames/s do not all send at once.
                    let phase = (id_phase(self.id) * 1e9 / rate) as u64;
                    let due = (rate * (elapsed + phase) as f64 / 1e9) as u64;
                    n = n.min(due.saturating_sub(self.c.sent));
                }
                if n == 0 {
                    return;
                }
                let ts = now_ns();
                for _ in 0..n {
                    self.put(dst, KIND_DATA, self.c.sent, ts);
                    self.c.sent += 1;
                }
                self.c.sent_bytes += n * self.size as u64;
                self.vm.raw_tx().publish();
            }
            Role::Ping => {
                let now = now_ns();
                if let Some((_, at)) = self.ping {
                    if now - at < PING_TIMEOUT_NS {
                        return;
                    }
                    self.c.ping_timeouts += 1;
                }
                // With a rate, pings are spaced 1/rate apart (sparse traffic); without, the next
                // ping follows each pong at once.
                if let Some(r) = self.rate
                    && now.saturating_sub(self.last_ping_at) < (1e9 / r) as u64
                {
                    return;
                }
                let dst = self.dst_mac.expect("a pinger has a destination");
                if self.put(dst, KIND_PING, self.c.pings_sent, now) {
                    self.last_ping_at = now;
                    self.ping = Some((self.c.pings_sent, now));
                    self.c.pings_sent += 1;
                    self.vm.raw_tx().publish();
                }
            }
            Role::Pong => {}
        }
    }

    fn send_hello(&mut self) {
        if self.put(BCAST, KIND_HELLO, self.c.hellos_sent, now_ns()) {
            self.c.hellos_sent += 1;
            self.vm.raw_tx().publish();
        }
    }
}

/// State shared by the generator threads.
pub struct Shared {
    pub vms: usize,
    pub ready: AtomicUsize,
    pub abort: AtomicBool,
    pub barrier: Barrier,
    /// Per VM: how many VMs need its hello, and how many have heard it. A VM stops announcing
    /// itself once all have (a thousand VMs broadcasting every 50 ms until the last is ready
    /// is a broadcast storm that keeps small receive rings full).
    listeners: Vec<u32>,
    heard: Vec<std::sync::atomic::AtomicU32>,
}

impl Shared {
    pub fn new(vms: usize, threads: usize, listeners: Vec<u32>) -> Arc<Shared> {
        Arc::new(Shared {
            vms,
            heard: (0..vms).map(|_| Default::default()).collect(),
            listeners,
            ready: AtomicUsize::new(0),
            abort: AtomicBool::new(false),
            barrier: Barrier::new(threads),
        })
    }
}

/// What one thread measured: its ports (still connected) and the measurement's length.
pub struct ThreadResult {
    pub ports: Vec<Port>,
    pub measured_ns: u64,
    /// VMs that never got the hellos they needed (the run was aborted).
    pub not_ready: Vec<u16>,
}

/// Where in its period a rate-limited VM sends (0..1): spread by its id.
fn id_phase(id: u16) -> f64 {
    (id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_right(17) as f64 / u64::MAX as f64
}

/// Sleeps `us` microseconds after a pass over the ports that moved no frame (`idle_sleep_us`).
fn rest_if_idle(moved: bool, us: u32) {
    if !moved && us > 0 {
        std::thread::sleep(std::time::Duration::from_micros(us as u64));
    }
}

/// Frames a port has put on and taken from its rings so far.
fn moved(p: &Port) -> u64 {
    p.c.tx_frames + p.c.rx_frames
}

/// One generator thread: hellos until every VM (on every thread) has heard its peers, then
/// `seconds` of traffic, then a drain until the switch completed every TX buffer, then a last
/// RX pass once every thread has drained. A pass over the ports that moved no frame is followed
/// by a sleep of `idle_sleep_us` (0: none; a thread of quiet VMs then need not take its CPU).
pub fn thread_main(
    mut ports: Vec<Port>,
    shared: Arc<Shared>,
    seconds: f64,
    burst: usize,
    idle_sleep_us: u32,
) -> ThreadResult {
    // Hellos.
    let deadline = now_ns() + HELLO_DEADLINE_NS;
    let mut last_hello = 0;
    loop {
        let now = now_ns();
        let before: u64 = ports.iter().map(moved).sum();
        for p in &mut ports {
            p.poll_rx(Phase::Hello);
            p.reclaim(now_ns());
            if !p.ready && p.needs.iter().all(|&s| p.have_hello[s as usize]) {
                p.ready = true;
                shared.ready.fetch_add(1, Ordering::AcqRel);
                for &s in &p.needs {
                    shared.heard[s as usize].fetch_add(1, Ordering::AcqRel);
                }
            }
        }
        if shared.ready.load(Ordering::Acquire) == shared.vms || shared.abort.load(Ordering::Relaxed) {
            break;
        }
        if now > deadline {
            shared.abort.store(true, Ordering::Relaxed);
            break;
        }
        if now - last_hello >= HELLO_EVERY_NS {
            for p in ports.iter_mut() {
                let i = p.id as usize;
                // Every VM announces itself at least once (the switch learns its MAC); then
                // only while a VM that needs its hello has not heard it.
                if p.c.hellos_sent == 0 || shared.heard[i].load(Ordering::Acquire) < shared.listeners[i] {
                    p.send_hello();
                }
            }
            last_hello = now;
        }
        rest_if_idle(ports.iter().map(moved).sum::<u64>() != before, idle_sleep_us);
    }
    shared.barrier.wait();
    let not_ready: Vec<u16> = ports.iter().filter(|p| !p.ready).map(|p| p.id).collect();
    let mut measured_ns = 0;
    if !shared.abort.load(Ordering::Relaxed) {
        // Traffic.
        let start = now_ns();
        let len = (seconds * 1e9) as u64;
        loop {
            let elapsed = now_ns() - start;
            if elapsed >= len {
                break;
            }
            let mut moved_any = false;
            for p in &mut ports {
                let before = moved(p);
                p.poll_rx(Phase::Measure);
                p.reclaim(now_ns());
                p.transmit(elapsed, burst);
                moved_any |= moved(p) != before;
            }
            rest_if_idle(moved_any, idle_sleep_us);
        }
        measured_ns = now_ns() - start;
    }
    // Drain: nothing new is sent; wait for the switch to complete every TX buffer, receiving
    // meanwhile (a full RX ring would hold it up).
    let stop = now_ns();
    loop {
        for p in &mut ports {
            p.poll_rx(Phase::Drain);
            p.reclaim(now_ns());
        }
        if ports.iter().all(|p| p.in_flight() == 0) {
            break;
        }
        if now_ns() - stop > DRAIN_DEADLINE_NS {
            for p in &mut ports {
                p.c.tx_incomplete = p.in_flight() as u64;
            }
            break;
        }
    }
    // Every thread's frames are completed, so delivered: one last look at the RX rings.
    shared.barrier.wait();
    for p in &mut ports {
        p.poll_rx(Phase::Drain);
    }
    ThreadResult { ports, measured_ns, not_ready }
}
