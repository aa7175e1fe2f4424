//! `vrfs`: each `[[vrf]]` as the data path routes it.

use serde::{Deserialize, Serialize};

/// One VRF: its gateway MAC, its networks, and the neighbours routing reaches in them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VrfInfo {
    pub name: String,
    pub gateway_mac: String,
    pub networks: Vec<NetworkInfo>,
    pub neighbours: Vec<NeighbourInfo>,
}

/// A network of a VRF: its VLAN and the gateway's address with the prefix length, IPv4 and
/// (a dual-stack network) IPv6.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkInfo {
    pub vlan: u16,
    pub gateway: String,
    #[serde(default)]
    pub gateway6: Option<String>,
}

/// An address routing reaches: the port that has it (`allowed_ips`), its MAC, its VLAN.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighbourInfo {
    pub address: String,
    pub mac: String,
    pub port: String,
    pub vlan: u16,
}
