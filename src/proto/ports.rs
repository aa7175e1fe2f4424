//! `ports`: each port, its queues and its counters.

use serde::{Deserialize, Serialize};

use super::{Counters, NicInfo};

/// One port (`ports` replies with one per port, by id).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PortInfo {
    pub name: String,
    pub id: u16,
    /// "vhost-user", "dpdk" or "vxlan" (a remote tunnel endpoint).
    #[serde(rename = "type")]
    pub kind: String,
    /// A vhost-user port's socket path (empty for a dpdk port).
    pub socket: String,
    /// "server" or "client" (a dpdk port: "server").
    pub mode: String,
    /// A dpdk port's device string.
    pub device: Option<String>,
    /// What DPDK reports of a dpdk port that opened.
    pub dpdk: Option<NicInfo>,
    /// A tunnel port's endpoints and next hop.
    #[serde(default)]
    pub vxlan: Option<VxlanInfo>,
    /// "running" (a NIC), "failed", "connected", "connecting" or "listening".
    pub state: String,
    pub connects: u64,
    pub connected_secs: Option<u64>,
    /// A failed port's error, else the last thing that happened to its connection.
    pub last_error: Option<String>,
    /// Log lines about the port that its frontend caused and that were not written (past 20
    /// at once, then one a second: `port::limit`), since the port was created.
    #[serde(default)]
    pub log_lines_suppressed: u64,
    pub features: Vec<String>,
    /// A vhost-user port's offloads.
    pub offloads: Option<PortOffloads>,
    pub memory_regions: usize,
    pub memory_bytes: u64,
    pub max_memory_regions: usize,
    pub max_guest_memory_mib: u64,
    pub macs_learned: u32,
    pub mac_limit: u32,
    /// Port security: the only source MACs the port may send (empty: any).
    #[serde(default)]
    pub allowed_macs: Vec<String>,
    /// Port security: the prefixes its source addresses must be in (empty: any).
    #[serde(default)]
    pub allowed_ips: Vec<String>,
    /// Security groups: the `[[security_group]]`s filtering its connections (empty: none).
    #[serde(default)]
    pub security_groups: Vec<String>,
    /// Connections tracked for its security groups now (null: it has none).
    #[serde(default)]
    pub connections: Option<u32>,
    pub numa_node: Option<usize>,
    pub queue_pairs: usize,
    pub mtu: u32,
    pub weight_packets: u32,
    pub weight_bytes: u32,
    /// The port's VLAN config.
    pub vlan: PortVlanInfo,
    /// The port's rate caps and the tokens their buckets hold.
    pub rate_caps: RateCapsInfo,
    /// A vhost-user port's live-migration state.
    pub migration: MigrationInfo,
    pub queues: Vec<QueueInfo>,
    /// The port's counters summed over the poll threads (their fields inline).
    #[serde(flatten)]
    pub counters: Counters,
}

/// A remote VXLAN tunnel endpoint's port: its VTEP, the addresses, the underlay next hop
/// and its MAC (None until ARP resolved it), and the VNIs it carries as "VNI:VLAN".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanInfo {
    pub vtep: String,
    pub underlay: String,
    pub local: String,
    pub remote: String,
    pub udp_port: u16,
    pub next_hop: String,
    pub next_hop_mac: Option<String>,
    pub vnis: Vec<String>,
    /// Whether it learns MACs from the frames it brings (`[[vtep]] learning`).
    #[serde(default = "yes")]
    pub learning: bool,
}

fn yes() -> bool {
    true
}

/// What a vhost-user port offers and what each direction negotiated, as offload names (csum,
/// tso4, tso6, ecn).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortOffloads {
    pub offered: bool,
    /// What the guest may send.
    pub guest_sends: Vec<String>,
    /// What the guest can take.
    pub guest_takes: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// A guest's receive virtqueue (the switch delivers into it).
    #[default]
    GuestRx,
    /// A guest's transmit virtqueue (a receive queue of the switch, polled by a poll thread).
    GuestTx,
    /// A NIC's receive queue.
    NicRx,
}

impl QueueKind {
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::GuestRx => "guest_rx",
            QueueKind::GuestTx => "guest_tx",
            QueueKind::NicRx => "nic_rx",
        }
    }
}

/// One queue of a port. `size`, `enabled`, `running` and `error` are a virtqueue's (null for a
/// NIC queue); `poll_thread` and the counters a receive queue's (null for a guest_rx queue).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub index: usize,
    pub kind: QueueKind,
    pub size: Option<u16>,
    pub enabled: Option<bool>,
    pub running: Option<bool>,
    /// Why the queue was stopped (a guest broke it).
    pub error: Option<String>,
    pub poll_thread: Option<usize>,
    pub rx_packets: Option<u64>,
    pub rx_bytes: Option<u64>,
}

/// Where a vhost-user port stands in a live migration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationInfo {
    /// Whether its rings log their writes (LOG_ALL negotiated and a log mapped).
    pub logging: bool,
    /// The dirty log's size in bytes, while logging.
    pub log_bytes: Option<u64>,
    /// SEND_RARP requests from the connected frontend.
    pub rarp_requests: u64,
    /// RARPs the data path sent from this port (since it was created).
    pub announcements: u64,
    /// SEND_RARP requests answered but not announced: past the port's budget (a burst of 8,
    /// then 4 a second), since the port was created.
    #[serde(default)]
    pub announcements_refused: u64,
}

/// A port's VLAN config (`vlan_mode`, `tag`, `trunks` in the config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortVlanInfo {
    /// "access", "trunk", "native-untagged" or "native-tagged".
    pub mode: String,
    /// The access or native VLAN (null for a trunk).
    pub tag: Option<u16>,
    /// The VLANs a trunk or native port carries tagged, as ids and ranges ("10", "20-29"; a
    /// trunk's "0" stands for untagged frames). Empty for an access port.
    pub trunks: Vec<String>,
}

/// A port's rate caps, per direction, in packets and bits a second (0: no cap), each bucket
/// holding `burst_ms` of its rate; and the whole tokens each capped bucket holds now (null:
/// no cap; negative: a debt being repaid).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateCapsInfo {
    pub ingress_pps: u64,
    pub ingress_bps: u64,
    pub egress_pps: u64,
    pub egress_bps: u64,
    pub burst_ms: u32,
    pub tokens: RateTokens,
}

/// Tokens held by each bucket (packets, or bits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateTokens {
    pub ingress_pps: Option<i64>,
    pub ingress_bps: Option<i64>,
    pub egress_pps: Option<i64>,
    pub egress_bps: Option<i64>,
}
