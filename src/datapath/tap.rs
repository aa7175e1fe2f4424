//! Capture's hooks in the data path (`capture`), and flow export's (`exported`). A burst's
//! consumed frames are offered to the captures of the port that sent them (`received`: each
//! frame as it came; with `--drops`, the dropped ones too, with their reason; a live trace's
//! with the data path's verdict on it), and a frame as it was written to a port to that port's
//! captures (`sent`: its shape's bytes, what the port was given). A VTEP's underlay is
//! captured on the wire's side: what it received before decapsulation (`underlay_received`),
//! what it sent with the outer headers encapsulation put in front (`underlay_sent`). All are
//! reached only through a port's non-empty `PortTable::taps`: a port nobody captures costs the
//! test of an empty slice.

use crate::capture::{self, Tap, Verdict, Way};
use crate::datapath::counters::DropReason;
use crate::datapath::frame::{FRONT_MAX, FlowState, Frame, NO_VLAN, Out, Shape};
use crate::export::{FlowExport, Observed};

/// Offers the frames a port sent (those consumed from its burst) to its captures: each
/// capture's slot locked once for the burst.
///
/// `missed`: a live trace's, by frame, the port delivery could not write it to and why.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn received(
    thread: usize,
    taps: &[Tap],
    frames: &[Frame],
    untag: bool,
    missed: &[Option<(u16, DropReason)>],
) {
    // `untag`: a tunnel's, whose outer tag (its VNI's VLAN) decapsulation put in.
    let len = |f: &Frame| if untag && f.len >= 12 + TAG { f.len - TAG } else { f.len };
    for t in taps {
        let cap = &*t.capture;
        if !cap.looks_in() {
            continue;
        }
        let Some(mut slot) = cap.slot(thread) else { continue };
        if cap.trace {
            for (i, f) in frames.iter().enumerate() {
                let missed = missed.get(i).copied().flatten();
                slot.offer_traced(t.iface, &verdict(f, missed), len(f), |buf| as_sent(f, untag, buf));
            }
            continue;
        }
        for f in frames {
            let drop = match f.out {
                Out::Drop(_) if !cap.drops => continue,
                Out::Drop(why) => Some(why as u8),
                _ => None,
            };
            slot.offer(t.iface, Way::In, drop, len(f), |buf| as_sent(f, untag, buf));
        }
    }
}

/// An 802.1Q tag's length.
const TAG: u32 = 4;

/// Copies frame `f` into `buf` as its port sent it: `untag`, without the tag after its
/// addresses. Returns the bytes.
#[inline]
fn as_sent(f: &Frame, untag: bool, buf: &mut [u8]) -> usize {
    if !untag || f.len < 12 + TAG {
        return f.read_at(0, buf);
    }
    let head = 12.min(buf.len());
    let n = f.read_at(0, &mut buf[..head]);
    match buf.get_mut(n..) {
        Some(rest) if n == 12 => n + f.read_at(12 + TAG, rest),
        _ => n,
    }
}

/// What the data path decided for `f` (consumed), and (`missed`) the port delivery could not
/// write it to and why, for a live trace.
fn verdict(f: &Frame, missed: Option<(u16, DropReason)>) -> Verdict {
    let (out, value) = match f.out {
        Out::Nowhere => (capture::OUT_NOWHERE, 0),
        Out::Drop(why) => (capture::OUT_DROP, why as u32),
        Out::Port(p) => (capture::OUT_PORT, p as u32),
        Out::Flood => (capture::OUT_FLOOD, 0),
        Out::Actions(i) | Out::Pipeline(i) => (capture::OUT_ACTIONS, i),
        Out::Path(i) => (capture::OUT_PATH, i),
        Out::Routed(p, _) => (capture::OUT_ROUTED, p as u32),
        Out::Answer => (capture::OUT_ANSWER, 0),
    };
    let mut v = Verdict {
        out,
        value,
        vlan: f.vlan,
        tag: f.tag,
        flow: match f.flow {
            FlowState::Hit(i) => Some(i),
            _ => None,
        },
        mss: f.off.tso.map_or(0, |t| t.mss),
        v6: f.off.tso.is_some_and(|t| t.v6),
        csum: f.off.csum.is_some(),
        ct: (f.ct != 0).then_some(((f.ct >> 8) as u16, f.ct as u8)),
        missed: missed.map(|(p, why)| (p, why as u8)),
        ..Verdict::default()
    };
    if out == capture::OUT_PATH {
        let met = f.path.flows();
        let n = met.len().min(Verdict::MAX_PATH);
        v.path[..n].copy_from_slice(&met[..n]);
        v.path_len = n as u8;
    }
    v
}

