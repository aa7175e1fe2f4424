//! pvsgen: a traffic generator for pvswitch. One process acts as many VMs, each a vhost-user
//! frontend (`frontend`) of one of the switch's sockets with its own memfd guest memory and
//! split virtqueues, driven by one busy-polling thread per given CPU (`engine`). Each VM sends
//! a numbered, timestamped stream at its own rate, frame size and destination; each receiver
//! checks every flow for loss, duplication and reordering and measures one-way latency
//! (`stats`). A ping-pong mode measures round trips with one frame in flight.
//!
//! Library use (as `tests/pvsgen.rs` does): build a [`Config`] (or [`parse_args`]), call
//! [`run`], read the [`Report`].

pub mod config;
pub mod dirty_log;
pub mod engine;
pub mod free_ids;
pub mod frontend;
pub mod probe;
pub mod stats;

use std::fmt::Write as _;

use serde::Serialize;

pub use config::{Config, Driver, Dst, Reuse, USAGE, VmSpec, parse_args};
use engine::{Port, Role, Shared};
use frontend::{Guest, HDR_LEN, Layout, Vm};
use probe::mac_of;
use stats::Histogram;

/// Latency summary in nanoseconds (None: no samples).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub samples: u64,
    pub min_ns: Option<u64>,
    pub mean_ns: Option<f64>,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub p999_ns: Option<u64>,
    pub max_ns: Option<u64>,
}

impl Latency {
    fn of(h: &Histogram) -> Latency {
        Latency {
            samples: h.count(),
            min_ns: h.min(),
            mean_ns: h.mean(),
            p50_ns: h.quantile(0.5),
            p99_ns: h.quantile(0.99),
            p999_ns: h.quantile(0.999),
            max_ns: h.max(),
        }
    }
}

/// One flow into a VM: everything one source VM sent it.
#[derive(Clone, Debug, Serialize)]
pub struct FlowReport {
    pub src: String,
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
}

/// Ping-pong results (on the pinging VM).
#[derive(Clone, Debug, Serialize)]
pub struct PingReport {
    pub peer: String,
    pub pings: u64,
    pub pongs: u64,
    pub timeouts: u64,
    pub rtt: Latency,
}

