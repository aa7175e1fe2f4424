//! What delivery keeps on a poll thread from frame to frame and burst to burst (`Delivery`):
//! the receive buffers being filled, what it knows of each destination (stalled, buffers too
//! small, skipped by floods), the frames waiting for NIC ports, and the interrupts owed
//! (`Interrupts`), sent once no ring is locked. `output` does the delivering.
#![forbid(unsafe_code)]

use std::sync::Arc;

use super::nic::TxBatches;
use crate::config::MAX_BURST;
use crate::datapath::counters::{DropReason, ThreadStats, bump};
use crate::mem::SegsSlot;
use crate::vring::CallFd;
use crate::vring::call::Signal;

/// Interrupts owed to guests, gathered while rings are locked and sent after: a write to a call
/// eventfd (a file the frontend controls) never happens under a ring lock.
#[derive(Default)]
pub(in crate::datapath) struct Interrupts {
    pending: Vec<Arc<CallFd>>,
}

impl Interrupts {
    /// Owes `call` an interrupt (once, however many rings of this visit name it).
    #[inline]
    pub fn owe(&mut self, call: &Arc<CallFd>) {
        if !self.pending.iter().any(|c| Arc::ptr_eq(c, call)) {
            self.pending.push(call.clone());
        }
    }

    /// Sends every owed interrupt. Call with no ring locked.
    #[inline]
    pub fn send(&mut self, st: &ThreadStats) {
        for call in self.pending.drain(..) {
            if call.signal(&st.in_call) == Signal::Sent {
                bump(&st.ports[call.port as usize].interrupts, 1);
            }
        }
    }
}

/// What delivery keeps from frame to frame and burst to burst on a poll thread: the segments
/// of the receive buffers being filled, what it knows of each destination (stalled, buffers
/// too small), the frames waiting for NIC ports, the interrupts owed, and the work a burst's
/// delivery did for the visit budget to charge.
#[derive(Default)]
pub(in crate::datapath) struct Delivery {
    /// Segments of the receive buffer being filled (a frame's first, and any further one).
    pub first: SegsSlot,
    pub more: SegsSlot,
    /// Ports whose guest let a frame time out on a full ring: dropped toward without waiting
    /// until they have room again.
    pub stalled: Vec<bool>,
    /// Frames waiting to be sent to NIC ports, one burst per port.
    pub nic_tx: TxBatches,
    /// The port whose burst is being delivered (a mirror of its destinations asks whether it
    /// already copied the frame as its source's).
    pub in_port: u16,
    /// Set when `deliver` dropped a frame on a full guest ring (a NIC's visit then ends).
    pub dropped_full: bool,
    /// Interrupts owed, sent when the visit ends.
    pub irqs: Interrupts,
    /// Receive descriptors walked (the visit budget charges them).
    pub walked: u32,
    /// Ports whose receive buffers could not hold a frame: the guest's avail index then, and the
    /// frame's length. Frames as long are dropped toward them without walking their buffers
    /// again until the guest makes more available (its avail index moves), so a ring of buffers too
    /// small (or too fragmented) for what is sent to it costs its senders one walk, not one
    /// walk a frame.
    pub too_small: Vec<Option<(u16, u32)>>,
    /// Frames produced by software segmentation beyond the frames taken (a TSO frame cut into
    /// `n` segments for a destination adds `n - 1`): the visit budget charges them.
    pub extra_segments: u32,
    /// How many frames the visit's budget has left for this burst: once software
    /// segmentation has produced that many, the burst's later TSO frames wait in the sender's
    /// ring for its next visit.
    pub segment_room: u32,
    /// Per port: floods skip it for a while after finding it full or down (see `FloodSkip`).
    pub flood_skip: Vec<FloodSkip>,
    /// Some port's `FloodSkip::missed` waits to be counted.
    pub flood_missed: bool,
    /// How long (TSC cycles) floods skip a port found full or down: `FLOOD_RETRY_US`.
    pub(in crate::datapath) flood_retry: u64,
    /// Per port: the ICMP errors this thread may still send it (routing's answers to what a
    /// router refuses). A port's own, so a VM that sends frames with TTL 1 by the thousand
    /// spends its budget, not its neighbours'.
    pub icmp_errors: Vec<ErrorBudget>,
    /// The burst being delivered is a live-traced port's (`PortPolicy::traced`): `missed`
    /// notes, by the frame's place in the burst, the port a frame could not be written to
    /// and why (the last such port), for the trace to tell; cleared once told (`rx::watched`,
    /// which every traced burst reaches).
    pub traced: bool,
    pub missed: [Option<(u16, DropReason)>; MAX_BURST as usize],
}

