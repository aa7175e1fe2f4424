//! A port's rate caps: token buckets in packets and in bits, one pair per direction, shared by
//! every poll thread that sends to or takes from the port (atomics, no lock), and kept across
//! reloads (a new cap changes the rate and depth, not the tokens a running port has).
//!
//! *Ingress* is what the port sends into the switch (a VM's TX): while it is over its cap its
//! queue is not visited, so the frames stay in the guest's ring (backpressure: the guest's own
//! TCP slows down) or in the NIC's. *Egress* is what the switch sends to it: a frame beyond the
//! cap is dropped and counted (`rate_cap`). A TSO frame costs the segments it stands for.
//!
//! A bucket may go into debt by one burst (a burst's frames are counted once it is sent): it is
//! then empty until the debt is repaid, so the average rate holds. A port without caps pays one
//! relaxed load of a flag per visit (ingress) and per frame delivered (egress).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};

use crate::config::RateCaps;
use crate::counter::{cycles, cycles_per_sec};

/// Fixed-point units per token (a packet, or a bit): refills of less than a token are kept.
const SCALE: u64 = 1 << 16;

/// One token bucket.
#[derive(Default)]
pub struct Bucket {
    /// Tokens per second; 0: no cap.
    rate: AtomicU64,
    /// Most units it holds.
    depth: AtomicU64,
    /// Units it holds (negative: a debt).
    units: AtomicI64,
    /// When it was last refilled (TSC).
    last: AtomicU64,
}

impl Bucket {
    /// Caps the bucket at `rate` tokens a second, holding at most `burst_ms` of them (and at
    /// least one frame's worth: 1 packet, or 64 KiB of bits). 0 removes the cap.
    pub fn set(&self, rate: u64, burst_ms: u32, floor: u64, now: u64) {
        let depth = ((rate as u128 * burst_ms as u128 / 1000) as u64).max(floor).saturating_mul(SCALE);
        let was = self.rate.swap(rate, Relaxed);
        self.depth.store(depth, Relaxed);
        if was == 0 {
            // A new cap starts full.
            self.units.store(depth as i64, Relaxed);
            self.last.store(now, Relaxed);
        } else {
            let _ = self.units.fetch_update(Relaxed, Relaxed, |u| Some(u.min(depth as i64)));
        }
    }

    #[inline]
    pub fn is_on(&self) -> bool {
        self.rate.load(Relaxed) != 0
    }

    pub fn rate(&self) -> u64 {
        self.rate.load(Relaxed)
    }

    /// Adds what accrued since the last refill (one thread wins each interval), then returns
    /// whole tokens held (negative: a debt). Only the time that made whole units is used up
    /// (rounded up to a cycle): the rest carries over, so frequent refills lose almost nothing
    /// to rounding. A full bucket lets time pass unused.
    /// At most one refill each 10 us (`hz / 100_000` cycles): the division stays off the
    /// per-frame path, and each refill adds enough units that rounding is negligible.
    #[inline]
    pub fn refill(&self, now: u64, hz: u64) -> i64 {
        let last = self.last.load(Relaxed);
        let depth = self.depth.load(Relaxed) as i64;
        if now > last && now - last >= hz / 100_000 {
            let per_sec = self.rate.load(Relaxed) as u128 * SCALE as u128;
            let hz = hz.max(1) as u128;
            if self.units.load(Relaxed) >= depth {
                let _ = self.last.compare_exchange(last, now, Relaxed, Relaxed);
            } else {
                let elapsed = (now - last) as u128;
                let add = (elapsed * per_sec / hz).min(i64::MAX as u128) as i64;
                // The cycles those units took, rounded up (at most `elapsed`): what is left is
                // under a cycle's worth, so a refill gives up less than 1/elapsed of its time.
                let used = (add as u128 * hz).div_ceil(per_sec.max(1)).min(elapsed) as u64;
                if add > 0 && self.last.compare_exchange(last, last + used, Relaxed, Relaxed).is_ok() {
                    let _ = self.units.fetch_update(Relaxed, Relaxed, |u| Some(u.saturating_add(add).min(depth)));
                }
            }
        }
        self.units.load(Relaxed).div_euclid(SCALE as i64)
    }

