//! Where the cycles and frames went: `stats` (per poll thread, like OVS's pmd-perf-show),
//! `rxq` (per receive queue, like pmd-rxq-show), `stats --clear`, and the Prometheus text
//! exposition. Everything here reads counters the poll threads write (relaxed loads, no locks,
//! no pause of the data path); rates come from samples the control thread takes once a second.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::control::Control;
use crate::datapath::counters::{DROP_REASONS, NDROPS, PortTotals, ThreadStats};

const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// One poll thread's totals at one moment.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadTotals {
    pub iterations: u64,
    pub busy: u64,
    pub idle: u64,
    pub ports: PortTotals,
}

impl ThreadTotals {
    pub fn read(th: &ThreadStats) -> ThreadTotals {
        let mut ports = PortTotals::default();
        for p in th.ports.iter() {
            ports.add(p);
        }
        ThreadTotals {
            iterations: th.iterations.load(Relaxed),
            busy: th.busy_cycles.load(Relaxed),
            idle: th.idle_cycles.load(Relaxed),
            ports,
        }
    }

    /// `self - base`, counter by counter (counters only grow, except a freed port slot's,
    /// which is why this saturates).
    pub fn since(&self, base: &ThreadTotals) -> ThreadTotals {
        let (a, b) = (&self.ports, &base.ports);
        let mut drops = [0; NDROPS];
        for (i, d) in drops.iter_mut().enumerate() {
            *d = a.drops[i].saturating_sub(b.drops[i]);
        }
        ThreadTotals {
            iterations: self.iterations.saturating_sub(base.iterations),
            busy: self.busy.saturating_sub(base.busy),
            idle: self.idle.saturating_sub(base.idle),
            ports: PortTotals {
                rx_packets: a.rx_packets.saturating_sub(b.rx_packets),
                rx_bytes: a.rx_bytes.saturating_sub(b.rx_bytes),
                tx_packets: a.tx_packets.saturating_sub(b.tx_packets),
                tx_bytes: a.tx_bytes.saturating_sub(b.tx_bytes),
                interrupts: a.interrupts.saturating_sub(b.interrupts),
                rx_bursts: a.rx_bursts.saturating_sub(b.rx_bursts),
                tx_batches: a.tx_batches.saturating_sub(b.tx_batches),
                drops,
            },
        }
    }
}

struct Snap {
    at: Instant,
    threads: Vec<ThreadTotals>,
    /// (packets, cycles) per receive queue.
    rxqs: HashMap<(u16, usize), (u64, u64)>,
}

/// The last two once-a-second samples, and the `stats --clear` baseline.
#[derive(Default)]
pub struct Samples {
    next: Option<Instant>,
    prev: Option<Snap>,
    last: Option<Snap>,
    base: Vec<ThreadTotals>,
    cleared_at: Option<Instant>,
}

impl Samples {
    /// How long until the next sample is due (zero: now).
    pub fn due_in(&self) -> Option<Duration> {
        Some(self.next.map_or(Duration::ZERO, |n| n.saturating_duration_since(Instant::now())))
    }

    /// The last interval: its length in seconds, and per thread the later and earlier totals.
    fn interval(&self) -> Option<(f64, &Snap, &Snap)> {
        let (p, l) = (self.prev.as_ref()?, self.last.as_ref()?);
        Some((l.at.duration_since(p.at).as_secs_f64().max(1e-9), l, p))
    }
}

/// Each receive queue's busy cycles over the last interval (empty before two samples).
pub fn rxq_interval_cycles(c: &Control) -> HashMap<(u16, usize), u64> {
    let Some((_, l, e)) = c.samples.interval() else { return HashMap::new() };
    l.rxqs.iter().map(|(k, (_, lc))| (*k, lc.saturating_sub(e.rxqs.get(k).map_or(0, |x| x.1)))).collect()
}

/// Each poll thread's busy share over the last interval, in percent.
pub fn busy_pct_last(c: &Control) -> Vec<f64> {
    let Some((_, l, e)) = c.samples.interval() else { return Vec::new() };
    l.threads
        .iter()
        .zip(&e.threads)
        .map(|(a, b)| {
            let d = a.since(b);
            pct(d.busy, d.busy + d.idle)
        })
        .collect()
}

