//! `capture`: the request's options, and the two replies of a capture's stream: the first
//! line (what is captured), and the last record (how it ended). Between them the stream
//! carries pcapng (see `Chunk`).

use serde::{Deserialize, Serialize};

pub use crate::capture::Direction;

/// A capture's stream after its first reply line: chunks, each a kind byte and a 4-byte
/// little-endian length, then that many bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    /// pcapng bytes, to be written out as they are.
    Pcapng = 0,
    /// The end: a [`CaptureEnd`] as JSON; nothing follows.
    End = 1,
    /// One traced frame (`trace --live`): a [`super::LiveTrace`] as JSON.
    Trace = 2,
}

impl Chunk {
    pub fn from_byte(b: u8) -> Option<Chunk> {
        match b {
            0 => Some(Chunk::Pcapng),
            1 => Some(Chunk::End),
            2 => Some(Chunk::Trace),
            _ => None,
        }
    }
}

/// `capture`'s first reply: what is captured. Each port is a pcapng interface, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CaptureStarted {
    pub ports: Vec<String>,
    /// Each port's kind (vhost-user, dpdk, vxlan).
    pub kinds: Vec<String>,
    pub direction: Direction,
    pub drops: bool,
    pub snaplen: u32,
    /// The filter (pcap-filter syntax; empty: every frame).
    pub filter: String,
}

/// How a capture ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CaptureEnd {
    /// Records written to the stream.
    pub packets: u64,
    /// Frames of its ports it looked at (each way counts once).
    pub seen: u64,
    /// Of those, the frames the filter took.
    pub matched: u64,
    /// Matched frames lost because the reader was behind (a poll thread's ring was full).
    pub lost: u64,
    /// Why it ended: "count reached", "the reader left", "port vm1 was deleted".
    pub reason: String,
}
