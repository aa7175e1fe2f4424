//! Once-a-second samples of the poll threads' and receive queues' counters: the control
//! thread takes one per second, so rates, busy shares and queue loads (for `stats`, `rxq` and
//! rebalancing) cover the last interval; `stats --clear` keeps a baseline here.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::Switch;
use super::placement::QueueId;
use crate::datapath::counters::{LoopTotals, PortTotals, ThreadStats, Total};

const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One poll thread's totals at one moment: its loop counters and its ports' counters summed.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadTotals {
    pub loops: LoopTotals,
    pub ports: PortTotals,
}

impl ThreadTotals {
    pub fn read(th: &ThreadStats) -> ThreadTotals {
        let mut ports = PortTotals::default();
        for p in th.ports.iter() {
            ports.add(&p.read());
        }
        ThreadTotals { loops: th.loops.read(), ports }
    }

    /// `self - base`, counter by counter.
    pub fn since(&self, base: &ThreadTotals) -> ThreadTotals {
        ThreadTotals { loops: self.loops.since(&base.loops), ports: self.ports.since(&base.ports) }
    }

    pub fn busy(&self) -> u64 {
        self.loops.busy_cycles
    }

    /// Busy and idle cycles: the time the thread polled.
    pub fn polled(&self) -> u64 {
        self.loops.busy_cycles + self.loops.idle_cycles
    }
}

/// The counters at one moment.
pub struct Snap {
    at: Instant,
    pub threads: Vec<ThreadTotals>,
    /// (packets, cycles) per receive queue.
    pub rxqs: HashMap<QueueId, (u64, u64)>,
}

/// The last interval between two samples.
pub struct Interval<'a> {
    pub seconds: f64,
    pub later: &'a Snap,
    pub earlier: &'a Snap,
}

impl Interval<'_> {
    /// Thread `i`'s counters over the interval.
    pub fn thread(&self, i: usize) -> Option<ThreadTotals> {
        Some(self.later.threads.get(i)?.since(self.earlier.threads.get(i)?))
    }

    /// Receive queue `q`'s (packets, cycles) over the interval.
    pub fn rxq(&self, q: QueueId) -> Option<(u64, u64)> {
        let (lp, lc) = *self.later.rxqs.get(&q)?;
        let (ep, ec) = self.earlier.rxqs.get(&q).copied().unwrap_or((0, 0));
        Some((lp.saturating_sub(ep), lc.saturating_sub(ec)))
    }
}

/// The last two once-a-second samples, and the `stats --clear` baseline.
#[derive(Default)]
pub struct Samples {
    next: Option<Instant>,
    prev: Option<Snap>,
    last: Option<Snap>,
    base: Vec<ThreadTotals>,
    cleared_at: Option<Instant>,
}

impl Samples {
    /// How long until the next sample is due (zero: now).
    pub fn due_in(&self) -> Duration {
        self.next.map_or(Duration::ZERO, |n| n.saturating_duration_since(Instant::now()))
    }

    /// The last interval (None before two samples).
    pub fn interval(&self) -> Option<Interval<'_>> {
        let (p, l) = (self.prev.as_ref()?, self.last.as_ref()?);
        Some(Interval { seconds: l.at.duration_since(p.at).as_secs_f64().max(1e-9), later: l, earlier: p })
    }

    /// Thread `i`'s totals at the last `stats --clear`, if there was one.
    pub fn base(&self, i: usize) -> Option<&ThreadTotals> {
        self.base.get(i)
    }

    pub fn cleared_at(&self) -> Option<Instant> {
        self.cleared_at
    }
}

/// `part` as a percentage of `whole` (0 when `whole` is 0).
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

impl Switch {
    /// Each receive queue's busy cycles over the last interval (empty before two samples).
    pub fn rxq_interval_cycles(&self) -> HashMap<QueueId, u64> {
        let Some(iv) = self.samples.interval() else { return HashMap::new() };
        iv.later.rxqs.keys().filter_map(|&k| Some((k, iv.rxq(k)?.1))).collect()
    }

    /// Each poll thread's busy share over the last interval, in percent.
    pub fn busy_pct_last(&self) -> Vec<f64> {
        let Some(iv) = self.samples.interval() else { return Vec::new() };
        (0..iv.later.threads.len()).filter_map(|i| iv.thread(i)).map(|d| pct(d.busy(), d.polled())).collect()
    }

    /// Takes the once-a-second sample.
    pub fn sample(&mut self) {
        let snap = Snap {
            at: Instant::now(),
            threads: self.threads.iter().map(|t| ThreadTotals::read(&t.stats)).collect(),
            rxqs: self.rxq_stats.iter().map(|(k, s)| (*k, (s.packets.load(Relaxed), s.cycles.load(Relaxed)))).collect(),
        };
        let s = &mut self.samples;
        s.prev = s.last.take();
        s.last = Some(snap);
        s.next = Some(Instant::now() + SAMPLE_EVERY);
        self.conntrack_tick();
        if let Some(x) = &self.export {
            x.tick(crate::export::now_ms(), false);
        }
    }

    /// `stats --clear`: what `stats` shows starts again from zero. Totals elsewhere (`ports`,
    /// Prometheus) are untouched.
    pub fn clear_stats(&mut self) {
        self.samples.base = self.threads.iter().map(|t| ThreadTotals::read(&t.stats)).collect();
        self.samples.cleared_at = Some(Instant::now());
    }
}
