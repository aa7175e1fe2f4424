//! Where the cycles and frames went: `stats` (per poll thread, like OVS's pmd-perf-show),
//! `rxq` (per receive queue, like pmd-rxq-show), as `proto` types, and the Prometheus text exposition.
//! Everything here reads counters the poll threads write (relaxed loads, no locks, no pause of
//! the data path); rates come from the once-a-second samples (`switch::samples`). Counter names
//! and help texts come from their declarations in `datapath::counters`.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use serde_json::Value;

use super::proto::{
    FlowExportStats, Parking, PollMode, RunningInfo, RxqInfo, RxqInterval, StatsReply, ThreadInterval, ThreadStats,
    WakeBucket, Wakeups, WokenBy,
};
use crate::datapath::counters::{self, LoopCounters, PortCounters, RunningTuning, RxqStats, cycles_per_sec};
use crate::port::PortKind;
use crate::switch::samples::{ThreadTotals, pct};
use crate::switch::{PortState, Switch};

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn queue_names(c: &Switch, i: usize) -> Vec<String> {
    c.threads[i].queues.iter().map(|&(p, q)| format!("{}:{q}", c.port_name(p))).collect()
}

/// Control wake-up latencies by bucket: below 2^i microseconds (the last bucket is open).
fn wake_hist(th: &counters::ThreadStats) -> Vec<WakeBucket> {
    let n = th.wake_latency_us.len();
    th.wake_latency_us
        .iter()
        .enumerate()
        .map(|(i, c)| WakeBucket { below_us: (i + 1 < n).then_some(1u64 << i), count: c.load(Relaxed) })
        .collect()
}

pub fn stats(c: &Switch) -> StatsReply {
    let hz = cycles_per_sec();
    let threads = c.threads.iter().enumerate().filter(|(_, t)| t.live).map(|(i, _)| thread(c, i, hz)).collect();
    StatsReply {
        uptime_secs: c.started.elapsed().as_secs(),
        tsc_hz: hz,
        cleared_secs_ago: c.samples.cleared_at().map(|t| t.elapsed().as_secs_f64()),
        threads,
        flow_export: c.export.as_deref().map(flow_export),
    }
}

/// Flow export's counts (totals: `stats --clear` does not restart them).
pub fn flow_export(x: &crate::export::FlowExport) -> FlowExportStats {
    FlowExportStats {
        collector: x.cfg.collector.to_string(),
        sampling: x.cfg.sampling,
        observed: x.observed(),
        flows: x.flows(),
        records: x.records.load(Relaxed),
        messages: x.messages.load(Relaxed),
        flows_not_recorded: x.full(),
        bursts_missed: x.missed.load(Relaxed),
        send_errors: x.send_errors.load(Relaxed),
    }
}

