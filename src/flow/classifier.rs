//! Flow lookup by tuple-space search.
//!
//! [`Classifier::new`] groups the flows by mask. Each group is a subtable: an open-addressing
//! hash table from masked key to the best flow with that masked key. A lookup masks the packet
//! key with each subtable's mask in turn and probes that subtable's table.
//!
//! Flows are ranked by `(priority, earlier in the list)`, packed into one `u64` so that ranks
//! are unique and a plain `>` implements the tie rule of the module docs (equal priority: the
//! flow listed first wins). Subtables are sorted by the best rank they hold, descending, and
//! the lookup stops at the first subtable whose best rank cannot beat the match found so far.
//!
//! **Subtables visited:** a lookup visits subtables in order until the next one's best rank is
//! below the best match so far. With no match at all it visits every subtable; a match in a
//! subtable holding the table's top-ranked flow stops after one visit. A typical table
//! (a few priorities, one mask shape per priority) visits the subtables down to the first
//! priority level that matches, plus those of the same priority listed earlier.
//! [`Classifier::lookup_counted`] reports the count, [`Classifier::subtables`] the total.
//!
//! The table is immutable once built; share it between threads with an `Arc`. A lookup does
//! not allocate.

use std::collections::HashMap;

use super::Flow;
use super::key::{FlowKey, Key};

/// `priority` in bits 32..48, `u32::MAX - index` below: a higher rank wins, and among equal
/// priorities the lower index has the higher rank. Never 0 for `index < u32::MAX`, so 0 can
/// mark "empty" and "no match".
#[inline]
fn rank(priority: u16, index: usize) -> u64 {
    ((priority as u64) << 32) | (u32::MAX - index as u32) as u64
}

#[inline]
fn rank_index(rank: u64) -> u32 {
    u32::MAX - rank as u32
}

#[derive(Clone, Copy, Default)]
struct Slot<const N: usize> {
    /// The masked key.
    key: Key<N>,
    /// Rank of the best flow with this masked key; 0 if the slot is empty.
    rank: u64,
}

/// All flows that share one mask.
struct Subtable<const N: usize> {
    mask: Key<N>,
    /// Highest rank in this subtable.
    max_rank: u64,
    /// Open addressing, linear probing, at most half full (so a probe always ends).
    slots: Box<[Slot<N>]>,
    /// `slots.len() - 1`.
    slot_mask: usize,
}

impl<const N: usize> Subtable<N> {
    fn new(mask: Key<N>, entries: &[(Key<N>, u64)]) -> Subtable<N> {
        let n = (entries.len() * 2).next_power_of_two().max(4);
        let mut st =
            Subtable { mask, max_rank: 0, slots: vec![Slot::default(); n].into_boxed_slice(), slot_mask: n - 1 };
        for &(key, rank) in entries {
            st.max_rank = st.max_rank.max(rank);
            let mut i = key.hash() as usize & st.slot_mask;
            loop {
                let s = &mut st.slots[i];
                if s.rank == 0 {
                    *s = Slot { key, rank };
                    break;
                }
                if s.key == key {
                    s.rank = s.rank.max(rank);
                    break;
                }
                i = (i + 1) & st.slot_mask;
            }
        }
        st
    }

    /// Rank of the best flow in this subtable that matches `key`, or 0.
    #[inline]
    fn find(&self, key: &Key<N>) -> u64 {
        let masked = key.and(&self.mask);
        let mut i = masked.hash() as usize & self.slot_mask;
        loop {
            let s = &self.slots[i];
            if s.rank == 0 || s.key == masked {
                return s.rank;
            }
            i = (i + 1) & self.slot_mask;
        }
    }
}

/// The flow table, built once; see the module docs. Over [`FlowKey`]s (`N` = 5), or over
/// [`PacketKey`](super::PacketKey)s (`N` = 4: table 0 as a frame first meets it).
pub struct Classifier<const N: usize = { super::key::WORDS }> {
    subtables: Vec<Subtable<N>>,
    flows: usize,
}

impl Classifier {
    /// Builds the classifier for `flows`. Lookups return indices into this slice.
    ///
    /// Panics if there are `u32::MAX` or more flows.
    pub fn new(flows: &[Flow]) -> Classifier {
        Classifier::build(flows.iter().enumerate().map(|(i, f)| (i, f.priority, f.m.key, f.m.mask)))
    }
}