pub fn sample(c: &mut Control) {
    let snap = Snap {
        at: Instant::now(),
        threads: c.threads.iter().map(|t| ThreadTotals::read(t)).collect(),
        rxqs: c.rxq_stats.iter().map(|(k, s)| (*k, (s.packets.load(Relaxed), s.cycles.load(Relaxed)))).collect(),
    };
    let s = &mut c.samples;
    s.prev = s.last.take();
    s.last = Some(snap);
    s.next = Some(Instant::now() + SAMPLE_EVERY);
}

/// `stats --clear`: what `stats` shows starts again from zero. Totals elsewhere (`ports`,
/// Prometheus) are untouched.
pub fn clear(c: &mut Control) -> Value {
    c.samples.base = c.threads.iter().map(|t| ThreadTotals::read(t)).collect();
    c.samples.cleared_at = Some(Instant::now());
    json!({ "cleared": true })
}

pub fn drops_json(d: &[u64; NDROPS]) -> Value {
    let mut m = serde_json::Map::new();
    for (name, n) in DROP_REASONS.iter().zip(d) {
        m.insert(name.to_string(), json!(n));
    }
    Value::Object(m)
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 { 0.0 } else { 100.0 * part as f64 / whole as f64 }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn queue_names(c: &Control, i: usize) -> Vec<String> {
    c.thread_queues[i].iter().filter_map(|(p, q)| Some(format!("{}:{}", c.port(*p as usize)?.port.name(), q))).collect()
}

/// Control wake-up latencies as [{"below_us": 2^i, "count": n}] (the last bucket is open).
fn wake_hist(th: &ThreadStats) -> Value {
    let n = th.wake_latency_us.len();
    Value::Array(
        th.wake_latency_us
            .iter()
            .enumerate()
            .map(|(i, c)| json!({ "below_us": if i + 1 < n { json!(1u64 << i) } else { Value::Null }, "count": c.load(Relaxed) }))
            .collect(),
    )
}

pub fn stats(c: &Control) -> Value {
    let hz = crate::datapath::counters::cycles_per_sec();
    let mut out = Vec::new();
    for (i, th) in c.threads.iter().enumerate().filter(|(i, _)| c.live[*i]) {
        let now = ThreadTotals::read(th);
        let t = match c.samples.base.get(i) {
            Some(b) => now.since(b),
            None => now,
        };
        let p = &t.ports;
        let last = c.samples.interval().and_then(|(dt, l, e)| {
            let d = l.threads.get(i)?.since(e.threads.get(i)?);
            Some(json!({
                "seconds": dt,
                "rx_pps": d.ports.rx_packets as f64 / dt,
                "tx_pps": d.ports.tx_packets as f64 / dt,
                "rx_bps": d.ports.rx_bytes as f64 * 8.0 / dt,
                "busy_pct": pct(d.busy, d.busy + d.idle),
                "cycles_per_packet": ratio(d.busy, d.ports.rx_packets),
            }))
        });
        out.push(json!({
            "thread": i,
            "core": th.core,
            "numa_node": th.numa_node,
            "queues": queue_names(c, i),
            "iterations": t.iterations,
            "busy_cycles": t.busy,
            "idle_cycles": t.idle,
            "busy_pct": pct(t.busy, t.busy + t.idle),
            "rx_packets": p.rx_packets,
            "rx_bytes": p.rx_bytes,
            "tx_packets": p.tx_packets,
            "tx_bytes": p.tx_bytes,
            "cycles_per_packet": ratio(t.busy, p.rx_packets),
            "avg_rx_burst": ratio(p.rx_packets, p.rx_bursts),
            "avg_tx_batch": ratio(p.tx_packets, p.tx_batches),
            "interrupts": p.interrupts,
            "drops": drops_json(&p.drops),
            "last_interval": last,
            "poll_mode": if c.cfg.sleep_after_us(th.core).is_some() { "adaptive" } else { "busy" },
            "sleeps": th.sleeps.load(Relaxed),
            "sleeping": th.sleeping.load(Relaxed) == 1,
            "asleep_secs": th.asleep_cycles.load(Relaxed) as f64 / hz as f64,
            "wakeups": {
                "kick": th.wakeups_kick.load(Relaxed),
                "control": th.wakeups_control.load(Relaxed),
                "timeout": th.wakeups_timeout.load(Relaxed),
            },
            "wake_latency_us": wake_hist(th),
        }));
    }
    json!({
        "uptime_secs": c.started.elapsed().as_secs(),
        "tsc_hz": hz,
        "cleared_secs_ago": c.samples.cleared_at.map(|t| t.elapsed().as_secs_f64()),
        "threads": out,
    })
}

/// Each receive queue: its thread and its share of that thread's busy cycles, over the last
/// interval and since start.
pub fn rxq(c: &Control) -> Value {
    let mut out = Vec::new();
    let interval = c.samples.interval();
    for (t, qs) in c.thread_queues.iter().enumerate() {
        let busy_total = c.threads[t].busy_cycles.load(Relaxed);
        let busy_last =
            interval.and_then(|(_, l, e)| Some(l.threads.get(t)?.busy.saturating_sub(e.threads.get(t)?.busy)));
        for &(pid, q) in qs {
            let (Some(pc), Some(s)) = (c.port(pid as usize), c.rxq_stats.get(&(pid, q))) else { continue };
            let cyc = s.cycles.load(Relaxed);
            let last = interval.and_then(|(dt, l, e)| {
                let (lp, lc) = *l.rxqs.get(&(pid, q))?;
                let (ep, ec) = e.rxqs.get(&(pid, q)).copied().unwrap_or((0, 0));
                Some(json!({
                    "seconds": dt,
                    "pps": lp.saturating_sub(ep) as f64 / dt,
                    "busy_share_pct": pct(lc.saturating_sub(ec), busy_last.unwrap_or(0)),
                }))
            });
            out.push(json!({
                "port": pc.port.name(),
                "queue": q,
                "thread": t,
                "core": c.threads[t].core,
                "numa_node": pc.numa_node(),
                "packets": s.packets.load(Relaxed),
                "bytes": s.bytes.load(Relaxed),
                "bursts": s.bursts.load(Relaxed),
                "visits": s.visits.load(Relaxed),
                "cycles": cyc,
                "busy_share_pct": pct(cyc, busy_total),
                "last_interval": last,
            }));
        }
    }
    Value::Array(out)
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The Prometheus text exposition format: raw totals (never cleared), conventional names.
pub fn metrics(c: &Control) -> String {
    let mut m = String::new();
    let head = |m: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    head(&mut m, "pvswitch_uptime_seconds", "gauge", "Seconds since pvswitchd started.");
    let _ = writeln!(m, "pvswitch_uptime_seconds {}", c.started.elapsed().as_secs_f64());

    let threads: Vec<ThreadTotals> = c.threads.iter().map(|t| ThreadTotals::read(t)).collect();
    for (name, help, get) in [
        (
            "pvswitch_pmd_iterations_total",
            "Poll loop iterations.",
            (|t: &ThreadTotals| t.iterations) as fn(&ThreadTotals) -> u64,
        ),
        ("pvswitch_pmd_busy_cycles_total", "TSC cycles in iterations that moved frames.", |t| t.busy),
        ("pvswitch_pmd_idle_cycles_total", "TSC cycles in iterations that found nothing.", |t| t.idle),
        ("pvswitch_pmd_rx_packets_total", "Frames the thread took from guests.", |t| t.ports.rx_packets),
        ("pvswitch_pmd_tx_packets_total", "Frames the thread delivered to guests.", |t| t.ports.tx_packets),
    ] {
        head(&mut m, name, "counter", help);
        for (i, t) in threads.iter().enumerate() {
            let _ = writeln!(m, "{name}{{thread=\"{i}\",core=\"{}\"}} {}", c.threads[i].core, get(t));
        }
    }
    for (name, help, get) in [
        (
            "pvswitch_pmd_sleeps_total",
            "Times the thread went to sleep (adaptive polling).",
            (|t: &ThreadStats| t.sleeps.load(Relaxed)) as fn(&ThreadStats) -> u64,
        ),
        ("pvswitch_pmd_asleep_cycles_total", "TSC cycles the thread slept.", |t| t.asleep_cycles.load(Relaxed)),
        ("pvswitch_pmd_wakeups_kick_total", "Wake-ups by a guest's kick.", |t| t.wakeups_kick.load(Relaxed)),
        ("pvswitch_pmd_wakeups_control_total", "Wake-ups by the control thread.", |t| t.wakeups_control.load(Relaxed)),
    ] {
        head(&mut m, name, "counter", help);
        for (i, t) in c.threads.iter().enumerate() {
            let _ = writeln!(m, "{name}{{thread=\"{i}\",core=\"{}\"}} {}", t.core, get(t));
        }
    }
    for (name, help, get) in
        [("pvswitch_pmd_dummy", "", (|_: &ThreadTotals| 0) as fn(&ThreadTotals) -> u64)].into_iter().filter(|_| false)
    {
        head(&mut m, name, "counter", help);
        for (i, t) in threads.iter().enumerate() {
            let _ = writeln!(m, "{name}{{thread=\"{i}\",core=\"{}\"}} {}", c.threads[i].core, get(t));
        }
    }

    let mut ports: Vec<(String, PortTotals)> = Vec::new();
    for pc in c.ports.iter().flatten() {
        let mut t = PortTotals::default();
        for th in &c.threads {
            t.add(&th.ports[pc.port.id as usize]);
        }
        ports.push((esc(pc.port.name()), t));
    }
    for (name, help, get) in [
        (
            "pvswitch_port_rx_packets_total",
            "Frames received from the port (the guest sent).",
            (|t: &PortTotals| t.rx_packets) as fn(&PortTotals) -> u64,
        ),
        ("pvswitch_port_rx_bytes_total", "Bytes received from the port.", |t| t.rx_bytes),
        ("pvswitch_port_tx_packets_total", "Frames sent to the port (the guest received).", |t| t.tx_packets),
        ("pvswitch_port_tx_bytes_total", "Bytes sent to the port.", |t| t.tx_bytes),
        ("pvswitch_port_interrupts_total", "Interrupts sent to the guest.", |t| t.interrupts),
    ] {
        head(&mut m, name, "counter", help);
        for (p, t) in &ports {
            let _ = writeln!(m, "{name}{{port=\"{p}\"}} {}", get(t));
        }
    }
    head(&mut m, "pvswitch_port_drops_total", "counter", "Frames dropped, by port and reason.");
    for (p, t) in &ports {
        for (reason, n) in DROP_REASONS.iter().zip(t.drops) {
            let _ = writeln!(m, "pvswitch_port_drops_total{{port=\"{p}\",reason=\"{reason}\"}} {n}");
        }
    }

    let mut rxqs: Vec<_> = c.rxq_stats.iter().collect();
    rxqs.sort_by_key(|(k, _)| **k);
    let owner = |k: &(u16, usize)| c.thread_queues.iter().position(|q| q.contains(k));
    for (name, help, get) in [
        (
            "pvswitch_rxq_packets_total",
            "Frames taken from a receive queue.",
            (|s: &crate::datapath::counters::RxqStats| s.packets.load(Relaxed))
                as fn(&crate::datapath::counters::RxqStats) -> u64,
        ),
        ("pvswitch_rxq_bytes_total", "Bytes taken from a receive queue.", |s| s.bytes.load(Relaxed)),
        ("pvswitch_rxq_cycles_total", "TSC cycles spent on a receive queue's busy visits.", |s| s.cycles.load(Relaxed)),
    ] {
        head(&mut m, name, "counter", help);
        for (k, s) in &rxqs {
            let Some(pc) = c.port(k.0 as usize) else { continue };
            let thread = owner(k).map_or(String::from("none"), |t| t.to_string());
            let _ = writeln!(
                m,
                "{name}{{port=\"{}\",queue=\"{}\",thread=\"{thread}\"}} {}",
                esc(pc.port.name()),
                k.1,
                get(s)
            );
        }
    }
    m
}
