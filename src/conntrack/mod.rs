//! Connection tracking: for each IP frame, which connection it belongs to and in which
//! direction, and that connection's state, as OVS's `ct` action gives it to its flows
//! (`ct_state`'s `+trk`, `+new`, `+est`, `+rel`, `+rpl`, `+inv`; `ct_zone`; `ct_mark`).
//!
//! - [`packet`]: what a frame is to the tracker (`CtPacket`): its tuple, a TCP segment, the
//!   connection an ICMP error quotes, or invalid.
//! - [`tcp`]: TCP's states and the window check (a segment outside the window is `+inv`).
//! - [`table`]: the table every poll thread shares, without a lock: a hit takes no lock
//!   another thread holds and an insert never waits for another thread.
//!
//! A connection lives in a zone (a tenant's address space: the same addresses in two zones
//! are two connections). It is stored only when a flow commits it (`ct(commit)`); until then
//! each of its frames is `+new`. Once a reply has been seen (for TCP: the responder's
//! SYN+ACK) its frames are `+est`, those from the responder `+rpl` too. An ICMP or ICMPv6
//! error quoting a stored connection is `+rel`. Connections expire by protocol and state
//! ([`Timeouts`]); a sweep removes expired ones a bounded number of slots at a time, so no
//! poll thread ever walks the whole table. Limits: the table's size (every zone together) and
//! a limit per zone, so one tenant's SYN flood fills its own quota only.
//!
//! IP fragments: a first fragment is tracked by the L4 header it carries; a later fragment
//! (which carries none) is `+inv`, so that no fragment passes a rule its first fragment
//! would not (reassembly is future work: DESIGN.md, "Connection tracking").
#![forbid(unsafe_code)]

pub mod packet;
pub mod table;
pub mod tcp;

use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Instant;

pub use packet::{CtPacket, Kind, Segment, Tuple};
use table::{Found, IN_USE, KEY_WORDS, Table};
use tcp::{Dir, TcpState};

/// `ct_state` bits (the flow language's: `flow::ct_state`).
pub use crate::flow::ct_state as state;

/// How long a connection lives without a frame, by protocol and state (seconds). The
/// defaults are those of OVS's userspace tracker, rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub tcp_syn: u32,
    pub tcp_established: u32,
    pub tcp_closing: u32,
    pub tcp_closed: u32,
    /// UDP and other protocols before and after a reply.
    pub udp_first: u32,
    pub udp_replied: u32,
    pub icmp: u32,
    /// A first fragment's note for its datagram's later fragments (Linux's `ipfrag_time`).
    pub fragment: u32,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            tcp_syn: 30,
            tcp_established: 24 * 3600,
            tcp_closing: 120,
            tcp_closed: 30,
            udp_first: 30,
            udp_replied: 120,
            icmp: 30,
            fragment: 30,
        }
    }
}

/// The most connections: all zones together (the table's size), and each zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: u32,
    pub per_zone: u32,
}

/// What tracking a frame gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CtResult {
    /// `ct_state` bits.
    pub state: u8,
    pub mark: u32,
    /// Why a commit stored nothing (the frame is then dropped, as OVS drops past `ct_limit`).
    pub refused: Option<Refused>,
    /// The connection is in the table (it was, or this commit stored it).
    pub stored: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The zone holds its limit of connections.
    ZoneLimit,
    /// The table holds its limit, or the connection's bucket is full of live ones.
    TableFull,
}

/// What `ct(commit, ...)` asks besides storing: a mark to set (`exec(set_field:V/M->ct_mark)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Commit {
    pub mark: Option<(u32, u32)>,
}

/// One stored connection, for `pvswitchctl conntrack`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub zone: u16,
    /// As its first frame went.
    pub orig: Tuple,
    /// TCP's state name, or "FIRST"/"REPLIED" for the others.
    pub state: &'static str,
    pub mark: u32,
    /// Seconds until it expires.
    pub expires_in: u32,
}

