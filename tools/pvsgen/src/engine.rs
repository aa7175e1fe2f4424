//! The generator's data path: per-VM TX and RX rings, driven by one busy-polling thread per
//! CPU, each serving many VMs.
//!
//! Wire format: a 12-byte virtio-net header (zero) and the Ethernet frame in one descriptor.
//! The frame is dst MAC, src MAC 02:00:00:00:VV:VV (VV:VV = the VM's index), ethertype 0x88b5,
//! then at offset 14: magic "PVSG" (u32 LE), kind (u8: data, hello, ping, pong), pad, source VM
//! index (u16 LE), pad, sequence number (u64 LE, per source VM, from 0), TX timestamp
//! (CLOCK_MONOTONIC ns, u64 LE); zeros up to the frame size.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use crate::frontend::{Desc, HDR_LEN, Vm};
use crate::stats::{FlowRx, Histogram};

pub const ETHERTYPE: u16 = 0x88b5;
pub const MAGIC: u32 = u32::from_le_bytes(*b"PVSG");
/// Bytes of the frame the generator writes and reads (Ethernet header and its fields).
pub const PROBE_LEN: usize = 40;
pub const KIND_DATA: u8 = 0;
pub const KIND_HELLO: u8 = 1;
pub const KIND_PING: u8 = 2;
pub const KIND_PONG: u8 = 3;
pub const BCAST: [u8; 6] = [0xff; 6];

/// How often an unanswered hello is repeated, and how long a ping waits for its pong.
const HELLO_EVERY_NS: u64 = 50_000_000;
const PING_TIMEOUT_NS: u64 = 100_000_000;
/// Give up waiting for hellos, or for the switch to complete TX buffers at the end.
pub const HELLO_DEADLINE_NS: u64 = 10_000_000_000;
const DRAIN_DEADLINE_NS: u64 = 5_000_000_000;