    /// Whole tokens held, as of the last refill.
    #[inline]
    pub fn held(&self) -> i64 {
        self.units.load(Relaxed).div_euclid(SCALE as i64)
    }

    /// Takes `n` tokens (the bucket may go into debt).
    #[inline]
    pub fn charge(&self, n: u64) {
        self.units.fetch_sub((n.saturating_mul(SCALE)).min(i64::MAX as u64) as i64, Relaxed);
    }
}

/// A port's four buckets.
#[derive(Default)]
pub struct PortRates {
    ingress: AtomicBool,
    egress: AtomicBool,
    pub ingress_pps: Bucket,
    pub ingress_bps: Bucket,
    pub egress_pps: Bucket,
    pub egress_bps: Bucket,
    hz: AtomicU64,
}

/// Frames and bits a frame costs on a wire: a TSO frame is the segments it stands for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub packets: u64,
    pub bits: u64,
}

impl Cost {
    pub fn add(&mut self, packets: u64, bytes: u64) {
        self.packets += packets;
        self.bits += bytes * 8;
    }

    /// Adds a frame of `len` bytes; a TSO frame (`tso`: its header length and MSS) counts as
    /// the segments it stands for, each with its own copy of the headers.
    #[inline]
    pub fn add_frame(&mut self, len: u64, tso: Option<(u16, u16)>) {
        match tso {
            Some((hdr, mss)) if mss > 0 => {
                let hdr = hdr as u64;
                let segs = len.saturating_sub(hdr).div_ceil(mss as u64).max(1);
                self.add(segs, len + (segs - 1) * hdr);
            }
            _ => self.add(1, len),
        }
    }
}

impl PortRates {
    /// Applies a port's caps (at start and on every reload).
    pub fn apply(&self, caps: &RateCaps) {
        let now = cycles();
        self.hz.store(cycles_per_sec(), Relaxed);
        self.apply_at(caps, now);
    }

    fn apply_at(&self, caps: &RateCaps, now: u64) {
        let b = caps.burst_ms;
        self.ingress_pps.set(caps.ingress_pps, b, 1, now);
        self.ingress_bps.set(caps.ingress_bps, b, 65536 * 8, now);
        self.egress_pps.set(caps.egress_pps, b, 1, now);
        self.egress_bps.set(caps.egress_bps, b, 65536 * 8, now);
        self.ingress.store(caps.ingress_pps != 0 || caps.ingress_bps != 0, Relaxed);
        self.egress.store(caps.egress_pps != 0 || caps.egress_bps != 0, Relaxed);
    }

    #[inline(always)]
    pub fn ingress_capped(&self) -> bool {
        self.ingress.load(Relaxed)
    }

    #[inline(always)]
    pub fn egress_capped(&self) -> bool {
        self.egress.load(Relaxed)
    }

    /// How many frames (at most `max`) the port may send into the switch now: 0 while it is
    /// over either ingress cap.
    #[inline]
    pub fn ingress_allows(&self, max: u32) -> u32 {
        self.allows(&self.ingress_pps, &self.ingress_bps, max, cycles)
    }

    /// Whether a frame may go to the port now (neither egress bucket is empty).
    #[inline]
    pub fn egress_allows(&self) -> bool {
        self.allows(&self.egress_pps, &self.egress_bps, 1, cycles) > 0
    }

    /// Up to `max` frames the two buckets allow. A bucket that holds enough is not refilled
    /// (nor the clock read): refills are lazy, the time since the last one is credited whole
    /// when one is needed.
    #[inline]
    fn allows(&self, pps: &Bucket, bps: &Bucket, max: u32, now: impl Fn() -> u64) -> u32 {
        let hz = self.hz.load(Relaxed);
        let mut n = max;
        if pps.is_on() {
            let mut held = pps.held();
            if held < max as i64 {
                held = pps.refill(now(), hz);
            }
            n = n.min(held.clamp(0, u32::MAX as i64) as u32);
        }
        if bps.is_on() && bps.held() <= 0 && bps.refill(now(), hz) <= 0 {
            n = 0;
        }
        n
    }

