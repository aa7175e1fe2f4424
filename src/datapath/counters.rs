//! Per-poll-thread counters. Each counter has exactly one writer, the poll thread that owns it,
//! which updates it with a plain load + store (no locked instruction); the control plane reads
//! them with relaxed loads and never stops the data path. Each thread's counters live in their
//! own allocation, aligned to cache lines, so no two writers share a line.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Adds to a counter that only the calling thread writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    #[cfg(not(feature = "no-counters"))]
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    #[cfg(feature = "no-counters")]
    let _ = (c, n);
}

/// Why a frame was dropped. The order is the order of `PortCounters::drops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Drop {
    /// The destination guest had no receive buffers (its RX ring was full).
    RxRingFull = 0,
    /// The destination guest's receive buffers were too small for the frame.
    RxBufferTooSmall,
    /// The destination port has no running receive queue (not connected, not enabled).
    PortDown,
    /// A frame from a guest longer than the port's MTU allows.
    Mtu,
    /// A frame shorter than an Ethernet header.
    Runt,
    /// A descriptor chain that broke its queue (the queue is stopped).
    Malformed,
    /// Port security: the frame's source MAC is not one the port may use.
    PortSecurity,
    /// No flow matched the frame (a flow table without a catch-all).
    NoMatch,
    /// The matching flow's actions drop the frame.
    FlowDrop,
    /// A NIC's transmit ring was full (or its mbuf pool empty): the frame was freed.
    NicTxFull,
}

pub const NDROPS: usize = 10;
pub const DROP_REASONS: [&str; NDROPS] = [
    "rx_ring_full",
    "rx_buffer_too_small",
    "port_down",
    "mtu_exceeded",
    "runt",
    "malformed",
    "port_security",
    "no_match",
    "flow_drop",
    "nic_tx_full",
];

/// Counters for one port, kept by one poll thread. `rx` is what the switch received from the
/// port (the guest transmitted); `tx` is what the switch sent to it (the guest received).
#[repr(align(64))]
#[derive(Default)]
pub struct PortCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub interrupts: AtomicU64,
    /// Bursts taken from this port's queues (rx_packets / rx_bursts is the average burst).
    pub rx_bursts: AtomicU64,
    /// Batches delivered into this port's queues, each one used-index store.
    pub tx_batches: AtomicU64,
    pub drops: [AtomicU64; NDROPS],
}

impl PortCounters {
    /// Zeroes the counters of a port slot being freed. Only the control thread calls this, and
    /// only once no poll thread's plan holds the port, so no writer races with it.
    pub fn reset(&self) {
        for c in [&self.rx_packets, &self.rx_bytes, &self.tx_packets, &self.tx_bytes, &self.interrupts]
            .into_iter()
            .chain([&self.rx_bursts, &self.tx_batches])
            .chain(&self.drops)
        {
            c.store(0, Relaxed);
        }
    }

    #[inline]
    pub fn drop(&self, why: Drop, n: u64) {
        bump(&self.drops[why as usize], n);
    }
}

/// Totals as read by the control plane.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct PortTotals {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub interrupts: u64,
    pub rx_bursts: u64,
    pub tx_batches: u64,
    pub drops: [u64; NDROPS],
}

impl PortTotals {
    pub fn add(&mut self, c: &PortCounters) {
        self.rx_packets += c.rx_packets.load(Relaxed);
        self.rx_bytes += c.rx_bytes.load(Relaxed);
        self.tx_packets += c.tx_packets.load(Relaxed);
        self.tx_bytes += c.tx_bytes.load(Relaxed);
        self.interrupts += c.interrupts.load(Relaxed);
        self.rx_bursts += c.rx_bursts.load(Relaxed);
        self.tx_batches += c.tx_batches.load(Relaxed);
        for (t, d) in self.drops.iter_mut().zip(&c.drops) {
            *t += d.load(Relaxed);
        }
    }
}

/// Counters for one receive queue (a guest's TX virtqueue), written by the poll thread that owns
/// the queue. A queue moves between threads only through two plan swaps (it leaves one thread,
/// which acknowledges, before it joins another), so there is one writer at a time.
#[repr(align(64))]
#[derive(Default)]
pub struct RxqStats {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// TSC cycles spent in visits that found frames (the queue's share of its thread's busy time).
    pub cycles: AtomicU64,
    pub visits: AtomicU64,
    pub bursts: AtomicU64,
}

/// One poll thread's counters.
#[repr(align(64))]
pub struct ThreadStats {
    pub core: usize,
    pub numa_node: Option<usize>,
    pub iterations: AtomicU64,
    pub busy_cycles: AtomicU64,
    pub idle_cycles: AtomicU64,
    /// Adaptive polling: times the thread went to sleep, and cycles spent asleep.
    pub sleeps: AtomicU64,
    pub asleep_cycles: AtomicU64,
    /// 1 while the thread sleeps.
    pub sleeping: AtomicU64,
    /// What woke it: a guest's kick, the control thread (plan, shutdown), or a timeout.
    pub wakeups_kick: AtomicU64,
    pub wakeups_control: AtomicU64,
    pub wakeups_timeout: AtomicU64,
    /// Control wake-ups by latency from the wake request to the thread running again:
    /// bucket i counts latencies below 2^i microseconds (the last bucket: the rest).
    pub wake_latency_us: [AtomicU64; WAKE_BUCKETS],
    pub ports: Box<[PortCounters]>,
}

pub const WAKE_BUCKETS: usize = 16;

impl ThreadStats {
    pub fn new(core: usize, numa_node: Option<usize>, nports: usize) -> ThreadStats {
        ThreadStats {
            core,
            numa_node,
            iterations: AtomicU64::new(0),
            busy_cycles: AtomicU64::new(0),
            idle_cycles: AtomicU64::new(0),
            sleeps: AtomicU64::new(0),
            sleeping: AtomicU64::new(0),
            asleep_cycles: AtomicU64::new(0),
            wakeups_kick: AtomicU64::new(0),
            wakeups_control: AtomicU64::new(0),
            wakeups_timeout: AtomicU64::new(0),
            wake_latency_us: std::array::from_fn(|_| AtomicU64::new(0)),
            ports: (0..nports).map(|_| PortCounters::default()).collect(),
        }
    }
}

impl ThreadStats {
    /// Counts one control wake-up that took `cycles` TSC cycles to reach the thread.
    pub fn record_wake_latency(&self, cycles: u64) {
        let us = cycles * 1_000_000 / cycles_per_sec();
        let bucket = (64 - us.leading_zeros() as usize).min(WAKE_BUCKETS - 1);
        bump(&self.wake_latency_us[bucket], 1);
    }
}

/// The CPU's time stamp counter (cycles at a constant rate).
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::time::Instant;
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Time stamp counter ticks per second, measured once against the monotonic clock.
pub fn cycles_per_sec() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        let t0 = std::time::Instant::now();
        let c0 = cycles();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c1 = cycles();
        let ns = t0.elapsed().as_nanos().max(1) as u64;
        ((c1.wrapping_sub(c0) as u128 * 1_000_000_000 / ns as u128) as u64).max(1)
    })
}
