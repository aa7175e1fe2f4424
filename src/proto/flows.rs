//! `flows` (the flow table with its counters) and `trace` (where a described frame goes).

use serde::{Deserialize, Serialize};

/// `flows`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowsReply {
    /// No flows configured: every frame takes actions=normal.
    pub normal_only: bool,
    /// Frames no flow matched.
    pub missed_packets: u64,
    pub missed_bytes: u64,
    pub flows: Vec<FlowInfo>,
}

/// One flow, in ovs-ofctl syntax, with its counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowInfo {
    #[serde(default)]
    pub table: u8,
    pub priority: u16,
    #[serde(rename = "match")]
    pub matches: String,
    pub actions: Vec<String>,
    /// The whole flow as ovs-ofctl prints it.
    pub flow: String,
    pub n_packets: u64,
    pub n_bytes: u64,
    /// Seconds since the table was installed.
    pub duration_secs: f64,
}

/// `trace`: the flow hit (None: no flow, or none consulted), the ports the frame would go to
/// (with any rewritten headers), and each step on the way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceReply {
    pub flow: Option<String>,
    pub outputs: Vec<String>,
    pub steps: Vec<String>,
}

/// `trace --live`: one real frame a port sent, and what the data path did with it, stage by
/// stage (`steps`), ending in where it went (`outputs`, each with how it leaves that port) or
/// why it was dropped (`dropped`: a drop reason's name, as `stats` counts it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTrace {
    pub port: String,
    /// When the poll thread saw it (nanoseconds since the Unix epoch).
    pub time_ns: u64,
    /// Its length on the wire (the steps read its first bytes).
    pub len: u32,
    /// The table-0 flow it hit, as ovs-ofctl prints it (None: no flow table, or no flow).
    pub flow: Option<String>,
    pub outputs: Vec<String>,
    pub dropped: Option<String>,
    pub steps: Vec<String>,
}
