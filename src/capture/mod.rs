//! Packet capture (`pvswitchctl capture`): what a poll thread copies of a captured port's
//! frames, and how the copies reach the one who asked.
//!
//! A capture is made on the control thread (`switch::captures`): its ports (each a pcapng
//! interface), which way it looks, its filter (a pcap-filter expression compiled to BPF by
//! libpcap: `filter.rs`), and one ring per poll thread. Plans carry, per port, the captures
//! that watch it ([`Tap`]); a port nobody watches costs a poll thread one test of an empty
//! slice per burst and per destination run. A watched frame is copied (up to the snap length)
//! into the thread's scratch buffer and run through the filter where it is; a match becomes one
//! record in the thread's ring. A full ring loses the record, counted: a slow or stopped reader
//! never slows the switch. The capture's own thread (`control::capture`) drains the rings
//! ([`Reader`]) into pcapng (`pcapng.rs`) and writes it to the client.
//!
//! Each ring has one writer, the poll thread of its index (the mutex around it is only ever
//! taken by that thread, so it never waits), and one reader, the capture's thread.
#![forbid(unsafe_code)]

pub mod filter;
pub mod pcapng;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rtrb::{Consumer, Producer, RingBuffer};
use serde::{Deserialize, Serialize};

pub use filter::Filter;

use crate::counter::{cycles, cycles_per_sec};

/// Bytes of records a poll thread may hold for one capture before it loses the next.
pub const RING_BYTES: usize = 4 << 20;
/// The snap length when none is given (tcpdump's).
pub const DEFAULT_SNAPLEN: u32 = 262_144;
/// The longest frame a port takes or gives (a guest's TSO frame: 64 KiB and its headers).
pub const MAX_FRAME: usize = 65_536 + 256;

/// Which way a capture looks at its ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// What the port sent (its frames as they arrived).
    In,
    /// What the port was given (after VLAN tags, rewrites, segmentation).
    Out,
    #[default]
    Both,
}

impl std::str::FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Direction, String> {
        match s {
            "in" => Ok(Direction::In),
            "out" => Ok(Direction::Out),
            "both" | "inout" => Ok(Direction::Both),
            _ => Err(format!("direction \"{s}\": expected in, out or both")),
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            Direction::In => "in",
            Direction::Out => "out",
            Direction::Both => "both",
        })
    }
}

/// A record's way through its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    In,
    Out,
}

/// A port's capture, as a plan carries it: the capture and the port's interface in it.
#[derive(Clone)]
pub struct Tap {
    pub capture: Arc<Capture>,
    pub iface: u32,
}

/// What a capture counts of one interface (port): frames offered to the filter, frames it
/// took, and of those the ones lost (the thread's ring was full: the reader is behind).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub seen: u64,
    pub matched: u64,
    pub lost: u64,
}

/// What the data path decided for a frame a live trace (`pvswitchctl trace --live`) records
/// with its bytes: where it went as classify and the tables left it, its VLAN, the flows it met
/// and what its sender's offload header asked. Plain numbers: the capture knows no data-path
/// types (`datapath::tap` fills it in, `ctl::live` reads it back into words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verdict {
    /// `datapath::frame::Out`'s kind: see the `OUT_*` constants.
    pub out: u8,
    /// The port (`OUT_PORT`), the drop reason (`OUT_DROP`), or the first flow (`OUT_ACTIONS`).
    pub value: u32,
    /// The VLAN NORMAL switched it in ([`Verdict::NO_VLAN`]: it leaves as it came).
    pub vlan: u16,
    /// Its outer 802.1Q tag's TCI as it came (None: untagged).
    pub tag: Option<u16>,
    /// The table-0 flow it hit (None: no flow table, or dropped before a lookup;
    /// `u32::MAX`: no flow matched).
    pub flow: Option<u32>,
    /// The flows its walk through the tables met, in order (`u32::MAX`: a table had none).
    pub path: [u32; Verdict::MAX_PATH],
    pub path_len: u8,
    /// TSO asked for: the segment size (0: none), and whether over IPv6.
    pub mss: u16,
    pub v6: bool,
    /// A partial checksum to complete (NEEDS_CSUM).
    pub csum: bool,
    /// What the connection tracker last said of it: its zone and `ct_state` (None: not
    /// tracked).
    pub ct: Option<(u16, u8)>,
    /// The port delivery could not write it to, and why (a drop reason's index): a full
    /// ring, a rate cap, buffers too small, a port down.
    pub missed: Option<(u16, u8)>,
}

