//! The flow table a poll thread classifies with: the configured flows compiled into a
//! classifier per table, with per-thread packet and byte counters for each flow. With no flows
//! configured the switch behaves as one `actions=normal` flow and skips classification.
//!
//! Flows are kept sorted by table (stably: within a table, in the order given), so table 0's
//! flows are the first and its classifier's answers are the flows' indices as they are; a later
//! table's classifier answers from its first flow's index on. A frame meets table 0 through the
//! exact-match cache; the tables after it (`resubmit`, `goto_table`, `ct(table=N)`) only in the
//! pipeline stage (`datapath/pipeline.rs`), through [`FlowTable::lookup_in`].
//!
//! A table is immutable once built; a reload builds a new one (carrying over the counters of
//! flows that did not change) and the poll threads switch to it with their next plan.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::counter::bump;
use crate::flow::key::PACKET_WORDS;
use crate::flow::{Action, Classifier, Depth, Emc, Field, Flow, FlowKey, PacketKey, parse_flow};

/// What classification returns when no flow matches.
pub const NO_MATCH: u32 = u32::MAX;

/// A flow's actions, reduced to the forms the data path handles without running an action
/// list (every flow that neither rewrites headers nor outputs more than once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Normal,
    Output(u16),
    InPort,
    Flood,
    Drop,
    /// Run the action list (header rewrites, several outputs).
    Actions,
    /// Follow the flow to other tables or the connection tracker first (`datapath/pipeline.rs`).
    Pipeline,
}

fn verdict(actions: &[Action]) -> Verdict {
    if actions.iter().any(Action::is_pipeline) {
        return Verdict::Pipeline;
    }
    match actions {
        [] | [Action::Drop] => Verdict::Drop,
        [Action::Normal] => Verdict::Normal,
        [Action::Output(p)] => Verdict::Output(*p),
        [Action::InPort] => Verdict::InPort,
        [Action::Flood] | [Action::All] => Verdict::Flood,
        _ => Verdict::Actions,
    }
}

pub struct FlowEntry {
    pub flow: Flow,
    pub verdict: Verdict,
    /// Packets and bytes counted by an earlier table for this same flow.
    base: (u64, u64),
}

#[derive(Default)]
struct FlowCounter {
    packets: AtomicU64,
    bytes: AtomicU64,
}

/// Padding after each thread's counter array, so two threads' arrays never share a cache line.
const PAD: usize = 4;

#[derive(Default)]
pub struct FlowTable {
    entries: Vec<FlowEntry>,
    /// Each entry's verdict, packed (the data path reads one a frame; an entry is several
    /// cache lines apart from the next).
    verdicts: Box<[Verdict]>,
    /// Table 0 as a frame first meets it (untracked: the flows whose tracker match a tracker
    /// word of 0 satisfies), over packet keys; None when there are no flows.
    cls: Option<Classifier<PACKET_WORDS>>,
    /// Each table that has flows, over full keys (for walks through the tables, which may
    /// come back to table 0 tracked).
    tables: Vec<(u8, Classifier)>,
    /// Whether some flow has a `ct` action (the plan then gives the pipeline a tracker).
    uses_ct: bool,
    has_pipeline: bool,
    /// Per poll thread, per flow; written only by that thread.
    counters: Vec<Box<[FlowCounter]>>,
    /// Per poll thread: frames no flow matched.
    missed: Vec<Box<[FlowCounter]>>,
    created: Option<Instant>,
    /// The union of table 0's masks: the fields the winning flow depends on.
    scope: PacketKey,
    /// How deep into a frame those fields lie.
    depth: Depth,
    /// How deep the fields of every table's flows lie (the pipeline's keys).
    all_depth: Depth,
    /// When the flows match on in_port alone: the flow each port id hits (ids past the end hit
    /// `by_port_rest`).
    by_port: Vec<u32>,
    by_port_rest: u32,
}