/// Meta bits (`table::Slot::meta`): the protocol state in the low byte, then flags.
const ORIG_LOW: u64 = 1 << 8;
const REPLIED: u64 = 1 << 9;
const IS_ICMP: u64 = 1 << 10;
const IS_TCP: u64 = 1 << 11;
/// Bit 12 + side: that side offered window scaling (its scale is at bits 16 + 4 * side).
const OFFERED: u32 = 12;
/// Non-TCP states.
const FIRST: u8 = 1;
const SEEN_REPLY: u8 = 2;

/// The most packets [`Conntrack::track_burst`] takes at once (a poll thread's burst).
pub const BURST: usize = 32;

/// Connections from which a burst's lookups are worth starting together
/// (`prefetch_tags`): below it the table's lines stay in the caches, and the extra pass cost
/// more than it saved (64 B frames through OVS's `ct` flows, tools/bench_ct.py --base: at one
/// connection 1.16x the cycles a frame; from this size on, 10,000 connections a zone took
/// 0.675x, 100,000 0.574x).
pub const PREFETCH_FROM: u32 = 4096;

/// Where a connection's key lies in the table: its two buckets and its tag
/// (`Conntrack::prefetch_tags`).
pub type Place = ([usize; 2], u32);

pub struct Conntrack {
    table: Table,
    limits: Limits,
    pub timeouts: Timeouts,
    start: Instant,
    /// Seconds since `start`, from 1, as last ticked.
    clock: AtomicU32,
    count: AtomicU32,
    zone_counts: Box<[AtomicU32]>,
    /// Frames found with no room to store their connection, by reason.
    pub refused: [AtomicU64; 2],
    /// Fragments after the first refused: no first fragment seen (or its note expired or
    /// found no room), overlapping what came before, or past 65,535 bytes.
    pub bad_fragments: AtomicU64,
}

impl Conntrack {
    pub fn new(limits: Limits, timeouts: Timeouts) -> Conntrack {
        let seed = std::collections::hash_map::RandomState::new();
        let seed = std::hash::BuildHasher::hash_one(&seed, 0x5eed_u64);
        Conntrack {
            table: Table::new(limits.total, seed),
            limits,
            timeouts,
            start: Instant::now(),
            clock: AtomicU32::new(1),
            count: AtomicU32::new(0),
            zone_counts: (0..=u16::MAX as usize).map(|_| AtomicU32::new(0)).collect(),
            refused: Default::default(),
            bad_fragments: AtomicU64::new(0),
        }
    }

    /// The table's clock: whole seconds since it was made, from 1.
    pub fn now(&self) -> u32 {
        self.start.elapsed().as_secs() as u32 + 1
    }

