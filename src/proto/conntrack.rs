//! `conntrack [PORT]` and `conntrack-flush PORT`: the connections security groups track.

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
    pub ports: Vec<ZoneInfo>,
    /// The connections listed (those of PORT, or every port's), as their first frame went.
    pub connections: Vec<ConnInfo>,
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
    pub port: String,
    /// tcp, udp, icmp, icmpv6, or the protocol's number.
    pub protocol: String,
    pub src: String,
    pub sport: u16,
    pub dst: String,
    pub dport: u16,
    /// TCP's state (SYN_SENT, ESTABLISHED, ...), or FIRST / REPLIED.
    pub state: String,
    /// Which way it opened: "ingress" (toward the port) or "egress".
    pub opened: String,
    /// A rule change no longer allows it: its frames drop until it expires.
    pub cut: bool,
    pub expires_in: u32,
}

/// The most connections `conntrack` lists.
pub const MAX_LISTED: usize = 1000;
