//! `conntrack [PORT|zone=N]` and `conntrack-flush PORT|zone=N`: the connections security
//! groups track (by port), and those flows' `ct` actions track (by zone).

use serde::{Deserialize, Serialize};

/// `conntrack`: the table's counts, each port with groups, and its connections (at most
/// `MAX_LISTED`, the rest counted only).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConntrackReply {
    /// Connections stored, every port's.
    pub total: u32,
    /// `ct_max_connections` (0: no table yet, no port has had a group).
    pub limit: u32,
    /// `ct_max_per_port`.
    pub limit_per_port: u32,
    /// Commits refused for the limits since start: a port's, the table's.
    pub refused_port_limit: u64,
    pub refused_table_full: u64,
    /// Fragments after the first refused since start: no first fragment passed before them,
    /// an overlap, past 65,535 bytes (the ports' table and the flows').
    #[serde(default)]
    pub bad_fragments: u64,
    pub ports: Vec<ZoneInfo>,
    /// The connections listed (those of PORT, of zone N, or every port's and zone's), as their
    /// first frame went.
    pub connections: Vec<ConnInfo>,
    /// Flows' `ct` actions: connections stored in their table (apart from the ports').
    #[serde(default)]
    pub flow_total: u32,
    /// Its zones that hold connections.
    #[serde(default)]
    pub flow_zones: Vec<FlowZone>,
}

/// A zone of the flows' table.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlowZone {
    pub zone: u16,
    pub connections: u32,
}

/// A port with security groups: its zone and how many connections it holds.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ZoneInfo {
    pub port: String,
    pub zone: u16,
    pub connections: u32,
}

/// One tracked connection.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConnInfo {
    /// The port whose security groups track it; empty for a flow's (see `zone`).
    pub port: String,
    #[serde(default)]
    pub zone: u16,
    /// tcp, udp, icmp, icmpv6, or the protocol's number.
    pub protocol: String,
    pub src: String,
    pub sport: u16,
    pub dst: String,
    pub dport: u16,
    /// TCP's state (SYN_SENT, ESTABLISHED, ...), or FIRST / REPLIED.
    pub state: String,
    /// Which way it opened: "ingress" (toward the port) or "egress"; empty for a flow's.
    pub opened: String,
    /// Its `ct_mark` (a flow's, set by `ct(commit,exec(set_field:V->ct_mark))`).
    #[serde(default)]
    pub mark: u32,
    /// A rule change no longer allows it: its frames drop until it expires.
    pub cut: bool,
    pub expires_in: u32,
}

/// The most connections `conntrack` lists.
pub const MAX_LISTED: usize = 1000;