/// Poll thread `i`: totals since start or since `stats --clear`, and the last interval's rates.
fn thread(c: &Switch, i: usize, hz: u64) -> ThreadStats {
    let th = &c.threads[i].stats;
    let now = ThreadTotals::read(th);
    let t = match c.samples.base(i) {
        Some(b) => now.since(b),
        None => now,
    };
    let (p, l) = (&t.ports, &t.loops);
    let last_interval = c.samples.interval().and_then(|iv| {
        let d = iv.thread(i)?;
        let dt = iv.seconds;
        Some(ThreadInterval {
            seconds: dt,
            rx_pps: d.ports.rx_packets as f64 / dt,
            tx_pps: d.ports.tx_packets as f64 / dt,
            rx_bps: d.ports.rx_bytes as f64 * 8.0 / dt,
            busy_pct: pct(d.busy(), d.polled()),
            cycles_per_packet: ratio(d.busy(), d.ports.rx_packets),
        })
    });
    let r = &th.running;
    let sleep = r.sleep_after_us.load(Relaxed);
    let running = RunningInfo {
        burst: r.burst.load(Relaxed),
        rx_retry_us: ((r.retry_cycles.load(Relaxed) as u128 * 1_000_000 + hz as u128 / 2) / hz.max(1) as u128) as u64,
        idle_before_sleep_us: (sleep != RunningTuning::BUSY).then_some(sleep),
        nic_poll_interval_us: r.nic_poll_interval_us.load(Relaxed),
        nic_poll_max_us: r.nic_poll_max_us.load(Relaxed),
        nic_sleep_us: r.nic_sleep_us.load(Relaxed),
        park_after_us: r.park_after_us.load(Relaxed),
        park_check_us: r.park_check_us.load(Relaxed),
    };
    ThreadStats {
        thread: i,
        core: th.core,
        numa_node: th.numa_node,
        queues: queue_names(c, i),
        poll_mode: if running.idle_before_sleep_us.is_some() { PollMode::Adaptive } else { PollMode::Busy },
        running,
        iterations: l.iterations,
        busy_cycles: l.busy_cycles,
        idle_cycles: l.idle_cycles,
        busy_pct: pct(t.busy(), t.polled()),
        rx_packets: p.rx_packets,
        rx_bytes: p.rx_bytes,
        tx_packets: p.tx_packets,
        tx_bytes: p.tx_bytes,
        cycles_per_packet: ratio(t.busy(), p.rx_packets),
        avg_rx_burst: ratio(p.rx_packets, p.rx_bursts),
        avg_tx_batch: ratio(p.tx_packets, p.tx_batches),
        interrupts: p.interrupts,
        drops: p.drops,
        sleeps: l.sleeps,
        sleeping: th.sleeping.load(Relaxed) == 1,
        asleep_secs: l.asleep_cycles as f64 / hz as f64,
        wakeups: Wakeups {
            kick: l.wakeups_kick,
            control: l.wakeups_control,
            timeout: l.wakeups_timeout,
            interrupt: l.wakeups_interrupt,
        },
        parked: th.parked.load(Relaxed),
        parking: Parking {
            parks: l.parks,
            unparks_kick: l.unparks_kick,
            unparks_control: l.unparks_control,
            unparks_sweep: l.unparks_sweep,
            checks: l.park_checks,
        },
        wake_latency_us: wake_hist(th),
        last_interval,
    }
}

/// Each receive queue: its thread and its share of that thread's busy cycles, over the last
/// interval and since start.
pub fn rxq(c: &Switch) -> Vec<RxqInfo> {
    let mut out = Vec::new();
    let interval = c.samples.interval();
    for (t, slot) in c.threads.iter().enumerate() {
        let busy_total = slot.stats.loops.busy_cycles.load(Relaxed);
        let busy_last = interval.as_ref().and_then(|iv| iv.thread(t)).map(|d| d.busy());
        for &(pid, q) in &slot.queues {
            let (Some(ps), Some(s)) = (c.port(pid as usize), c.rxq_stats.get(&(pid, q))) else { continue };
            let s = s.read();
            let parked = s.parks > s.unparks;
            let last_interval = interval.as_ref().and_then(|iv| {
                let (packets, cycles) = iv.rxq((pid, q))?;
                Some(RxqInterval {
                    seconds: iv.seconds,
                    pps: packets as f64 / iv.seconds,
                    busy_share_pct: pct(cycles, busy_last.unwrap_or(0)),
                })
            });
            out.push(RxqInfo {
                port: ps.name().to_string(),
                queue: q,
                thread: t,
                core: slot.core(),
                numa_node: ps.numa_node(),
                busy_share_pct: pct(s.cycles, busy_total),
                parked,
                woken_by: woken_by(ps, q),
                last_interval,
                counters: s,
            });
        }
    }
    out
}