    pub fn len(&self) -> u32 {
        self.count.load(Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a burst's lookups are worth starting together (`PREFETCH_FROM`).
    #[inline]
    pub fn worth_prefetching(&self) -> bool {
        self.len() >= PREFETCH_FROM
    }

    pub fn zone_len(&self, zone: u16) -> u32 {
        self.zone_counts[zone as usize].load(Relaxed)
    }

    /// The table's slots: what a full sweep visits.
    pub fn slots(&self) -> usize {
        self.table.slots()
    }

    /// Bytes the table holds, per connection it may hold.
    pub fn bytes_per_connection(&self) -> usize {
        self.table.slots() * table::SLOT_BYTES / self.limits.total.max(1) as usize
    }

    /// Tracks packet `p` in `zone` at time `now` (`Conntrack::now`), storing its connection if
    /// `commit` says so. Never blocks; allocates nothing.
    ///
    /// IP fragments follow their first fragment: a first fragment whose connection is stored
    /// (found, or committed now) leaves a note of its datagram (`FRAG`: addresses, protocol,
    /// identification, this direction only; what the tracker said, and where the data seen
    /// so far ends), and a later fragment gets what its first got, if its data begins at or
    /// after that end and ends within 65,535 bytes; anything else about it is `+inv` (no first
    /// fragment, or it came later; an overlap; an oversized datagram), counted in
    /// `bad_fragments`. So no fragment passes where its first would not, without reassembly;
    /// fragments out of order after the first are dropped.
    pub fn track(&self, p: &CtPacket, zone: u16, commit: Option<Commit>, now: u32) -> CtResult {
        use state::*;
        let done = |state: u8| CtResult { state, ..Default::default() };
        match *p {
            CtPacket::NotIp => done(TRK),
            CtPacket::Invalid => done(TRK | INV),
            CtPacket::Conn { tuple, first: Some(frag), .. } => {
                let r = self.track_conn(p, zone, commit, now);
                if r.stored && r.state & INV == 0 {
                    self.note_first_fragment(&tuple, frag, zone, r, now);
                }
                r
            }
            CtPacket::Fragment { group, offset, end } => {
                let Some(f) = self.find_live(&frag_key(&group, zone), now) else {
                    self.bad_fragments.fetch_add(1, Relaxed);
                    return done(TRK | INV);
                };
                // Where the data seen so far ends, and where the last fragment began.
                let [seen, last, _] = &self.table.slot(f.index).tcp[0];
                let (seen_end, last_start) = (seen.load(Relaxed), last.load(Relaxed));
                // The last fragment again (a frame retried after backpressure) is no overlap.
                let again = offset == last_start && end == seen_end;
                if (offset < seen_end && !again) || end > u16::MAX as u32 {
                    self.bad_fragments.fetch_add(1, Relaxed);
                    return done(TRK | INV);
                }
                // One datagram's fragments come from one sender's queue, which one thread
                // polls: no other store races these.
                seen.store(end, Relaxed);
                last.store(offset, Relaxed);
                CtResult { state: f.meta as u8, mark: (f.meta >> 32) as u32, refused: None, stored: true }
            }
            _ => self.track_conn(p, zone, commit, now),
        }
    }

    /// The note a first fragment leaves for its datagram's later fragments (`track`): in the
    /// table as a connection is, counted in its zone, gone after `Timeouts::fragment`.
    #[cold]
    fn note_first_fragment(&self, t: &Tuple, frag: packet::Frag, zone: u16, r: CtResult, now: u32) {
        let key = frag_key(&packet::Frag::group(t, frag.id), zone);
        let meta = r.state as u64 | (r.mark as u64) << 32;
        let expires = now + self.timeouts.fragment;
        let sides = [Dir { end: frag.end, ..Dir::default() }, Dir::default()];
        if let Some(f) = self.find_live(&key, now) {
            // The same first fragment again (or the identification reused): start over.
            let slot = self.table.slot(f.index);
            slot.tcp[0][0].store(frag.end, Relaxed);
            slot.tcp[0][1].store(0, Relaxed);
            let _ = slot.meta.compare_exchange(f.meta, (f.meta & 0xff00_0000) | meta, AcqRel, Relaxed);
            slot.expires.store(expires, Relaxed);
            return;
        }
        if self.insert(&key, zone, now, expires, meta, sides).is_err() {
            self.bad_fragments.fetch_add(1, Relaxed);
        }
    }

    /// `track` for everything but fragments' notes.
    #[inline(always)]
    fn track_conn(&self, p: &CtPacket, zone: u16, commit: Option<Commit>, now: u32) -> CtResult {
        use state::*;
        let done = |state: u8| CtResult { state, ..Default::default() };
        match *p {
            CtPacket::NotIp | CtPacket::Fragment { .. } => unreachable!("track takes these"),
            CtPacket::Invalid => done(TRK | INV),
            CtPacket::Error { quoted, .. } => {
                let (key, low) = canonical(&quoted, zone);
                match self.find_live(&key, now) {
                    // The error travels against the quoted frame: a reply if that frame went
                    // the connection's original way.
                    Some(f) => {
                        let quoted_orig = (f.meta & ORIG_LOW != 0) == low;
                        done(TRK | REL | if quoted_orig { RPL } else { 0 })
                    }
                    None => done(TRK | INV),
                }
            }
            CtPacket::Conn { tuple, tcp, kind, .. } => {
                let (key, low) = canonical(&tuple, zone);
                if let Some(f) = self.find_live(&key, now) {
                    match self.hit(f, low, tcp.as_ref(), commit, now) {
                        Some(r) => return CtResult { stored: true, ..r },
                        // A closed TCP connection's port reused by a new SYN: start over.
                        None => {
                            let i = f.index;
                            if let Some(k) = self.table.remove_if(i, |k, _| *k == key) {
                                self.uncount(&k);
                            }
                        }
                    }
                }
                if kind == Kind::ReplyOnly {
                    return done(TRK | INV);
                }
                let (meta, sides) = match tcp {
                    Some(seg) => match tcp::opens(&seg) {
                        Some((st, d)) => {
                            let mut sides = [Dir::default(); 2];
                            sides[if low { 0 } else { 1 }] = d;
                            (st as u64 | scales(&sides) | IS_TCP, sides)
                        }
                        None => return done(TRK | INV),
                    },
                    None => {
                        let icmp = matches!(tuple.proto, crate::wire::protocol::ICMP | crate::wire::protocol::ICMPV6);
                        (FIRST as u64 | if icmp { IS_ICMP } else { 0 }, [Dir::default(); 2])
                    }
                };
                let mut r = done(TRK | NEW);
                if let Some(c) = commit {
                    let mark = c.mark.map_or(0, |(v, m)| v & m);
                    let meta = meta | if low { ORIG_LOW } else { 0 } | (mark as u64) << 32;
                    let expires = now + self.timeout(meta);
                    match self.insert(&key, zone, now, expires, meta, sides) {
                        Ok(()) => (r.mark, r.stored) = (mark, true),
                        Err(why) => {
                            self.refused[why as usize].fetch_add(1, Relaxed);
                            r.refused = Some(why);
                        }
                    }
                }
                r
            }
        }
    }

    /// Tracks a burst of at most [`BURST`] packets (the rest are left as they are), each as
    /// `track` would: first every packet's key is hashed and its buckets' tags start loading,
    /// then the slots those tags point at, then each is tracked. A burst's cache misses then
    /// overlap instead of following one another (the exact-match cache's trick).
    pub fn track_burst(&self, pkts: &[CtPacket], zone: u16, commit: Option<Commit>, now: u32, out: &mut [CtResult]) {
        let n = pkts.len().min(out.len()).min(BURST);
        let mut places = [None; BURST];
        for (p, place) in pkts[..n].iter().zip(places.iter_mut()) {
            *place = self.prefetch_tags(p, zone);
        }
        for place in places[..n].iter().flatten() {
            self.prefetch_slots(*place);
        }
        for (p, r) in pkts[..n].iter().zip(out.iter_mut()) {
            *r = self.track(p, zone, commit, now);
        }
    }

    /// The first step of a lookup ahead of time: where `p`'s connection in `zone` would be
    /// (None: `p` looks up no connection), its buckets' tags loading. A burst's frames each
    /// take this step, then `prefetch_slots`, then `track`: their cache misses overlap.
    #[inline]
    pub fn prefetch_tags(&self, p: &CtPacket, zone: u16) -> Option<Place> {
        let t = match p {
            CtPacket::Conn { tuple, .. } => tuple,
            CtPacket::Error { quoted, .. } => quoted,
            _ => return None,
        };
        let place = self.table.place(&canonical(t, zone).0);
        self.table.prefetch_tags(place.0);
        Some(place)
    }

    /// The second step: the slots the place's tags point at start loading.
    #[inline]
    pub fn prefetch_slots(&self, (buckets, tag): Place) {
        self.table.prefetch_slots(buckets, tag);
    }

    /// The slot of `key`'s connection if it has not expired at `now`; an expired one is
    /// removed (the sweep may not have come by yet), so it starts over as a new connection.
    #[inline]
    fn find_live(&self, key: &[u64; KEY_WORDS], now: u32) -> Option<Found> {
        let f = self.table.find(key)?;
        if self.table.slot(f.index).expires.load(Relaxed) > now {
            return Some(f);
        }
        if let Some(k) = self.table.remove_if(f.index, |k, e| k == key && e <= now) {
            self.uncount(&k);
        }
        None
    }

    /// A frame of a stored connection. `None`: a new SYN on a closed connection's tuple.
    fn hit(&self, f: Found, low: bool, seg: Option<&Segment>, commit: Option<Commit>, now: u32) -> Option<CtResult> {
        use state::*;
        let slot = self.table.slot(f.index);
        let reply = (f.meta & ORIG_LOW != 0) != low;
        let mut meta = f.meta;
        let proto = meta as u8;
        if let Some(seg) = seg {
            let st = TcpState::from_u8(proto).unwrap_or(TcpState::Closed);
            let (me, peer) = if low { (0, 1) } else { (1, 0) };
            let side = |i: usize| Dir {
                end: slot.tcp[i][0].load(Relaxed),
                maxend: slot.tcp[i][1].load(Relaxed),
                maxwin: slot.tcp[i][2].load(Relaxed),
                scale: (meta >> (16 + 4 * i)) as u8 & 0xf
                    | if (meta >> (OFFERED as usize + i)) & 1 != 0 { 0x80 } else { 0 },
            };
            let fresh_syn =
                seg.flags & crate::wire::tcp::flags::SYN != 0 && seg.flags & crate::wire::tcp::flags::ACK == 0;
            if matches!(st, TcpState::TimeWait | TcpState::Closed) && fresh_syn {
                return None;
            }
            let Some((next, s, r)) = tcp::step(st, reply, side(me), side(peer), seg) else {
                return Some(CtResult { state: TRK | INV, mark: (meta >> 32) as u32, refused: None, stored: true });
            };
            for (i, d) in [(me, s), (peer, r)] {
                slot.tcp[i][0].store(d.end, Relaxed);
                slot.tcp[i][1].store(d.maxend, Relaxed);
                slot.tcp[i][2].store(d.maxwin, Relaxed);
            }
            let mut sides = [Dir::default(); 2];
            (sides[me], sides[peer]) = (s, r);
            meta = (meta & !0xff & !(0xff << 16) & !(0b11 << OFFERED)) | next as u64 | scales(&sides);
        } else if reply && proto == FIRST {
            meta = (meta & !0xff) | SEEN_REPLY as u64;
        }
        if reply {
            meta |= REPLIED;
        }
        if let Some(Commit { mark: Some((v, m)) }) = commit {
            let old = (meta >> 32) as u32;
            meta = (meta & 0xffff_ffff) | (((old & !m) | (v & m)) as u64) << 32;
        }
        // Another thread's update of the same connection meanwhile wins; this frame's verdict
        // stands either way (as two frames racing in the kernel's tracker).
        if meta != f.meta {
            let _ = slot.meta.compare_exchange(f.meta, meta, AcqRel, Relaxed);
        }
        // Written only when it moves (once a second at most): a connection's frames on two
        // threads then share its slot's line read-only between state changes.
        let expires = now + self.timeout(meta);
        if slot.expires.load(Relaxed) != expires {
            slot.expires.store(expires, Relaxed);
        }
        // Established once the responder answered (for TCP, its SYN+ACK), as OVS and Linux say.
        let est = meta & REPLIED != 0;
        let state = TRK | if est { EST } else { NEW } | if reply { RPL } else { 0 };
        Some(CtResult { state, mark: (meta >> 32) as u32, refused: None, stored: true })
    }

    fn timeout(&self, meta: u64) -> u32 {
        let t = &self.timeouts;
        if meta & IS_ICMP != 0 {
            return t.icmp;
        }
        if meta & IS_TCP != 0 {
            return match TcpState::from_u8(meta as u8) {
                Some(TcpState::SynSent | TcpState::SynRecv) => t.tcp_syn,
                Some(TcpState::Established) => t.tcp_established,
                Some(TcpState::FinWait | TcpState::TimeWait) => t.tcp_closing,
                _ => t.tcp_closed,
            };
        }
        if meta & REPLIED != 0 { t.udp_replied } else { t.udp_first }
    }

    fn insert(
        &self,
        key: &[u64; KEY_WORDS],
        zone: u16,
        now: u32,
        expires: u32,
        meta: u64,
        sides: [Dir; 2],
    ) -> Result<(), Refused> {
        let zc = &self.zone_counts[zone as usize];
        if zc.fetch_add(1, Relaxed) >= self.limits.per_zone {
            zc.fetch_sub(1, Relaxed);
            return Err(Refused::ZoneLimit);
        }
        if self.count.fetch_add(1, Relaxed) >= self.limits.total {
            self.count.fetch_sub(1, Relaxed);
            zc.fetch_sub(1, Relaxed);
            return Err(Refused::TableFull);
        }
        let words = sides.map(|d| [d.end, d.maxend, d.maxwin]);
        match self.table.insert(key, now, expires, meta, words) {
            Some((_, replaced)) => {
                if let Some(old) = replaced {
                    self.uncount(&old);
                }
                Ok(())
            }
            None => {
                self.count.fetch_sub(1, Relaxed);
                zc.fetch_sub(1, Relaxed);
                Err(Refused::TableFull)
            }
        }
    }

    fn uncount(&self, key: &[u64; KEY_WORDS]) {
        self.count.fetch_sub(1, Relaxed);
        self.zone_counts[zone_of(key) as usize].fetch_sub(1, Relaxed);
    }

    /// Removes what expired at `now` among `budget` slots from `*cursor` on (which moves on,
    /// wrapping): a poll thread calls it with a small budget each loop, so expiry is bounded
    /// work whatever the table's size. Returns how many it removed.
    pub fn sweep(&self, cursor: &mut usize, budget: usize, now: u32) -> usize {
        let n = self.table.slots();
        let mut removed = 0;
        for _ in 0..budget.min(n) {
            let i = *cursor % n;
            *cursor = (i + 1) % n;
            let e = self.table.slot(i).expires.load(Relaxed);
            if e != 0
                && e <= now
                && let Some(k) = self.table.remove_if(i, |_, e| e <= now)
            {
                self.uncount(&k);
                removed += 1;
            }
        }
        removed
    }

    /// Removes every connection of `zone` (every one: `None`). Returns how many.
    pub fn flush(&self, zone: Option<u16>) -> usize {
        let mut removed = 0;
        for i in 0..self.table.slots() {
            if let Some(k) = self.table.remove_if(i, |k, _| zone.is_none_or(|z| zone_of(k) == z)) {
                self.uncount(&k);
                removed += 1;
            }
        }
        removed
    }

    /// Sets the mark of each connection of `zone` to what `remark` says, given its tuple as its
    /// first frame went and its mark: what a rule change does to the connections it tracks
    /// (marks them cut, or no longer cut). Returns how many marks changed. A walk over the
    /// whole table (the control thread's); a poll thread's hit meanwhile keeps its verdict, and
    /// the mark is set again over its update (a slot's generation tells a new connection in
    /// the same slot from the one read).
    pub fn remark(&self, zone: u16, remark: impl Fn(&Tuple, u32) -> u32) -> usize {
        let mut changed = 0;
        for i in 0..self.table.slots() {
            let Some((k, meta)) = self.table.read_key(i) else { continue };
            if zone_of(&k) != zone || is_frag_note(&k) {
                continue;
            }
            let t = tuple_of(&k, meta & ORIG_LOW != 0);
            let mark = remark(&t, (meta >> 32) as u32);
            if mark == (meta >> 32) as u32 {
                continue;
            }
            let slot = self.table.slot(i);
            let mut seen = meta;
            for _ in 0..8 {
                let next = (seen & 0xffff_ffff) | (mark as u64) << 32;
                match slot.meta.compare_exchange(seen, next, AcqRel, Relaxed) {
                    Ok(_) => {
                        changed += 1;
                        break;
                    }
                    // A hit updated it: again, if it is still the same connection.
                    Err(now) if table::generation(now) == table::generation(meta) => seen = now,
                    Err(_) => break,
                }
            }
        }
        changed
    }

    /// The table's clock as the control thread last set it (`tick`): what the poll threads
    /// track with, a load rather than a clock read a frame.
    #[inline]
    pub fn clock(&self) -> u32 {
        self.clock.load(Relaxed)
    }

    /// Sets the clock `clock` reads to `now()`; returns it.
    pub fn tick(&self) -> u32 {
        let now = self.now();
        self.clock.store(now, Relaxed);
        now
    }

    /// The stored connections of `zone` (all: `None`), at most `max`.
    pub fn entries(&self, zone: Option<u16>, max: usize) -> Vec<Entry> {
        let now = self.now();
        let mut out = Vec::new();
        for i in 0..self.table.slots() {
            if out.len() >= max {
                break;
            }
            let Some((k, _)) = self.table.read_key(i) else { continue };
            let z = zone_of(&k);
            if zone.is_some_and(|want| want != z) || is_frag_note(&k) {
                continue;
            }
            let s = self.table.slot(i);
            let meta = s.meta.load(Relaxed);
            let expires = s.expires.load(Relaxed);
            let t = tuple_of(&k, meta & ORIG_LOW != 0);
            let state = match TcpState::from_u8(meta as u8) {
                Some(st) if meta & IS_TCP != 0 => st.name(),
                _ if meta & REPLIED != 0 => "REPLIED",
                _ => "FIRST",
            };
            out.push(Entry {
                zone: z,
                orig: t,
                state,
                mark: (meta >> 32) as u32,
                expires_in: expires.saturating_sub(now),
            });
        }
        out
    }
}

/// The two sides' window scales into meta (4 bits each at 16 and 20; "offered" at 12, 13).
fn scales(sides: &[Dir; 2]) -> u64 {
    let mut m = 0u64;
    for (i, d) in sides.iter().enumerate() {
        m |= ((d.scale & 0xf) as u64) << (16 + 4 * i);
        if d.scale & 0x80 != 0 {
            m |= 1 << (OFFERED as usize + i);
        }
    }
    m
}

/// A tuple as a table key in `zone`, the same for both directions, and whether the tuple is
/// the key's low-to-high direction.
pub fn canonical(t: &Tuple, zone: u16) -> ([u64; KEY_WORDS], bool) {
    // The addresses as numbers: the same order as their bytes, without a memcmp.
    let (src, dst) = (u128::from_be_bytes(t.src), u128::from_be_bytes(t.dst));
    let low = (src, t.sport) <= (dst, t.dport);
    let (a, b, pa, pb) = if low { (src, dst, t.sport, t.dport) } else { (dst, src, t.dport, t.sport) };
    let last =
        pa as u64 | (pb as u64) << 16 | (zone as u64) << 32 | (t.proto as u64) << 48 | (t.v6 as u64) << 56 | IN_USE;
    ([(a >> 64) as u64, a as u64, (b >> 64) as u64, b as u64, last], low)
}

/// A key's bit (in its last word) that makes it a first fragment's note, not a connection.
const FRAG: u64 = 1 << 57;
/// With `FRAG`: the datagram went from the key's high side to its low side.
const FRAG_HIGH_TO_LOW: u64 = 1 << 58;

/// The key of datagram `group`'s note in `zone`: one direction only (a fragment the other
/// way with the same identification is another datagram's).
fn frag_key(group: &Tuple, zone: u16) -> [u64; KEY_WORDS] {
    let (mut k, low) = canonical(group, zone);
    k[KEY_WORDS - 1] |= FRAG | if low { 0 } else { FRAG_HIGH_TO_LOW };
    k
}

fn is_frag_note(k: &[u64; KEY_WORDS]) -> bool {
    k[KEY_WORDS - 1] & FRAG != 0
}

fn zone_of(k: &[u64; KEY_WORDS]) -> u16 {
    (k[KEY_WORDS - 1] >> 32) as u16
}

/// The original direction's tuple of key `k` (`orig_low`: the originator is the low side).
fn tuple_of(k: &[u64; KEY_WORDS], orig_low: bool) -> Tuple {
    let mut a = [0u8; 16];
    let mut b = [0u8; 16];
    a[..8].copy_from_slice(&k[0].to_be_bytes());
    a[8..].copy_from_slice(&k[1].to_be_bytes());
    b[..8].copy_from_slice(&k[2].to_be_bytes());
    b[8..].copy_from_slice(&k[3].to_be_bytes());
    let last = k[KEY_WORDS - 1];
    let t = Tuple {
        src: a,
        dst: b,
        sport: last as u16,
        dport: (last >> 16) as u16,
        proto: (last >> 48) as u8,
        v6: (last >> 56) & 1 != 0,
    };
    if orig_low { t } else { t.reversed() }
}

#[cfg(test)]
mod tests;
