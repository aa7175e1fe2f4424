//! The flow table a poll thread classifies with: the configured flows compiled into a
//! classifier, with per-thread packet and byte counters for each flow. With no flows
//! configured the switch behaves as one `actions=normal` flow and skips classification.
//!
//! A table is immutable once built; a reload builds a new one (carrying over the counters of
//! flows that did not change) and the poll threads switch to it with their next plan.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::counter::bump;
use crate::flow::{Action, Classifier, Emc, Flow, FlowKey, parse_flow};

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
}

fn verdict(actions: &[Action]) -> Verdict {
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
    /// None when there are no flows.
    cls: Option<Classifier>,
    /// Per poll thread, per flow; written only by that thread.
    counters: Vec<Box<[FlowCounter]>>,
    /// Per poll thread: frames no flow matched.
    missed: Vec<Box<[FlowCounter]>>,
    created: Option<Instant>,
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
        if let Some(old) = old {
            for e in &mut entries {
                if let Some(i) = old.entries.iter().position(|o| o.flow == e.flow) {
                    e.base = old.totals(i);
                }
            }
        }
        let n = entries.len();
        let flows: Vec<Flow> = entries.iter().map(|e| e.flow.clone()).collect();
        let cls = (n > 0).then(|| Classifier::new(&flows));
        let counters = (0..threads).map(|_| (0..n + PAD).map(|_| FlowCounter::default()).collect()).collect();
        let missed = (0..threads).map(|_| (0..1 + PAD).map(|_| FlowCounter::default()).collect()).collect();
        Ok(FlowTable { entries, cls, counters, missed, created: Some(Instant::now()) })
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

    /// The flow a key hits, through this thread's exact-match cache; NO_MATCH if none.
    #[inline]
    pub fn classify(&self, emc: &mut Emc, key: &FlowKey) -> u32 {
        let h = key.hash();
        if let Some(i) = emc.lookup(key, h) {
            return i;
        }
        let i = self.lookup(key);
        emc.insert(key, h, i);
        i
    }

    /// The flow a key hits, without a cache; NO_MATCH if none.
    pub fn lookup(&self, key: &FlowKey) -> u32 {
        self.cls.as_ref().and_then(|c| c.lookup(key)).unwrap_or(NO_MATCH)
    }

    /// Counts a frame on flow `i` (or as a miss), in thread `thread`'s counters.
    #[inline]
    pub fn count(&self, thread: usize, i: u32, bytes: u32) {
        let c = if i == NO_MATCH { &self.missed[thread][0] } else { &self.counters[thread][i as usize] };
        bump(&c.packets, 1);
        bump(&c.bytes, bytes as u64);
    }

    #[inline]
    pub fn verdict(&self, i: u32) -> Verdict {
        self.entries[i as usize].verdict
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
