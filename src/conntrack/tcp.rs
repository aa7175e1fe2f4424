//! TCP in connection tracking: the state a connection is in, and whether a segment lies in
//! the window its peer opened (after Guido van Rooij's "Real Stateful TCP Packet Filtering in
//! IP Filter", as Linux's and OVS's trackers check it). Pure: a segment and the state before
//! it give the state after it, or `Invalid`; the table stores the result.

use super::packet::Segment;
use crate::wire::tcp::flags;

/// A connection's TCP state, coarse as OVS's userspace tracker keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum TcpState {
    /// The originator's SYN seen.
    SynSent = 1,
    /// The responder's SYN+ACK seen: `+est` from here on.
    SynRecv = 2,
    Established = 3,
    /// A FIN seen from one side.
    FinWait = 4,
    /// FINs seen from both sides.
    TimeWait = 5,
    /// A RST seen.
    Closed = 6,
}

impl TcpState {
    pub fn from_u8(v: u8) -> Option<TcpState> {
        use TcpState::*;
        [SynSent, SynRecv, Established, FinWait, TimeWait, Closed].into_iter().find(|s| *s as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Closed => "CLOSED",
        }
    }
}

/// One direction's sequence space, as its sender used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dir {
    /// The highest sequence number sent, plus one (seq + len).
    pub end: u32,
    /// The highest sequence number the peer allowed (its ack + window).
    pub maxend: u32,
    /// The largest window this side advertised (scaled), at least 1 once seen.
    pub maxwin: u32,
    /// This side's window scale (0 unless both sides offered it).
    pub scale: u8,
}

/// `a` after `b` in sequence space.
fn after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

fn before(a: u32, b: u32) -> bool {
    after(b, a)
}

/// The most an ACK may fall behind what was sent (Linux's MAXACKWINDOW floor).
const MAX_ACK_WINDOW: u32 = 66000;

/// What a segment may do to a connection that has not been seen: open it (a SYN), pick it up
/// mid-stream (an ACK without SYN, as Linux's loose pickup: after a restart the switch finds
/// established connections it never saw open), or nothing.
pub fn opens(seg: &Segment) -> Option<(TcpState, Dir)> {
    let f = seg.flags;
    if f & flags::RST != 0 {
        return None;
    }
    let win = seg.window as u32;
    if f & flags::SYN != 0 {
        if f & flags::ACK != 0 {
            return None;
        }
        let end = seg.seq.wrapping_add(1);
        let scale = seg.wscale.unwrap_or(0);
        let d =
            Dir { end, maxend: end, maxwin: win.max(1), scale: if seg.wscale.is_some() { scale | 0x80 } else { 0 } };
        return Some((TcpState::SynSent, d));
    }
    if f & flags::ACK == 0 {
        return None;
    }
    // Picked up: the window's scale is unknown, so the window is taken as large as scaling
    // could make it (as Linux does for a picked-up connection).
    let end = seg.seq.wrapping_add(seg.len).wrapping_add((f & flags::FIN != 0) as u32);
    let d = Dir { end, maxend: end.wrapping_add(win << 14), maxwin: (win << 14).max(1), scale: 14 };
    Some((TcpState::Established, d))
}

