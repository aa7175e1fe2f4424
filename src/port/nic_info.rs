//! What a NIC port reports (`pvswitchctl ports`, a port's `dpdk` object): plain data, in
//! every build (pvswitchctl has no DPDK), which `port::nic` fills in and `port::dpdk` counts
//! into. A leaf: it imports nothing of either, so both may use it.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

/// What `pvswitchctl ports` shows of a NIC (a port's `dpdk` object): driver, queues, NUMA node
/// (`socket_id`) and DPDK's own counters. Part of the control protocol (`proto`), here
/// because `NicPort::info` builds it; it exists without the `dpdk` feature too, for pvswitchctl.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicInfo {
    pub device: String,
    pub ethdev: String,
    pub port_id: u16,
    pub driver: String,
    pub rx_queues: u16,
    pub tx_queues: u16,
    pub rx_ring: u16,
    pub tx_ring: u16,
    pub socket_id: Option<u32>,
    pub mtu: Option<u16>,
    pub offloads: NicOffloads,
    pub mac: Option<String>,
    pub notes: Vec<String>,
    pub mbufs_free: u32,
    pub stats: Option<NicStats>,
}

/// The device offloads a NIC port uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicOffloads {
    pub tx_checksum: bool,
    pub tx_tso4: bool,
    pub tx_tso6: bool,
    pub rx_checksum: bool,
}

/// DPDK's counters of a NIC port (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    pub rx_nombuf: u64,
}

/// An Rx queue's receive interrupt: a file that becomes readable when frames arrive (an
/// eventfd the kernel signals, or for net_tap the queue's own file). Ours is a duplicate of
/// DPDK's descriptor, so it stays valid while a poll thread watches it, even past the port's
/// close; it is never read (an eventfd is watched edge-triggered, a queue's own file
/// level-triggered).
#[derive(Debug, Clone)]
pub struct RxInterrupt {
    pub fd: std::sync::Arc<std::fs::File>,
    /// The driver signals only after `arm_rx_interrupt(q, true)` (a NIC's interrupt register);
    /// false: it signals whenever frames arrive (net_tap).
    pub needs_arming: bool,
}