/// `Verdict::out`'s values.
pub const OUT_NOWHERE: u8 = 0;
pub const OUT_DROP: u8 = 1;
pub const OUT_PORT: u8 = 2;
pub const OUT_FLOOD: u8 = 3;
pub const OUT_ACTIONS: u8 = 4;
pub const OUT_PATH: u8 = 5;
/// Routed to a port (`value`), in the VLAN `vlan` says.
pub const OUT_ROUTED: u8 = 6;
/// Answered by the switch (ARP for a gateway, an echo request to it).
pub const OUT_ANSWER: u8 = 7;

impl Verdict {
    /// `vlan` when NORMAL switched it in none (`datapath::frame::NO_VLAN`).
    pub const NO_VLAN: u16 = u16::MAX;
    /// Flows a path records (`flow::MAX_PATH`).
    pub const MAX_PATH: usize = 16;
    /// Its bytes in a record.
    const LEN: usize = 24 + 4 * Verdict::MAX_PATH;

    fn write(&self, b: &mut [u8; Verdict::LEN]) {
        b[0] = self.out;
        b[1] = self.path_len;
        b[2] = self.v6 as u8
            | (self.csum as u8) << 1
            | (self.tag.is_some() as u8) << 2
            | (self.flow.is_some() as u8) << 3
            | (self.ct.is_some() as u8) << 4
            | (self.missed.is_some() as u8) << 5;
        b[4..8].copy_from_slice(&self.value.to_le_bytes());
        b[8..10].copy_from_slice(&self.vlan.to_le_bytes());
        b[10..12].copy_from_slice(&self.tag.unwrap_or(0).to_le_bytes());
        b[12..14].copy_from_slice(&self.mss.to_le_bytes());
        b[16..20].copy_from_slice(&self.flow.unwrap_or(0).to_le_bytes());
        let (zone, state) = self.ct.unwrap_or_default();
        b[20..22].copy_from_slice(&zone.to_le_bytes());
        b[22] = state;
        let (port, why) = self.missed.unwrap_or_default();
        b[14..16].copy_from_slice(&port.to_le_bytes());
        b[23] = why;
        for (i, f) in self.path.iter().enumerate() {
            b[24 + 4 * i..28 + 4 * i].copy_from_slice(&f.to_le_bytes());
        }
    }

    fn read(b: &[u8]) -> Verdict {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut path = [0u32; Verdict::MAX_PATH];
        for (i, f) in path.iter_mut().enumerate() {
            *f = u32_at(24 + 4 * i);
        }
        Verdict {
            out: b[0],
            value: u32_at(4),
            vlan: u16_at(8),
            tag: (b[2] & 4 != 0).then(|| u16_at(10)),
            flow: (b[2] & 8 != 0).then(|| u32_at(16)),
            path,
            path_len: b[1].min(Verdict::MAX_PATH as u8),
            mss: u16_at(12),
            v6: b[2] & 1 != 0,
            csum: b[2] & 2 != 0,
            ct: (b[2] & 16 != 0).then(|| (u16_at(20), b[22])),
            missed: (b[2] & 32 != 0).then(|| (u16_at(14), b[23])),
        }
    }

    /// The flows met, in order.
    pub fn path(&self) -> &[u32] {
        &self.path[..self.path_len as usize]
    }
}

