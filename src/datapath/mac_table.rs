//! The MAC learning table, shared by all poll threads without locks, and not a tenant's to
//! abuse.
//!
//! Each entry is one `AtomicU64`: 48 bits of MAC and 16 bits of (port id + 1); 0 is empty.
//! Entries sit in 8-way buckets of one cache line. A lookup is a few relaxed loads. Learning
//! writes only when the entry is missing or the MAC moved to another port, so in steady state
//! poll threads only read the table and no cache line bounces between cores.
//!
//! What a guest cannot do with it:
//! - **aim at a bucket**: the bucket comes from a keyed hash whose two 64-bit keys are random
//!   per process (the MAC xor-ed with one, multiplied by the other, then mixed as splitmix64
//!   does, so every MAC bit reaches the top bits that pick the bucket): without the keys,
//!   which MACs share a bucket is unknown, and structured sets (a VMM's sequential MACs, an
//!   attacker's counter) spread like random ones;
//! - **evict another port's entries**: a full bucket only makes room by replacing an entry of
//!   the learning port itself; if there is none, the new MAC is not learned (frames to it
//!   flood, as for any unknown MAC) and the refusal is counted;
//! - **fill the table**: each port learns at most its `mac_limit` addresses (set per port);
//!   beyond that, refusals are counted (`PortCounters::learn_refused`).
//!
//! A guest may still claim another guest's MAC (the entry moves to its port): port security
//! (`allowed_macs`) is what stops that, and is required for untrusted guests.
//!
//! **Per VLAN.** An entry's 48 bits are the MAC xor-ed with its VLAN's salt: a random 48-bit
//! value per VLAN (VLAN 0, untagged, has salt 0, so a switch without VLANs keys by the MAC
//! itself). The same MAC on two VLANs is two keys, in two buckets, learned and moved apart.
//! Two (MAC, VLAN) pairs share a key only if their MACs differ by the xor of their VLANs'
//! salts, which a guest cannot know; and should it happen, the lookup's answer is still
//! checked against the VLAN (a port that does not carry the frame's VLAN is not a
//! destination: the frame floods in its VLAN). The VLAN of each entry is also kept beside it,
//! for `pvswitchctl fdb` only.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

pub use crate::wire::MacAddr as Mac;

const WAYS: usize = 8;
const MAC_BITS: u64 = 0xFFFF_FFFF_FFFF;

#[repr(align(64))]
struct Bucket([AtomicU64; WAYS]);

/// What `learn` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// Known already, or learned, or moved to this port.
    Yes,
    /// Not learned: the port is at its limit, or the bucket holds only other ports' entries.
    Refused,
}

pub struct MacTable {
    buckets: Box<[Bucket]>,
    /// 64 - log2(buckets): the bucket is the hash's top bits (which depend on every MAC bit).
    shift: u32,
    /// Keys of the bucket hash.
    k1: u64,
    k2: u64,
    /// Per port id: addresses learned, and the most it may learn.
    learned: Box<[AtomicU32]>,
    limit: Box<[AtomicU32]>,
    /// Per VLAN id: the salt its MACs are xor-ed with (0 for VLAN 0).
    salts: Box<[u64]>,
    /// Beside each entry, its VLAN (for display only).
    vids: Box<[[AtomicU16; WAYS]]>,
}

#[inline]
fn mac_bits(mac: &Mac) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac.0);
    u64::from_le_bytes(b)
}

/// The entry's port, if it holds one.
#[inline]
fn port_of(v: u64) -> Option<u16> {
    (v != 0).then(|| (v >> 48) as u16 - 1)
}

/// Two random 64-bit keys, from the standard library's per-process random hash seed.
fn random_keys() -> (u64, u64) {
    use std::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    (s.hash_one(0x5eed_u64) | 1, s.hash_one(0xfeed_u64))
}

/// A random, distinct, nonzero 48-bit salt per VLAN id but 0 (whose salt is 0).
fn random_salts() -> Box<[u64]> {
    use std::hash::BuildHasher;
    let s = std::collections::hash_map::RandomState::new();
    let mut seen = std::collections::HashSet::from([0u64]);
    let mut salts = vec![0u64; 4096];
    for (v, salt) in salts.iter_mut().enumerate().skip(1) {
        let mut i = v as u64;
        *salt = loop {
            let x = s.hash_one(i) & MAC_BITS;
            if seen.insert(x) {
                break x;
            }
            i += 1 << 32;
        };
    }
    salts.into_boxed_slice()
}

