//! The stage profile: where a visit's cycles go, stage by stage (take, classify, lookup,
//! deliver, count + complete), per frame, for guest and NIC sources apart. Built only with the
//! cargo feature `stage-profile` (off by default): without it `Stages` is empty and every
//! call here compiles to nothing, so normal builds pay nothing. With it, each poll thread adds
//! up its own cycles (thread-local, no sharing) and logs one line per source kind every
//! `REPORT_FRAMES` frames (the stage tables in docs/benchmark-history.md come from these lines).
#![forbid(unsafe_code)]

/// The stages, in the order a burst goes through them.
#[cfg_attr(not(feature = "stage-profile"), allow(dead_code))]
pub(super) const NAMES: [&str; 5] = ["take", "classify", "lookup", "deliver", "count+complete"];

/// One burst's stage boundaries: `mark(i)` as stage `i` starts, `mark(NAMES.len())` at the end.
#[derive(Default)]
pub(super) struct Stages {
    #[cfg(feature = "stage-profile")]
    at: [u64; NAMES.len() + 1],
}

impl Stages {
    #[inline(always)]
    pub fn mark(&mut self, _stage: usize) {
        #[cfg(feature = "stage-profile")]
        {
            self.at[_stage] = super::counters::cycles();
        }
    }

    /// The burst of `_frames` frames from a guest (`_guest`) or a NIC is done: adds it up.
    #[inline(always)]
    pub fn done(&self, _guest: bool, _frames: usize) {
        #[cfg(feature = "stage-profile")]
        imp::add(_guest, &self.at, _frames as u64);
    }
}

/// The calling thread's guest-source profile since the last call ("take 52.0 classify ...",
/// cycles a frame), and starts a new one; None without the feature. For in-process measures
/// (`datapath::tests::flows::classify_cost`), which run too few frames for the log line.
#[cfg(test)]
pub(crate) fn take_guest_profile() -> Option<String> {
    #[cfg(feature = "stage-profile")]
    return Some(imp::take(true));
    #[cfg(not(feature = "stage-profile"))]
    None
}

#[cfg(feature = "stage-profile")]
mod imp {
    use super::NAMES;
    use std::cell::RefCell;

    /// Frames between two report lines, per source kind.
    const REPORT_FRAMES: u64 = 10_000_000;

    #[derive(Default, Clone, Copy)]
    struct Sums {
        cycles: [u64; NAMES.len()],
        frames: u64,
    }

    thread_local! {
        static SUMS: RefCell<[Sums; 2]> = RefCell::new([Sums::default(); 2]);
    }

    pub(super) fn add(guest: bool, at: &[u64; NAMES.len() + 1], frames: u64) {
        SUMS.with(|s| {
            let s = &mut s.borrow_mut()[guest as usize];
            for (i, c) in s.cycles.iter_mut().enumerate() {
                *c += at[i + 1].wrapping_sub(at[i]);
            }
            s.frames += frames;
            if s.frames >= REPORT_FRAMES {
                log::info!("stages ({} source, cycles a frame): {}", if guest { "guest" } else { "nic" }, s.line());
                *s = Sums::default();
            }
        });
    }

    impl Sums {
        fn line(&self) -> String {
            let n = self.frames.max(1) as f64;
            let parts: Vec<String> =
                NAMES.iter().zip(self.cycles).map(|(name, c)| format!("{name} {:.1}", c as f64 / n)).collect();
            parts.join(" ")
        }
    }

    #[cfg(test)]
    pub(super) fn take(guest: bool) -> String {
        SUMS.with(|s| std::mem::take(&mut s.borrow_mut()[guest as usize]).line())
    }
}
