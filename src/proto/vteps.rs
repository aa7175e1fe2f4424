//! What a VTEP's control plane reads (`vteps`) and tells it (`vtep-sync`'s state).

use serde::{Deserialize, Serialize};

/// `vtep-sync`'s state for one VTEP: every remote endpoint with its VNIs, every remote MAC,
/// and the addresses of remote MACs (EVPN's MAC+IP routes: neighbours for the VRFs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VtepState {
    #[serde(default)]
    pub remotes: Vec<RemoteVnis>,
    #[serde(default)]
    pub macs: Vec<RemoteMac>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neighbours: Vec<RemoteNeighbour>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteVnis {
    pub remote: String,
    pub vnis: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteMac {
    pub vni: u32,
    pub mac: String,
    pub remote: String,
}

/// An address of a remote MAC on a VNI (the MAC is one of the state's `macs`, so behind that
/// MAC's remote).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteNeighbour {
    pub vni: u32,
    pub ip: String,
    pub mac: String,
}

/// `vteps`: one VTEP as its control plane reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VtepInfo {
    pub name: String,
    pub underlay: String,
    pub local: String,
    pub udp_port: u16,
    /// (VNI, VLAN) pairs.
    pub vnis: Vec<VniInfo>,
    /// MACs on this host, per VNI: learned on its ports (not on tunnels) and the configured
    /// `allowed_macs` of connected access ports in the VNI's VLAN.
    pub local_macs: Vec<LocalMac>,
    /// What the last `vtep-sync` said (sorted).
    pub learned: VtepState,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VniInfo {
    pub vni: u32,
    pub vlan: u16,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalMac {
    pub vni: u32,
    pub mac: String,
    /// An `allowed_macs` entry of a connected access port (else learned on a local port).
    #[serde(default)]
    pub configured: bool,
    /// A configured MAC's host addresses in the VNI's network (the port's `allowed_ips`, its
    /// only MAC's; what the VRFs route to it): exported as EVPN MAC+IP routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<String>,
}