impl<const N: usize> Classifier<N> {
    /// Builds a classifier of `(index, priority, key, mask)` flows: a lookup answers the
    /// index of the winner (highest priority, then lowest index).
    ///
    /// Panics if an index is `u32::MAX` or more.
    pub fn build(flows: impl Iterator<Item = (usize, u16, Key<N>, Key<N>)>) -> Classifier<N> {
        let mut groups: HashMap<Key<N>, Vec<(Key<N>, u64)>> = HashMap::new();
        let mut n = 0;
        for (i, priority, key, mask) in flows {
            assert!(i < u32::MAX as usize, "too many flows");
            groups.entry(mask).or_default().push((key.and(&mask), rank(priority, i)));
            n += 1;
        }
        let mut subtables: Vec<Subtable<N>> = groups.iter().map(|(mask, e)| Subtable::new(*mask, e)).collect();
        subtables.sort_unstable_by_key(|st| std::cmp::Reverse(st.max_rank));
        Classifier { subtables, flows: n }
    }

    /// Index of the winning flow for `key`: highest priority, then first in the list.
    #[inline]
    pub fn lookup(&self, key: &Key<N>) -> Option<u32> {
        self.lookup_counted(key).0
    }

    /// [`Classifier::lookup`], plus the number of subtables it visited.
    #[inline]
    pub fn lookup_counted(&self, key: &Key<N>) -> (Option<u32>, usize) {
        let mut best = 0;
        let mut visited = 0;
        for st in &self.subtables {
            if st.max_rank <= best {
                break;
            }
            visited += 1;
            best = best.max(st.find(key));
        }
        ((best != 0).then(|| rank_index(best)), visited)
    }

    /// Number of subtables (distinct masks).
    pub fn subtables(&self) -> usize {
        self.subtables.len()
    }

    /// Number of flows the classifier was built from.
    pub fn flows(&self) -> usize {
        self.flows
    }
}

/// The reference classifier: a linear scan with the same answers as [`Classifier`].
pub struct Linear {
    flows: Vec<(u16, super::Match)>,
}

impl Linear {
    pub fn new(flows: &[Flow]) -> Linear {
        Linear { flows: flows.iter().map(|f| (f.priority, super::Match::new(f.m.key, f.m.mask))).collect() }
    }

    /// Same contract as [`Classifier::lookup`].
    pub fn lookup(&self, key: &FlowKey) -> Option<u32> {
        let mut best: Option<(u16, u32)> = None;
        for (i, (prio, m)) in self.flows.iter().enumerate() {
            if m.matches(key) && best.is_none_or(|(p, _)| *prio > p) {
                best = Some((*prio, i as u32));
            }
        }
        best.map(|(_, i)| i)
    }
}

#[cfg(test)]
mod tests {
    use super::super::key::{Field, testutil::Rng};
    use super::super::{Match, parse_flow};
    use super::*;

    fn flows(specs: &[&str]) -> Vec<Flow> {
        let port = |s: &str| s.strip_prefix("p").and_then(|n| n.parse().ok());
        specs.iter().map(|s| parse_flow(s, &port).unwrap()).collect()
    }

    fn key(in_port: u16, nw_dst: [u8; 4], tp_dst: u16) -> FlowKey {
        FlowKey::default()
            .with(Field::InPort, in_port as u64)
            .with(Field::DlType, 0x0800)
            .with(Field::NwProto, 6)
            .with(Field::NwDst, u32::from_be_bytes(nw_dst) as u64)
            .with(Field::TpDst, tp_dst as u64)
    }

    #[test]
    fn priorities_and_ties() {
        let t = flows(&[
            "priority=10,ip,nw_dst=10.0.0.0/8 actions=p1",
            "priority=20,tcp,tp_dst=80 actions=p2",
            "priority=20,in_port=p3 actions=p3",
            "priority=20,ip,nw_dst=10.1.0.0/16 actions=p4",
            "priority=0 actions=normal",
            "priority=20,ip,nw_dst=10.1.0.0/16 actions=p5",
        ]);
        let c = Classifier::new(&t);
        let l = Linear::new(&t);
        assert_eq!(c.subtables(), 5);
        assert_eq!(c.flows(), 6);
        let cases = [
            (key(1, [10, 9, 9, 9], 22), Some(0)),
            (key(1, [10, 9, 9, 9], 80), Some(1)),
            (key(3, [10, 9, 9, 9], 80), Some(1)),
            (key(3, [10, 9, 9, 9], 81), Some(2)),
            (key(3, [10, 1, 9, 9], 81), Some(2)),
            (key(1, [10, 1, 9, 9], 81), Some(3)),
            (key(1, [11, 1, 9, 9], 81), Some(4)),
        ];
        for (k, want) in cases {
            assert_eq!(c.lookup(&k), want, "{k:?}");
            assert_eq!(l.lookup(&k), want, "{k:?}");
        }
        // The tcp,tp_dst=80 subtable holds the best rank: a hit there ends the search.
        assert_eq!(c.lookup_counted(&key(1, [10, 9, 9, 9], 80)), (Some(1), 1));
        assert_eq!(c.lookup_counted(&key(1, [11, 1, 9, 9], 81)), (Some(4), 5));
        let empty = Classifier::new(&[]);
        assert_eq!((empty.lookup(&key(1, [1, 1, 1, 1], 1)), empty.subtables()), (None, 0));
    }