/// Offers a frame written to a port, shaped by `e` (a prefix, then the sender's bytes from
/// `skip`, a checksum patched in), to its captures; or (`drop`) one that delivery could not
/// write there, for the captures that take drops, with the reason (a full ring, buffers too
/// small, the MTU, a rate cap), as it would have been written.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn sent(thread: usize, taps: &[Tap], f: &Frame, e: Shape, drop: Option<DropReason>) {
    let len = e.prefix.len() as u32 + e.body_len(f);
    for t in taps.iter().filter(|t| t.capture.looks_out() && (drop.is_none() || t.capture.drops)) {
        if let Some(mut slot) = t.capture.slot(thread) {
            slot.offer(t.iface, Way::Out, drop.map(|d| d as u8), len, |buf| shaped(f, e, buf));
        }
    }
}

/// Offers a frame a VTEP's underlay received, `d` (the first `len` bytes of it, before it is
/// decapsulated), to the underlay's captures: what the wire carried, outer headers and all; with
/// `--drops`, a frame dropped there with its reason. (Its inner frame is the tunnel port's, as it
/// enters the switch.) A live trace looks at switched frames only, so it takes none of these.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn underlay_received(thread: usize, taps: &[Tap], d: &[u8], len: u32, drop: Option<u8>) {
    for t in taps {
        let cap = &*t.capture;
        if !cap.looks_in() || cap.trace || (drop.is_some() && !cap.drops) {
            continue;
        }
        if let Some(mut slot) = cap.slot(thread) {
            slot.offer(t.iface, Way::In, drop, len, |buf| copy_bytes(d, buf));
        }
    }
}

/// Offers a frame an underlay sent to its captures: `outer` (the tunnel's outer headers, as
/// encapsulation filled them) then frame `f` as shape `e` makes it, or (no `f`) `outer` alone,
/// a frame the VTEP made itself (ARP).
#[cold]
#[inline(never)]
pub(in crate::datapath) fn underlay_sent(thread: usize, taps: &[Tap], outer: &[u8], inner: Option<(&Frame, Shape)>) {
    let len = outer.len() as u32 + inner.map_or(0, |(f, e)| e.prefix.len() as u32 + e.body_len(f));
    for t in taps.iter().filter(|t| t.capture.looks_out()) {
        if let Some(mut slot) = t.capture.slot(thread) {
            slot.offer(t.iface, Way::Out, None, len, |buf| {
                let n = copy_bytes(outer, buf);
                match inner {
                    Some((f, e)) if n == outer.len() => n + shaped(f, e, &mut buf[n..]),
                    _ => n,
                }
            });
        }
    }
}

/// Copies as much of `d` as `buf` holds; returns the bytes.
fn copy_bytes(d: &[u8], buf: &mut [u8]) -> usize {
    let n = d.len().min(buf.len());
    buf[..n].copy_from_slice(&d[..n]);
    n
}

/// Copies frame `f` as shape `e` makes it into `buf` (as much as it holds); returns the bytes.
fn shaped(f: &Frame, e: Shape, buf: &mut [u8]) -> usize {
    let pre = e.prefix.len().min(buf.len());
    buf[..pre].copy_from_slice(&e.prefix[..pre]);
    let body = (e.body_len(f) as usize).min(buf.len() - pre);
    let n = pre + f.read_at(e.skip, &mut buf[pre..pre + body]);
    if let Some((at, v)) = e.patch {
        let at = at as usize;
        if at + 2 <= n {
            buf[at..at + 2].copy_from_slice(&v.to_be_bytes());
        }
    }
    n
}

/// Offers the frames port `in_port` sent (those consumed from its burst) to flow export, each
/// with where it went; dropped frames are not flows. The table is taken once for the burst.
#[cold]
#[inline(never)]
pub(in crate::datapath) fn exported(x: &FlowExport, thread: usize, in_port: u16, frames: &[Frame]) {
    let Some(mut table) = x.table(thread) else { return };
    let now = crate::export::now_ms();
    let mut buf = [0u8; FRONT_MAX];
    for f in frames.iter().filter(|f| !matches!(f.out, Out::Drop(_))) {
        if !table.samples() {
            continue;
        }
        let n = f.read_at(0, &mut buf);
        let egress = match f.out {
            Out::Port(p) | Out::Routed(p, _) => Some(p),
            _ => None,
        };
        let vlan = (f.vlan != NO_VLAN).then_some(f.vlan);
        table.record(now, Observed { front: &buf[..n], len: f.len, ingress: in_port, egress, vlan });
    }
}
const _: () = assert!(Verdict::MAX_PATH == crate::flow::MAX_PATH && Verdict::NO_VLAN == NO_VLAN);
