//! Two-dimensional deficit round robin (DRR) over a poll thread's receive queues.
//!
//! Each receive queue has a quantum in packets *and* bytes (its weights; defaults 256 frames /
//! 512 KiB, as Linux vhost-net's per-visit limits) and a [`Deficit`]: its credit in both
//! dimensions. A poll thread visits its queues round robin; a visit goes like this:
//!
//! ```text
//! let mut b = deficit.start_visit(quantum);   // credit += one quantum (carry-over capped)
//! while b.allows() {                          // both credits positive
//!     let n = available.min(burst).min(b.burst_limit());
//!     if n == 0 { break }
//!     ... take n frames, of `bytes` bytes in all ...
//!     b.charge(n, bytes);                     // may overdraw: frames are never split
//! }
//! if the queue had nothing at the visit's start { deficit.idle() }
//! ```
//!
//! Exact rules, for credit `c` and quantum `q` in each dimension separately:
//!
//! - **start of a visit**: `c = min(c, q) + q`. Credit left unused by the previous visit carries
//!   over, but by at most one quantum, so credit never exceeds two quanta: a queue that was
//!   short of frames for a while cannot burst for long when it comes back. A negative credit
//!   (an overdraft) is kept whole and reduces this visit's credit.
//! - **during a visit**: frames are taken while *both* credits are positive; the visit ends as
//!   soon as either is spent (≤ 0). The packet credit also limits a burst's size. Both can go
//!   negative: a frame is never split, so the last burst may overdraw the byte credit by up to
//!   one burst of frames; and the data path charges the packet credit for work, not frames
//!   alone (a burst of long descriptor chains costs more than its frame count), so a queue of
//!   pathological chains overdraws it and is repaid from its later visits.
//! - **overdraft**: a negative credit is repaid from the next visit's quantum, so over many
//!   visits a busy queue gets exactly its quantum per visit on average, in whichever dimension
//!   limits it.
//! - **idle**: a queue that had nothing to send at its visit accumulates no credit: positive
//!   credit is reset to zero (an overdraft is not forgiven). This is classic DRR's "an empty
//!   queue's deficit is reset", and is what keeps a mostly idle queue from saving up credit.
//!
//! With every queue always busy, a queue's share of a poll thread's frames and bytes is
//! therefore set by whichever dimension runs out first for it: with equal-size frames and
//! packet-limited visits, shares are proportional to the packet quanta; with byte-limited
//! visits, to the byte quanta. See the tests for both, and for mixed frame sizes.
#![forbid(unsafe_code)]

/// A queue's weights: the credit one visit adds in each dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantum {
    pub packets: u32,
    pub bytes: u32,
}

impl Quantum {
    /// The defaults: 256 frames or 512 KiB per visit, whichever first.
    pub const DEFAULT: Quantum = Quantum { packets: 256, bytes: 512 * 1024 };
}

impl Default for Quantum {
    fn default() -> Quantum {
        Quantum::DEFAULT
    }
}

/// A queue's credit in packets and bytes, carried from one visit to the next. Starts at zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deficit {
    packets: i64,
    bytes: i64,
}

impl Deficit {
    #[cfg(test)]
    pub const fn new() -> Deficit {
        Deficit { packets: 0, bytes: 0 }
    }

    /// Credit in frames (negative: an overdraft to repay).
    #[cfg(test)]
    pub fn packets(&self) -> i64 {
        self.packets
    }

    /// Credit in bytes (negative: an overdraft to repay).
    #[cfg(test)]
    pub fn bytes(&self) -> i64 {
        self.bytes
    }