/// One poll thread's side of a capture, locked by that thread for a burst (or a frame) at a
/// time, and by the capture's thread only once it is unhooked (its counts).
pub struct Slot {
    ring: Producer<u8>,
    filter: Option<Filter>,
    /// Where a frame is copied to be filtered, then recorded.
    scratch: Vec<u8>,
    /// By interface.
    counts: Box<[Counts]>,
}

/// One capture: shared by the poll threads that offer it frames, the control thread that
/// hooks it into plans and unhooks it, and its own thread that reads it.
pub struct Capture {
    /// Its ports' names, by interface.
    pub ifaces: Vec<String>,
    pub direction: Direction,
    /// Frames dropped on the way in are recorded too, with their reason.
    pub drops: bool,
    /// A live trace: each record carries the data path's [`Verdict`] (it looks in, drops too).
    pub trace: bool,
    pub snaplen: u32,
    slots: Box<[Mutex<Slot>]>,
    /// Its thread is done with it (count reached, client gone, or `end` set): unhook it.
    pub finished: AtomicBool,
    /// No plan holds it any more: nothing will be offered to it again.
    pub unhooked: AtomicBool,
    /// Why the switch ended it (one of its ports was deleted), if it did.
    ended: Mutex<Option<String>>,
}

/// A record's header in a ring: total length, interface, flags (way, a verdict follows (4),
/// drop reason + 1 in the upper half), the frame's length, the time (the TSC: the reader makes it a time).
const HDR: usize = 24;

/// One record, as the capture's thread reads it.
pub struct Record<'a> {
    pub iface: u32,
    pub way: Way,
    /// The drop reason's index (`datapath::counters::DROP_REASONS`), for a drop.
    pub drop: Option<u8>,
    pub len: u32,
    pub time_ns: u64,
    /// A live trace's record: what the data path decided.
    pub verdict: Option<Verdict>,
    pub data: &'a [u8],
}

/// The capture's thread's side: every poll thread's ring, and the TSC's origin and rate (a
/// record's time is the poll thread's TSC, read without a system call).
pub struct Reader {
    rings: Vec<Consumer<u8>>,
    buf: Vec<u8>,
    tsc0: u64,
    ns0: u64,
    hz: u64,
}

impl Slot {
    /// Offers a frame of `len` bytes on interface `iface`: `fill` copies the frame's first
    /// bytes into the buffer it is given (as many as it holds) and returns how many it copied.
    /// Filtered, then recorded; a full ring loses the record, counted. Never waits.
    #[inline]
    pub fn offer(&mut self, iface: u32, way: Way, drop: Option<u8>, len: u32, fill: impl FnOnce(&mut [u8]) -> usize) {
        self.record(iface, way, drop, None, len, fill)
    }

    /// As [`Slot::offer`], a frame a live trace looks at, with what the data path decided.
    #[inline]
    pub fn offer_traced(&mut self, iface: u32, v: &Verdict, len: u32, fill: impl FnOnce(&mut [u8]) -> usize) {
        let drop = (v.out == OUT_DROP).then_some(v.value as u8);
        self.record(iface, Way::In, drop, Some(v), len, fill)
    }

