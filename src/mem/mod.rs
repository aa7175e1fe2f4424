//! Guest memory: what a frontend shared with pvswitchd, and the host pointers the data path
//! reads and writes through. This is where most of the data path's `unsafe` lives (the rest is
//! the ring walk in `vring`); see DESIGN.md for why it is sound.
//!
//! - [`guest`]: one memory table's regions mapped into pvswitchd, and bounds-checked
//!   translation from guest (or frontend virtual) addresses to host pointers.
//! - [`fault`]: the registry of guest mappings and the SIGBUS handler that survives a frontend
//!   shrinking the file behind its memory.
//! - [`segs`]: [`Segs`], one descriptor chain's buffers as host pointers, and the one copy a
//!   frame takes from a sender's buffers into a receiver's.
//! - [`huge`]: large shared tables (the connection tracker's) on transparent huge pages.

pub mod fault;
pub mod guest;
pub mod huge;
pub mod segs;

pub use guest::{GuestMem, MAX_REGIONS, MemError, MemLimits, RegionDesc};
pub use segs::{Segs, SegsFull, SegsSlot};
