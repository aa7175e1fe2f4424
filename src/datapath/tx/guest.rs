//! Writing one frame into a guest's receive ring (`write_frame`): the virtio-net header, then
//! the frame over as many receive buffers as MRG_RXBUF allows, each copied once and marked in
//! the dirty log while the VM migrates; what `Open::write_one` calls for a guest port.
#![forbid(unsafe_code)]

use super::delivery::Delivery;
use crate::datapath::counters::DropReason;
use crate::datapath::frame::{Frame, Shape};
use crate::vring::{Ahead, RingError, RingLoan};
use crate::wire::VirtioNetHdr;

pub(super) enum WriteError {
    Drop(DropReason),
    Ring(RingError),
}

impl From<RingError> for WriteError {
    fn from(e: RingError) -> Self {
        WriteError::Ring(e)
    }
}

/// Most receive buffers one frame may take (MRG_RXBUF): a 64 KiB frame in 256-byte buffers.
pub const MAX_FRAME_BUFS: usize = 256;
/// Most receive descriptors walked for one frame, over all its buffers.
pub const MAX_FRAME_DESCS: u32 = 1024;

/// A guest receive ring, open for writing, and how its guest takes frames.
pub(super) struct RxRing<'a> {
    pub ring: RingLoan<'a>,
    /// The virtio-net header's length.
    pub hdr_len: u32,
    /// MRG_RXBUF: a frame may span several buffers.
    pub mrg: bool,
}

/// Copies one frame into the guest's receive buffers: the virtio-net header (`vh`, with
/// num_buffers), then the frame, spread over several buffers when MRG_RXBUF allows (num_buffers
/// says how many); the shape's `patch` (frame offset, value) is stored over the copy, in the
/// first buffer. Returns the buffers it took. Inlined into `Open::write_one`, whose two
/// instances (with and without captures' hook) would otherwise share it as a call.
#[inline(always)]
pub(super) fn write_frame(
    dst: RxRing,
    f: &Frame,
    e: Shape,
    vh: &VirtioNetHdr,
    dv: &mut Delivery,
) -> Result<u16, WriteError> {
    let RxRing { mut ring, hdr_len, mrg } = dst;
    let patch = e.patch;
    let pre = e.prefix.len() as u32;
    let (body_off, body_len) = (e.skip, e.body_len(f));
    let need = hdr_len + pre + body_len;
    if ring.avail()? == 0 {
        return Err(WriteError::Drop(DropReason::RxRingFull));
    }
    ring.prefetch_ahead(Ahead::Write(hdr_len));
    let first = dv.first.lend();
    let head = ring.pop(first, true)?;
    let first_room = first.len();
    if first_room < hdr_len + pre || (!mrg && first_room < need) {
        ring.push_used(head, 0);
        return Err(WriteError::Drop(DropReason::RxBufferTooSmall));
    }
    if pre > 0 {
        first.write_at(hdr_len, e.prefix);
    }
    let mut copied = (first_room - hdr_len - pre).min(body_len);
    if let Some((at, _)) = patch
        && at + 2 > pre + copied
    {
        ring.push_used(head, 0);
        return Err(WriteError::Drop(DropReason::RxBufferTooSmall));
    }
    f.copy_to(first, hdr_len + pre, body_off, copied);
    if let Some((at, v)) = patch {
        first.write_at(hdr_len + at, &v.to_be_bytes());
    }
    // While the VM migrates: what was just written is marked now (a frame given back below
    // was written all the same); the header, written last, is marked once it is.
    ring.log_written(first, hdr_len, pre + copied);
    ring.push_used(head, hdr_len + pre + copied);
    let mut nbufs: u16 = 1;
    let walked = ring.walked();
    while copied < body_len {
        // Bounded work per frame: at most MAX_FRAME_BUFS buffers and MAX_FRAME_DESCS
        // descriptors; a guest whose buffers are smaller than that gets the frame dropped.
        let room = ring.avail()?;
        let too_small = nbufs as usize >= MAX_FRAME_BUFS || ring.walked() - walked > MAX_FRAME_DESCS;
        if room == 0 || too_small {
            ring.unpop(nbufs);
            ring.unpush(nbufs);
            return Err(WriteError::Drop(if too_small {
                DropReason::RxBufferTooSmall
            } else {
                DropReason::RxRingFull
            }));
        }
        let more = dv.more.lend();
        let h = ring.pop(more, true)?;
        let c = more.len().min(body_len - copied);
        f.copy_to(more, 0, body_off + copied, c);
        ring.log_written(more, 0, c);
        ring.push_used(h, c);
        copied += c;
        nbufs += 1;
    }
    // Usually the buffer's header already reads so (the guest's last frame in it was a one-buffer
    // frame too); not writing it then keeps the guest's cached copy of that line valid. Compared
    // in registers (`update_words`): see there for why not through a byte array.
    let (lo, hi) = VirtioNetHdr { num_buffers: nbufs, ..*vh }.words();
    let stored = first.update_words(0, lo, hi, hdr_len);
    if stored {
        ring.log_written(first, 0, hdr_len);
    }
    ring.header_written(stored);
    Ok(nbufs)
}
