//! The raw layer: the file as serde reads it, before any value is checked. Every key that an
//! error may point at is `Spanned`, so the section validators can name its line and column.

use std::collections::HashMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;

use super::error::{ConfigError, Ctx};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub switch: Option<RawSwitch>,
    #[serde(default)]
    pub port: Vec<RawPort>,
    #[serde(default)]
    pub flows: Vec<Spanned<String>>,
    pub dpdk: Option<RawDpdk>,
    #[serde(default)]
    pub vtep: Vec<RawVtep>,
    #[serde(default)]
    pub security_group: Vec<RawSecurityGroup>,
    #[serde(default)]
    pub mirror: Vec<RawMirror>,
    pub ipfix: Option<RawIpfix>,
    #[serde(default)]
    pub vrf: Vec<RawVrf>,
}

/// A `[[vrf]]` table: a tenant's networks and their anycast gateway (`vrf.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVrf {
    pub name: Spanned<String>,
    pub gateway_mac: Spanned<String>,
    #[serde(default)]
    pub network: Vec<RawVrfNetwork>,
}

/// A `[[vrf.network]]` table: a VLAN and the gateway's address in it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVrfNetwork {
    pub vlan: Spanned<i64>,
    pub gateway: Spanned<String>,
    pub gateway6: Option<Spanned<String>>,
}

/// The `[ipfix]` table: flow export (`ipfix.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIpfix {
    pub collector: Spanned<String>,
    pub sampling: Option<Spanned<u32>>,
    pub active_timeout_s: Option<Spanned<u32>>,
    pub idle_timeout_s: Option<Spanned<u32>>,
    pub max_flows: Option<Spanned<u32>>,
    pub observation_domain_id: Option<Spanned<u32>>,
}

/// A `[[mirror]]` table: which frames are copied to which port (`mirror.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMirror {
    pub name: Spanned<String>,
    pub output_port: Spanned<String>,
    #[serde(default)]
    pub select_src_port: Vec<Spanned<String>>,
    #[serde(default)]
    pub select_dst_port: Vec<Spanned<String>>,
    pub select_all: Option<bool>,
    #[serde(default)]
    pub select_vlan: Vec<Spanned<u32>>,
    pub snaplen: Option<Spanned<u32>>,
}

/// A `[[security_group]]` table: named rules a port's `security_groups` attach (`secgroup.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecurityGroup {
    pub name: Spanned<String>,
    pub allow_all_egress: Option<bool>,
    #[serde(default)]
    pub rule: Vec<RawSgRule>,
}

/// A `[[security_group.rule]]`: what a connection may be, in one direction.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSgRule {
    pub direction: Spanned<String>,
    pub ethertype: Option<Spanned<String>>,
    pub protocol: Option<Spanned<String>>,
    pub ports: Option<Spanned<toml::Value>>,
    pub remote: Option<Spanned<String>>,
    pub remote_group: Option<Spanned<String>>,
}

/// A `[[vtep]]` table: a VXLAN tunnel endpoint (`vtep.rs`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVtep {
    pub name: Spanned<String>,
    pub underlay: Spanned<String>,
    pub local_ip: Spanned<String>,
    pub gateway: Option<Spanned<String>>,
    pub next_hop_mac: Option<Spanned<String>>,
    pub udp_port: Option<Spanned<u32>>,
    pub mtu: Option<Spanned<u32>>,
    pub learning: Option<Spanned<bool>>,
    #[serde(default)]
    pub vni: Vec<RawVni>,
}

/// A `[[vtep.vni]]` entry: one tenant network, a VNI across hosts and a VLAN on this one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVni {
    pub vni: Spanned<i64>,
    pub vlan: Spanned<i64>,
    #[serde(default)]
    pub remotes: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDpdk {
    pub eal_args: Option<Vec<String>>,
    pub mbufs: Option<Spanned<u32>>,
    pub nic_poll_interval_us: Option<Spanned<u32>>,
    pub nic_poll_max_us: Option<Spanned<u32>>,
    pub runtime_vdevs: Option<Vec<Spanned<String>>>,
}

