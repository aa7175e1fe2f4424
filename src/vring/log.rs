//! Dirty-page logging, for live migration: while a frontend migrates its VM it shares a bitmap
//! (SET_LOG_BASE), one bit per 4 KiB guest-physical page, and every page pvswitchd writes must
//! be marked in it, so the frontend copies that page again. A mark follows its write, never
//! precedes it (a mark the frontend clears before the write lands would lose the page):
//! delivery marks the bytes it wrote into a receive buffer right after writing them
//! (`ActiveRing::log_written`: the frame's bytes and the virtio-net header, not the rest of the
//! buffer, however long the frontend made its descriptors), and a ring marks its used ring
//! (entries, index, `avail_event`) when it publishes. Nothing is kept between pops: a chain
//! popped and given back unwritten marks nothing, and one given back after a write had its
//! bytes marked at the write. So the work is bounded by the bytes written (a page per 4 KiB
//! plus one per buffer piece), whatever the frontend's descriptors say, and the log holds no
//! state that grows. A ring without a log pays one branch per buffer written and one per
//! publish.
#![forbid(unsafe_code)]

use std::fs::File;
use std::sync::Arc;

use crate::mem::{GuestMem, MemLimits, RegionDesc};

/// Log granularity: one bit per 4 KiB page (VHOST_LOG_PAGE).
pub const PAGE_SHIFT: u32 = 12;

/// The frontend's log bitmap, mapped (checked and charged like guest memory: its size and
/// offset against the file and the port's limits, and protected against the file shrinking).
pub struct DirtyLog {
    bitmap: GuestMem,
    bytes: u64,
}

impl DirtyLog {
    /// Maps the `size` bytes at `offset` of `file`.
    pub fn map(size: u64, offset: u64, file: File, limits: &MemLimits) -> Result<DirtyLog, String> {
        if size == 0 {
            return Err("log of 0 bytes".into());
        }
        let desc = RegionDesc { guest_phys_addr: 0, size, user_addr: 0, mmap_offset: offset };
        let bitmap = GuestMem::map(&[desc], vec![file], limits).map_err(|e| format!("log: {e}"))?;
        Ok(DirtyLog { bitmap, bytes: size })
    }

    /// Bytes of bitmap.
    pub fn len(&self) -> u64 {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Whether host address `addr` lies in the bitmap's mapping (a fault there is the
    /// frontend's: it shrank the log's file).
    pub fn contains_host(&self, addr: usize) -> bool {
        self.bitmap.contains_host(addr)
    }

    /// Whether the bitmap has a bit for every page below guest address `end`.
    pub fn covers(&self, end: u64) -> bool {
        end.div_ceil(1 << PAGE_SHIFT).div_ceil(8) <= self.bytes
    }

    /// Marks page number `page` (a page past the bitmap is not marked: the frontend sized it).
    #[inline]
    pub fn mark_page(&self, page: u64) {
        self.bitmap.fetch_or_byte(page >> 3, 1 << (page & 7));
    }

    /// Marks the pages of `[gpa, gpa + len)`, skipping the page marked just before (`last`):
    /// consecutive pieces that share a page mark it once.
    #[inline]
    pub fn mark(&self, gpa: u64, len: u64, last: &mut u64) {
        if len == 0 {
            return;
        }
        let first = gpa >> PAGE_SHIFT;
        let end = gpa.saturating_add(len - 1) >> PAGE_SHIFT;
        for page in first..=end {
            if page != *last {
                self.mark_page(page);
                *last = page;
            }
        }
    }
}

/// One ring's part of a port's log: the log, and where its used ring is (if the frontend asked
/// for it to be logged: VHOST_VRING_F_LOG).
pub struct RingLog {
    pub log: Arc<DirtyLog>,
    /// Guest address and length of the used ring.
    used: Option<(u64, u64)>,
}

impl RingLog {
    pub fn new(log: Arc<DirtyLog>, used_gpa: Option<u64>, size: u16) -> RingLog {
        RingLog { log, used: used_gpa.map(|g| (g, 6 + 8 * size as u64)) }
    }

    /// The used ring was written (its entries, index or `avail_event`).
    #[inline]
    pub fn used_written(&self) {
        if let Some((gpa, len)) = self.used {
            let mut none = u64::MAX;
            self.log.mark(gpa, len, &mut none);
        }
    }
}
