//! The connection table every poll thread shares, without a lock: a fixed array of slots in
//! buckets of `WAYS`, each slot a sequence lock of its own. A lookup reads a bucket's keys
//! and takes no lock at all (it retries a slot whose writer is mid-write, which is a few
//! stores, then treats it as a miss); an insert or a removal claims one slot (a compare-and-
//! swap of its sequence number) and never waits for another thread. A hit updates its
//! connection's state with compare-and-swap on the fields it changes. Every field is an
//! atomic: no `unsafe` here.
//!
//! Memory is allocated once, at start: `slots_for(limit)` slots of [`SLOT_BYTES`] each for a
//! table holding at most `limit` connections; nothing grows at run time.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64, fence};

use crate::counter::prefetch;

/// Slots in a bucket: where a connection may sit (its hash picks the bucket).
pub const WAYS: usize = 8;
/// Key words: addresses (4), then ports, zone, protocol, family and the "in use" bit.
pub const KEY_WORDS: usize = 5;
/// The "in use" bit of the last key word.
pub const IN_USE: u64 = 1 << 63;
/// A slot and its tag.
pub const SLOT_BYTES: usize = std::mem::size_of::<Slot>() + 4;

/// One connection's place.
#[derive(Default)]
pub struct Slot {
    /// Even: stable; odd: being written. Grows by 2 each write, so a reader that saw the same
    /// even value before and after reading saw one whole key.
    seq: AtomicU32,
    /// When the connection expires (table seconds); 0: the slot is free.
    pub expires: AtomicU32,
    key: [AtomicU64; KEY_WORDS],
    /// Protocol state (8 bits), flags (8), the two sides' window scales (8), the generation
    /// (8: one more at each insert into the slot, so a hit's compare-and-swap on a slot
    /// reused meanwhile fails), the mark (32).
    pub meta: AtomicU64,
    /// Per side (0: the canonical low side, 1: the high side): TCP end, maxend, maxwin.
    pub tcp: [[AtomicU32; 3]; 2],
}

/// A slot found for a key, with what its meta said when it was found.
#[derive(Debug, Clone, Copy)]
pub struct Found {
    pub index: usize,
    pub meta: u64,
}

pub struct Table {
    slots: Box<[Slot]>,
    /// Per slot, a tag of its key's hash (0: none), dense so that a lookup reads one cache
    /// line of tags per bucket and only the slots whose tag matches.
    tags: Box<[AtomicU32]>,
    buckets: usize,
    seed: u64,
}

/// Slots a table of at most `limit` connections gets: half again as many, whole buckets.
pub fn slots_for(limit: u32) -> usize {
    ((limit as usize * 3 / 2).div_ceil(WAYS)).max(1) * WAYS
}