impl MacTable {
    /// A table of `buckets` (rounded up to a power of two) buckets of 8 entries, for ports ids
    /// below `ports`, each port learning at most `default_limit` addresses until set otherwise.
    pub fn new(buckets: usize, ports: usize, default_limit: u32) -> MacTable {
        let n = buckets.next_power_of_two().max(1);
        let (k1, k2) = random_keys();
        MacTable {
            buckets: (0..n).map(|_| Bucket(std::array::from_fn(|_| AtomicU64::new(0)))).collect(),
            shift: 64 - n.trailing_zeros(),
            k1,
            k2,
            learned: (0..ports).map(|_| AtomicU32::new(0)).collect(),
            limit: (0..ports).map(|_| AtomicU32::new(default_limit)).collect(),
            salts: random_salts(),
            vids: (0..n).map(|_| std::array::from_fn(|_| AtomicU16::new(0))).collect(),
        }
    }

    /// The key of `mac` on VLAN `vid`.
    #[inline]
    fn key(&self, mac: &Mac, vid: u16) -> u64 {
        // VLAN 0 (every frame, on a switch without VLANs) is salted with 0: no load.
        if vid == 0 { mac_bits(mac) } else { mac_bits(mac) ^ self.salts[vid as usize & 0xfff] }
    }

    #[inline]
    fn index(&self, bits: u64) -> usize {
        // A plain multiply-add-shift (the top bits of k1 * mac + k2) let keys that differ in
        // a few high bytes, with some k1, share a handful of buckets: mix after multiplying.
        let mut h = (bits ^ self.k2).wrapping_mul(self.k1);
        h ^= h >> 31;
        h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        h ^= h >> 29;
        // A shift by 64 (one bucket) is done in u128 so it yields 0.
        ((h as u128) >> self.shift) as usize
    }

    #[inline]
    fn bucket(&self, bits: u64) -> &Bucket {
        &self.buckets[self.index(bits)]
    }

    /// Sets how many addresses `port` may learn.
    pub fn set_limit(&self, port: u16, limit: u32) {
        self.limit[port as usize].store(limit, Relaxed);
    }

    /// Addresses `port` has learned.
    pub fn learned(&self, port: u16) -> u32 {
        self.learned[port as usize].load(Relaxed)
    }

    /// Where `mac` was learned on VLAN `vid` (0: untagged, or no VLANs).
    #[inline]
    pub fn lookup(&self, mac: &Mac, vid: u16) -> Option<u16> {
        let bits = self.key(mac, vid);
        for e in &self.bucket(bits).0 {
            let v = e.load(Relaxed);
            if v != 0 && v & MAC_BITS == bits {
                return port_of(v);
            }
        }
        None
    }

    /// Records that `mac` on VLAN `vid` lives behind `port`. Writes only if that is news.
    #[inline]
    pub fn learn(&self, mac: &Mac, vid: u16, port: u16) -> Learned {
        let bits = self.key(mac, vid);
        let want = bits | ((port as u64 + 1) << 48);
        let bi = self.index(bits);
        let b = &self.buckets[bi];
        let mut moved = false;
        let (mut free, mut own) = (None, None);
        for (w, e) in b.0.iter().enumerate() {
            let v = e.load(Relaxed);
            if v == want {
                return Learned::Yes;
            }
            if v != 0 && v & MAC_BITS == bits {
                // The MAC moved to this port (every copy: two threads may have learned it at
                // once into two slots).
                if !moved && !self.claim(port) {
                    return Learned::Refused;
                }
                if e.compare_exchange(v, want, Relaxed, Relaxed).is_ok()
                    && let Some(old) = port_of(v)
                {
                    self.release(old);
                }
                moved = true;
                continue;
            }
            if v == 0 {
                free.get_or_insert((w, e));
            } else if port_of(v) == Some(port) {
                own.get_or_insert((w, e));
            }
        }
        if moved {
            return Learned::Yes;
        }
        // A new address: room in the bucket (a free slot, or one of this port's own entries),
        // and room in the port's allowance.
        if let Some((w, e)) = free {
            if !self.claim(port) {
                return Learned::Refused;
            }
            self.vids[bi][w].store(vid, Relaxed);
            if e.compare_exchange(0, want, Relaxed, Relaxed).is_err() {
                // Another thread took the slot meanwhile: try again next frame.
                self.release(port);
                return Learned::Refused;
            }
            return Learned::Yes;
        }
        if let Some((w, e)) = own {
            // Replaces one of the port's own addresses: its count does not change.
            self.vids[bi][w].store(vid, Relaxed);
            e.store(want, Relaxed);
            return Learned::Yes;
        }
        Learned::Refused
    }

