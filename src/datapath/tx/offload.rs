//! Offloads a destination did not negotiate, done for that destination only: a partial
//! checksum (NEEDS_CSUM) completed, a TSO frame cut into segments. `output` asks this module
//! for the checksum's value or for each segment's headers, and copies the payload itself, from
//! the sender's buffers straight into the receiver's, as for any frame. The wire formats are
//! `wire::gso`'s; here they meet a frame in guest memory.
#![forbid(unsafe_code)]

use crate::datapath::frame::Frame;
use crate::wire::gso::{self, DeviceJob, MAX_HDR, Tso};

/// What a NIC with TX offloads must be told to finish frame `f` itself, as sent with `prefix`
/// in place of its first `skip` bytes; None if the device cannot (the switch then does it).
pub(in crate::datapath) fn device_job(f: &Frame, prefix: &[u8], skip: u32) -> Option<DeviceJob> {
    let mut head = [0u8; MAX_HDR + 8];
    head.get_mut(..prefix.len())?.copy_from_slice(prefix);
    let want = (f.len.saturating_sub(skip) as usize).min(head.len() - prefix.len());
    let got = f.read_at(skip, &mut head[prefix.len()..prefix.len() + want]);
    let off = f.off.shifted(prefix.len() as i32 - skip as i32);
    DeviceJob::new(&head[..prefix.len() + got], &off)
}

/// The checksum a NEEDS_CSUM frame asked for, computed from the sender's bytes: the field's
/// offset in the frame and its value.
pub(in crate::datapath) fn checksum(f: &Frame) -> Option<(u32, u16)> {
    let (start, field) = f.off.csum?;
    let (start, field) = (start as u32, field as u32);
    let sum = f.sum(start, f.len - start);
    Some((start + field, gso::final_value(sum.fold())))
}

/// The segments of a TSO frame as sent to one destination: `prefix` replaces its first `skip`
/// bytes (a rewritten Ethernet header), as `output::Shape` says.
pub(in crate::datapath) struct Segments {
    /// The destination's headers before segmentation: prefix, then the sender's from `skip`.
    hdrs: [u8; MAX_HDR + 8],
    /// Their layout in `hdrs`.
    t: Tso,
    /// Where the payload starts in the sender's frame.
    payload_at: u32,
    payload_len: u32,
    pub count: u32,
    next: u32,
}

/// One segment: its headers, and the part of the sender's frame that is its payload.
pub(in crate::datapath) struct Segment {
    pub hdrs: [u8; MAX_HDR + 8],
    pub hdr_len: u32,
    /// Offset of the payload in the sender's frame, and its length.
    pub skip: u32,
    pub len: u32,
    /// The TCP header's offset (the checksum starts there).
    pub l4: u16,
}

impl Segments {
    pub fn new(f: &Frame, prefix: &[u8], skip: u32) -> Option<Segments> {
        let t0 = f.off.tso?;
        let t = f.off.shifted(prefix.len() as i32 - skip as i32).tso?;
        let mut hdrs = [0u8; MAX_HDR + 8];
        if t.hdr_len as usize > hdrs.len() || (t0.hdr_len as u32) < skip {
            return None;
        }
        hdrs[..prefix.len()].copy_from_slice(prefix);
        let rest = t0.hdr_len as u32 - skip;
        let got = f.read_at(skip, &mut hdrs[prefix.len()..prefix.len() + rest as usize]);
        if got < rest as usize {
            return None;
        }
        let payload_len = f.len - t0.hdr_len as u32;
        let count = f.off.segments(f.len);
        Some(Segments { hdrs, t, payload_at: t0.hdr_len as u32, payload_len, count, next: 0 })
    }

    /// The next segment's headers, with the TCP checksum complete if `full`, else in the
    /// partial form (pseudo header only) a receiver with GUEST_CSUM completes itself.
    pub fn next(&mut self, f: &Frame, full: bool) -> Option<Segment> {
        if self.next == self.count {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let mss = self.t.mss as u32;
        let off = i * mss;
        let len = (self.payload_len - off).min(mss);
        let mut s = Segment {
            hdrs: [0u8; MAX_HDR + 8],
            hdr_len: self.t.hdr_len as u32,
            skip: self.payload_at + off,
            len,
            l4: self.t.l4,
        };
        gso::segment_headers(&self.hdrs, &self.t, i, self.count, off, len, &mut s.hdrs);
        if full {
            let payload = f.sum(s.skip, len);
            gso::finish_tcp_checksum(&mut s.hdrs, &self.t, payload);
        }
        Some(s)
    }
}

/// What the fuzz target (`fuzz::gso`) sees of a frame's segmentation and checksum, through the
/// data path's own code: the frame is `len` bytes at `data_off` in `segs`, its offload `off`
/// as classify checked it, sent with `prefix` in place of its first `skip` bytes. Returns the
/// software checksum (field offset, value) and each segment (its headers, the offset and
/// length of its payload in the sender's frame, its TCP header's offset), or None where the
/// data path drops the frame (`DropReason::OffloadHeaders`).
#[cfg(test)]
#[allow(clippy::type_complexity)]
pub(crate) fn for_fuzzing(
    segs: crate::mem::Segs,
    data_off: u32,
    len: u32,
    off: gso::Offload,
    prefix: &[u8],
    skip: u32,
    full: bool,
) -> (Option<(u32, u16)>, Option<Vec<(Vec<u8>, u32, u32, u16)>>) {
    let mut f = Frame::default();
    *f.source_mut() = segs;
    f.place(data_off);
    f.len = len;
    f.off = off;
    // As classify leaves a frame that asks for offloads: its headers in the front.
    f.take_front(crate::datapath::frame::FRONT_MAX);
    let sum = checksum(&f);
    let segments = Segments::new(&f, prefix, skip).map(|mut s| {
        let mut out = Vec::new();
        while let Some(g) = s.next(&f, full) {
            out.push((g.hdrs[..g.hdr_len as usize].to_vec(), g.skip, g.len, g.l4));
        }
        out
    });
    (sum, segments)
}