impl Table {
    pub fn new(limit: u32, seed: u64) -> Table {
        let n = slots_for(limit);
        // On huge pages where the kernel has them: a random slot of a large table is a TLB
        // miss on 4 KiB pages (BENCHMARKS.md, new connections a second).
        let tags = crate::mem::huge::filled(n, || AtomicU32::new(0));
        Table { slots: crate::mem::huge::filled(n, Slot::default), tags, buckets: n / WAYS, seed }
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    pub fn slot(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    #[cfg(test)]
    fn buckets(&self, key: &[u64; KEY_WORDS]) -> [usize; 2] {
        self.place(key).0
    }

    /// The key's two buckets (the first slot of each) and its tag (never 0). Two choices, the
    /// emptier taken at an insert: with one, a bucket of 8 overflows for about 3% of keys at
    /// half load, which would refuse connections far below the limit; with two, practically
    /// never at two thirds (the table's most).
    pub fn place(&self, key: &[u64; KEY_WORDS]) -> ([usize; 2], u32) {
        let mut h = self.seed;
        for w in key {
            h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            h ^= h >> 29;
        }
        let pick = |x: u64| ((x as u128 * self.buckets as u128) >> 64) as usize * WAYS;
        let h2 = h.rotate_left(32).wrapping_mul(0xff51_afd7_ed55_8ccd);
        ([pick(h), pick(h2)], (h2 >> 32) as u32 | 1)
    }

    /// Starts loading the tags of a key's two buckets (`place`), ahead of its lookup.
    #[inline]
    pub fn prefetch_tags(&self, buckets: [usize; 2]) {
        for b in buckets {
            prefetch(self.tags[b..].as_ptr() as *const u8);
        }
    }

    /// Starts loading the slots whose tag is `tag` in both buckets (their tags loaded first,
    /// by `prefetch_tags`): what the lookup will read; if none has it (a new connection, as
    /// far as the tags say), the slot an insert would take first.
    #[inline]
    pub fn prefetch_slots(&self, buckets: [usize; 2], tag: u32) {
        let slot = |i: usize| {
            let p = self.slots[i..].as_ptr() as *const u8;
            prefetch(p);
            prefetch(p.wrapping_add(64));
        };
        let mut matched = false;
        for b in buckets {
            for i in b..b + WAYS {
                if self.tags[i].load(Relaxed) == tag {
                    slot(i);
                    matched = true;
                }
            }
        }
        if !matched {
            let (first, second) = self.emptier(buckets);
            let mut order = (first..first + WAYS).chain(second..second + WAYS);
            if let Some(i) = order.find(|&i| self.tags[i].load(Relaxed) == 0) {
                slot(i);
            }
        }
    }

    /// A key's two buckets, the one with fewer tagged slots first (where an insert looks first).
    #[inline]
    fn emptier(&self, [b1, b2]: [usize; 2]) -> (usize, usize) {
        let tagged = |b: usize| (b..b + WAYS).filter(|&i| self.tags[i].load(Relaxed) != 0).count();
        if tagged(b2) < tagged(b1) { (b2, b1) } else { (b1, b2) }
    }

    /// The key of slot `i` if it holds one and was not being written (`None` after a few
    /// retries of a slot mid-write), with its meta as it was with that key.
    pub fn read_key(&self, i: usize) -> Option<([u64; KEY_WORDS], u64)> {
        let s = &self.slots[i];
        for _ in 0..4 {
            let s1 = s.seq.load(Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let k: [u64; KEY_WORDS] = std::array::from_fn(|w| s.key[w].load(Relaxed));
            let meta = s.meta.load(Relaxed);
            fence(Acquire);
            if s.seq.load(Relaxed) == s1 {
                return (k[KEY_WORDS - 1] & IN_USE != 0).then_some((k, meta));
            }
        }
        None
    }

    /// The slot holding `key`, if any.
    pub fn find(&self, key: &[u64; KEY_WORDS]) -> Option<Found> {
        let (buckets, tag) = self.place(key);
        for b in buckets {
            for (j, t) in self.tags[b..b + WAYS].iter().enumerate() {
                // Cheap reject before the sequence lock: the tag (a stale tag only costs a read).
                if t.load(Relaxed) != tag {
                    continue;
                }
                if let Some((k, meta)) = self.read_key(b + j)
                    && k == *key
                {
                    return Some(Found { index: b + j, meta });
                }
            }
        }
        None
    }

    /// Claims slot `i` for writing if its sequence number is still `seq` (even).
    fn claim(&self, i: usize, seq: u32) -> bool {
        let ok = self.slots[i].seq.compare_exchange(seq, seq | 1, Acquire, Relaxed).is_ok();
        if ok {
            fence(Release);
        }
        ok
    }

    fn release(&self, i: usize, seq: u32) {
        self.slots[i].seq.store(seq.wrapping_add(2), Release);
    }

    /// Puts `key` in a free or expired slot of the emptier of its buckets (expired at `now`). `init` writes
    /// the new connection's state (its meta gets the slot's generation). Returns the slot and
    /// the key it replaced (an expired connection, which the caller uncounts), or `None` if
    /// every slot of both buckets holds a live connection.
    pub fn insert(
        &self,
        key: &[u64; KEY_WORDS],
        now: u32,
        expires: u32,
        meta: u64,
        tcp: [[u32; 3]; 2],
    ) -> Option<(usize, Option<[u64; KEY_WORDS]>)> {
        let (buckets, tag) = self.place(key);
        // Which bucket is emptier, and which slots are free, from the tags alone (a bucket's
        // are one cache line, its slots ten): a slot without a tag is free, one with a tag may
        // have expired and not been swept yet, so those are tried second.
        let (first, second) = self.emptier(buckets);
        let order = (first..first + WAYS).chain(second..second + WAYS);
        let untagged = order.clone().filter(|&i| self.tags[i].load(Relaxed) == 0);
        for i in untagged.chain(order.filter(|&i| self.tags[i].load(Relaxed) != 0)) {
            let s = &self.slots[i];
            let e = s.expires.load(Relaxed);
            if e != 0 && e > now {
                continue;
            }
            let seq = s.seq.load(Acquire);
            if seq & 1 == 1 || !self.claim(i, seq) {
                continue;
            }
            // Claimed: look again (a hit may have refreshed it since).
            let e = s.expires.load(Relaxed);
            if e != 0 && e > now {
                self.release(i, seq);
                continue;
            }
            let old: [u64; KEY_WORDS] = std::array::from_fn(|w| s.key[w].load(Relaxed));
            let replaced = (e != 0 && old[KEY_WORDS - 1] & IN_USE != 0).then_some(old);
            for (w, v) in key.iter().enumerate() {
                s.key[w].store(*v, Relaxed);
            }
            let g = generation(s.meta.load(Relaxed)).wrapping_add(1);
            s.meta.store(with_generation(meta, g), Relaxed);
            for (side, words) in tcp.iter().enumerate() {
                for (f, v) in words.iter().enumerate() {
                    s.tcp[side][f].store(*v, Relaxed);
                }
            }
            s.expires.store(expires, Relaxed);
            self.tags[i].store(tag, Relaxed);
            self.release(i, seq);
            return Some((i, replaced));
        }
        None
    }

    /// Frees slot `i` if `still(key, expires)` holds once it is claimed. Returns its key.
    pub fn remove_if(&self, i: usize, still: impl Fn(&[u64; KEY_WORDS], u32) -> bool) -> Option<[u64; KEY_WORDS]> {
        let s = &self.slots[i];
        let seq = s.seq.load(Acquire);
        if seq & 1 == 1 || s.expires.load(Relaxed) == 0 || !self.claim(i, seq) {
            return None;
        }
        let key: [u64; KEY_WORDS] = std::array::from_fn(|w| s.key[w].load(Relaxed));
        let gone = key[KEY_WORDS - 1] & IN_USE != 0 && still(&key, s.expires.load(Relaxed));
        if gone {
            s.key[KEY_WORDS - 1].store(0, Relaxed);
            s.expires.store(0, Relaxed);
            self.tags[i].store(0, Relaxed);
        }
        self.release(i, seq);
        gone.then_some(key)
    }
}

pub fn generation(meta: u64) -> u8 {
    (meta >> 24) as u8
}

fn with_generation(meta: u64, g: u8) -> u64 {
    (meta & !(0xff << 24)) | (g as u64) << 24
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> [u64; KEY_WORDS] {
        [n, 0, 0, 0, IN_USE | n]
    }

    #[test]
    fn insert_find_expire_and_reuse() {
        let t = Table::new(64, 1);
        assert!(t.slots() >= 96 && t.slots().is_multiple_of(WAYS));
        let (i, old) = t.insert(&key(1), 10, 40, 7 << 32, [[0; 3]; 2]).unwrap();
        assert!(old.is_none());
        let f = t.find(&key(1)).unwrap();
        assert_eq!((f.index, f.meta >> 32), (i, 7));
        assert!(t.find(&key(2)).is_none());
        // Not expired at 39; expired and taken over at 41 (the replaced key returned).
        assert!(t.remove_if(i, |_, e| e <= 39).is_none());
        assert!(t.find(&key(1)).is_some());
        assert_eq!(t.remove_if(i, |_, e| e <= 41), Some(key(1)));
        assert!(t.find(&key(1)).is_none());
    }

    #[test]
    fn a_full_bucket_refuses_and_an_expired_slot_is_taken_over() {
        let t = Table::new(16, 2);
        // Keys with the same two buckets: 2 * WAYS of them fill both.
        let bs = (0..).map(|n| t.buckets(&key(n))).find(|[a, b]| a != b).unwrap();
        let same: Vec<u64> = (0..1_000_000).filter(|n| t.buckets(&key(*n)) == bs).take(2 * WAYS + 1).collect();
        assert_eq!(same.len(), 2 * WAYS + 1);
        for n in &same[..2 * WAYS] {
            assert!(t.insert(&key(*n), 10, 20, 0, [[0; 3]; 2]).is_some());
        }
        assert!(t.insert(&key(same[2 * WAYS]), 10, 20, 0, [[0; 3]; 2]).is_none(), "all live");
        let (_, old) = t.insert(&key(same[2 * WAYS]), 21, 50, 0, [[0; 3]; 2]).unwrap();
        assert!(old.is_some(), "an expired connection's slot, its key returned to be uncounted");
    }

    #[test]
    fn a_hit_on_a_reused_slot_sees_another_generation() {
        let t = Table::new(8, 3);
        let (i, _) = t.insert(&key(1), 1, 5, 0, [[0; 3]; 2]).unwrap();
        let before = t.find(&key(1)).unwrap().meta;
        t.remove_if(i, |_, _| true).unwrap();
        let (j, _) = t.insert(&key(1), 1, 5, 0, [[0; 3]; 2]).unwrap();
        let after = t.find(&key(1)).unwrap().meta;
        assert!(j != i || generation(before) != generation(after));
        // A claim that changed nothing leaves the connection found.
        assert!(t.remove_if(j, |_, _| false).is_none());
        assert!(t.find(&key(1)).is_some());
    }

    #[test]
    fn readers_never_see_a_torn_key_while_writers_churn() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let t = Arc::new(Table::new(8, 4));
        let stop = Arc::new(AtomicBool::new(false));
        // A writer replaces one slot's key over and over with keys whose words all agree.
        let w = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 1u64;
                while !stop.load(Relaxed) {
                    let k = [n; KEY_WORDS].map(|w| w | IN_USE);
                    if let Some((i, _)) = t.insert(&k, n as u32 + 2, n as u32 + 3, 0, [[0; 3]; 2]) {
                        t.remove_if(i, |_, _| true);
                    }
                    n += 1;
                }
            })
        };
        let mut seen = 0;
        for _ in 0..200_000 {
            for i in 0..t.slots() {
                if let Some((k, _)) = t.read_key(i) {
                    assert!(k.iter().all(|w| *w == k[0]), "a torn key: {k:x?}");
                    seen += 1;
                }
            }
        }
        stop.store(true, Relaxed);
        w.join().unwrap();
        let _ = seen;
    }
}