    #[test]
    fn no_match_visits_all() {
        let t = flows(&["priority=5,in_port=p1 actions=drop", "priority=6,tcp,tp_dst=80 actions=drop"]);
        let c = Classifier::new(&t);
        assert_eq!(c.lookup_counted(&key(2, [1, 1, 1, 1], 81)), (None, 2));
    }

    /// A random match over a small alphabet, so that random keys often match.
    fn random_match(rng: &mut Rng) -> Match {
        let mut k = FlowKey::default();
        let mut m = FlowKey::default();
        let mut field = |f: Field, vals: &[u64], masks: &[u64], rng: &mut Rng| {
            if rng.below(2) == 0 {
                let mask = rng.pick(masks);
                m.set(f, mask);
                k.set(f, rng.pick(vals) & mask);
            }
        };
        field(Field::InPort, &[0, 1, 2], &[0xffff], rng);
        field(Field::DlType, &[0x800, 0x806], &[0xffff], rng);
        field(
            Field::NwDst,
            &[0x0a00_0001, 0x0a00_0101, 0x0b00_0001],
            &[!0, 0xffff_ff00, 0xff00_0000, 0xffff_0000],
            rng,
        );
        field(Field::NwProto, &[6, 17], &[0xff], rng);
        field(Field::TpDst, &[80, 0x1050, 443], &[0xffff, 0xf000, 0x00ff], rng);
        field(Field::VlanTci, &[0, 0x1005, 0x3005], &[0xffff, 0x1fff, 0xf000], rng);
        Match::new(k, m)
    }

    fn random_key(rng: &mut Rng) -> FlowKey {
        FlowKey::default()
            .with(Field::InPort, rng.below(3))
            .with(Field::DlType, rng.pick(&[0x800, 0x806, 0x86dd]))
            .with(Field::NwDst, rng.pick(&[0x0a00_0001, 0x0a00_0101, 0x0b00_0001, 0x0a00_0102, 0x0b01_0001]))
            .with(Field::NwProto, rng.pick(&[6, 17, 1]))
            .with(Field::TpDst, rng.pick(&[80, 0x1050, 443, 0x1000, 0x2050]))
            .with(Field::VlanTci, rng.pick(&[0, 0x1005, 0x3005, 0x1006]))
            .with(Field::TpSrc, rng.below(4))
    }

    #[test]
    fn random_tables_agree_with_linear() {
        let mut rng = Rng(0x5eed_1234_abcd_0001);
        let mut matched = 0u64;
        let mut total = 0u64;
        for table in 0..200 {
            let n = 1 + rng.below(300) as usize;
            let prios: &[u16] = if table % 2 == 0 { &[0, 1, 2, 3, 100, 32768, 65535] } else { &[7] };
            let t: Vec<Flow> = (0..n)
                .map(|_| Flow { table: 0, priority: rng.pick(prios), m: random_match(&mut rng), actions: vec![] })
                .collect();
            let c = Classifier::new(&t);
            let l = Linear::new(&t);
            assert!(c.subtables() <= n);
            for _ in 0..1000 {
                let k = random_key(&mut rng);
                let (got, visited) = c.lookup_counted(&k);
                assert_eq!(got, l.lookup(&k), "table {table} key {k:?}");
                assert!(visited <= c.subtables());
                matched += got.is_some() as u64;
                total += 1;
            }
        }
        // The alphabet is small enough that most lookups hit something, but not all.
        assert!(matched > total / 2 && matched < total, "{matched}/{total}");
    }
}
