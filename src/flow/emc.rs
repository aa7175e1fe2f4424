//! The exact match cache: a small per-thread table from a full [`PacketKey`] (table 0's key of a
//! frame) to a flow index.
//!
//! A poll thread looks up every frame here before the classifier. Entries are 2-way
//! set-associative: the low hash bits pick a set of two, so a lookup touches at most two
//! 40-byte entries. An insert into a full set replaces one of the two ways, alternating. The
//! value is any `u32` (the caller can cache "no flow matched" as e.g. `u32::MAX`). All memory
//! is allocated by [`Emc::new`]; nothing allocates afterwards. The cache knows nothing about
//! the flow table: the caller must [`Emc::clear`] it when the table changes.

use super::key::PacketKey;
use crate::counter::prefetch;

const WAYS: usize = 2;
// `Emc::lookup` compares the two ways of a set by name.
const _: () = assert!(WAYS == 2);

/// Default number of entries.
pub const DEFAULT_ENTRIES: usize = 8192;

#[derive(Clone, Copy, Default)]
struct Entry {
    key: PacketKey,
    /// Low 32 bits of the key's hash with bit 0 forced to 1; 0 marks an empty entry.
    tag: u32,
    flow: u32,
}

/// Exact match cache. Not shared: one per poll thread.
pub struct Emc {
    entries: Box<[Entry]>,
    set_mask: usize,
    /// Which way a full set gives up next.
    victim: usize,
}

#[inline]
fn tag(hash: u64) -> u32 {
    hash as u32 | 1
}

impl Default for Emc {
    fn default() -> Emc {
        Emc::new(DEFAULT_ENTRIES)
    }
}

impl Emc {
    /// A cache of `entries` entries, rounded up to a power of two (at least 2).
    pub fn new(entries: usize) -> Emc {
        let n = entries.next_power_of_two().max(WAYS);
        Emc { entries: vec![Entry::default(); n].into_boxed_slice(), set_mask: n / WAYS - 1, victim: 0 }
    }

    /// Number of entries.
    pub fn capacity(&self) -> usize {
        self.entries.len()
    }

    /// Index of the first way of the set for `hash`. The set comes from bits 32.., the tag from
    /// bits 0..32, so the tag comparison is not redundant with the set choice.
    #[inline(always)]
    fn set(&self, hash: u64) -> usize {
        ((hash >> 32) as usize & self.set_mask) * WAYS
    }

    /// The flow cached for `key`. `hash` must be the same function of the key that
    /// [`Emc::insert`] was given (normally [`PacketKey::hash`](super::key::Key::hash)).
    #[inline]
    pub fn lookup(&self, key: &PacketKey, hash: u64) -> Option<u32> {
        let s = self.set(hash);
        let t = tag(hash);
        // Both ways compared without a branch between them: which way holds a frame's key (in
        // a set that holds two) follows from its hash, which no branch predictor learns.
        let [a, b] = &self.entries[s..s + WAYS] else { unreachable!() };
        let (ha, hb) = (a.tag == t && a.key == *key, b.tag == t && b.key == *key);
        (ha | hb).then_some(if ha { a.flow } else { b.flow })
    }

    /// Starts loading the set `hash` picks into the cache, ahead of a [`Emc::lookup`] of a key
    /// with that hash.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        // A set is two 40-byte entries: it spans two cache lines, sometimes three.
        let p = self.entries[self.set(hash)..].as_ptr() as *const u8;
        prefetch(p);
        prefetch(p.wrapping_add(64));
    }

    /// Caches `flow` for `key`, replacing an older value for the same key, else filling a free
    /// way, else evicting one.
    pub fn insert(&mut self, key: &PacketKey, hash: u64, flow: u32) {
        let s = self.set(hash);
        let t = tag(hash);
        let set = &mut self.entries[s..s + WAYS];
        let way = match set.iter().position(|e| e.tag == t && e.key == *key) {
            Some(w) => w,
            None => match set.iter().position(|e| e.tag == 0) {
                Some(w) => w,
                None => {
                    self.victim = (self.victim + 1) % WAYS;
                    self.victim
                }
            },
        };
        set[way] = Entry { key: *key, tag: t, flow };
    }

    /// Forgets every entry.
    pub fn clear(&mut self) {
        for e in self.entries.iter_mut() {
            e.tag = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::key::{Field, testutil::Rng};
    use super::*;

    fn key(i: u64) -> PacketKey {
        PacketKey::default().with(Field::NwDst, i).with(Field::TpDst, i * 7)
    }

    #[test]
    fn insert_lookup_update_clear() {
        let mut emc = Emc::new(100);
        assert_eq!(emc.capacity(), 128);
        for i in 0..50 {
            assert_eq!(emc.lookup(&key(i), key(i).hash()), None);
            emc.insert(&key(i), key(i).hash(), i as u32);
        }
        let hits = (0..50).filter(|&i| emc.lookup(&key(i), key(i).hash()) == Some(i as u32)).count();
        assert!(hits > 40, "{hits}");
        emc.insert(&key(3), key(3).hash(), u32::MAX);
        assert_eq!(emc.lookup(&key(3), key(3).hash()), Some(u32::MAX));
        emc.clear();
        assert!((0..50).all(|i| emc.lookup(&key(i), key(i).hash()).is_none()));
    }

    #[test]
    fn collisions_never_give_a_wrong_answer() {
        // Every key in the same set (hash 0 and 1 give the same set, and the same tag).
        let mut emc = Emc::new(8);
        let mut last = Vec::new();
        for i in 0..20u64 {
            emc.insert(&key(i), i & 1, i as u32);
            last.push(i);
            let present: Vec<u64> = (0..20).filter(|&j| emc.lookup(&key(j), j & 1).is_some()).collect();
            assert!(present.len() <= WAYS);
            assert!(present.contains(&i), "the newest entry is always present");
            for j in present {
                assert_eq!(emc.lookup(&key(j), j & 1), Some(j as u32));
            }
        }
        // A different hash (tag) for the same key misses.
        emc.insert(&key(100), 5, 100);
        assert_eq!(emc.lookup(&key(100), 7), None);
        assert_eq!(emc.lookup(&key(100), 5), Some(100));
    }

    #[test]
    fn random_agrees_with_a_model() {
        let mut rng = Rng(99);
        let mut emc = Emc::new(64);
        let mut model = std::collections::HashMap::new();
        for _ in 0..100_000 {
            let k = key(rng.below(300));
            let h = k.hash();
            if rng.below(3) == 0 {
                let v = rng.next() as u32;
                emc.insert(&k, h, v);
                model.insert(k, v);
            } else if let Some(v) = emc.lookup(&k, h) {
                assert_eq!(Some(&v), model.get(&k));
            }
            if rng.below(20_000) == 0 {
                emc.clear();
            }
        }
    }
}
