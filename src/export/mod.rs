//! Flow export (`[ipfix]`): the frames the switch takes in, one in `sampling`, counted per
//! flow (addresses, protocol, ports, VLAN, ingress and egress port) in a table of each poll
//! thread's own, and sent as IPFIX (RFC 7011) records to a collector over UDP once a flow has
//! been active `active_timeout_s` or idle `idle_timeout_s` (`ipfix.rs` encodes them).
//!
//! A poll thread never waits here: its table is in a slot locked with `try_lock` once a burst;
//! the control thread locks it once a second to take the expired flows, and a burst that finds
//! it taken (a microseconds' window a second) is not counted, and says so (`missed`). A new
//! flow beyond `max_flows` is not recorded (`full`).
#![forbid(unsafe_code)]

pub mod ipfix;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::config::IpfixConfig;
use crate::conntrack::{CtPacket, Tuple};
use crate::wire::ethernet::l3_start;

/// What one flow record is about: a direction of a connection through the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub tuple: Tuple,
    /// The VLAN it was switched in (0: none).
    pub vlan: u16,
    /// Port ids plus one (0: none, a flood or a drop), as IPFIX interfaces.
    pub ingress: u32,
    pub egress: u32,
}

/// A flow's counts since its record last went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowCounts {
    pub packets: u64,
    pub bytes: u64,
    /// Milliseconds since the epoch of its first and last frame.
    pub start_ms: u64,
    pub end_ms: u64,
    /// TCP flags seen, ORed.
    pub tcp_flags: u16,
}

/// Why a record went (IPFIX's flowEndReason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Idle = 1,
    Active = 2,
    /// The exporter stops (a reload without `[ipfix]`, or pvswitchd's end).
    Forced = 4,
}

/// One record for the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRecord {
    pub key: FlowKey,
    pub counts: FlowCounts,
    pub reason: EndReason,
    /// The VNI a VTEP carries the flow's VLAN in (0: none).
    pub vni: u32,
}

/// One frame as a poll thread hands it over: its first bytes, length, ports and VLAN.
pub struct Observed<'a> {
    pub front: &'a [u8],
    pub len: u32,
    pub ingress: u16,
    /// Where it went (None: flooded, dropped, nowhere).
    pub egress: Option<u16>,
    /// The VLAN NORMAL switched it in, if any.
    pub vlan: Option<u16>,
}

/// A poll thread's table.
struct Table {
    flows: HashMap<FlowKey, FlowCounts>,
    /// Frames until the next one observed.
    skip: u32,
    /// Frames observed (sampled), new flows not recorded (the table was full): counted here,
    /// under the thread's own lock, not in atomics every poll thread would write.
    observed: u64,
    full: u64,
}

/// The switch's flow export: its settings, each poll thread's table, the socket and counts.
pub struct FlowExport {
    pub cfg: IpfixConfig,
    slots: Box<[Mutex<Table>]>,
    socket: Option<UdpSocket>,
    /// Bursts not counted (their slot was taken: rare), records and messages sent, messages
    /// the socket refused (the control thread's). Frames observed and flows not recorded are
    /// each table's (`observed`, `full`).
    pub missed: AtomicU64,
    pub records: AtomicU64,
    pub messages: AtomicU64,
    pub send_errors: AtomicU64,
    /// The next message's sequence number (records sent before it, RFC 7011) and when
    /// templates last went.
    state: Mutex<ExportState>,
    /// By VLAN id: the VNI a VTEP carries it in (0: none), for the records (`set_vnis`). The
    /// control thread's alone.
    vnis: Mutex<Vec<u32>>,
}

struct ExportState {
    sequence: u32,
    templates_sent: Option<std::time::Instant>,
}

/// A poll thread's table, held for one burst.
pub struct Recorder<'a> {
    x: &'a FlowExport,
    t: std::sync::MutexGuard<'a, Table>,
}

