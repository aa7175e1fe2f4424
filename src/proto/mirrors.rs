//! `mirrors`: each `[[mirror]]` as it runs.

use serde::{Deserialize, Serialize};

/// One mirror: its selection as configured, which of the ports it names are absent, and what
/// its output was given (its copies) and could not take.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorInfo {
    pub name: String,
    pub output_port: String,
    pub select_src_port: Vec<String>,
    pub select_dst_port: Vec<String>,
    pub select_all: bool,
    pub select_vlan: Vec<u16>,
    /// Bytes kept of each copy (None: whole).
    pub snaplen: Option<u32>,
    /// Its output is here (a vhost-user or dpdk port): copies are made.
    pub active: bool,
    /// The ports it names that the switch does not have (yet).
    pub absent: Vec<String>,
    /// Copies its output was given, and their bytes.
    pub copies: u64,
    pub copy_bytes: u64,
    /// Copies its output could not take (every drop counted on it: a full ring, a port down).
    pub dropped: u64,
}
