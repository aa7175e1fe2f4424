//! Counting on the data path: single-writer counters bumped with a plain load and store
//! (`bump`), declared once per kind with `counters!` (the atomics, their totals and their
//! names), the CPU's time stamp counter the cycle counts use, and a cache prefetch hint. Leaf
//! module: the data path's and the flow table's counters are built on it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Adds to a counter that only the calling thread writes.
#[inline]
pub fn bump(c: &AtomicU64, n: u64) {
    #[cfg(not(feature = "no-counters"))]
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    #[cfg(feature = "no-counters")]
    let _ = (c, n);
}

/// The counters of one kind of thing, declared once: the macro makes the struct of atomics the
/// data path bumps (one writer each), the struct of totals the control plane reads
/// (`Serialize`d and `Deserialize`d field by field: these names are the JSON and Prometheus
/// names, and the control protocol's `proto` reads them back), and the list of
/// field names with their help text (for Prometheus and the documentation check).
macro_rules! counters {
    ($(#[$m:meta])* pub struct $name:ident => $total:ident {
        $( $(#[doc = $doc:literal])+ $field:ident : $ty:ty, )*
    }) => {
        $(#[$m])*
        #[derive(Default)]
        pub struct $name {
            $( $(#[doc = $doc])+ pub $field: $ty, )*
        }

        /// Totals of the counters, as the control plane reads them.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
        pub struct $total {
            $( pub $field: <$ty as $crate::counter::Counter>::Total, )*
        }

        impl $name {
            /// Every counter: (name, help).
            pub const FIELDS: &'static [(&'static str, &'static str)] =
                &[ $( (stringify!($field), concat!($($doc),+)) ),* ];

            /// Reads every counter (relaxed loads).
            pub fn read(&self) -> $total {
                $total { $( $field: $crate::counter::Counter::read(&self.$field), )* }
            }

            /// Zeroes every counter. Only for a slot no writer uses any more.
            pub fn reset(&self) {
                $( $crate::counter::Counter::reset(&self.$field); )*
            }
        }

        impl $crate::counter::Total for $total {
            fn add(&mut self, o: &Self) {
                $( $crate::counter::Total::add(&mut self.$field, &o.$field); )*
            }
            fn since(&self, base: &Self) -> Self {
                $total { $( $field: $crate::counter::Total::since(&self.$field, &base.$field), )* }
            }
        }
    };
}
pub(crate) use counters;

/// A counter as its writer holds it, and what reading it gives.
pub trait Counter: Default {
    type Total: Total + Default + std::fmt::Debug + PartialEq + Eq + serde::Serialize + serde::de::DeserializeOwned;
    fn read(&self) -> Self::Total;
    fn reset(&self);
}

/// Read totals: summed over threads, and differenced between two samples.
pub trait Total: Copy {
    fn add(&mut self, o: &Self);
    /// `self - base`, saturating (a freed port slot's counters restart from zero).
    fn since(&self, base: &Self) -> Self;
}

impl Counter for AtomicU64 {
    type Total = u64;
    fn read(&self) -> u64 {
        self.load(Relaxed)
    }
    fn reset(&self) {
        self.store(0, Relaxed)
    }
}

impl Total for u64 {
    fn add(&mut self, o: &u64) {
        *self += o
    }
    fn since(&self, base: &u64) -> u64 {
        self.saturating_sub(*base)
    }
}

/// Starts loading the cache line at `p` for reading: a hint, for a lookup a few steps ahead.
#[inline(always)]
pub fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache: it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
}

/// The CPU's time stamp counter (cycles at a constant rate).
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86_64.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::time::Instant;
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Time stamp counter ticks per second, measured once against the monotonic clock.
pub fn cycles_per_sec() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        let t0 = std::time::Instant::now();
        let c0 = cycles();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c1 = cycles();
        let ns = t0.elapsed().as_nanos().max(1) as u64;
        ((c1.wrapping_sub(c0) as u128 * 1_000_000_000 / ns as u128) as u64).max(1)
    })
}