impl FlowTable {
    /// Compiles flows given in ovs-ofctl syntax (the configuration has validated them), naming
    /// ports by the ids `port_id` gives. Counters of flows that are unchanged from `old` carry
    /// over.
    pub fn build<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        port_id: &dyn Fn(&str) -> Option<u16>,
        threads: usize,
        old: Option<&FlowTable>,
    ) -> Result<FlowTable, String> {
        let mut entries = Vec::new();
        for text in texts {
            let flow = parse_flow(text, port_id).map_err(|e| format!("flow \"{text}\": {}", e.message))?;
            let verdict = verdict(&flow.actions);
            entries.push(FlowEntry { flow, verdict, base: (0, 0) });
        }
        entries.sort_by_key(|e| e.flow.table);
        if let Some(old) = old {
            for e in &mut entries {
                if let Some(i) = old.entries.iter().position(|o| o.flow == e.flow) {
                    e.base = old.totals(i);
                }
            }
        }
        let n = entries.len();
        let flows: Vec<Flow> = entries.iter().map(|e| e.flow.clone()).collect();
        let first_later = flows.iter().position(|f| f.table != 0).unwrap_or(n);
        let untracked = |f: &&Flow| f.m.key.full_only() == 0;
        let zero = flows[..first_later].iter().enumerate().filter(|(_, f)| untracked(f));
        let cls =
            (n > 0).then(|| Classifier::build(zero.map(|(i, f)| (i, f.priority, f.m.key.packet(), f.m.mask.packet()))));
        let mut tables = Vec::new();
        let mut start = 0;
        while start < n {
            let t = flows[start].table;
            let end = flows[start..].iter().position(|f| f.table != t).map_or(n, |e| start + e);
            let of_t = flows[start..end].iter().enumerate().map(|(i, f)| (start + i, f.priority, f.m.key, f.m.mask));
            tables.push((t, Classifier::build(of_t)));
            start = end;
        }
        let scope = flows[..first_later].iter().fold(PacketKey::default(), |u, f| u.or(&f.m.mask.packet()));
        let all_depth = flows.iter().fold(FlowKey::default(), |u, f| u.or(&f.m.mask)).depth();
        let uses_ct = flows.iter().any(|f| f.actions.iter().any(|a| matches!(a, Action::Ct(_))));

        let counters = (0..threads).map(|_| (0..n + PAD).map(|_| FlowCounter::default()).collect()).collect();
        let missed = (0..threads).map(|_| (0..1 + PAD).map(|_| FlowCounter::default()).collect()).collect();
        let verdicts = entries.iter().map(|e| e.verdict).collect();
        let has_pipeline = entries.iter().any(|e| e.flow.table == 0 && e.verdict == Verdict::Pipeline);
        let mut t = FlowTable {
            verdicts,
            entries,
            cls,
            tables,
            uses_ct,
            has_pipeline,
            counters,
            missed,
            created: Some(Instant::now()),
            scope,
            depth: scope.depth(),
            all_depth,
            by_port: Vec::new(),
            by_port_rest: NO_MATCH,
        };
        if t.depth == Depth::Port {
            // Ports a flow names, and one id past them that stands for every other port.
            let ids = flows.iter().filter(|f| f.m.mask.get(Field::InPort) != 0).map(|f| f.m.key.get(Field::InPort));
            let end = ids.max().map_or(0, |m| m as usize + 1);
            let at = |p: usize| t.lookup(&PacketKey::default().with(Field::InPort, p as u64));
            let (by_port, rest) = ((0..end).map(at).collect(), at(end));
            (t.by_port, t.by_port_rest) = (by_port, rest);
        }
        Ok(t)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[FlowEntry] {
        &self.entries
    }

    /// Seconds since this table was installed.
    pub fn age_secs(&self) -> f64 {
        self.created.map_or(0.0, |t| t.elapsed().as_secs_f64())
    }

    /// True when there are no flows: every frame takes the NORMAL (MAC learning) path.
    #[inline]
    pub fn is_normal(&self) -> bool {
        self.cls.is_none()
    }

    /// The fields some flow of table 0 matches on (the union of their masks). Which flow a frame
    /// hits depends on these bits of its key alone, so two keys equal under this mask hit the
    /// same flow, and a key needs to be extracted only to [`FlowTable::depth`].
    #[inline]
    pub fn scope(&self) -> &PacketKey {
        &self.scope
    }

    /// How deep into a frame the fields of [`FlowTable::scope`] lie.
    #[inline]
    pub fn depth(&self) -> Depth {
        self.depth
    }

    /// With flows that match on in_port alone (depth [`Depth::Port`]), the flow a frame from
    /// `in_port` hits, whatever it carries; else None.
    #[inline]
    pub fn port_flow(&self, in_port: u16) -> Option<u32> {
        (self.depth == Depth::Port).then(|| *self.by_port.get(in_port as usize).unwrap_or(&self.by_port_rest))
    }

    /// The flow a key already under [`FlowTable::scope`] hits, through this thread's
    /// exact-match cache, given the key's [`FlowKey::hash`]; NO_MATCH if none. The cache holds
    /// keys under the scope, so frames that differ only in fields no flow looks at share an
    /// entry. A wrong hash costs a cache miss, never a wrong flow: the cache compares whole
    /// keys.
    #[inline]
    pub fn classify_masked(&self, emc: &mut Emc, key: &PacketKey, hash: u64) -> u32 {
        if let Some(i) = emc.lookup(key, hash) {
            return i;
        }
        let i = self.lookup(key);
        emc.insert(key, hash, i);
        i
    }

    /// The flow an untracked frame's key hits in table 0, without a cache; NO_MATCH if none.
    pub fn lookup(&self, key: &PacketKey) -> u32 {
        self.cls.as_ref().and_then(|c| c.lookup(key)).unwrap_or(NO_MATCH)
    }

    /// The flow a key (tracker's word and all) hits in table `table`; NO_MATCH if none (a
    /// table without flows has none).
    pub fn lookup_in(&self, table: u8, key: &FlowKey) -> u32 {
        match self.tables.iter().find(|(t, _)| *t == table) {
            Some((_, cls)) => cls.lookup(key).unwrap_or(NO_MATCH),
            None => NO_MATCH,
        }
    }

    /// How deep into a frame the fields of every table's flows lie: what the pipeline stage
    /// extracts.
    pub fn all_depth(&self) -> Depth {
        self.all_depth
    }

    /// Whether some flow of table 0 goes on to other tables or the tracker.
    #[inline]
    pub fn has_pipeline(&self) -> bool {
        self.has_pipeline
    }

    /// Whether some flow has a `ct` action.
    pub fn uses_ct(&self) -> bool {
        self.uses_ct
    }

    /// The tables that have flows, in order.
    pub fn tables(&self) -> impl Iterator<Item = u8> + '_ {
        self.tables.iter().map(|(t, _)| *t)
    }

    /// Counts `packets` frames of `bytes` bytes on flow `i` (or as misses), in thread
    /// `thread`'s counters.
    #[inline]
    pub fn count(&self, thread: usize, i: u32, packets: u64, bytes: u64) {
        let c = if i == NO_MATCH { &self.missed[thread][0] } else { &self.counters[thread][i as usize] };
        bump(&c.packets, packets);
        bump(&c.bytes, bytes);
    }

    #[inline]
    pub fn verdict(&self, i: u32) -> Verdict {
        self.verdicts[i as usize]
    }

    #[inline]
    pub fn actions(&self, i: u32) -> &[Action] {
        &self.entries[i as usize].flow.actions
    }

    /// Packets and bytes flow `i` matched, over every thread and earlier identical flows.
    pub fn totals(&self, i: usize) -> (u64, u64) {
        let base = self.entries[i].base;
        self.counters.iter().fold(base, |(p, b), t| (p + t[i].packets.load(Relaxed), b + t[i].bytes.load(Relaxed)))
    }

    /// Frames no flow matched, over every thread.
    pub fn missed(&self) -> (u64, u64) {
        self.missed.iter().fold((0, 0), |(p, b), t| (p + t[0].packets.load(Relaxed), b + t[0].bytes.load(Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::key::testutil::Rng;

    fn table(flows: &[&str]) -> FlowTable {
        let id = |s: &str| s.strip_prefix("p").and_then(|n| n.parse().ok());
        FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap()
    }

    fn random_key(rng: &mut Rng) -> PacketKey {
        PacketKey::default()
            .with(Field::InPort, rng.below(8))
            .with(Field::DlType, rng.pick(&[0x800, 0x806, 0x86dd]))
            .with(Field::NwDst, 0x0a00_0000 | rng.below(4))
            .with(Field::TpDst, rng.below(3))
    }

    #[test]
    fn scope_and_depth_are_the_union_of_the_masks() {
        let t = table(&["in_port=p1,actions=output:p2", "priority=0,actions=drop"]);
        assert_eq!((t.depth(), *t.scope()), (Depth::Port, PacketKey::default().with(Field::InPort, u64::MAX)));
        let t = table(&["in_port=p1,actions=drop", "ip,nw_dst=10.0.0.1,actions=drop"]);
        assert_eq!(t.depth(), Depth::L3);
        assert_eq!(t.scope().get(Field::NwDst), u32::MAX as u64);
        assert_eq!((t.scope().get(Field::TpDst), t.scope().get(Field::DlSrc)), (0, 0));
        assert_eq!(table(&["tcp,tp_dst=80,actions=drop"]).depth(), Depth::L4);
        assert_eq!(table(&["actions=normal"]).depth(), Depth::Port);
    }

    #[test]
    fn in_port_tables_answer_by_port_as_the_classifier_does() {
        for flows in [
            &["in_port=p1,actions=output:p2", "in_port=p2,actions=output:p1"][..],
            &["priority=5,in_port=p3,actions=drop", "in_port=p0,actions=normal", "priority=1,actions=flood"],
            &["actions=normal"],
            &[],
        ] {
            let t = table(flows);
            if flows.is_empty() {
                continue; // no table at all: NORMAL, never classified
            }
            for p in 0..10u16 {
                let k = PacketKey::default().with(Field::InPort, p as u64).with(Field::NwDst, 7);
                assert_eq!(t.port_flow(p), Some(t.lookup(&k)), "{flows:?} port {p}");
            }
        }
        assert_eq!(table(&["in_port=p1,ip,actions=drop"]).port_flow(1), None);
    }

    #[test]
    fn classify_under_the_scope_agrees_with_lookup() {
        let t = table(&[
            "priority=10,in_port=p1,ip,nw_dst=10.0.0.1,actions=output:p2",
            "priority=20,tcp,tp_dst=1,actions=drop",
            "priority=5,in_port=p2,actions=normal",
            "priority=0,actions=drop",
        ]);
        let mut emc = Emc::new(16);
        let mut rng = Rng(5);
        for _ in 0..5000 {
            let k = random_key(&mut rng).with(Field::DlSrc, rng.next()).with(Field::TpSrc, rng.next());
            let m = k.and(t.scope());
            assert_eq!(t.classify_masked(&mut emc, &m, m.hash()), t.lookup(&k), "{k:?}");
        }
    }

    #[test]
    fn tables_answer_by_number_and_table_0_first_sees_frames_untracked() {
        let t = table(&[
            "table=2,priority=5,ip,actions=drop",
            "priority=10,ip,ct_state=-trk,actions=ct(table=2)",
            "priority=20,ip,ct_state=+trk,actions=output:p1",
            "table=2,priority=9,ip,ct_state=+trk+est,actions=output:p2",
            "priority=0,actions=drop",
        ]);
        // Sorted by table, stably: table 0's three first, in the order given.
        let order: Vec<(u8, u16)> = t.entries().iter().map(|e| (e.flow.table, e.flow.priority)).collect();
        assert_eq!(order, [(0, 10), (0, 20), (0, 0), (2, 5), (2, 9)]);
        assert_eq!(t.tables().collect::<Vec<_>>(), [0, 2]);
        let ip = PacketKey::default().with(Field::DlType, 0x800);
        // An untracked frame: the +trk flow cannot match it, so -trk wins.
        assert_eq!(t.lookup(&ip), 0);
        assert_eq!(t.lookup_in(0, &ip.full()), 0);
        // Back in table 0 tracked: +trk now wins (priority 20).
        let tracked = ip.full().with(Field::CtState, 0x20);
        assert_eq!(t.lookup_in(0, &tracked), 1);
        assert_eq!(t.lookup_in(2, &tracked), 3, "table 2: +trk but not +est");
        assert_eq!(t.lookup_in(2, &tracked.with(Field::CtState, 0x22)), 4);
        assert_eq!(t.lookup_in(7, &tracked), NO_MATCH, "a table without flows");
        assert!(t.has_pipeline() && t.uses_ct());
        assert_eq!(t.verdict(0), Verdict::Pipeline);
        assert!(!table(&["table=1,actions=drop", "actions=normal"]).has_pipeline(), "nothing goes to table 1");
    }
}