    /// Starts a visit: adds one quantum to each credit after capping the carried-over credit at
    /// one quantum (so credit is at most two quanta). Returns the visit's budget, which charges
    /// this deficit.
    pub fn start_visit(&mut self, q: Quantum) -> Budget<'_> {
        self.packets = self.packets.min(q.packets as i64) + q.packets as i64;
        self.bytes = self.bytes.min(q.bytes as i64) + q.bytes as i64;
        Budget { d: self }
    }

    /// True while both credits are positive: the visit may take another burst.
    pub fn allows(&self) -> bool {
        self.packets > 0 && self.bytes > 0
    }

    /// The most frames the next burst may take: the packet credit (0 when spent).
    pub fn burst_limit(&self) -> u32 {
        self.packets.clamp(0, u32::MAX as i64) as u32
    }

    /// Charges frames taken. Either credit may go negative; the overdraft is repaid from the
    /// next visit.
    pub fn charge(&mut self, packets: u32, bytes: u64) {
        self.packets -= packets as i64;
        self.bytes = self.bytes.saturating_sub(bytes.min(i64::MAX as u64) as i64);
    }

    /// The queue had nothing to send at its visit: it keeps no positive credit (an overdraft
    /// stays).
    pub fn idle(&mut self) {
        self.packets = self.packets.min(0);
        self.bytes = self.bytes.min(0);
    }
}

/// One visit's view of a queue's [`Deficit`].
#[derive(Debug)]
pub struct Budget<'a> {
    d: &'a mut Deficit,
}