    pub fn charge_ingress(&self, c: Cost) {
        self.ingress_pps.charge(c.packets);
        self.ingress_bps.charge(c.bits);
    }

    pub fn charge_egress(&self, c: Cost) {
        self.egress_pps.charge(c.packets);
        self.egress_bps.charge(c.bits);
    }

    /// Tokens held now by each capped bucket (ingress pps, ingress bps, egress pps, egress
    /// bps; None where there is no cap), for `pvswitchctl ports`.
    pub fn tokens(&self) -> [Option<i64>; 4] {
        let (now, hz) = (cycles(), self.hz.load(Relaxed));
        [&self.ingress_pps, &self.ingress_bps, &self.egress_pps, &self.egress_bps]
            .map(|b| b.is_on().then(|| b.refill(now, hz)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 1_000_000;

    fn caps(ingress_pps: u64, ingress_bps: u64) -> RateCaps {
        RateCaps { ingress_pps, ingress_bps, burst_ms: 10, ..RateCaps::default() }
    }

    fn rates(c: &RateCaps) -> PortRates {
        let r = PortRates::default();
        r.hz.store(HZ, Relaxed);
        r.apply_at(c, 0);
        r
    }

    /// Taking frames as fast as allowed for a simulated second gives the cap, within the
    /// bucket's depth, however the second is cut into visits.
    #[test]
    fn a_bucket_gives_its_rate_over_time() {
        for (pps, step) in [(1000u64, 1u64), (1000, 37), (50_000, 3), (1_000_000, 1)] {
            let r = rates(&caps(pps, 0));
            let mut sent = 0u64;
            let mut now = 0;
            while now < HZ {
                let n = r.allows(&r.ingress_pps, &r.ingress_bps, 32, || now);
                r.charge_ingress(Cost { packets: n as u64, bits: 0 });
                sent += n as u64;
                now += step;
            }
            let depth = (pps / 100).max(1);
            assert!(sent >= pps && sent <= pps + depth + 32, "{pps} pps in steps of {step}: sent {sent}");
        }
    }

    /// A bits cap lets a burst go once the bucket holds anything, then holds the port until
    /// the debt is repaid: the average is the cap.
    #[test]
    fn a_bits_cap_averages_out_debts() {
        let r = rates(&caps(0, 8_000_000)); // 1 MB/s
        let (mut bytes, mut now) = (0u64, 0u64);
        while now < HZ {
            if r.allows(&r.ingress_pps, &r.ingress_bps, 32, || now) > 0 {
                // A burst of 32 frames of 1518 bytes.
                r.charge_ingress(Cost { packets: 32, bits: 32 * 1518 * 8 });
                bytes += 32 * 1518;
            }
            now += 10;
        }
        assert!((1_000_000..=1_000_000 + 10_000 + 65536 + 32 * 1518).contains(&bytes), "{bytes} bytes in a second");
    }

    /// A new cap starts full; a changed cap keeps its tokens (within the new depth); no cap
    /// lets everything through.
    #[test]
    fn reload_changes_the_rate_not_the_tokens() {
        let c = caps(1000, 0);
        let r = rates(&c);
        assert_eq!(r.allows(&r.ingress_pps, &r.ingress_bps, 32, || 0), 10);
        r.charge_ingress(Cost { packets: 10, bits: 0 });
        r.apply_at(&caps(2000, 0), 0);
        assert_eq!(r.allows(&r.ingress_pps, &r.ingress_bps, 32, || 0), 0, "a reload refilled the bucket");
        r.apply_at(&RateCaps::default(), 0);
        assert!(!r.ingress_capped());
        assert_eq!(r.tokens(), [None; 4]);
    }
}