    /// Counts one more address for `port`, if its limit allows.
    fn claim(&self, port: u16) -> bool {
        let c = &self.learned[port as usize];
        let limit = self.limit[port as usize].load(Relaxed);
        c.fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1)).is_ok()
    }

    fn release(&self, port: u16) {
        let _ = self.learned[port as usize].fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Forgets `mac` on VLAN `vid` if it is still behind `port` (a remote MAC its control
    /// plane withdrew); one that moved elsewhere since stays.
    pub fn forget(&self, mac: &Mac, vid: u16, port: u16) {
        let bits = self.key(mac, vid);
        let want = bits | ((port as u64 + 1) << 48);
        for e in &self.bucket(bits).0 {
            if e.compare_exchange(want, 0, Relaxed, Relaxed).is_ok() {
                self.release(port);
            }
        }
    }

    /// Forgets every MAC learned on `port` (it disconnected or was removed).
    pub fn flush_port(&self, port: u16) {
        for b in self.buckets.iter() {
            for e in &b.0 {
                let v = e.load(Relaxed);
                if port_of(v) == Some(port) && e.compare_exchange(v, 0, Relaxed, Relaxed).is_ok() {
                    self.release(port);
                }
            }
        }
    }

    /// All entries as (MAC, VLAN, port), for `pvswitchctl fdb`.
    pub fn entries(&self) -> Vec<(Mac, u16, u16)> {
        let mut out = Vec::new();
        for (b, vids) in self.buckets.iter().zip(self.vids.iter()) {
            for (e, vid) in b.0.iter().zip(vids) {
                let v = e.load(Relaxed);
                if let Some(p) = port_of(v) {
                    let vid = vid.load(Relaxed);
                    let m = ((v & MAC_BITS) ^ self.salts[vid as usize & 0xfff]).to_le_bytes();
                    out.push((Mac([m[0], m[1], m[2], m[3], m[4], m[5]]), vid, p));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(i: u32) -> Mac {
        let b = i.to_be_bytes();
        Mac([2, 0, b[0], b[1], b[2], b[3]])
    }

    #[test]
    fn forget_takes_only_the_entry_still_behind_its_port() {
        let t = MacTable::new(64, 4, 100);
        let (a, b) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        t.learn(&a, 10, 1);
        t.learn(&b, 10, 1);
        t.learn(&b, 10, 2);
        t.forget(&a, 20, 1);
        assert_eq!(t.lookup(&a, 10), Some(1), "another VLAN's entry is another entry");
        t.forget(&a, 10, 1);
        t.forget(&b, 10, 1);
        assert_eq!((t.lookup(&a, 10), t.lookup(&b, 10)), (None, Some(2)), "b moved to port 2: it stays");
        assert_eq!((t.learned(1), t.learned(2)), (0, 1));
    }

    #[test]
    fn learn_lookup_move_flush() {
        let t = MacTable::new(4, 16, 100);
        let (a, b) = (mac(1), mac(2));
        assert_eq!(t.lookup(&a, 0), None);
        t.learn(&a, 0, 0);
        t.learn(&b, 0, 7);
        assert_eq!((t.lookup(&a, 0), t.lookup(&b, 0)), (Some(0), Some(7)));
        assert_eq!(t.learn(&a, 0, 3), Learned::Yes);
        assert_eq!(t.lookup(&a, 0), Some(3));
        assert_eq!((t.learned(0), t.learned(3), t.learned(7)), (0, 1, 1));
        t.flush_port(3);
        assert_eq!((t.lookup(&a, 0), t.lookup(&b, 0), t.learned(3)), (None, Some(7), 0));
    }

    #[test]
    fn a_port_learns_at_most_its_limit() {
        let t = MacTable::new(1024, 4, 10);
        let learned = (0..100).filter(|&i| t.learn(&mac(i), 0, 1) == Learned::Yes).count();
        assert_eq!((learned, t.learned(1)), (10, 10));
        assert_eq!(t.entries().len(), 10);
        t.set_limit(1, 20);
        assert_eq!((0..100).filter(|&i| t.learn(&mac(1000 + i), 0, 1) == Learned::Yes).count(), 10);
        t.flush_port(1);
        assert_eq!(t.learned(1), 0);
    }

    /// However many addresses a port sends from, another port's entries stay: a full bucket
    /// only ever gives up the learning port's own entries.
    #[test]
    fn no_port_evicts_another_ports_entries() {
        let t = MacTable::new(16, 4, u32::MAX);
        let victims: Vec<Mac> = (0..40).map(|i| mac(0x7000 + i)).collect();
        for v in &victims {
            t.learn(v, 0, 0);
        }
        let kept: Vec<Mac> = victims.iter().copied().filter(|v| t.lookup(v, 0) == Some(0)).collect();
        assert!(kept.len() >= 30, "the victim port itself learned only {}", kept.len());
        // Addresses of its own (claiming the victim's is what port security is for).
        for i in 0..100_000 {
            t.learn(&mac(0x10_0000 + i), 0, 1);
        }
        for v in &kept {
            assert_eq!(t.lookup(v, 0), Some(0), "{v} was evicted by another port");
        }
        // The attacker's own refusals are all it gets; the table holds both.
        assert!(t.learned(1) <= 16 * 8 - kept.len() as u32);
    }

    /// Structured address sets (a VMM's sequential MACs, a counter in any byte) fill a table
    /// as evenly as random ones would, whatever the keys: with 8 times more addresses than
    /// entries, nearly every entry ends up used.
    #[test]
    fn structured_macs_spread_over_every_bucket() {
        for round in 0..200 {
            let t = MacTable::new(64, 2, u32::MAX);
            let set = round % 4;
            for i in 0..4096u32 {
                let m = match set {
                    0 => Mac([0x52, 0x54, 0x00, 0x00, (i >> 8) as u8, i as u8]),
                    1 => Mac([0x06, 0xaa, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0]),
                    2 => Mac([(i as u8) << 1, 0, 0, 0, 0, (i >> 8) as u8]),
                    _ => Mac([0x02, (i >> 4) as u8, 0, (i & 15) as u8, 0, 0]),
                };
                t.learn(&m, 0, 0);
            }
            assert!(t.learned(0) >= 500, "round {round} (set {set}): only {} of 512 entries used", t.learned(0));
        }
    }

    /// The same MAC on two VLANs is two entries, each with its own port; a MAC learned on one
    /// VLAN is unknown on another; `entries` gives each its VLAN.
    #[test]
    fn each_vlan_learns_apart() {
        let t = MacTable::new(64, 8, 100);
        let m = mac(5);
        t.learn(&m, 10, 1);
        assert_eq!((t.lookup(&m, 10), t.lookup(&m, 20), t.lookup(&m, 0)), (Some(1), None, None));
        t.learn(&m, 20, 2);
        assert_eq!((t.lookup(&m, 10), t.lookup(&m, 20)), (Some(1), Some(2)), "learning on 20 moved the entry of 10");
        let mut e = t.entries();
        e.sort_by_key(|x| x.1);
        assert_eq!(e, vec![(m, 10, 1), (m, 20, 2)]);
        // A port's limit counts its entries on every VLAN.
        t.set_limit(3, 4);
        let learned = (1..=10u16).filter(|&v| t.learn(&mac(9), v, 3) == Learned::Yes).count();
        assert_eq!((learned, t.learned(3)), (4, 4));
    }

    #[test]
    fn keys_differ_between_tables() {
        let (a, b) = (MacTable::new(1, 1, 1), MacTable::new(1, 1, 1));
        assert_ne!((a.k1, a.k2), (b.k1, b.k2));
    }
}