    fn record(
        &mut self,
        iface: u32,
        way: Way,
        drop: Option<u8>,
        verdict: Option<&Verdict>,
        len: u32,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) {
        let Slot { ring, filter, scratch, counts } = self;
        let Some(counts) = counts.get_mut(iface as usize) else { return };
        counts.seen += 1;
        let n = fill(scratch).min(scratch.len());
        let data = &scratch[..n];
        if filter.as_ref().is_some_and(|f| !f.matches(data)) {
            return;
        }
        counts.matched += 1;
        let flags = match way {
            Way::In => 1,
            Way::Out => 2,
        } | (verdict.is_some() as u32) << 2
            | drop.map_or(0, |d| (d as u32 + 1) << 16);
        let mut v = [0u8; Verdict::LEN];
        let vlen = match verdict {
            Some(x) => {
                x.write(&mut v);
                Verdict::LEN
            }
            None => 0,
        };
        let total = HDR + vlen + n;
        let mut hdr = [0u8; HDR];
        hdr[0..4].copy_from_slice(&(total as u32).to_le_bytes());
        hdr[4..8].copy_from_slice(&iface.to_le_bytes());
        hdr[8..12].copy_from_slice(&flags.to_le_bytes());
        hdr[12..16].copy_from_slice(&len.to_le_bytes());
        hdr[16..24].copy_from_slice(&cycles().to_le_bytes());
        let Ok(mut chunk) = ring.write_chunk(total) else {
            counts.lost += 1;
            return;
        };
        let (a, b) = chunk.as_mut_slices();
        put(a, b, 0, &hdr);
        put(a, b, HDR, &v[..vlen]);
        put(a, b, HDR + vlen, data);
        chunk.commit_all();
    }
}

impl Capture {
    /// A capture of `ifaces` for `threads` poll threads, `snaplen` bytes of each frame (0:
    /// all), its filter compiled from `filter` (none if empty), and its reader.
    pub fn new(
        ifaces: Vec<String>,
        direction: Direction,
        drops: bool,
        snaplen: u32,
        filter: &str,
        threads: usize,
    ) -> Result<(Arc<Capture>, Reader), String> {
        Capture::make(ifaces, direction, drops, false, snaplen, filter, threads)
    }

    /// A live trace of `ifaces`: what they send (dropped frames too), each record with the data
    /// path's [`Verdict`].
    pub fn tracing(
        ifaces: Vec<String>,
        snaplen: u32,
        filter: &str,
        threads: usize,
    ) -> Result<(Arc<Capture>, Reader), String> {
        Capture::make(ifaces, Direction::In, true, true, snaplen, filter, threads)
    }

    fn make(
        ifaces: Vec<String>,
        direction: Direction,
        drops: bool,
        trace: bool,
        snaplen: u32,
        filter: &str,
        threads: usize,
    ) -> Result<(Arc<Capture>, Reader), String> {
        let snaplen = if snaplen == 0 { DEFAULT_SNAPLEN } else { snaplen.min(DEFAULT_SNAPLEN) };
        let compiled = if filter.trim().is_empty() { None } else { Some(Filter::compile(filter)?) };
        let scratch = (snaplen as usize).min(MAX_FRAME);
        let mut slots = Vec::with_capacity(threads);
        let mut rings = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (p, c) = RingBuffer::new(RING_BYTES);
            let filter = compiled.as_ref().map(|_| Filter::compile(filter)).transpose()?;
            let counts = vec![Counts::default(); ifaces.len()].into();
            slots.push(Mutex::new(Slot { ring: p, filter, scratch: vec![0; scratch], counts }));
            rings.push(c);
        }
        let hz = cycles_per_sec();
        let (tsc0, ns0) = (cycles(), SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
        let cap = Capture {
            ifaces,
            direction,
            drops,
            trace,
            snaplen,
            slots: slots.into(),
            finished: AtomicBool::new(false),
            unhooked: AtomicBool::new(false),
            ended: Mutex::new(None),
        };
        Ok((Arc::new(cap), Reader { rings, buf: Vec::new(), tsc0, ns0, hz }))
    }

    /// Whether it records what its ports send (and drop on the way in).
    #[inline]
    pub fn looks_in(&self) -> bool {
        self.direction != Direction::Out
    }

    /// Whether it records what its ports are given.
    #[inline]
    pub fn looks_out(&self) -> bool {
        self.direction != Direction::In
    }