/// The MAC address of VM `id`.
pub fn mac_of(id: u16) -> [u8; 6] {
    let b = id.to_be_bytes();
    [0x02, 0, 0, 0, b[0], b[1]]
}

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
    /// TX descriptor ids not in the switch's hands.
    free: Vec<u16>,
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
        mut vm: Vm,
        dst_mac: Option<[u8; 6]>,
        size: usize,
        rate: Option<f64>,
        role: Role,
        needs: Vec<u16>,
        sources: &[bool],
    ) -> Port {
        let l = *vm.layout();
        vm.post_rx_buffers(l.qsize, l.buf_slot as u32);
        Port {
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
            free: (0..l.qsize).rev().collect(),
            ping: None,
            last_ping_at: 0,
            c: Counters::default(),
            flows: sources.iter().map(|&s| s.then(FlowRx::default)).collect(),
            latency: Histogram::new(),
            rtt: Histogram::new(),
        }
    }

    fn in_flight(&self) -> usize {
        self.vm.layout().qsize as usize - self.free.len()
    }

    /// Stages one frame on the TX ring (publish with `self.vm.raw_tx().publish()`); false if
    /// no TX buffer is free.
    #[inline]
    fn put(&mut self, dst: [u8; 6], kind: u8, seq: u64, ts: u64) -> bool {
        let Some(id) = self.free.pop() else { return false };
        let at = self.vm.layout().tx_buf(id);
        let mut h = [0u8; PROBE_LEN];
        h[0..6].copy_from_slice(&dst);
        h[6..12].copy_from_slice(&self.mac);
        h[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        h[14..18].copy_from_slice(&MAGIC.to_le_bytes());
        h[18] = kind;
        h[20..22].copy_from_slice(&self.id.to_le_bytes());
        h[24..32].copy_from_slice(&seq.to_le_bytes());
        h[32..40].copy_from_slice(&ts.to_le_bytes());
        // The 12-byte virtio-net header before it stays zero (the memfd starts zeroed).
        self.vm.mem.write(at + HDR_LEN as u64, &h);
        let mut tx = self.vm.raw_tx();
        tx.desc(id, Desc { addr: at, len: (HDR_LEN + self.size) as u32, flags: 0, next: 0 });
        tx.stage(id);
        self.c.tx_frames += 1;
        true
    }

    /// Takes back TX buffers the switch completed.
    #[inline]
    fn reclaim(&mut self) {
        let qsize = self.vm.layout().qsize;
        let mut tx = self.vm.raw_tx();
        let used = tx.used_idx();
        while let Some((id, _)) = tx.next_used(used) {
            assert!(id < qsize as u32, "the switch completed TX descriptor {id}");
            self.free.push(id as u16);
        }
    }

    /// Drains the RX ring, handles every frame, and gives the buffers back.
    fn poll_rx(&mut self, phase: Phase) {
        let l = *self.vm.layout();
        let used = self.vm.raw_rx().used_idx();
        if used == self.vm.raw_rx().last_used() {
            return;
        }
        let now = now_ns();
        let mut echoed = false;
        while let Some((id, len)) = self.vm.raw_rx().next_used(used) {
            assert!(id < l.qsize as u32, "the switch returned RX descriptor {id}");
            let id = id as u16;
            self.c.rx_frames += 1;
            let len = (len as usize).saturating_sub(HDR_LEN);
            let mut h = [0u8; PROBE_LEN];
            if len >= PROBE_LEN {
                self.vm.mem.read_into(l.rx_buf(id) + HDR_LEN as u64, &mut h);
            }
            self.vm.raw_rx().stage(id);
            let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]);
            let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
            let src = u16_at(20) as usize;
            if len < PROBE_LEN
                || h[12..14] != ETHERTYPE.to_be_bytes()
                || h[14..18] != MAGIC.to_le_bytes()
                || src >= self.flows.len()
                || (h[0..6] != self.mac && h[0..6] != BCAST)
            {
                self.c.foreign += 1;
                continue;
            }
            let (seq, ts) = (u64_at(24), u64_at(32));
            match h[18] {
                KIND_DATA => match &mut self.flows[src] {
                    Some(f) => {
                        f.record(seq);
                        self.c.received += 1;
                        self.c.received_bytes += len as u64;
                        self.latency.record(now.saturating_sub(ts));
                    }
                    None => self.c.foreign += 1,
                },
                KIND_HELLO => {
                    self.c.hellos_received += 1;
                    self.have_hello[src] = true;
                }
                KIND_PING if self.role == Role::Pong => {
                    self.c.pings_received += 1;
                    if phase == Phase::Measure {
                        let to: [u8; 6] = h[6..12].try_into().unwrap();
                        if self.put(to, KIND_PONG, seq, ts) {
                            self.c.pongs_sent += 1;
                            echoed = true;
                        }
                    }
                }
                KIND_PONG if self.role == Role::Ping => {
                    self.c.pongs_received += 1;
                    if self.ping.is_some_and(|(s, _)| s == seq) {
                        self.rtt.record(now_ns().saturating_sub(ts));
                        self.ping = None;
                    }
                }
                _ => self.c.foreign += 1,
            }
        }
        self.vm.raw_rx().publish();
        if echoed {
            self.vm.raw_tx().publish();
        }
    }

    /// Puts what is due on the TX ring. `elapsed` is the time since the measurement started.
    #[inline]
    fn transmit(&mut self, elapsed: u64, burst: usize) {
        match self.role {
            Role::Stream => {
                let Some(dst) = self.dst_mac else { return };
                let mut n = burst.min(self.free.len()) as u64;
                if let Some(rate) = self.rate {
                    let due = (rate * elapsed as f64 / 1e9) as u64;
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
}

impl Shared {
    pub fn new(vms: usize, threads: usize) -> Arc<Shared> {
        Arc::new(Shared {
            vms,
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

/// One generator thread: hellos until every VM (on every thread) has heard its peers, then
/// `seconds` of traffic, then a drain until the switch completed every TX buffer, then a last
/// RX pass once every thread has drained.
pub fn thread_main(mut ports: Vec<Port>, shared: Arc<Shared>, seconds: f64, burst: usize) -> ThreadResult {
    // Hellos.
    let deadline = now_ns() + HELLO_DEADLINE_NS;
    let mut last_hello = 0;
    loop {
        let now = now_ns();
        for p in &mut ports {
            p.poll_rx(Phase::Hello);
            p.reclaim();
            if !p.ready && p.needs.iter().all(|&s| p.have_hello[s as usize]) {
                p.ready = true;
                shared.ready.fetch_add(1, Ordering::AcqRel);
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
            ports.iter_mut().for_each(Port::send_hello);
            last_hello = now;
        }
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
            for p in &mut ports {
                p.poll_rx(Phase::Measure);
                p.reclaim();
                p.transmit(elapsed, burst);
            }
        }
        measured_ns = now_ns() - start;
    }
    // Drain: nothing new is sent; wait for the switch to complete every TX buffer, receiving
    // meanwhile (a full RX ring would hold it up).
    let stop = now_ns();
    loop {
        for p in &mut ports {
            p.poll_rx(Phase::Drain);
            p.reclaim();
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
