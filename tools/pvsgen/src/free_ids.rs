//! Free descriptor ids of one ring, handed out in the order a driver reuses them: first in
//! first out, last in first out, or at random (real drivers differ; the switch must not care).

use std::collections::VecDeque;

use crate::config::Reuse;

/// Free descriptor ids of one ring, handed out in the driver's reuse order.
pub struct FreeIds {
    ids: VecDeque<u16>,
    reuse: Reuse,
    rng: u64,
}

impl FreeIds {
    pub fn new(n: u16, reuse: Reuse, seed: u64) -> FreeIds {
        FreeIds { ids: (0..n).collect(), reuse, rng: seed | 1 }
    }

    pub fn take(&mut self) -> Option<u16> {
        match self.reuse {
            Reuse::Lifo => self.ids.pop_back(),
            Reuse::Fifo => self.ids.pop_front(),
            Reuse::Random => {
                if self.ids.is_empty() {
                    return None;
                }
                self.rng ^= self.rng << 13;
                self.rng ^= self.rng >> 7;
                self.rng ^= self.rng << 17;
                let i = (self.rng % self.ids.len() as u64) as usize;
                self.ids.swap_remove_back(i)
            }
        }
    }

    pub fn give(&mut self, id: u16) {
        self.ids.push_back(id);
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}