    /// Poll thread `thread`'s side, to offer it frames (a burst's, or one). None only if its
    /// lock is held, which a poll thread never finds (its lock is its own; the capture's
    /// thread takes it once the capture is unhooked).
    #[inline]
    pub fn slot(&self, thread: usize) -> Option<MutexGuard<'_, Slot>> {
        self.slots.get(thread)?.try_lock().ok()
    }

    /// What it counted of interface `iface`, over every poll thread.
    pub fn counts(&self, iface: usize) -> Counts {
        let mut c = Counts::default();
        for s in self.slots.iter() {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(x) = s.counts.get(iface) {
                c.seen += x.seen;
                c.matched += x.matched;
                c.lost += x.lost;
            }
        }
        c
    }

    /// Ends it from the switch's side (`why`: one of its ports was deleted).
    pub fn end(&self, why: String) {
        let mut e = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        e.get_or_insert(why);
    }

    /// Why the switch ended it, if it did.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Writes `bytes` at `at` of the two slices `a` then `b` (a ring's chunk, which may wrap).
fn put(a: &mut [u8], b: &mut [u8], at: usize, bytes: &[u8]) {
    let in_a = a.len().saturating_sub(at).min(bytes.len());
    if in_a > 0 {
        a[at..at + in_a].copy_from_slice(&bytes[..in_a]);
    }
    let rest = &bytes[in_a..];
    if !rest.is_empty() {
        let off = at + in_a - a.len();
        b[off..off + rest.len()].copy_from_slice(rest);
    }
}

/// Reads `out.len()` bytes from the two slices `a` then `b`.
fn get(a: &[u8], b: &[u8], out: &mut [u8]) {
    let in_a = a.len().min(out.len());
    out[..in_a].copy_from_slice(&a[..in_a]);
    let rest = out.len() - in_a;
    out[in_a..].copy_from_slice(&b[..rest]);
}

