//! The MAC learning table, shared by all poll threads without locks.
//!
//! Each entry is one `AtomicU64`: 48 bits of MAC and 16 bits of (port id + 1); 0 is empty.
//! Entries sit in 8-way buckets of one cache line. A lookup is a few relaxed loads. Learning
//! writes only when the entry is missing or the MAC moved to another port, so in steady state
//! poll threads only read the table and no cache line bounces between cores. Two threads
//! learning at once may race; the last store wins, which is the learning semantics anyway.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use crate::wire::MacAddr as Mac;

const WAYS: usize = 8;

#[repr(align(64))]
struct Bucket([AtomicU64; WAYS]);

pub struct MacTable {
    buckets: Box<[Bucket]>,
    mask: usize,
}

#[inline]
fn mac_bits(mac: &Mac) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac.0);
    u64::from_le_bytes(b)
}

impl MacTable {
    /// A table of `buckets` (rounded up to a power of two) buckets of 8 entries.
    pub fn new(buckets: usize) -> MacTable {
        let n = buckets.next_power_of_two().max(1);
        MacTable { buckets: (0..n).map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(0)))).collect(), mask: n - 1 }
    }

    #[inline]
    fn bucket(&self, bits: u64) -> &Bucket {
        let h = bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        &self.buckets[h as usize & self.mask]
    }

    #[inline]
    pub fn lookup(&self, mac: &Mac) -> Option<u16> {
        let bits = mac_bits(mac);
        for e in &self.bucket(bits).0 {
            let v = e.load(Relaxed);
            if v != 0 && v & 0xFFFF_FFFF_FFFF == bits {
                return Some((v >> 48) as u16 - 1);
            }
        }
        None
    }

    /// Records that `mac` lives behind `port`. Writes only if that is news.
    #[inline]
    pub fn learn(&self, mac: &Mac, port: u16) {
        let bits = mac_bits(mac);
        let want = bits | ((port as u64 + 1) << 48);
        let b = self.bucket(bits);
        let mut free = None;
        for e in &b.0 {
            let v = e.load(Relaxed);
            if v == want {
                return;
            }
            if v != 0 && v & 0xFFFF_FFFF_FFFF == bits {
                e.store(want, Relaxed); // the MAC moved
                return;
            }
            if v == 0 && free.is_none() {
                free = Some(e);
            }
        }
        // Bucket full: evict an entry chosen by the MAC's low bits.
        let e = free.unwrap_or(&b.0[(bits >> 40) as usize % WAYS]);
        e.store(want, Relaxed);
    }

    /// Forgets every MAC learned on `port` (it disconnected or was removed).
    pub fn flush_port(&self, port: u16) {
        for b in self.buckets.iter() {
            for e in &b.0 {
                let v = e.load(Relaxed);
                if v != 0 && (v >> 48) as u16 == port + 1 {
                    let _ = e.compare_exchange(v, 0, Relaxed, Relaxed);
                }
            }
        }
    }

    /// All entries, for `pvswitchctl fdb`.
    pub fn entries(&self) -> Vec<(Mac, u16)> {
        let mut out = Vec::new();
        for b in self.buckets.iter() {
            for e in &b.0 {
                let v = e.load(Relaxed);
                if v != 0 {
                    let m = v.to_le_bytes();
                    out.push((Mac([m[0], m[1], m[2], m[3], m[4], m[5]]), (v >> 48) as u16 - 1));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learn_lookup_move_flush() {
        let t = MacTable::new(4);
        let a = Mac([2, 0, 0, 0, 0, 1]);
        let b = Mac([2, 0, 0, 0, 0, 2]);
        assert_eq!(t.lookup(&a), None);
        t.learn(&a, 0);
        t.learn(&b, 7);
        assert_eq!(t.lookup(&a), Some(0));
        assert_eq!(t.lookup(&b), Some(7));
        t.learn(&a, 3);
        assert_eq!(t.lookup(&a), Some(3));
        t.flush_port(3);
        assert_eq!(t.lookup(&a), None);
        assert_eq!(t.lookup(&b), Some(7));
    }

    #[test]
    fn full_bucket_evicts_but_stays_consistent() {
        let t = MacTable::new(1);
        for i in 0..100u8 {
            t.learn(&Mac([2, 0, 0, 0, 1, i]), i as u16);
        }
        let e = t.entries();
        assert_eq!(e.len(), 8);
        for (m, p) in e {
            assert_eq!(t.lookup(&m), Some(p));
            assert_eq!(m.0[5] as u16, p);
        }
    }
}