/// Everything measured for one VM.
#[derive(Clone, Debug, Serialize)]
pub struct VmReport {
    pub name: String,
    pub mac: String,
    pub thread: usize,
    pub cpu: usize,
    pub dst: String,
    pub size: usize,
    pub rate: Option<f64>,
    /// Data frames sent, and frames sent in all (with hellos, pings and pongs): the latter is
    /// what the switch counts as received from this port.
    #[serde(flatten)]
    pub counters: engine::Counters,
    /// With `log=1`: the pages the switch marked in this VM's dirty log, summed over the
    /// generator's syncs (every 10 ms) from setup to the end of the run.
    pub dirty_pages: u64,
    /// Data frames addressed to this VM (sum over the flows into it) and those that never
    /// arrived (sent minus distinct frames received, per flow).
    pub expected: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub tx_mpps: f64,
    /// Data bytes sent per second (Ethernet frames as put on the ring: a TSO frame whole).
    pub tx_gbps: f64,
    /// Data frames received per second: the rate the switch forwarded to this VM.
    pub rx_mpps: f64,
    pub rx_gbps: f64,
    /// One-way latency of received data frames (TX timestamp to RX poll).
    pub latency: Latency,
    pub flows: Vec<FlowReport>,
    pub pingpong: Option<PingReport>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub rx_mpps: f64,
    pub rx_gbps: f64,
    pub latency: Latency,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Length of the measurement (the longest of the threads').
    pub seconds: f64,
    pub cpus: Vec<usize>,
    pub qsize: u16,
    pub vms: Vec<VmReport>,
    pub totals: Totals,
}

fn mac_str(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// Raises this process's soft limit on open files to its hard limit and returns both: each VM
/// takes six (its socket, its memory file, two kick and two call eventfds), and a few hundred
/// VMs are more than the usual soft limit of 1024.
pub fn raise_fd_limit() -> (u64, u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return (0, 0);
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    (r.rlim_cur, r.rlim_max)
}

/// Open files `n` VMs take in this process (see `raise_fd_limit`), with room for the rest.
pub fn fds_for(n: usize) -> u64 {
    6 * n as u64 + 64
}

/// Connects every VM, runs the configured traffic and returns what was measured. The VMs
/// disconnect when this returns. Raises the process's soft limit on open files first (as the
/// binary does), and refuses to start with a clear error when even the hard limit is too low.
pub fn run(cfg: &Config) -> Result<Report, String> {
    cfg.validate()?;
    let (soft, hard) = raise_fd_limit();
    if soft < fds_for(cfg.vms.len()) {
        return Err(format!(
            "{} VMs need about {} open files; the limit is {soft} (hard limit {hard}): raise it (ulimit -n)",
            cfg.vms.len(),
            fds_for(cfg.vms.len())
        ));
    }
    let n = cfg.vms.len();
    let ping = cfg.pingpong.as_ref().map(|(a, b)| (cfg.index(a).unwrap(), cfg.index(b).unwrap()));
    let role = |i: usize| match ping {
        Some((a, _)) if a == i => Role::Ping,
        Some((_, b)) if b == i => Role::Pong,
        _ => Role::Stream,
    };
    // Where each VM's stream goes: Some(Some(j)) to VM j, Some(None) broadcast, None nowhere.
    let target = |i: usize| -> Option<Option<usize>> {
        match (role(i), &cfg.vms[i].dst) {
            (Role::Ping, _) => Some(Some(ping.unwrap().1)),
            (Role::Pong, _) => None,
            (Role::Stream, Dst::Vm(d)) => Some(Some(cfg.index(d).unwrap())),
            (Role::Stream, Dst::Bcast) => Some(None),
            (Role::Stream, Dst::None) => None,
        }
    };
    // Does VM `src`'s data stream reach VM `dst`?
    let streams_to = |src: usize, dst: usize| {
        src != dst && role(src) == Role::Stream && matches!(target(src), Some(t) if t.is_none_or(|j| j == dst))
    };
    // The largest frame a VM may receive: a TSO sender's arrive as segments of at most its
    // MSS of payload (the generator never negotiates GUEST_TSO4).
    let max_size = cfg
        .vms
        .iter()
        .map(|v| if v.driver.tso > 0 { v.size.min(probe::TSO_HDRS + v.driver.tso as usize) } else { v.size })
        .max()
        .unwrap();

    let threads = cfg.cpus.len();
    // How many VMs need each VM's hello (its announcement stops once they all heard it).
    let mut listeners = vec![0u32; n];
    let mut logs = Vec::new();
    let mut per_thread: Vec<Vec<Port>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, v) in cfg.vms.iter().enumerate() {
        // A buffer slot holds the largest frame any VM sends (a receive buffer without
        // MRG_RXBUF must), or the receive buffer asked for, and the frame's indirect table.
        let table = engine::TABLE_LEN.max(v.driver.table_len());
        let need = (HDR_LEN + max_size.max(v.size)) as u64 + table;
        let slot = need.max(v.driver.rx_buf.unwrap_or(0) as u64 + table).div_ceil(64).max(32) * 64;
        let mut layout = Layout::packed(v.driver.qsize.unwrap_or(cfg.qsize), slot);
        if v.driver.rx_claim > 0 {
            // Room for the last receive buffer's claim (sparse: only what is written is ever
            // touched).
            let end = layout.rx_buf(layout.qsize - 1) + HDR_LEN as u64 + v.driver.rx_claim as u64;
            layout.mem_size = layout.mem_size.max(end.next_multiple_of(4096));
        }
        let guest = Guest::try_new(layout, layout.mem_size).map_err(|e| format!("VM {}: {e}", v.name))?;
        let vm = Vm::connect_guest(&v.socket.display().to_string(), guest, v.driver.features())
            .map_err(|e| format!("VM {}: vhost-user setup on {}: {e}", v.name, v.socket.display()))?;
        if let Some(l) = &vm.log {
            logs.push((i, l.clone()));
        }
        let mut needs = Vec::new();
        if let Some(Some(j)) = target(i) {
            needs.push(j as u16);
        }
        if role(i) == Role::Pong {
            needs.push(ping.unwrap().0 as u16);
        }
        needs.iter().for_each(|&j| listeners[j as usize] += 1);
        let sources: Vec<bool> = (0..n).map(|s| streams_to(s, i)).collect();
        let dst_mac = target(i).map(|t| t.map_or(probe::BCAST, |j| mac_of(j as u16)));
        let port = Port::with_driver(i as u16, vm, dst_mac, v.size, v.rate, role(i), needs, &sources, v.driver);
        per_thread[i % threads].push(port);
    }

    let shared = Shared::new(n, threads, listeners);
    let syncing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let syncer = (!logs.is_empty()).then(|| {
        let syncing = syncing.clone();
        std::thread::spawn(move || {
            // What a migrating VMM does with the log: read and clear it, over and over.
            let mut pages = vec![0u64; n];
            while syncing.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(10));
                for (i, l) in &logs {
                    pages[*i] += l.sync();
                }
            }
            pages
        })
    });
    let mut handles = Vec::new();
    for (t, ports) in per_thread.into_iter().enumerate() {
        let (shared, cpu, seconds, burst) = (shared.clone(), cfg.cpus[t], cfg.seconds, cfg.burst as usize);
        let idle_sleep_us = cfg.idle_sleep_us;
        handles.push(
            std::thread::Builder::new()
                .name(format!("pvsgen{t}"))
                .spawn(move || {
                    if let Err(e) = engine::pin_to(cpu) {
                        eprintln!("pvsgen: {e}; running unpinned");
                    }
                    engine::thread_main(ports, shared, seconds, burst, idle_sleep_us)
                })
                .map_err(|e| format!("spawning a thread: {e}"))?,
        );
    }
    let mut ports: Vec<Option<(usize, Port)>> = (0..n).map(|_| None).collect();
    let mut not_ready = Vec::new();
    let mut measured_ns = 0;
    for (t, h) in handles.into_iter().enumerate() {
        let r = h.join().map_err(|_| "a generator thread panicked".to_string())?;
        measured_ns = measured_ns.max(r.measured_ns);
        not_ready.extend(r.not_ready.iter().map(|&i| cfg.vms[i as usize].name.clone()));
        for p in r.ports {
            let id = p.id as usize;
            ports[id] = Some((t, p));
        }
    }
    syncing.store(false, std::sync::atomic::Ordering::Relaxed);
    let dirty_pages = syncer.map(|h| h.join().expect("the log syncer")).unwrap_or_else(|| vec![0; n]);
    let ports: Vec<(usize, Port)> = ports.into_iter().map(|p| p.unwrap()).collect();
    if !not_ready.is_empty() {
        return Err(format!(
            "no hello from the peers of {} within {} s: is the switch forwarding between these ports?",
            not_ready.join(", "),
            engine::HELLO_DEADLINE_NS / 1_000_000_000
        ));
    }

    let secs = measured_ns as f64 / 1e9;
    let mut vms = Vec::new();
    let mut all_latency = Histogram::new();
    for (i, (t, p)) in ports.iter().enumerate() {
        let v = &cfg.vms[i];
        let mut flows = Vec::new();
        for (s, f) in p.flows.iter().enumerate() {
            let Some(f) = f else { continue };
            let sent = ports[s].1.c.sent;
            flows.push(FlowReport {
                src: cfg.vms[s].name.clone(),
                sent,
                received: f.received,
                lost: sent.saturating_sub(f.unique()),
                duplicates: f.duplicates,
                reordered: f.reordered,
            });
        }
        all_latency.merge(&p.latency);
        let sum = |g: fn(&FlowReport) -> u64| flows.iter().map(g).sum::<u64>();
        let dst = match target(i) {
            Some(Some(j)) => cfg.vms[j].name.clone(),
            Some(None) => "bcast".into(),
            None => "-".into(),
        };
        vms.push(VmReport {
            name: v.name.clone(),
            mac: mac_str(p.mac),
            thread: *t,
            cpu: cfg.cpus[*t],
            dst,
            size: v.size,
            rate: v.rate,
            counters: p.c.clone(),
            dirty_pages: dirty_pages[i],
            expected: sum(|f| f.sent),
            lost: sum(|f| f.lost),
            duplicates: sum(|f| f.duplicates),
            reordered: sum(|f| f.reordered),
            tx_mpps: p.c.sent as f64 / secs / 1e6,
            tx_gbps: p.c.sent_bytes as f64 * 8.0 / secs / 1e9,
            rx_mpps: p.c.received as f64 / secs / 1e6,
            rx_gbps: p.c.received_bytes as f64 * 8.0 / secs / 1e9,
            latency: Latency::of(&p.latency),
            flows,
            pingpong: (p.role == Role::Ping).then(|| PingReport {
                peer: cfg.vms[ping.unwrap().1].name.clone(),
                pings: p.c.pings_sent,
                pongs: p.c.pongs_received,
                timeouts: p.c.ping_timeouts,
                rtt: Latency::of(&p.rtt),
            }),
        });
    }
    let total = |g: fn(&VmReport) -> u64| vms.iter().map(g).sum::<u64>();
    let totals = Totals {
        sent: total(|v| v.counters.sent),
        received: total(|v| v.counters.received),
        lost: total(|v| v.lost),
        duplicates: total(|v| v.duplicates),
        reordered: total(|v| v.reordered),
        rx_mpps: vms.iter().map(|v| v.rx_mpps).sum(),
        rx_gbps: vms.iter().map(|v| v.rx_gbps).sum(),
        latency: Latency::of(&all_latency),
    };
    Ok(Report { seconds: secs, cpus: cfg.cpus.clone(), qsize: cfg.qsize, vms, totals })
}