/// ICMP errors a poll thread sends one port (`tx/route.rs`), at most `ICMP_ERRORS_PER_SEC` a
/// second after a burst of `ICMP_ERRORS_BURST`, as a router limits them (RFC 1812 4.3.2.8;
/// Linux's `icmp_ratelimit`, per destination): a guest that sends frames with TTL 1 gets a few
/// answers, not one a frame.
#[derive(Default, Clone)]
pub(in crate::datapath) struct ErrorBudget {
    tokens: u32,
    /// When the tokens were last refilled (TSC).
    at: u64,
}

pub const ICMP_ERRORS_PER_SEC: u64 = 100;
pub const ICMP_ERRORS_BURST: u32 = 10;

impl ErrorBudget {
    /// Whether one more error may go at TSC `now` (`hz` cycles a second).
    pub fn take(&mut self, now: u64, hz: u64) -> bool {
        let per = (hz / ICMP_ERRORS_PER_SEC).max(1);
        let earned = now.saturating_sub(self.at) / per;
        if earned > 0 {
            self.tokens = (self.tokens as u64 + earned).min(ICMP_ERRORS_BURST as u64) as u32;
            self.at = now;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// Floods skip a port found full or down for this long before they try it again, and twice as
/// long each time it is found so again, up to `FLOOD_RETRY_US << FLOOD_BACKOFF_MAX` (3.2 ms):
/// a flood to many ports that cannot take it then costs a few loads a port, not a lock and a
/// ring read, and a thousand rings that stay full are tried a few hundred times a second in
/// all, not a thousand times every 100 us (that alone took 70% of a poll thread). A port that
/// takes a frame again is tried every time (broadcast is best effort: a full ring misses
/// frames anyway).
pub const FLOOD_RETRY_US: u64 = 100;
pub const FLOOD_BACKOFF_MAX: u8 = 5;

/// What floods know of one destination on one poll thread.
#[derive(Clone, Copy, Default)]
pub(in crate::datapath) struct FloodSkip {
    /// Until when (TSC) floods skip it without opening it.
    pub until: u64,
    /// It was full (its missed frames count as `rx_ring_full`), not down (they count nothing,
    /// as a flood to a port that is not running never did).
    pub full: bool,
    /// Found full or down this many times in a row: the next skip lasts `flood_retry << backoff`.
    pub backoff: u8,
    /// Flooded frames it missed while skipped, not yet counted (counted when it is tried again,
    /// or by `flush_flood_missed`).
    pub missed: u32,
}

impl Delivery {
    /// Notes that frame `i` of the burst could not be written to port `p`, for `why`, if the
    /// burst is traced (the caller counts the drop). Out of line: only drops call it.
    #[cold]
    #[inline(never)]
    pub fn missed(&mut self, i: usize, p: u16, why: DropReason) {
        if self.traced
            && let Some(m) = self.missed.get_mut(i)
        {
            *m = Some((p, why));
        }
    }

    /// Forgets what it knew of the destinations: a new plan, with `ports` port ids.
    pub fn new_plan(&mut self, ports: usize, stats: &ThreadStats) {
        self.flush_flood_missed(stats);
        self.stalled.clear();
        self.stalled.resize(ports, false);
        self.too_small.clear();
        self.too_small.resize(ports, None);
        self.flood_skip.clear();
        self.flood_skip.resize(ports, FloodSkip::default());
        // Budgets are kept across plans: a port's spent budget is not refilled by a new plan.
        self.icmp_errors.resize(ports, ErrorBudget::default());
        self.flood_retry = FLOOD_RETRY_US * crate::counter::cycles_per_sec() / 1_000_000;
    }

    /// Counts the flooded frames that ports skipped as full have missed so far.
    pub fn flush_flood_missed(&mut self, stats: &ThreadStats) {
        if !std::mem::take(&mut self.flood_missed) {
            return;
        }
        for (id, s) in self.flood_skip.iter_mut().enumerate() {
            if s.missed > 0 {
                stats.ports[id].drop(DropReason::RxRingFull, s.missed as u64);
                s.missed = 0;
            }
        }
    }

    /// Whether a flood has frames counted as missed that `flush_flood_missed` has not counted.
    pub fn flood_missed(&self) -> bool {
        self.flood_missed
    }
}
