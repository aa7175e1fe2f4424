//! Where the cycles and frames went: `stats` (per poll thread, like OVS's pmd-perf-show),
//! `rxq` (per receive queue, like pmd-rxq-show), and the Prometheus text exposition.
//! Everything here reads counters the poll threads write (relaxed loads, no locks, no pause of
//! the data path); rates come from the once-a-second samples (`switch::samples`). Counter names
//! and help texts come from their declarations in `datapath::counters`.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::{Value, json};

use crate::datapath::counters::{LoopCounters, PortCounters, RxqStats, ThreadStats, cycles_per_sec};
use crate::switch::Switch;
use crate::switch::samples::{ThreadTotals, pct};

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn queue_names(c: &Switch, i: usize) -> Vec<String> {
    c.threads[i].queues.iter().map(|&(p, q)| format!("{}:{q}", c.port_name(p))).collect()
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

pub fn stats(c: &Switch) -> Value {
    let hz = cycles_per_sec();
    let mut out = Vec::new();
    let interval = c.samples.interval();
    for (i, slot) in c.threads.iter().enumerate().filter(|(_, t)| t.live) {
        let th = &slot.stats;
        let now = ThreadTotals::read(th);
        let t = match c.samples.base(i) {
            Some(b) => now.since(b),
            None => now,
        };
        let (p, l) = (&t.ports, &t.loops);
        let last = interval.as_ref().and_then(|iv| {
            let d = iv.thread(i)?;
            let dt = iv.seconds;
            Some(json!({
                "seconds": dt,
                "rx_pps": d.ports.rx_packets as f64 / dt,
                "tx_pps": d.ports.tx_packets as f64 / dt,
                "rx_bps": d.ports.rx_bytes as f64 * 8.0 / dt,
                "busy_pct": pct(d.busy(), d.polled()),
                "cycles_per_packet": ratio(d.busy(), d.ports.rx_packets),
            }))
        });
        out.push(json!({
            "thread": i,
            "core": th.core,
            "numa_node": th.numa_node,
            "queues": queue_names(c, i),
            "iterations": l.iterations,
            "busy_cycles": l.busy_cycles,
            "idle_cycles": l.idle_cycles,
            "busy_pct": pct(t.busy(), t.polled()),
            "rx_packets": p.rx_packets,
            "rx_bytes": p.rx_bytes,
            "tx_packets": p.tx_packets,
            "tx_bytes": p.tx_bytes,
            "cycles_per_packet": ratio(t.busy(), p.rx_packets),
            "avg_rx_burst": ratio(p.rx_packets, p.rx_bursts),
            "avg_tx_batch": ratio(p.tx_packets, p.tx_batches),
            "interrupts": p.interrupts,
            "drops": p.drops,
            "last_interval": last,
            "poll_mode": if c.cfg.sleep_after_us(th.core).is_some() { "adaptive" } else { "busy" },
            "sleeps": l.sleeps,
            "sleeping": th.sleeping.load(Relaxed) == 1,
            "asleep_secs": l.asleep_cycles as f64 / hz as f64,
            "wakeups": {
                "kick": l.wakeups_kick,
                "control": l.wakeups_control,
                "timeout": l.wakeups_timeout,
            },
            "wake_latency_us": wake_hist(th),
        }));
    }
    json!({
        "uptime_secs": c.started.elapsed().as_secs(),
        "tsc_hz": hz,
        "cleared_secs_ago": c.samples.cleared_at().map(|t| t.elapsed().as_secs_f64()),
        "threads": out,
    })
}

/// Each receive queue: its thread and its share of that thread's busy cycles, over the last
/// interval and since start.
pub fn rxq(c: &Switch) -> Value {
    let mut out = Vec::new();
    let interval = c.samples.interval();
    for (t, slot) in c.threads.iter().enumerate() {
        let busy_total = slot.stats.loops.busy_cycles.load(Relaxed);
        let busy_last = interval.as_ref().and_then(|iv| iv.thread(t)).map(|d| d.busy());
        for &(pid, q) in &slot.queues {
            let (Some(ps), Some(s)) = (c.port(pid as usize), c.rxq_stats.get(&(pid, q))) else { continue };
            let s = s.read();
            let last = interval.as_ref().and_then(|iv| {
                let (packets, cycles) = iv.rxq((pid, q))?;
                Some(json!({
                    "seconds": iv.seconds,
                    "pps": packets as f64 / iv.seconds,
                    "busy_share_pct": pct(cycles, busy_last.unwrap_or(0)),
                }))
            });
            let mut v = json!({
                "port": ps.name(),
                "queue": q,
                "thread": t,
                "core": slot.core(),
                "numa_node": ps.numa_node(),
                "busy_share_pct": pct(s.cycles, busy_total),
                "last_interval": last,
            });
            merge(&mut v, &s);
            out.push(v);
        }
    }
    Value::Array(out)
}

/// Adds the fields of `totals` (a counters' totals struct) to the JSON object `v`.
pub fn merge(v: &mut Value, totals: &impl serde::Serialize) {
    if let (Some(o), Ok(Value::Object(t))) = (v.as_object_mut(), serde_json::to_value(totals)) {
        o.extend(t);
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// One counter family: `# HELP`, `# TYPE` and a sample per (labels, totals) pair; `value`
/// picks the field out of the serialized totals (a number, or for `drops` one sample per reason).
fn family(m: &mut String, name: &str, help: &str, field: &str, rows: &[(String, Value)]) {
    let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} counter");
    for (labels, totals) in rows {
        match &totals[field] {
            Value::Object(by_reason) => {
                for (reason, n) in by_reason {
                    let _ = writeln!(m, "{name}{{{labels},reason=\"{reason}\"}} {n}");
                }
            }
            n => {
                let _ = writeln!(m, "{name}{{{labels}}} {n}");
            }
        }
    }
}

/// The Prometheus text exposition format: raw totals (never cleared), conventional names:
/// `pvswitch_pmd_<counter>_total`, `pvswitch_port_<counter>_total`, `pvswitch_rxq_<counter>_total`
/// for every counter `datapath::counters` declares.
pub fn metrics(c: &Switch) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# HELP pvswitch_uptime_seconds Seconds since pvswitchd started.");
    let _ = writeln!(m, "# TYPE pvswitch_uptime_seconds gauge");
    let _ = writeln!(m, "pvswitch_uptime_seconds {}", c.started.elapsed().as_secs_f64());

    let threads: Vec<(String, Value)> = c
        .threads
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let tt = ThreadTotals::read(&t.stats);
            let mut v = serde_json::to_value(tt.loops).unwrap_or_default();
            for (k, n) in [("rx_packets", tt.ports.rx_packets), ("tx_packets", tt.ports.tx_packets)] {
                v[k] = json!(n);
            }
            (format!("thread=\"{i}\",core=\"{}\"", t.core()), v)
        })
        .collect();
    for (field, help) in LoopCounters::FIELDS.iter().chain(&[
        ("rx_packets", "Frames the thread took from its queues."),
        ("tx_packets", "Frames the thread delivered."),
    ]) {
        family(&mut m, &format!("pvswitch_pmd_{field}_total"), help, field, &threads);
    }

    let ports: Vec<(String, Value)> = c
        .ports
        .iter()
        .flatten()
        .map(|ps| {
            (format!("port=\"{}\"", esc(ps.name())), serde_json::to_value(c.port_totals(ps.id())).unwrap_or_default())
        })
        .collect();
    for (field, help) in PortCounters::FIELDS {
        family(&mut m, &format!("pvswitch_port_{field}_total"), help, field, &ports);
    }

    let mut rxqs: Vec<_> = c.rxq_stats.iter().collect();
    rxqs.sort_by_key(|(k, _)| **k);
    let rxqs: Vec<(String, Value)> = rxqs
        .into_iter()
        .filter_map(|(&(pid, q), s)| {
            let ps = c.port(pid as usize)?;
            let thread = c.owner((pid, q)).map_or(String::from("none"), |t| t.to_string());
            let labels = format!("port=\"{}\",queue=\"{q}\",thread=\"{thread}\"", esc(ps.name()));
            Some((labels, serde_json::to_value(s.read()).unwrap_or_default()))
        })
        .collect();
    for (field, help) in RxqStats::FIELDS {
        family(&mut m, &format!("pvswitch_rxq_{field}_total"), help, field, &rxqs);
    }
    m
}
