//! The data path: poll-mode threads. Each owns a set of receive queues (guests' TX virtqueues
//! and NIC receive queues, from any ports) and visits them in turn. One visit reads bursts of
//! frames until the queue's packet or byte budget is spent, classifies each frame, and copies it
//! once, straight from the sender's buffer into the receiver's, then completes the burst with
//! one used-index store and at most one interrupt per queue.
//!
//! The data path reads in one direction, one room per stage:
//! `rx/` (port rx: a visit takes bursts of `Frame`s from its `Source`, a guest's ring, a NIC
//! queue, an announcement or a VTEP's underlay, within its budget, `rx::sched`) -> `classify`
//! (where each frame goes: port security, VLANs, NORMAL, flows) -> `pipeline` (the tables after
//! the first and flows' connection tracking; only for flows that go on) -> `firewall` (security
//! groups, with connection tracking; only where a port has them) -> `tx/` (actions, then port
//! tx: `deliver`, `write_frame`, a destination's offloads done in software, VXLAN
//! encapsulation, the NIC transmit batches; `tx::delivery` is what delivery keeps between
//! frames and bursts). A destination's ring is completed in `tx`, the source's back in `rx`.
//! `frame` is what travels: a frame's bytes (the switch's copy of its front among them), where
//! it stands with the flow table (`FlowState`) and where it goes (`Out`).
//!
//! The thread that runs them is `thread/` (the loop, `park`: idle queues out of it, `idle`:
//! adaptive polling's sleep, `kicks`: the eventfds and timer both watch). Shared by all of
//! them: `plan` (what a thread works from, and how it gets a new one), `mac_table`, `vlan` (a
//! frame's VLAN as it enters and as it leaves each port), `counters`, and `profile` (the
//! cycles of each stage, with the `stage-profile` feature only).

mod classify;
pub mod counters;
pub mod firewall;
mod frame;
pub mod mac_table;
pub mod mailbox;
mod pipeline;
pub mod plan;
mod profile;
pub mod route;
pub(crate) mod rx;
pub mod spoof;
mod tap;
#[cfg(test)]
mod tests;
pub mod thread;
pub(crate) mod tx;
pub mod vlan;

#[cfg(test)]
pub(crate) use tx::offload::for_fuzzing as offload_for_fuzzing;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use log::error;

use self::counters::ThreadStats;
use self::frame::Frames;
use self::mac_table::MacTable;
use self::mailbox::Mailbox;
use self::plan::PortTable;
use self::tx::delivery::Delivery;
use crate::flow::Emc;
use crate::flow::table::FlowTable;
use crate::port::Port;
use crate::vring::RingError;

/// What a poll thread is given at start. Its polling (`burst`, `retry_cycles`,
/// `sleep_after_us`, `nic_poll_interval_us`) follows each plan's `Tuning`.
pub struct Ctx {
    pub index: usize,
    pub mac: Arc<MacTable>,
    pub stats: Arc<ThreadStats>,
    pub burst: u32,
    /// How long a frame may wait for room in a full guest RX ring before it is dropped.
    pub retry_cycles: u64,
    pub shutdown: Arc<AtomicBool>,
    pub mailbox: Arc<Mailbox>,
    /// Adaptive polling: sleep after this long without frames. None: busy polling.
    pub sleep_after_us: Option<u32>,
    /// Adaptive polling: a thread with NIC queues (which cannot kick) sleeps this long first,
    /// backing off to `nic_poll_max_us` while it finds nothing.
    pub nic_poll_interval_us: u32,
    pub nic_poll_max_us: u32,
    /// Parking: a queue empty this long is parked (0: never); parked queues' kicks are looked
    /// at every `park_check_us`.
    pub park_after_us: u32,
    pub park_check_us: u32,
}

/// The current plan's tables, borrowed for one loop iteration.
struct Env<'a> {
    cx: &'a Ctx,
    ports: &'a PortTable,
    flows: &'a FlowTable,
    /// The iteration's start (TSC): what delivery compares its timed skips against.
    now: u64,
    /// Queue pair of the queue being visited: frames from it go to the same-numbered receive
    /// queue of their destination (modulo its count), whichever thread polls it, so moving a
    /// queue between threads never splits a flow over two of the receiver's queues.
    src_q: std::cell::Cell<usize>,
}

/// What a poll thread reuses from burst to burst, lent to each visit: the burst's frames, the
/// exact-match cache in front of the flow table's classifier, and delivery's state.
struct Work {
    frames: Frames,
    emc: Box<Emc>,
    delivery: Delivery,
}

/// Logs a queue's first error and stops it (`broken`), until the guest resets it.
pub(crate) fn ring_broke(port: &Port, vq: usize, broken: &mut Option<RingError>, e: RingError) {
    if broken.is_none() {
        error!("port {} queue {vq}: {}; queue stopped until the guest resets it", port.name(), e.as_str());
        *broken = Some(e);
    }
}