impl Reader {
    /// Hands `f` every record the rings hold now, ring by ring; returns how many. Stops early
    /// once `f` returns false.
    pub fn drain(&mut self, mut f: impl FnMut(Record) -> bool) -> usize {
        let mut n = 0;
        for ring in &mut self.rings {
            while ring.slots() >= HDR {
                let mut hdr = [0u8; HDR];
                {
                    let Ok(chunk) = ring.read_chunk(HDR) else { break };
                    let (a, b) = chunk.as_slices();
                    get(a, b, &mut hdr);
                    // Not committed: the header is read again with its record.
                }
                let word = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().expect("4 bytes"));
                let total = word(0) as usize;
                let Ok(chunk) = ring.read_chunk(total) else { break };
                self.buf.resize(total, 0);
                let (a, b) = chunk.as_slices();
                get(a, b, &mut self.buf);
                chunk.commit_all();
                let flags = word(8);
                let tsc = u64::from_le_bytes(hdr[16..24].try_into().expect("8 bytes"));
                let since = (tsc.wrapping_sub(self.tsc0) as u128 * 1_000_000_000 / self.hz as u128) as u64;
                let (verdict, data) = match flags & 4 != 0 && total >= HDR + Verdict::LEN {
                    true => (Some(Verdict::read(&self.buf[HDR..])), &self.buf[HDR + Verdict::LEN..]),
                    false => (None, &self.buf[HDR..]),
                };
                let rec = Record {
                    iface: word(4),
                    way: if flags & 3 == 2 { Way::Out } else { Way::In },
                    drop: (flags >> 16).checked_sub(1).map(|d| d as u8),
                    len: word(12),
                    time_ns: self.ns0 + since,
                    verdict,
                    data,
                };
                n += 1;
                if !f(rec) {
                    return n;
                }
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: usize, b: u8) -> Vec<u8> {
        let mut f = vec![b; n];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f
    }

    #[test]
    fn records_go_through_the_ring_whole_and_a_full_ring_loses_them_counted() {
        let (cap, mut rd) = Capture::new(vec!["a".into(), "b".into()], Direction::Both, false, 100, "", 2).unwrap();
        let f = frame(150, 7);
        let mut offered = 0;
        // More than the ring holds: the rest is lost, counted, and nothing waits.
        while offered < RING_BYTES / 100 + 10 {
            cap.slot(1).unwrap().offer(1, Way::Out, None, f.len() as u32, |buf| {
                let n = buf.len().min(f.len());
                buf[..n].copy_from_slice(&f[..n]);
                n
            });
            offered += 1;
        }
        let Counts { seen, matched, lost } = cap.counts(1);
        assert_eq!((seen, matched), (offered as u64, offered as u64));
        assert!(lost > 0);
        let mut got = 0;
        rd.drain(|r| {
            assert_eq!((r.iface, r.way, r.drop, r.len, r.data.len()), (1, Way::Out, None, 150, 100));
            assert!(r.data.iter().skip(14).all(|&b| b == 7));
            got += 1;
            true
        });
        assert_eq!(got + lost, offered as u64);
        // Drained, the ring takes records again; a wrapped record reads back whole.
        for i in 0..3u8 {
            cap.slot(1).unwrap().offer(0, Way::In, Some(i), 64, |buf| {
                buf[..64].copy_from_slice(&frame(64, i));
                64
            });
        }
        let mut seen = Vec::new();
        rd.drain(|r| {
            seen.push((r.way, r.drop, r.data[20]));
            true
        });
        assert_eq!(seen, vec![(Way::In, Some(0), 0), (Way::In, Some(1), 1), (Way::In, Some(2), 2)]);
    }

    #[test]
    fn a_traced_record_carries_its_verdict_whole() {
        let (cap, mut rd) = Capture::tracing(vec!["a".into()], 128, "", 1).unwrap();
        assert!(cap.trace && cap.drops && cap.looks_in() && !cap.looks_out());
        let mut path = [0u32; Verdict::MAX_PATH];
        path[..3].copy_from_slice(&[4, u32::MAX, 9]);
        let sent = [
            Verdict {
                out: OUT_PORT,
                value: 3,
                vlan: 100,
                tag: Some(0x2064),
                flow: Some(7),
                missed: Some((3, 9)),
                ..Default::default()
            },
            Verdict {
                out: OUT_PATH,
                value: 4,
                path,
                path_len: 3,
                mss: 1448,
                v6: true,
                csum: true,
                ct: Some((5, 0x22)),
                ..Default::default()
            },
            Verdict { out: OUT_DROP, value: 5, vlan: u16::MAX, flow: Some(u32::MAX), ..Default::default() },
        ];
        for v in &sent {
            cap.slot(0).unwrap().offer_traced(0, v, 60, |buf| {
                buf[..60].copy_from_slice(&frame(60, v.out));
                60
            });
        }
        let mut got = Vec::new();
        rd.drain(|r| {
            assert_eq!((r.data.len(), r.data[20]), (60, r.verdict.unwrap().out));
            got.push((r.verdict.unwrap(), r.drop));
            true
        });
        let want: Vec<_> = sent.iter().map(|v| (*v, (v.out == OUT_DROP).then_some(5))).collect();
        assert_eq!(got, want);
        assert_eq!(got[1].0.path(), &[4, u32::MAX, 9]);
    }

    #[test]
    fn the_filter_runs_where_the_frame_is() {
        let (cap, mut rd) = Capture::new(vec!["a".into()], Direction::In, false, 256, "arp", 1).unwrap();
        let ip = frame(60, 1);
        let mut arp = frame(60, 2);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        for f in [&ip, &arp, &ip] {
            cap.slot(0).unwrap().offer(0, Way::In, None, 60, |buf| {
                buf[..60].copy_from_slice(f);
                60
            });
        }
        assert_eq!(cap.counts(0), Counts { seen: 3, matched: 1, lost: 0 });
        let mut n = 0;
        rd.drain(|r| {
            assert_eq!(r.data[14], 2);
            n += 1;
            true
        });
        assert_eq!(n, 1);
        let err = Capture::new(vec!["a".into()], Direction::In, false, 256, "tcp port", 1).err().unwrap();
        assert!(err.contains("filter"), "{err}");
    }
}
