//! An OpenFlow-like flow table with Open vSwitch's `ovs-ofctl` flow syntax.
//!
//! The pieces, in the order a frame meets them:
//!
//! - [`FlowKey`] (key.rs): the fields flows match on (in_port, dl_src/dl_dst, dl_type,
//!   vlan_tci, nw_src/nw_dst, nw_proto, nw_tos, tp_src/tp_dst) packed into four `u64` words,
//!   and a fifth for the connection tracker's `ct_state`, `ct_zone`, `ct_mark`. A mask is also
//!   a `FlowKey`, so masking is five ANDs. A [`PacketKey`] is the first four words alone: what
//!   table 0 (which every frame meets untracked) and the exact-match cache work on.
//! - extract.rs: [`FlowKey::extract`] and [`FlowKey::extract_to`] fill one from the first
//!   bytes of a frame, down to a [`Depth`], over any [`FrameBytes`].
//! - [`Emc`] (emc.rs): a per-thread exact match cache from a frame's packet key to its table-0
//!   flow, consulted first.
//! - [`Classifier`] (classifier.rs): tuple-space search over the flow table, on an EMC miss.
//!   [`Linear`] is its slow reference implementation.
//! - [`execute`] (action.rs): runs the winning flow's [`Action`]s on an [`EthHeader`] and emits
//!   each output with the header as it is at that point; [`execute_path`] runs those of the
//!   flows a frame met in several tables (`datapath/pipeline.rs` found them).
//! - [`parse_flow`] (parse/: the match in `mod.rs`, the actions in `actions.rs`) reads an
//!   `ovs-ofctl add-flow` style string such as
//!   `priority=100,tcp,in_port=vm1,nw_dst=10.0.0.0/24,tp_dst=80 actions=output:vm2`, and
//!   [`Flow::to_ovs_string`] (print.rs) prints one back in `ovs-ofctl dump-flows` order.
//!
//! **Which flow wins:** the matching flow with the highest priority. Among overlapping
//! matching flows of equal priority, the one that comes first in the flow list wins (OVS
//! leaves this case undefined). [`Classifier`], [`Linear`] and hence the EMC all follow this
//! rule, so a table behaves the same whatever lookup path a frame takes.
#![forbid(unsafe_code)]

mod action;
mod classifier;
mod emc;
mod extract;
mod key;
mod parse;
mod print;
pub mod table;

pub use action::{Action, Ct, Emit, execute, execute_path};
pub use classifier::{Classifier, Linear};
pub use emc::Emc;
pub use extract::FrameBytes;
pub use key::{Depth, ETH_TYPE_NONE, Field, FlowKey, Key, PacketKey, VLAN_PRESENT, WORDS};
pub use parse::{FlowError, parse_flow};
pub use print::ct_state_string;

/// `ct_state` bits, as OVS numbers them (ovs-fields(7)): what a `ct` action found, matched by
/// `ct_state=+trk+est` and set by the connection tracker (`crate::conntrack`).
pub mod ct_state {
    pub const NEW: u8 = 0x01;
    pub const EST: u8 = 0x02;
    pub const REL: u8 = 0x04;
    pub const RPL: u8 = 0x08;
    pub const INV: u8 = 0x10;
    pub const TRK: u8 = 0x20;
    /// Each flag's name in a `ct_state` match, with its bit.
    pub const NAMES: [(&str, u8); 6] =
        [("new", NEW), ("est", EST), ("rel", REL), ("rpl", RPL), ("inv", INV), ("trk", TRK)];
}

/// The priority of a flow that does not give one (as OVS).
pub const DEFAULT_PRIORITY: u16 = 32768;

/// The most flows one frame's walk through the tables meets (`datapath/pipeline.rs`, and
/// `trace`); a walk that would meet more is dropped (OVS allows 64 resubmits; a firewall's
/// pipeline needs four or five).
pub const MAX_PATH: usize = 16;

/// The last table a flow may be in (OVS's 0..=254; 255 is OpenFlow's "all tables").
pub const MAX_TABLE: u8 = 254;

/// What a flow matches: the packets whose key, masked with `mask`, equals `key`.
/// `key` is kept pre-masked (`key == key.and(&mask)`); [`Match::new`] ensures that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Match {
    pub key: FlowKey,
    pub mask: FlowKey,
}

impl Match {
    /// Matches every packet.
    pub const ANY: Match = Match { key: FlowKey::from_words([0; WORDS]), mask: FlowKey::from_words([0; WORDS]) };

    /// A match with `key` pre-masked by `mask`.
    pub fn new(key: FlowKey, mask: FlowKey) -> Match {
        Match { key: key.and(&mask), mask }
    }

    /// Matches exactly `key` (every field).
    pub fn exact(key: FlowKey) -> Match {
        Match { key, mask: FlowKey::EXACT }
    }

    /// True if `key` is matched.
    #[inline]
    pub fn matches(&self, key: &FlowKey) -> bool {
        key.and(&self.mask) == self.key
    }
}

/// One flow: its table, a match, its priority and the actions for the packets it wins.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    /// A frame starts in table 0; `resubmit`, `goto_table` and `ct(table=N)` take it to others.
    pub table: u8,
    pub priority: u16,
    pub m: Match,
    /// Run in order by [`execute`]. Empty means drop (`actions=drop` parses to empty).
    pub actions: Vec<Action>,
}

impl Flow {
    /// A flow with the default priority.
    pub fn new(m: Match, actions: Vec<Action>) -> Flow {
        Flow { table: 0, priority: DEFAULT_PRIORITY, m, actions }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn match_basics() {
        let k = FlowKey::default().with(Field::TpDst, 80).with(Field::TpSrc, 9);
        let mask = FlowKey::default().with(Field::TpDst, u64::MAX);
        let m = Match::new(k, mask);
        assert_eq!(m.key.tp_src(), 0);
        assert!(m.matches(&k));
        assert!(m.matches(&k.with(Field::NwDst, 1)));
        assert!(!m.matches(&k.with(Field::TpDst, 81)));
        assert!(Match::ANY.matches(&k));
        assert!(Match::exact(k).matches(&k));
        assert!(!Match::exact(k).matches(&k.with(Field::InPort, 1)));
        assert_eq!(Flow::new(m, vec![]).priority, DEFAULT_PRIORITY);
    }
}
