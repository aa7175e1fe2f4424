//! Per-poll-thread counters. Each counter has exactly one writer, the poll thread that owns it,
//! which updates it with a plain load + store (no locked instruction); the control plane reads
//! them with relaxed loads and never stops the data path. Each thread's counters live in their
//! own allocation, aligned to cache lines, so no two writers share a line.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::counter::counters;
pub use crate::counter::{Counter, Total, bump, cycles, cycles_per_sec};

/// The drop reasons, declared once: the `DropReason` enum, the counters by reason and their names.
macro_rules! drop_reasons {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $name:literal, )*) => {
        /// Why a frame was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum DropReason {
            $( $(#[doc = $doc])+ $variant, )*
        }

        /// Every drop reason: (name, help), in `DropReason` order.
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
    /// Port security: the frame's source address (IPv4, IPv6, ARP sender, neighbour
    /// advertisement target) is not one the port's `allowed_ips` allow.
    IpSpoofed = "ip_spoofed",
    /// Security groups: a new connection no rule of the port's groups allows (counted on the
    /// port whose rules refused it), or DHCP served or routers advertised by a guest.
    SecurityGroup = "security_group",
    /// Security groups: connection tracking found the frame invalid (a TCP segment outside the
    /// window or with no connection it could open, a later IP fragment, an echo reply or ICMP
    /// error belonging to no connection, truncated headers).
    CtInvalid = "ct_invalid",
    /// Security groups, or a flow's `ct(commit)`: a new connection found its zone's or the
    /// switch's connection limit reached (`ct_max_per_port`, `ct_max_connections`).
    CtLimit = "ct_limit",
    /// No flow matched the frame (a flow table without a catch-all).
    NoMatch = "no_match",
    /// The matching flow's actions drop the frame (or a walk through the tables met no output).
    FlowDrop = "flow_drop",
    /// A frame's walk through the tables met more flows than the switch follows (16: a
    /// resubmit loop).
    ResubmitLimit = "resubmit_limit",
    /// A NIC's transmit ring was full (or its mbuf pool empty): the frame was freed.
    NicTxFull = "nic_tx_full",
    /// A NIC's driver refused a frame's offload request (`rte_eth_tx_prepare`): the frame was freed.
    NicRefused = "nic_tx_refused",
    /// Offloads: NEEDS_CSUM with csum_start/csum_offset past the frame's end.
    OffloadCsum = "offload_bad_csum",
    /// Offloads: a gso_type pvswitchd does not know (only TCPv4/TCPv6 segmentation).
    OffloadGsoType = "offload_bad_gso_type",
    /// Offloads: a TSO frame with gso_size below 88 (TCP's smallest MSS), 0 included.
    OffloadGsoSize = "offload_gso_size_too_small",
    /// Offloads: a TSO frame whose headers are not Ethernet/IP/TCP, or hdr_len past the frame.
    OffloadHeaders = "offload_bad_headers",
    /// Offloads: a frame asked for an offload its port did not negotiate.
    OffloadNotNegotiated = "offload_not_negotiated",
    /// Mirrors: a frame sent by a mirror's output port, which receives the mirror's copies only.
    MirrorOutput = "mirror_output",
    /// VLANs: a tagged frame from an access port.
    VlanTagged = "vlan_tagged_on_access",
    /// VLANs: a frame on a VLAN its port does not carry (or untagged, on a trunk without VLAN 0).
    VlanNotAllowed = "vlan_not_allowed",
    /// VLANs: an 802.1ad (QinQ) outer tag, or two tags.
    VlanStacked = "vlan_stacked",
    /// Rate caps: a frame to a port beyond its egress cap.
    RateCap = "rate_cap",
    /// VXLAN: a frame to a tunnel whose underlay next hop's MAC is not resolved yet (ARP asked).
    NoNeighbour = "vxlan_no_neighbour",
    /// VXLAN: a frame from the underlay for a VNI this VTEP does not carry.
    VxlanUnknownVni = "vxlan_unknown_vni",
    /// VXLAN: a frame from the underlay from a tunnel endpoint this VTEP does not know.
    VxlanUnknownRemote = "vxlan_unknown_remote",
    /// VXLAN: a frame to this VTEP whose outer headers are short or inconsistent.
    VxlanBadOuter = "vxlan_bad_outer",
    /// VXLAN: a decapsulated frame too short for an Ethernet header, or tagged.
    VxlanBadInner = "vxlan_bad_inner",
    /// VXLAN: a frame claiming to come from a remote VTEP on the underlay's own segment whose
    /// outer source MAC is not that remote's (as our ARP resolved it), or before it was resolved.
    VxlanNotFromNextHop = "vxlan_not_from_next_hop",
    /// VXLAN: underlay traffic that is neither VXLAN to this VTEP nor ARP.
    UnderlayOther = "underlay_not_vxlan",
    /// VXLAN: a frame from one remote VTEP to a MAC behind another (split horizon; counted on
    /// the tunnel it came from).
    SplitHorizon = "vxlan_split_horizon",
    /// Routing: a frame to a VRF's gateway whose destination no network of the VRF holds
    /// (answered with ICMP net unreachable, rate-limited), or not IPv4, or to the gateway's own
    /// address and not an echo request.
    NoRoute = "route_no_route",
    /// Routing: a frame to a VRF's gateway with a TTL of 1 or 0 (answered with ICMP time
    /// exceeded, rate-limited).
    TtlExceeded = "route_ttl_exceeded",
    /// Routing: a frame to a VRF's gateway whose destination is in one of its networks but
    /// is no port's address (`allowed_ips`; answered with ICMP host unreachable, rate-limited).
    RouteNoNeighbour = "route_no_neighbour",
    /// Routing: a frame to a VRF's gateway whose IPv4 header is broken (version, header or
    /// total length).
    RouteBadHeader = "route_bad_header",
}

impl From<crate::wire::gso::OffloadError> for DropReason {
    fn from(e: crate::wire::gso::OffloadError) -> DropReason {
        use crate::wire::gso::OffloadError as E;
        match e {
            E::CsumOutOfFrame => DropReason::OffloadCsum,
            E::GsoType => DropReason::OffloadGsoType,
            E::GsoSizeTooSmall => DropReason::OffloadGsoSize,
            E::GsoHeaders => DropReason::OffloadHeaders,
            E::NotNegotiated => DropReason::OffloadNotNegotiated,
        }
    }
}

pub const NDROPS: usize = DROP_REASONS.len();

/// Frames dropped, by reason.
pub struct DropCounters([AtomicU64; NDROPS]);

impl Default for DropCounters {
    fn default() -> DropCounters {
        DropCounters(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// Frames dropped, by reason, as read; serialized as `{"reason": count, ...}` (read back
/// leniently: a reason missing is 0, one this build does not know is ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropTotals(pub [u64; NDROPS]);

impl Default for DropTotals {
    fn default() -> DropTotals {
        DropTotals([0; NDROPS])
    }
}

impl DropCounters {
    #[inline]
    pub fn count(&self, why: DropReason, n: u64) {
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
    pub fn get(&self, why: DropReason) -> u64 {
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

impl<'de> serde::Deserialize<'de> for DropTotals {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let by_name = std::collections::BTreeMap::<String, u64>::deserialize(d)?;
        Ok(DropTotals(std::array::from_fn(|i| by_name.get(DROP_REASONS[i].0).copied().unwrap_or(0))))
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
        /// Source MACs not learned: the port was at its `mac_limit`, or the bucket held only other
        /// ports' entries (frames to such a MAC flood).
        learn_refused: AtomicU64,
        /// TSO frames received from the port (the guest handed over up to 64 KiB at once).
        rx_gso: AtomicU64,
        /// TSO frames cut into segments for this port (it did not negotiate the offload).
        sw_segmented: AtomicU64,
        /// Partial checksums completed for this port (it did not negotiate GUEST_CSUM, or is a NIC).
        sw_checksums: AtomicU64,
        /// Frames handed to this NIC whole, for the device to segment (TSO) or checksum.
        hw_offloaded: AtomicU64,
        /// Frames delivered to this guest marked DATA_VALID: their NIC verified the TCP/UDP
        /// checksum, so the guest need not.
        data_valid: AtomicU64,
        /// Visits that found the port over its ingress rate cap and left its frames queued
        /// (in the guest's ring: backpressure; or in the NIC's).
        rate_held: AtomicU64,
        /// Frames dropped, by reason.
        drops: DropCounters,
    }
}

impl PortCounters {
    #[inline]
    pub fn drop(&self, why: DropReason, n: u64) {
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
        /// Times it was parked (found empty for `park_after_us`: no longer polled, its kicks
        /// watched); parked now while `parks` > `unparks`.
        parks: AtomicU64,
        /// Times it was polled again after being parked.
        unparks: AtomicU64,
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
        /// Wake-ups by a NIC queue's receive interrupt.
        wakeups_interrupt: AtomicU64,
        /// Queues parked (idle for `park_after_us`: no longer polled, their kicks watched).
        parks: AtomicU64,
        /// Parked queues polled again because their guest kicked.
        unparks_kick: AtomicU64,
        /// Parked queues polled again after a control wake-up (their ring restarted, or an
        /// announcement waits).
        unparks_control: AtomicU64,
        /// Parked queues the sweep found with frames (a frontend that did not kick).
        unparks_sweep: AtomicU64,
        /// Looks at the parked queues' kicks (one non-blocking epoll_wait each).
        park_checks: AtomicU64,
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
    /// Its queues parked now.
    pub parked: AtomicU64,
    /// While the thread writes a guest's call eventfd: the TSC at which it started (else 0).
    /// The control thread's watchdog interrupts a write that lasts (`vring::call`).
    pub in_call: AtomicU64,
    /// Control wake-ups by latency from the wake request to the thread running again:
    /// bucket i counts latencies below 2^i microseconds (the last bucket: the rest).
    pub wake_latency_us: [AtomicU64; WAKE_BUCKETS],
    /// The polling settings the thread runs with, stored by the thread when it takes them
    /// (`pvswitchctl stats` shows these, not the configuration's copy).
    pub running: RunningTuning,
    pub ports: Box<[PortCounters]>,
}

/// A poll thread's polling settings as it adopted them. Written by that thread only.
#[derive(Default)]
pub struct RunningTuning {
    pub burst: AtomicU64,
    pub retry_cycles: AtomicU64,
    /// Adaptive polling: microseconds idle before sleeping; `BUSY`: the thread polls busily
    /// (configured so, or it could not make its sleeper).
    pub sleep_after_us: AtomicU64,
    pub nic_poll_interval_us: AtomicU64,
    pub nic_poll_max_us: AtomicU64,
    /// How long the thread's latest sleep on the NIC timer was to last (microseconds): the
    /// backoff, `nic_poll_interval_us` after a frame, doubling to `nic_poll_max_us`.
    pub nic_sleep_us: AtomicU64,
    /// Parking: a queue empty this long is parked (0: never), kicks looked at this often.
    pub park_after_us: AtomicU64,
    pub park_check_us: AtomicU64,
}

impl RunningTuning {
    pub const BUSY: u64 = u64::MAX;
}

pub const WAKE_BUCKETS: usize = 16;

impl ThreadStats {
    pub fn new(core: usize, numa_node: Option<usize>, nports: usize) -> ThreadStats {
        ThreadStats {
            core,
            numa_node,
            loops: LoopCounters::default(),
            sleeping: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            in_call: AtomicU64::new(0),
            wake_latency_us: std::array::from_fn(|_| AtomicU64::new(0)),
            running: RunningTuning::default(),
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