/// What wakes a sleeping thread for queue `q` of port `ps`.
fn woken_by(ps: &PortState, q: usize) -> Option<WokenBy> {
    match &ps.port.kind {
        PortKind::VhostUser(_) => Some(WokenBy::Kick),
        PortKind::Nic(n) => Some(match n.rx_interrupt(q) {
            Some(i) if i.needs_arming => WokenBy::ArmedInterrupt,
            Some(_) => WokenBy::Interrupt,
            None => WokenBy::Timer,
        }),
        PortKind::Failed | PortKind::Tunnel(_) => None,
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
                v[k] = Value::from(n);
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
    conntrack_metrics(c, &mut m);
    flow_conntrack_metrics(c, &mut m);
    flow_export_metrics(c, &mut m);
    m
}

/// Flows' connection tracking (`ct` actions): connections per zone holding any, in all, and
/// the commits refused by reason. Nothing before a flow had a `ct`.
fn flow_conntrack_metrics(c: &Switch, m: &mut String) {
    let Some(ct) = c.flow_conntrack.get() else { return };
    let name = "pvswitch_flow_conntrack_connections";
    let _ = writeln!(m, "# HELP {name} Connections flows' ct(commit) stored, by zone.\n# TYPE {name} gauge");
    for zone in (0..=u16::MAX).filter(|&z| ct.zone_len(z) > 0) {
        let _ = writeln!(m, "{name}{{zone=\"{zone}\"}} {}", ct.zone_len(zone));
    }
    let name = "pvswitch_flow_conntrack_connections_all";
    let _ = writeln!(m, "# HELP {name} Connections flows' ct(commit) stored, every zone's.\n# TYPE {name} gauge");
    let _ = writeln!(m, "{name} {}", ct.len());
    let help = "ct(commit)s not stored: a zone's limit, or the table full.";
    refused_metrics(m, "pvswitch_flow_conntrack_refused_total", help, ct, "zone_limit");
}

/// Flow export's counts, while `[ipfix]` is configured.
fn flow_export_metrics(c: &Switch, m: &mut String) {
    let Some(x) = c.export.as_deref() else { return };
    let s = flow_export(x);
    let _ = writeln!(m, "# HELP pvswitch_flow_export_flows Flows the poll threads' tables hold.");
    let _ = writeln!(m, "# TYPE pvswitch_flow_export_flows gauge\npvswitch_flow_export_flows {}", s.flows);
    for (name, help, n) in [
        ("observed", "Frames taken into a flow (one in sampling).", s.observed),
        ("records", "Flow records sent.", s.records),
        ("messages", "IPFIX messages sent.", s.messages),
        ("flows_not_recorded", "New flows not recorded: a poll thread's table was full.", s.flows_not_recorded),
        ("bursts_missed", "Bursts not looked at: the table was taken.", s.bursts_missed),
        ("send_errors", "Messages the socket refused.", s.send_errors),
    ] {
        let name = format!("pvswitch_flow_export_{name}_total");
        let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {n}");
    }
}

/// A table's refused commits as a counter family by reason (`per_zone`: what its zones'
/// limit is called).
fn refused_metrics(m: &mut String, name: &str, help: &str, ct: &crate::conntrack::Conntrack, per_zone: &str) {
    let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} counter");
    for (i, reason) in [per_zone, "table_full"].iter().enumerate() {
        let n = ct.refused[i].load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(m, "{name}{{reason=\"{reason}\"}} {n}");
    }
}

/// Security groups' connection tracking: connections per port with groups and in all, the
/// limits, and the commits refused by reason. Nothing before the table exists.
fn conntrack_metrics(c: &Switch, m: &mut String) {
    let Some(ct) = c.conntrack.get() else { return };
    let gauge = |m: &mut String, name: &str, help: &str| {
        let _ = writeln!(m, "# HELP {name} {help}\n# TYPE {name} gauge");
    };
    gauge(m, "pvswitch_conntrack_connections", "Connections tracked for a port's security groups.");
    for ps in c.ports.iter().flatten().filter(|ps| !ps.cfg.security_groups.is_empty()) {
        let n = ct.zone_len(crate::switch::secgroups::zone_of(ps.id()));
        let _ = writeln!(m, "pvswitch_conntrack_connections{{port=\"{}\"}} {n}", esc(ps.name()));
    }
    gauge(m, "pvswitch_conntrack_connections_all", "Connections tracked, every port's.");
    let _ = writeln!(m, "pvswitch_conntrack_connections_all {}", ct.len());
    gauge(m, "pvswitch_conntrack_limit", "ct_max_connections: the most connections, every port's.");
    let _ = writeln!(m, "pvswitch_conntrack_limit {}", c.cfg.ct_max_connections);
    let help = "New connections not stored: a port's limit, or the table full.";
    refused_metrics(m, "pvswitch_conntrack_refused_total", help, ct, "port_limit");
}