fn us(ns: Option<u64>) -> String {
    ns.map_or("-".into(), |v| format!("{:.1}", v as f64 / 1000.0))
}

impl Report {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<8} {:>3} {:<8} {:>5} {:>11} {:>11} {:>8} {:>6} {:>6} {:>8} {:>8} {:>7} {:>8} {:>8} {:>8}",
            "vm",
            "thr",
            "dst",
            "size",
            "sent",
            "received",
            "lost",
            "dup",
            "reord",
            "tx_Mpps",
            "rx_Mpps",
            "rx_Gbps",
            "p50_us",
            "p99_us",
            "p99.9_us"
        );
        for v in &self.vms {
            let _ = writeln!(
                s,
                "{:<8} {:>3} {:<8} {:>5} {:>11} {:>11} {:>8} {:>6} {:>6} {:>8.3} {:>8.3} {:>7.2} {:>8} {:>8} {:>8}",
                v.name,
                v.thread,
                v.dst,
                v.size,
                v.counters.sent,
                v.counters.received,
                v.lost,
                v.duplicates,
                v.reordered,
                v.tx_mpps,
                v.rx_mpps,
                v.rx_gbps,
                us(v.latency.p50_ns),
                us(v.latency.p99_ns),
                us(v.latency.p999_ns)
            );
        }
        let t = &self.totals;
        let _ = writeln!(
            s,
            "{:<8} {:>3} {:<8} {:>5} {:>11} {:>11} {:>8} {:>6} {:>6} {:>8} {:>8.3} {:>7.2} {:>8} {:>8} {:>8}",
            "total",
            "",
            "",
            "",
            t.sent,
            t.received,
            t.lost,
            t.duplicates,
            t.reordered,
            "",
            t.rx_mpps,
            t.rx_gbps,
            us(t.latency.p50_ns),
            us(t.latency.p99_ns),
            us(t.latency.p999_ns)
        );
        for v in &self.vms {
            if let Some(p) = &v.pingpong {
                let _ = writeln!(
                    s,
                    "pingpong {} <-> {}: {} round trips ({} timeouts), RTT min {} p50 {} p99 {} p99.9 {} max {} us",
                    v.name,
                    p.peer,
                    p.rtt.samples,
                    p.timeouts,
                    us(p.rtt.min_ns),
                    us(p.rtt.p50_ns),
                    us(p.rtt.p99_ns),
                    us(p.rtt.p999_ns),
                    us(p.rtt.max_ns)
                );
            }
        }
        let _ = writeln!(s, "{:.2} s measured on CPUs {:?}", self.seconds, self.cpus);
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("the report serializes")
    }
}