impl Recorder<'_> {
    /// Whether the next frame is one to observe (one in `sampling`).
    #[inline]
    pub fn samples(&mut self) -> bool {
        if self.t.skip > 0 {
            self.t.skip -= 1;
            return false;
        }
        self.t.skip = self.x.cfg.sampling - 1;
        true
    }

    /// Counts frame `o`, seen at `now_ms`, in its flow.
    pub fn record(&mut self, now_ms: u64, o: Observed) {
        let Some((key, flags, bytes)) = key_of(&o) else { return };
        self.t.observed += 1;
        let n = self.t.flows.len();
        match self.t.flows.get_mut(&key) {
            Some(c) => {
                c.packets += 1;
                c.bytes += bytes;
                c.end_ms = now_ms;
                c.tcp_flags |= flags;
            }
            None if n >= self.x.cfg.max_flows as usize => self.t.full += 1,
            None => {
                let c = FlowCounts { packets: 1, bytes, start_ms: now_ms, end_ms: now_ms, tcp_flags: flags };
                self.t.flows.insert(key, c);
            }
        }
    }
}

/// Templates are sent again this often (over UDP a collector may have missed them).
const TEMPLATE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl FlowExport {
    /// An export for `threads` poll thread slots (`configured` of them running now) and its socket (not connected: a collector that is
    /// down for a while costs lost messages, not an error on the next send; a socket that
    /// cannot be made is logged, and records are then counted as send errors).
    pub fn new(cfg: IpfixConfig, configured: usize, threads: usize) -> FlowExport {
        let bind = if cfg.collector.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
        let socket = UdpSocket::bind(bind)
            .and_then(|s| s.set_nonblocking(true).map(|_| s))
            .map_err(|e| log::error!("ipfix: cannot open a socket to {}: {e}", cfg.collector))
            .ok();
        let skip = cfg.sampling - 1;
        // The configured threads' tables are made at their full size here, so a poll thread
        // never allocates for a new flow; a thread a later reload adds grows its table.
        let table = |t: usize| {
            let flows = if t < configured { HashMap::with_capacity(cfg.max_flows as usize) } else { HashMap::new() };
            Mutex::new(Table { flows, skip, observed: 0, full: 0 })
        };
        FlowExport {
            slots: (0..threads).map(table).collect(),
            socket,
            cfg,
            missed: AtomicU64::new(0),
            records: AtomicU64::new(0),
            messages: AtomicU64::new(0),
            send_errors: AtomicU64::new(0),
            state: Mutex::new(ExportState { sequence: 0, templates_sent: None }),
            vnis: Mutex::new(vec![0; 4096]),
        }
    }

    /// The VNIs of the VLANs VTEPs carry (`(vlan, vni)`), named in the records of their flows
    /// from now on.
    pub fn set_vnis(&self, map: impl Iterator<Item = (u16, u32)>) {
        let mut v = self.vnis.lock().unwrap_or_else(|e| e.into_inner());
        v.iter_mut().for_each(|x| *x = 0);
        for (vlan, vni) in map {
            if let Some(x) = v.get_mut(vlan as usize) {
                *x = vni;
            }
        }
    }

    /// Poll thread `thread`'s table, for one burst's frames; None (counted) if the control
    /// thread holds it: a poll thread never waits for it.
    pub fn table(&self, thread: usize) -> Option<Recorder<'_>> {
        let slot = self.slots.get(thread)?;
        match slot.try_lock() {
            Ok(t) => Some(Recorder { x: self, t }),
            Err(_) => {
                self.missed.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Counts `frames` on poll thread `thread` at `now_ms`, one in `sampling`.
    pub fn observe<'a>(&self, thread: usize, now_ms: u64, frames: impl Iterator<Item = Observed<'a>>) {
        if let Some(mut t) = self.table(thread) {
            for o in frames {
                if t.samples() {
                    t.record(now_ms, o);
                }
            }
        }
    }

    /// Frames observed, and new flows not recorded, over every poll thread's table.
    pub fn observed(&self) -> u64 {
        self.sum(|t| t.observed)
    }

    pub fn full(&self) -> u64 {
        self.sum(|t| t.full)
    }

    /// Flows the tables hold now.
    pub fn flows(&self) -> u64 {
        self.sum(|t| t.flows.len() as u64)
    }

    fn sum(&self, f: impl Fn(&Table) -> u64) -> u64 {
        self.slots.iter().map(|s| f(&s.lock().unwrap_or_else(|e| e.into_inner()))).sum()
    }

    /// Takes the flows due at `now_ms` (every flow if `all`) from every poll thread's table.
    pub fn expire(&self, now_ms: u64, all: bool) -> Vec<FlowRecord> {
        let (idle, active) = (self.cfg.idle_timeout_s as u64 * 1000, self.cfg.active_timeout_s as u64 * 1000);
        let mut out = Vec::new();
        let vnis = self.vnis.lock().unwrap_or_else(|e| e.into_inner());
        for slot in self.slots.iter() {
            let mut t = slot.lock().unwrap_or_else(|e| e.into_inner());
            t.flows.retain(|key, c| {
                let reason = if all {
                    EndReason::Forced
                } else if now_ms.saturating_sub(c.end_ms) >= idle {
                    EndReason::Idle
                } else if now_ms.saturating_sub(c.start_ms) >= active {
                    EndReason::Active
                } else {
                    return true;
                };
                let vni = vnis.get(key.vlan as usize).copied().unwrap_or(0);
                out.push(FlowRecord { key: *key, counts: *c, reason, vni });
                false
            });
        }
        out
    }

    /// Sends the flows due at `now_ms` (all if `all`) to the collector, the templates first
    /// when they are due. Never blocks: a message the socket refuses is counted and lost.
    pub fn tick(&self, now_ms: u64, all: bool) {
        let records = self.expire(now_ms, all);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let templates_due = st.templates_sent.is_none_or(|t| t.elapsed() >= TEMPLATE_EVERY);
        if records.is_empty() && !templates_due {
            return;
        }
        let export_s = (now_ms / 1000) as u32;
        let mut messages = Vec::new();
        if templates_due {
            messages.push(ipfix::templates(export_s, st.sequence, self.cfg.observation_domain_id, self.cfg.sampling));
            st.templates_sent = Some(std::time::Instant::now());
        }
        for chunk in records.chunks(ipfix::RECORDS_PER_MESSAGE) {
            messages.push(ipfix::records(export_s, st.sequence, self.cfg.observation_domain_id, chunk));
            st.sequence = st.sequence.wrapping_add(chunk.len() as u32);
        }
        drop(st);
        for m in messages {
            let sent = match (&m, &self.socket) {
                (Ok(bytes), Some(s)) => s.send_to(bytes, self.cfg.collector).is_ok(),
                (Err(e), _) => {
                    log::warn!("ipfix: a message could not be encoded: {e}");
                    false
                }
                _ => false,
            };
            match sent {
                true => self.messages.fetch_add(1, Relaxed),
                false => self.send_errors.fetch_add(1, Relaxed),
            };
        }
        self.records.fetch_add(records.len() as u64, Relaxed);
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A frame's flow (its IP addresses, protocol and ports), its TCP flags and its IP bytes (what
/// IPFIX counts: from the IP header on); None for a frame that is not IP (or too broken to say).
fn key_of(o: &Observed) -> Option<(FlowKey, u16, u64)> {
    let (ty, l3, tag) = l3_start(o.front)?;
    let (tuple, flags) = match CtPacket::parse(ty, o.front.get(l3..)?, (o.len as usize).saturating_sub(l3)) {
        CtPacket::Conn { tuple, tcp, .. } => (tuple, tcp.map_or(0, |s| s.flags)),
        CtPacket::Error { tuple, .. } => (tuple, 0),
        CtPacket::Fragment { group, .. } => (Tuple { sport: 0, dport: 0, ..group }, 0),
        CtPacket::Invalid | CtPacket::NotIp => return None,
    };
    let vlan = o.vlan.or(tag.map(|t| t.vid())).unwrap_or(0);
    let key = FlowKey { tuple, vlan, ingress: o.ingress as u32 + 1, egress: o.egress.map_or(0, |p| p as u32 + 1) };
    Some((key, flags, (o.len as usize).saturating_sub(l3) as u64))
}

#[cfg(test)]
mod tests;
