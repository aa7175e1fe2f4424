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

/// The counters of one kind of thing, declared once: the macro makes the struct of atomics the
/// data path bumps (one writer each), the struct of totals the control plane reads
/// (`Serialize`d field by field: these names are the JSON and Prometheus names), and the list of
/// field names with their help text (for Prometheus and the documentation check).
macro_rules! counters {
    ($(#[$m:meta])* pub struct $name:ident => $total:ident {
        $( $(#[doc = $doc:literal])+ $field:ident : $ty:ty, )*
    }) => {
        $(#[$m])*
        #[derive(Default)]
        pub struct $name {
            $( $(#[doc = $doc])+ pub $field: $ty, )*
        }

        /// Totals of the counters, as the control plane reads them.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub struct $total {
            $( pub $field: <$ty as Counter>::Total, )*
        }

        impl $name {
            /// Every counter: (name, help).
            pub const FIELDS: &'static [(&'static str, &'static str)] =
                &[ $( (stringify!($field), concat!($($doc),+)) ),* ];

            /// Reads every counter (relaxed loads).
            pub fn read(&self) -> $total {
                $total { $( $field: self.$field.read(), )* }
            }

            /// Zeroes every counter. Only for a slot no writer uses any more.
            pub fn reset(&self) {
                $( self.$field.reset(); )*
            }
        }

        impl Total for $total {
            fn add(&mut self, o: &Self) {
                $( self.$field.add(&o.$field); )*
            }
            fn since(&self, base: &Self) -> Self {
                $total { $( $field: self.$field.since(&base.$field), )* }
            }
        }
    };
}

/// A counter as its writer holds it, and what reading it gives.
pub trait Counter: Default {
    type Total: Total + Default + std::fmt::Debug + PartialEq + Eq + serde::Serialize;
    fn read(&self) -> Self::Total;
    fn reset(&self);
}

/// Read totals: summed over threads, and differenced between two samples.
pub trait Total: Copy {
    fn add(&mut self, o: &Self);
    /// `self - base`, saturating (a freed port slot's counters restart from zero).
    fn since(&self, base: &Self) -> Self;
}

impl Counter for AtomicU64 {
    type Total = u64;
    fn read(&self) -> u64 {
        self.load(Relaxed)
    }
    fn reset(&self) {
        self.store(0, Relaxed)
    }
}

impl Total for u64 {
    fn add(&mut self, o: &u64) {
        *self += o
    }
    fn since(&self, base: &u64) -> u64 {
        self.saturating_sub(*base)
    }
}

/// The drop reasons, declared once: the `Drop` enum, the counters by reason and their names.
macro_rules! drop_reasons {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $name:literal, )*) => {
        /// Why a frame was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum Drop {
            $( $(#[doc = $doc])+ $variant, )*
        }

        /// Every drop reason: (name, help), in `Drop` order.
        pub const DROP_REASONS: &[(&str, &str)] = &[ $( ($name, concat!($($doc),+)) ),* ];
    };
}

drop_reasons! {
    /// The destination guest had no receive buffers (its RX ring was full).
    RxRingFull = "rx_ring_full",
    /// The destination guest's receive buffers were too small for the frame.
    RxBufferTooSmall = "rx_buffer_too_small",
    /// The destination port has no running receive queue (not connected, not enabled).
    PortDown = "port_down",
    /// A frame from a guest longer than the port's MTU allows.
    Mtu = "mtu_exceeded",
    /// A frame shorter than an Ethernet header.
    Runt = "runt",
    /// A descriptor chain that broke its queue (the queue is stopped).
    Malformed = "malformed",
    /// Port security: the frame's source MAC is not one the port may use.
    PortSecurity = "port_security",
    /// No flow matched the frame (a flow table without a catch-all).
    NoMatch = "no_match",
    /// The matching flow's actions drop the frame.
    FlowDrop = "flow_drop",
    /// A NIC's transmit ring was full (or its mbuf pool empty): the frame was freed.
    NicTxFull = "nic_tx_full",
}

pub const NDROPS: usize = DROP_REASONS.len();

/// Frames dropped, by reason.
#[derive(Default)]
pub struct DropCounters([AtomicU64; NDROPS]);

/// Frames dropped, by reason, as read; serialized as `{"reason": count, ...}`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DropTotals(pub [u64; NDROPS]);

impl DropCounters {
    #[inline]
    pub fn count(&self, why: Drop, n: u64) {
        bump(&self.0[why as usize], n);
    }
}

impl Counter for DropCounters {
    type Total = DropTotals;
    fn read(&self) -> DropTotals {
        DropTotals(std::array::from_fn(|i| self.0[i].load(Relaxed)))
    }
    fn reset(&self) {
        self.0.iter().for_each(|c| c.store(0, Relaxed));
    }
}

impl Total for DropTotals {
    fn add(&mut self, o: &Self) {
        self.0.iter_mut().zip(o.0).for_each(|(a, b)| *a += b);
    }
    fn since(&self, base: &Self) -> Self {
        DropTotals(std::array::from_fn(|i| self.0[i].saturating_sub(base.0[i])))
    }
}

impl DropTotals {
    pub fn get(&self, why: Drop) -> u64 {
        self.0[why as usize]
    }
}

impl serde::Serialize for DropTotals {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(NDROPS))?;
        for ((name, _), n) in DROP_REASONS.iter().zip(self.0) {
            m.serialize_entry(name, &n)?;
        }
        m.end()
    }
}

counters! {
    /// Counters for one port, kept by one poll thread. `rx` is what the switch received from the
    /// port (the guest transmitted); `tx` is what the switch sent to it (the guest received).
    #[repr(align(64))]
    pub struct PortCounters => PortTotals {
        /// Frames received from the port (the guest sent them).
        rx_packets: AtomicU64,
        /// Bytes received from the port.
        rx_bytes: AtomicU64,
        /// Frames sent to the port (the guest received them).
        tx_packets: AtomicU64,
        /// Bytes sent to the port.
        tx_bytes: AtomicU64,
        /// Interrupts sent to the guest.
        interrupts: AtomicU64,
        /// Bursts taken from the port's queues (rx_packets / rx_bursts is the average burst).
        rx_bursts: AtomicU64,
        /// Batches delivered into the port's queues, each one used-index store.
        tx_batches: AtomicU64,
        /// Frames dropped, by reason.
        drops: DropCounters,
    }
}

impl PortCounters {
    #[inline]
    pub fn drop(&self, why: Drop, n: u64) {
        self.drops.count(why, n);
    }
}

counters! {
    /// Counters for one receive queue (a guest's TX virtqueue, a NIC receive queue), written by
    /// the poll thread that owns the queue. A queue moves between threads only through two plan
    /// swaps (it leaves one thread, which acknowledges, before it joins another), so there is one
    /// writer at a time.
    #[repr(align(64))]
    pub struct RxqStats => RxqTotals {
        /// Frames taken from the queue.
        packets: AtomicU64,
        /// Bytes taken from the queue.
        bytes: AtomicU64,
        /// TSC cycles spent in visits that found frames (the queue's share of its thread's busy time).
        cycles: AtomicU64,
        /// Visits of the poll thread to the queue.
        visits: AtomicU64,
        /// Bursts taken from the queue.
        bursts: AtomicU64,
    }
}

counters! {
    /// A poll thread's loop counters.
    pub struct LoopCounters => LoopTotals {
        /// Poll loop iterations.
        iterations: AtomicU64,
        /// TSC cycles in iterations that moved frames.
        busy_cycles: AtomicU64,
        /// TSC cycles in iterations that found nothing.
        idle_cycles: AtomicU64,
        /// Times the thread went to sleep (adaptive polling).
        sleeps: AtomicU64,
        /// TSC cycles the thread slept.
        asleep_cycles: AtomicU64,
        /// Wake-ups by a guest's kick.
        wakeups_kick: AtomicU64,
        /// Wake-ups by the control thread (a plan, shutdown).
        wakeups_control: AtomicU64,
        /// Wake-ups by the NIC poll timer.
        wakeups_timeout: AtomicU64,
    }
}

/// One poll thread's counters.
#[repr(align(64))]
pub struct ThreadStats {
    pub core: usize,
    pub numa_node: Option<usize>,
    pub loops: LoopCounters,
    /// 1 while the thread sleeps.
    pub sleeping: AtomicU64,
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
            loops: LoopCounters::default(),
            sleeping: AtomicU64::new(0),
            wake_latency_us: std::array::from_fn(|_| AtomicU64::new(0)),
            ports: (0..nports).map(|_| PortCounters::default()).collect(),
        }
    }

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
