//! An OpenFlow-like flow table with Open vSwitch's `ovs-ofctl` flow syntax.
//!
//! The pieces, in the order a frame meets them:
//!
//! - [`FlowKey`] (key.rs): the header fields flows match on (in_port, dl_src/dl_dst, dl_type,
//!   vlan_tci, nw_src/nw_dst, nw_proto, nw_tos, tp_src/tp_dst) packed into four `u64` words.
//!   A mask is also a `FlowKey`, so masking is four ANDs.
//! - extract.rs: [`FlowKey::extract`] and [`FlowKey::extract_to`] fill one from the first
//!   bytes of a frame, down to a [`Depth`], over any [`FrameBytes`].
//! - [`Emc`] (emc.rs): a per-thread exact match cache from full key to flow index, consulted
//!   first.
//! - [`Classifier`] (classifier.rs): tuple-space search over the flow table, on an EMC miss.
//!   [`Linear`] is its slow reference implementation.
//! - [`execute`] (action.rs): runs the winning flow's [`Action`]s on an [`EthHeader`] and emits
//!   each output with the header as it is at that point.
//! - [`parse_flow`] (parse.rs) reads an `ovs-ofctl add-flow` style string such as
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

pub use action::{Action, Emit, execute};
pub use classifier::{Classifier, Linear};
pub use emc::Emc;
pub use extract::FrameBytes;
pub use key::{Depth, ETH_TYPE_NONE, Field, FlowKey, VLAN_PRESENT, WORDS};
pub use parse::{FlowError, parse_flow};

/// The priority of a flow that does not give one (as OVS).
pub const DEFAULT_PRIORITY: u16 = 32768;

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

/// One flow: a match, its priority and the actions for the packets it wins.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub priority: u16,
    pub m: Match,
    /// Run in order by [`execute`]. Empty means drop (`actions=drop` parses to empty).
    pub actions: Vec<Action>,
}

impl Flow {
    /// A flow with the default priority.
    pub fn new(m: Match, actions: Vec<Action>) -> Flow {
        Flow { priority: DEFAULT_PRIORITY, m, actions }
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