/// `poll_cores = [1, 2]` or `poll_cores = "auto"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawCores {
    List(Vec<usize>),
    Word(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    pub index: Spanned<u16>,
    pub weight_packets: Option<Spanned<u32>>,
    pub weight_bytes: Option<Spanned<u32>>,
    pub affinity: Option<Spanned<usize>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSwitch {
    pub poll_cores: Option<Spanned<RawCores>>,
    pub poll_cores_per_node: Option<Spanned<u32>>,
    pub rxq_assign: Option<Spanned<String>>,
    pub rxq_isolate: Option<bool>,
    pub auto_rebalance: Option<bool>,
    pub rebalance_interval_s: Option<Spanned<u32>>,
    pub rebalance_threshold_pct: Option<Spanned<u32>>,
    pub rebalance_improvement_pct: Option<Spanned<u32>>,
    pub control_socket: Option<String>,
    pub control_socket_mode: Option<Spanned<String>>,
    pub socket_mode: Option<Spanned<String>>,
    pub socket_group: Option<Spanned<String>>,
    pub socket_dir: Option<String>,
    /// The port drop-in directory (`dropin.rs`), relative to the main file's.
    pub ports_dir: Option<String>,
    pub max_ports: Option<Spanned<u32>>,
    pub weight_packets: Option<Spanned<u32>>,
    pub weight_bytes: Option<Spanned<u32>>,
    pub burst: Option<Spanned<u32>>,
    pub rx_retry_us: Option<Spanned<u32>>,
    pub metrics_listen: Option<Spanned<String>>,
    pub poll_mode: Option<Spanned<String>>,
    pub idle_before_sleep_us: Option<Spanned<u32>>,
    pub park_after_us: Option<Spanned<u32>>,
    pub park_check_us: Option<Spanned<u32>>,
    pub core_poll_mode: Option<Spanned<HashMap<String, String>>>,
    pub mac_limit: Option<Spanned<u32>>,
    pub max_guest_memory_mib: Option<Spanned<u32>>,
    pub max_memory_regions: Option<Spanned<u32>>,
    pub max_total_guest_memory_mib: Option<Spanned<u32>>,
    /// Connection tracking's limits (security groups): every port's connections together, and
    /// each port's.
    pub ct_max_connections: Option<Spanned<u32>>,
    pub ct_max_per_port: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPort {
    pub name: Spanned<String>,
    #[serde(rename = "type")]
    pub kind: Spanned<String>,
    pub socket: Option<Spanned<String>>,
    pub device: Option<Spanned<String>>,
    pub rx_queues: Option<Spanned<u16>>,
    pub tx_queues: Option<Spanned<u16>>,
    pub rx_ring: Option<Spanned<u16>>,
    pub tx_ring: Option<Spanned<u16>>,
    #[serde(default)]
    pub mode: Option<Spanned<String>>,
    pub queues: Option<Spanned<u16>>,
    pub mtu: Option<Spanned<u32>>,
    pub weight_packets: Option<Spanned<u32>>,
    pub weight_bytes: Option<Spanned<u32>>,
    #[serde(default)]
    pub allowed_macs: Vec<Spanned<String>>,
    #[serde(default)]
    pub allowed_ips: Vec<Spanned<String>>,
    /// The `[[security_group]]`s whose rules filter the port's connections.
    #[serde(default)]
    pub security_groups: Vec<Spanned<String>>,
    pub mac_limit: Option<Spanned<u32>>,
    pub max_guest_memory_mib: Option<Spanned<u32>>,
    pub max_memory_regions: Option<Spanned<u32>>,
    /// Checksum and segmentation offloads: offered to the guest (vhost-user), or used on the
    /// device where it has them (dpdk). Default on.
    pub offloads: Option<Spanned<bool>>,
    /// Pin every queue of the port to this poll core.
    pub affinity: Option<Spanned<usize>>,
    /// Per-queue overrides: `[[port.queue]] index = 0, weight_packets = 64, affinity = 2`.
    #[serde(default)]
    pub queue: Vec<RawQueue>,
    /// VLANs (`tenant.rs`): "access", "trunk", "native-untagged" or "native-tagged".
    pub vlan_mode: Option<Spanned<String>>,
    pub tag: Option<Spanned<i64>>,
    pub trunks: Option<Spanned<Vec<Spanned<RawVid>>>>,
    /// Rate caps (`tenant.rs`), 0 or absent: none.
    pub ingress_pps: Option<Spanned<i64>>,
    pub ingress_bps: Option<Spanned<i64>>,
    pub egress_pps: Option<Spanned<i64>>,
    pub egress_bps: Option<Spanned<i64>>,
    pub rate_burst_ms: Option<Spanned<i64>>,
}

/// A `trunks` entry: a VLAN id, or a range such as `"100-199"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawVid {
    One(i64),
    Range(String),
}

/// Reads `cx.text` as `T` (a whole file, or one port's keys); a TOML or schema error (syntax,
/// unknown key, wrong type, missing key) is positioned where toml found it.
pub(super) fn read<T: DeserializeOwned>(cx: &Ctx) -> Result<T, ConfigError> {
    toml::from_str(cx.text).map_err(|e| {
        let mut msg = e.message().trim().to_string();
        if msg.starts_with("unknown field `flows`") {
            msg.push_str(" (in TOML, top-level keys such as `flows` must come before the first [table])");
        }
        cx.err(e.span(), msg)
    })
}