/// The state after segment `seg` from `sender` (the originator's side if `!reply`) to
/// `receiver`, with the two sides' new sequence spaces; `None`: the segment is out of window or
/// its flags make no sense here (`+inv`, and nothing changes).
pub fn step(state: TcpState, reply: bool, sender: Dir, receiver: Dir, seg: &Segment) -> Option<(TcpState, Dir, Dir)> {
    let f = seg.flags;
    let (mut s, mut r) = (sender, receiver);
    let syn = f & flags::SYN != 0;
    let ack_set = f & flags::ACK != 0;
    // Flags that no stack sends together.
    if (syn && f & (flags::RST | flags::FIN) != 0) || f & (flags::SYN | flags::RST | flags::ACK | flags::FIN) == 0 {
        return None;
    }
    // The responder's SYN+ACK: its side of the window starts here.
    if syn {
        if !(reply && ack_set && state == TcpState::SynSent) {
            // A retransmitted SYN from the originator is fine; anything else is not.
            return (!reply && !ack_set && state == TcpState::SynSent && seg.seq.wrapping_add(1) == s.end)
                .then_some((state, s, r));
        }
        let both = seg.wscale.is_some() && r.scale & 0x80 != 0;
        let sc = |own: Option<u8>, d: u8| if both { own.unwrap_or(d & 0x7f) } else { 0 };
        s = Dir {
            end: seg.seq.wrapping_add(1),
            maxend: seg.seq.wrapping_add(1),
            maxwin: (seg.window as u32).max(1),
            scale: sc(seg.wscale, 0),
        };
        r.scale = sc(None, r.scale);
        if seg.ack != r.end {
            return None;
        }
        r.maxend = seg.ack.wrapping_add(s.maxwin);
        return Some((TcpState::SynRecv, s, r));
    }
    let seq = seg.seq;
    let ack = if ack_set { seg.ack } else { r.end };
    let end = seq.wrapping_add(seg.len).wrapping_add((f & flags::FIN != 0) as u32);
    let win = (seg.window as u32) << (s.scale & 0x7f).min(14);
    if s.maxwin == 0 {
        // The sender's first segment seen (a connection picked up from the other side).
        (s.end, s.maxend, s.maxwin) = (end, end, win.max(1));
    }
    if r.maxwin == 0 {
        // The receiver has sent nothing yet (picked up from this side only).
        (r.end, r.maxend) = (ack, ack);
    }
    let max_ack_window = s.maxwin.max(MAX_ACK_WINDOW);
    let in_window = !after(seq, s.maxend)
        && !before(end, s.end.wrapping_sub(r.maxwin.max(1)).wrapping_sub(1))
        && !after(ack, r.end)
        && !before(ack, r.end.wrapping_sub(max_ack_window));
    if !in_window {
        return None;
    }
    if s.maxwin < win {
        s.maxwin = win;
    }
    if after(end, s.end) {
        s.end = end;
    }
    if ack_set && after(ack.wrapping_add(win), r.maxend) {
        r.maxend = ack.wrapping_add(win);
    }
    let next = if f & flags::RST != 0 {
        TcpState::Closed
    } else if f & flags::FIN != 0 {
        match state {
            TcpState::FinWait | TcpState::TimeWait => TcpState::TimeWait,
            TcpState::Closed => TcpState::Closed,
            _ => TcpState::FinWait,
        }
    } else {
        match state {
            TcpState::SynRecv if !reply => TcpState::Established,
            TcpState::SynSent => state,
            other => other,
        }
    };
    Some((next, s, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(flags: u16, seq: u32, ack: u32, window: u16, len: u32) -> Segment {
        Segment { flags, seq, ack, window, len, wscale: None }
    }

    const SYN: u16 = flags::SYN;
    const ACK: u16 = flags::ACK;

    /// A handshake from client sequence 1000 and server sequence 5000, both windows 1000.
    fn handshake() -> (TcpState, Dir, Dir) {
        let (st, c) = opens(&seg(SYN, 1000, 0, 1000, 0)).unwrap();
        let (st, s, c) = step(st, true, Dir::default(), c, &seg(SYN | ACK, 5000, 1001, 1000, 0)).unwrap();
        assert_eq!(st, TcpState::SynRecv);
        let (st, c, s) = step(st, false, c, s, &seg(ACK, 1001, 5001, 1000, 0)).unwrap();
        assert_eq!(st, TcpState::Established);
        (st, c, s)
    }

    #[test]
    fn a_handshake_then_data_within_the_window() {
        let (st, c, s) = handshake();
        let (st, c, s) = step(st, false, c, s, &seg(ACK, 1001, 5001, 1000, 500)).unwrap();
        assert_eq!(c.end, 1501);
        let (_, s, c) = step(st, true, s, c, &seg(ACK, 5001, 1501, 1000, 0)).unwrap();
        assert_eq!(c.maxend, 1501 + 1000, "the server's ACK opened the client's window");
        let _ = s;
    }

    #[test]
    fn segments_outside_the_window_are_invalid() {
        let (st, c, s) = handshake();
        // Past what the server allowed (ack 5001 + window 1000 from 1001: up to 2001).
        assert!(step(st, false, c, s, &seg(ACK, 1001 + 5000, 5001, 1000, 100)).is_none(), "far ahead");
        // Acknowledging what the server never sent.
        assert!(step(st, false, c, s, &seg(ACK, 1001, 5001 + 10, 1000, 0)).is_none(), "an ACK of unsent data");
        // Far behind: a stale segment from long ago.
        assert!(step(st, false, c, s, &seg(ACK, 1001u32.wrapping_sub(200_000), 5001, 1000, 10)).is_none());
        // A retransmission of what was sent is fine.
        assert!(step(st, false, c, s, &seg(ACK, 1001, 5001, 1000, 0)).is_some());
    }

    #[test]
    fn fins_and_rst_close_and_nonsense_is_invalid() {
        let (st, c, s) = handshake();
        let (st, c, s) = step(st, false, c, s, &seg(ACK | flags::FIN, 1001, 5001, 1000, 0)).unwrap();
        assert_eq!(st, TcpState::FinWait);
        let (st, s, c) = step(st, true, s, c, &seg(ACK | flags::FIN, 5001, 1002, 1000, 0)).unwrap();
        assert_eq!(st, TcpState::TimeWait);
        let (st, ..) = step(st, false, c, s, &seg(flags::RST, 1002, 0, 0, 0)).unwrap();
        assert_eq!(st, TcpState::Closed);
        let (st, c, s) = handshake();
        assert!(step(st, false, c, s, &seg(SYN | flags::FIN, 1001, 0, 0, 0)).is_none(), "SYN+FIN");
        assert!(step(st, false, c, s, &seg(0, 1001, 0, 0, 0)).is_none(), "no flags");
        assert!(step(st, true, s, c, &seg(SYN | ACK, 5000, 1001, 1000, 0)).is_none(), "a SYN+ACK once established");
    }

    #[test]
    fn a_syn_ack_must_acknowledge_the_syn_and_scales_apply_only_when_both_offer() {
        let (st, c) = opens(&Segment { wscale: Some(7), ..seg(SYN, 1000, 0, 1000, 0) }).unwrap();
        assert!(step(st, true, Dir::default(), c, &seg(SYN | ACK, 5000, 999, 1000, 0)).is_none(), "wrong ACK");
        let (_, s, c2) =
            step(st, true, Dir::default(), c, &Segment { wscale: Some(3), ..seg(SYN | ACK, 5000, 1001, 1000, 0) })
                .unwrap();
        assert_eq!((c2.scale, s.scale), (7, 3));
        let (_, s, c2) = step(st, true, Dir::default(), c, &seg(SYN | ACK, 5000, 1001, 1000, 0)).unwrap();
        assert_eq!((c2.scale, s.scale), (0, 0), "the server did not offer: neither scales");
    }

    #[test]
    fn a_connection_is_picked_up_mid_stream_and_tracked_on() {
        let (st, c) = opens(&seg(ACK, 70_000, 90_000, 500, 100)).unwrap();
        assert_eq!(st, TcpState::Established);
        // The server's first segment seen: its ACK covers what the client sent.
        let (st, s, c) = step(st, true, Dir::default(), c, &seg(ACK, 90_000, 70_100, 500, 0)).unwrap();
        let (_, c, _) = step(st, false, c, s, &seg(ACK, 70_100, 90_000, 500, 100)).unwrap();
        assert_eq!(c.end, 70_200);
        assert!(opens(&seg(flags::RST, 1, 0, 0, 0)).is_none() && opens(&seg(SYN | ACK, 1, 2, 0, 0)).is_none());
    }
}