impl Budget<'_> {
    /// The queue was empty at this visit (see [`Deficit::idle`]).
    #[cfg(test)]
    pub fn idle(self) {
        self.d.idle();
    }

    /// True while both credits are positive.
    pub fn allows(&self) -> bool {
        self.d.allows()
    }

    /// The most frames the next burst may take.
    pub fn burst_limit(&self) -> u32 {
        self.d.burst_limit()
    }

    /// Charges a burst (see [`Deficit::charge`]).
    pub fn charge(&mut self, packets: u32, bytes: u64) {
        self.d.charge(packets, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BURST: u32 = 32;

    /// One visit to an always-busy queue of `frame`-byte frames; returns (frames, bytes) taken.
    fn visit(d: &mut Deficit, q: Quantum, frame: u64) -> (u64, u64) {
        let mut b = d.start_visit(q);
        let (mut n, mut bytes) = (0u64, 0u64);
        while b.allows() {
            let k = BURST.min(b.burst_limit());
            b.charge(k, k as u64 * frame);
            n += k as u64;
            bytes += k as u64 * frame;
        }
        (n, bytes)
    }

    #[test]
    fn packet_limited() {
        let mut d = Deficit::new();
        let q = Quantum { packets: 100, bytes: 1 << 20 };
        // 100 frames of 64 B: the packet credit runs out first; the last burst is cut to fit.
        assert_eq!(visit(&mut d, q, 64), (100, 6400));
        assert_eq!(d.packets(), 0);
        assert_eq!(d.bytes(), (1 << 20) - 6400);
    }

    #[test]
    fn byte_limited() {
        let mut d = Deficit::new();
        let q = Quantum { packets: 256, bytes: 10_000 };
        // 1500 B frames in bursts of 32: the first burst (48 000 B) already spends the bytes.
        assert_eq!(visit(&mut d, q, 1500), (32, 48_000));
        assert_eq!(d.bytes(), 10_000 - 48_000);
        assert_eq!(d.packets(), 256 - 32);
    }

    #[test]
    fn carry_over_is_capped_at_one_quantum() {
        let mut d = Deficit::new();
        let q = Quantum { packets: 10, bytes: 1000 };
        // Three visits that take nothing but are not idle (e.g. the destination was full).
        for _ in 0..3 {
            let _ = d.start_visit(q);
        }
        assert_eq!((d.packets(), d.bytes()), (20, 2000), "credit never exceeds two quanta");
        // Some credit left over: it carries, capped.
        d.charge(15, 100);
        let _ = d.start_visit(q);
        assert_eq!((d.packets(), d.bytes()), (15, 2000));
    }

    #[test]
    fn overdraft_is_repaid_next_visit() {
        let mut d = Deficit::new();
        let q = Quantum { packets: 256, bytes: 3000 };
        let mut b = d.start_visit(q);
        b.charge(3, 4500); // one burst of three 1500 B frames: 1500 B overdrawn
        assert!(!b.allows());
        assert_eq!(d.bytes(), -1500);
        let b = d.start_visit(q);
        assert!(b.allows());
        assert_eq!(d.bytes(), 1500, "next visit gets one quantum minus the overdraft");
        // A bigger overdraft than a quantum skips visits until repaid.
        d.charge(1, 9000);
        assert_eq!(d.bytes(), -7500);
        assert!(!d.start_visit(q).allows());
        assert!(!d.start_visit(q).allows());
        assert!(d.start_visit(q).allows());
        assert_eq!(d.bytes(), 1500);
    }

    #[test]
    fn idle_queue_accumulates_nothing() {
        let mut d = Deficit::new();
        let q = Quantum { packets: 8, bytes: 800 };
        for _ in 0..100 {
            d.start_visit(q).idle();
        }
        assert_eq!((d.packets(), d.bytes()), (0, 0));
        // When it wakes up it gets exactly one quantum.
        assert_eq!(visit(&mut d, q, 10), (8, 80));
        // An overdraft survives idleness.
        let mut b = d.start_visit(q);
        b.charge(1, 5000);
        d.idle();
        assert_eq!(d.bytes(), 800 - 80 + 800 - 5000);
        assert_eq!(d.packets(), 0);
    }

    /// Runs DRR rounds over always-busy queues; returns each queue's (frames, bytes).
    fn simulate(queues: &[(Quantum, u64)], rounds: usize) -> Vec<(u64, u64)> {
        let mut ds = vec![Deficit::new(); queues.len()];
        let mut out = vec![(0, 0); queues.len()];
        for _ in 0..rounds {
            for (i, &(q, frame)) in queues.iter().enumerate() {
                let (n, b) = visit(&mut ds[i], q, frame);
                out[i].0 += n;
                out[i].1 += b;
            }
        }
        out
    }

    fn shares(v: &[u64]) -> Vec<f64> {
        let total: u64 = v.iter().sum();
        v.iter().map(|&x| x as f64 / total as f64).collect()
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 0.01, "shares {got:?}, expected {want:?} within 1%");
        }
    }

    #[test]
    fn weighted_shares_1_1_2_4() {
        let q = |p: u32| Quantum { packets: 64 * p, bytes: 512 * 1024 };
        let queues = [(q(1), 256), (q(1), 256), (q(2), 256), (q(4), 256)];
        let out = simulate(&queues, 1000);
        let pk: Vec<u64> = out.iter().map(|o| o.0).collect();
        assert_close(&shares(&pk), &[0.125, 0.125, 0.25, 0.5]);
    }

    /// Equal weights, one queue of 64 B frames and one of 1500 B frames.
    ///
    /// - With the default quanta (256 frames / 512 KiB), both queues are packet-limited (256 ×
    ///   1500 B = 375 000 B < 512 KiB), so DRR predicts equal *packet* shares, 1/2 each, and
    ///   *byte* shares proportional to frame size: 64/1564 = 4.09 % and 1500/1564 = 95.91 %.
    /// - With a byte quantum of 64 KiB the big-frame queue becomes byte-limited: per visit the
    ///   64 B queue takes 256 frames (16 KiB) and the 1500 B queue 65 536 B on average (its
    ///   overdraft is repaid), i.e. 43.69 frames. DRR predicts byte shares 16 384 : 65 536 =
    ///   20 % : 80 %, and packet shares 256 : 43.69 = 85.42 % : 14.58 %.
    #[test]
    fn mixed_frame_sizes() {
        let out = simulate(&[(Quantum::DEFAULT, 64), (Quantum::DEFAULT, 1500)], 1000);
        assert_close(&shares(&[out[0].0, out[1].0]), &[0.5, 0.5]);
        assert_close(&shares(&[out[0].1, out[1].1]), &[64.0 / 1564.0, 1500.0 / 1564.0]);

        let q = Quantum { packets: 256, bytes: 64 * 1024 };
        let out = simulate(&[(q, 64), (q, 1500)], 1000);
        assert_close(&shares(&[out[0].1, out[1].1]), &[0.2, 0.8]);
        let big = 65536.0 / 1500.0;
        assert_close(&shares(&[out[0].0, out[1].0]), &[256.0 / (256.0 + big), big / (256.0 + big)]);
    }
}
