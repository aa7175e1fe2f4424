//! Measurement state with no per-packet allocation: a log-linear latency histogram and a
//! per-flow sequence tracker (loss, duplicates, reordering).

/// Sub-buckets per power of two: 32, so a bucket's width is at most 1/32 (3.1 %) of its value.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values below 2*SUB get a bucket each; above, 32 buckets per power of two up to 2^64.
const BUCKETS: usize = (2 * SUB + (64 - SUB_BITS as u64 - 1) * SUB) as usize;

/// Latency histogram in nanoseconds: values below 64 are exact, larger ones land in one of 32
/// buckets per power of two (relative error under 3.2 %). Percentiles report a bucket's
/// midpoint.
#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    n: u64,
    min: u64,
    max: u64,
    sum: u128,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram { counts: vec![0; BUCKETS].into_boxed_slice(), n: 0, min: u64::MAX, max: 0, sum: 0 }
    }

    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
        let m = (v >> (e - SUB_BITS)) & (SUB - 1);
        (2 * SUB + (e - SUB_BITS - 1) as u64 * SUB + m) as usize
    }

    /// The range [lo, hi) of values in bucket `i`.
    fn bounds(i: usize) -> (u64, u64) {
        let i = i as u64;
        if i < 2 * SUB {
            return (i, i + 1);
        }
        let e = (i - 2 * SUB) / SUB + SUB_BITS as u64 + 1;
        let m = (i - 2 * SUB) % SUB;
        let lo = (SUB + m) << (e - SUB_BITS as u64);
        (lo, lo.saturating_add(1 << (e - SUB_BITS as u64)))
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[Histogram::index(v)] += 1;
        self.n += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v as u128;
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.n += o.n;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.sum += o.sum;
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    pub fn min(&self) -> Option<u64> {
        (self.n > 0).then_some(self.min)
    }

    pub fn max(&self) -> Option<u64> {
        (self.n > 0).then_some(self.max)
    }

    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum as f64 / self.n as f64)
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding the
    /// ceil(q*n)-th smallest sample, clamped to [min, max].
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = Histogram::bounds(i);
                return Some((lo + (hi - lo) / 2).clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

/// Window of recent sequence numbers remembered per flow, for telling duplicates from late
/// frames.
pub const WINDOW: u64 = 4096;

/// One flow's receive side: frames from one source VM, numbered 0, 1, 2, ...
#[derive(Clone)]
pub struct FlowRx {
    /// One more than the highest sequence number seen (0: none yet).
    next: u64,
    /// Bit `s % WINDOW` is set if `s` (within WINDOW below `next`) has arrived.
    seen: Box<[u64; (WINDOW / 64) as usize]>,
    /// Frames received, duplicates included.
    pub received: u64,
    /// Frames whose sequence number had already arrived (within the window).
    pub duplicates: u64,
    /// Frames that arrived after a higher-numbered one of the same flow.
    pub reordered: u64,
    /// Frames more than WINDOW behind the highest: counted as reordered, not checked for
    /// duplication.
    pub too_late: u64,
}

impl Default for FlowRx {
    fn default() -> FlowRx {
        FlowRx {
            next: 0,
            seen: Box::new([0; (WINDOW / 64) as usize]),
            received: 0,
            duplicates: 0,
            reordered: 0,
            too_late: 0,
        }
    }
}

impl FlowRx {
    fn bit(&mut self, s: u64) -> (&mut u64, u64) {
        let i = s % WINDOW;
        (&mut self.seen[(i / 64) as usize], 1u64 << (i % 64))
    }

    /// Records sequence number `s`.
    #[inline]
    pub fn record(&mut self, s: u64) {
        self.received += 1;
        if s >= self.next {
            // New highest: forget what falls out of the window, from `next` up to `s`.
            if s - self.next >= WINDOW {
                self.seen.fill(0);
            } else {
                for x in self.next..s {
                    let (w, b) = self.bit(x);
                    *w &= !b;
                }
            }
            let (w, b) = self.bit(s);
            *w |= b;
            self.next = s + 1;
        } else if self.next - s > WINDOW {
            self.reordered += 1;
            self.too_late += 1;
        } else {
            let (w, b) = self.bit(s);
            if *w & b != 0 {
                self.duplicates += 1;
            } else {
                *w |= b;
                self.reordered += 1;
            }
        }
    }

    /// Distinct frames received (duplicates not counted).
    pub fn unique(&self) -> u64 {
        self.received - self.duplicates
    }

    /// One more than the highest sequence number received.
    pub fn highest_plus_one(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_cover_and_order() {
        let mut prev = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let i = Histogram::index(v);
            assert!(i < BUCKETS);
            assert!(i >= prev || v > 100_000);
            prev = i;
            let (lo, hi) = Histogram::bounds(i);
            assert!(lo <= v && (v < hi || hi == u64::MAX), "{v} in bucket {i} [{lo},{hi})");
        }
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        let within = |got: u64, want: f64| ((got as f64 - want) / want).abs() < 0.04;
        assert!(within(h.quantile(0.5).unwrap(), 500_000.0), "{:?}", h.quantile(0.5));
        assert!(within(h.quantile(0.99).unwrap(), 990_000.0));
        assert!(within(h.quantile(0.999).unwrap(), 999_000.0));
        assert_eq!(h.quantile(1.0), Some(1_000_000));
        assert_eq!(h.min(), Some(100));
    }

    #[test]
    fn flow_tracking() {
        let mut f = FlowRx::default();
        for s in [0, 1, 2, 4, 3, 3, 5, 5, 10] {
            f.record(s);
        }
        assert_eq!(f.received, 9);
        assert_eq!(f.duplicates, 2);
        assert_eq!(f.reordered, 1);
        assert_eq!(f.unique(), 7);
        assert_eq!(f.highest_plus_one(), 11); // 6..=9 missing: 11 - 7 = 4 lost
        // Far beyond the window, then a late one within it, then one too late.
        f.record(10 + 2 * WINDOW);
        f.record(10 + WINDOW + 100);
        f.record(10);
        assert_eq!((f.reordered, f.too_late, f.duplicates), (3, 1, 2));
    }
}
