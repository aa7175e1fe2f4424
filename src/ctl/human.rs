//! pvswitchctl's human output, printed from the reply types of `proto` (each function returns
//! the text, so it can be tested without a daemon).

use std::fmt::Write;

use serde::de::DeserializeOwned;

use super::proto::{
    CaptureEnd, CaptureStarted, ConntrackReply, Drops, FdbEntry, FlowsReply, LiveTrace, MigrationInfo, MirrorInfo,
    MoveReply, PortInfo, PortReply, PortVlanInfo, QueueInfo, RateCapsInfo, RebalanceReply, ReloadReply, Request,
    RxqInfo, StatsReply, ThreadStats, TraceReply, VersionReply, VrfInfo, VtepInfo,
};
use crate::datapath::counters::DROP_REASONS;

/// The human text for the reply `result` to `req` (read into the command's reply type).
pub fn render(req: &Request, result: &str) -> Result<String, String> {
    Ok(match req {
        Request::Ports => ports(&typed::<Vec<PortInfo>>(result)?),
        Request::Stats { clear: true } => "counters cleared\n".into(),
        Request::Stats { clear: false } => stats(&typed(result)?),
        Request::Rxq => rxq(&typed::<Vec<RxqInfo>>(result)?),
        Request::Fdb => fdb(&typed::<Vec<FdbEntry>>(result)?),
        Request::Flows => flows(&typed(result)?),
        Request::Trace { .. } => trace(&typed(result)?),
        Request::Rebalance { .. } => rebalance(&typed(result)?),
        Request::Move { port, queue, .. } => moved(&format!("{port}:{queue}"), &typed(result)?),
        Request::Reload => reload(&typed(result)?),
        Request::Version => version(&typed(result)?),
        Request::Port { name } if super::proto::is_glob(name) => ports(&typed::<Vec<PortInfo>>(result)?),
        Request::Port { .. } => ports(&[typed::<PortInfo>(result)?]),
        Request::Conntrack { .. } => conntrack(&typed(result)?),
        Request::AddPort { .. }
        | Request::DelPort { .. }
        | Request::SetPort { .. }
        | Request::AddMirror { .. }
        | Request::DelMirror { .. }
        | Request::VtepSync { .. }
        | Request::ConntrackFlush { .. } => {
            format!("{}\n", typed::<PortReply>(result)?.summary)
        }
        Request::Vteps => vteps(&typed::<Vec<VtepInfo>>(result)?),
        Request::Mirrors => mirrors(&typed::<Vec<MirrorInfo>>(result)?),
        Request::Vrfs => vrfs(&typed::<Vec<VrfInfo>>(result)?),
        Request::Capture { .. } | Request::TraceLive { .. } => capture_started(&typed(result)?),
    })
}

/// `capture`'s first line, as tcpdump says where it listens.
pub fn capture_started(c: &CaptureStarted) -> String {
    let ports: Vec<String> = c.ports.iter().zip(&c.kinds).map(|(p, k)| format!("{p} ({k})")).collect();
    let filter = if c.filter.is_empty() { String::new() } else { format!(", filter \"{}\"", c.filter) };
    let drops = if c.drops { ", drops too" } else { "" };
    format!(
        "capturing on {}, direction {}{drops}, {} bytes a frame{filter}\n",
        ports.join(", "),
        c.direction,
        c.snaplen
    )
}

/// `trace --live`'s first line.
pub fn trace_started(c: &CaptureStarted) -> String {
    let filter = if c.filter.is_empty() { String::new() } else { format!(" that match \"{}\"", c.filter) };
    format!("tracing the frames {} ({}) sends{filter}\n", c.ports.join(", "), c.kinds.join(", "))
}

/// How a live trace ended.
pub fn trace_end(e: &CaptureEnd) -> String {
    format!(
        "{} frames traced ({} matched of {} seen, {} lost: the reader was behind); trace ended: {}\n",
        e.packets, e.matched, e.seen, e.lost, e.reason
    )
}

/// How a capture ended, as tcpdump's closing lines.
pub fn capture_end(e: &CaptureEnd) -> String {
    format!(
        "{} packets captured\n{} packets matched the filter, of {} seen\n{} packets lost (the reader was behind)\ncapture ended: {}\n",
        e.packets, e.matched, e.seen, e.lost, e.reason
    )
}

/// `conntrack`: the counts, each port with groups, then one line a connection (conntrack -L's
/// order: protocol, state, addresses and ports as the first frame went).
fn conntrack(r: &ConntrackReply) -> String {
    let mut s = format!(
        "{} connections (limit {}, {} a port); refused: {} at a port's limit, {} table full, {} fragments\n",
        r.total, r.limit, r.limit_per_port, r.refused_port_limit, r.refused_table_full, r.bad_fragments
    );
    for z in &r.ports {
        let _ = writeln!(s, "  {}: zone {}, {} connections", z.port, z.zone, z.connections);
    }
    if r.flow_total > 0 || !r.flow_zones.is_empty() {
        let _ = writeln!(s, "flows' ct(): {} connections", r.flow_total);
        for z in &r.flow_zones {
            let _ = writeln!(s, "  zone {}: {} connections", z.zone, z.connections);
        }
    }
    for c in &r.connections {
        let cut = if c.cut { " [cut]" } else { "" };
        let (who, how) = match c.port.as_str() {
            "" => (format!("zone={}", c.zone), format!("mark=0x{:x}", c.mark)),
            port => (port.to_string(), format!("opened={}", c.opened)),
        };
        let _ = writeln!(
            s,
            "{who} {} {} src={} sport={} dst={} dport={} {how} expires_in={}{cut}",
            c.protocol, c.state, c.src, c.sport, c.dst, c.dport, c.expires_in
        );
    }
    s
}

/// `vteps`: one block per VTEP: its VNIs, its local MACs, what its control plane said.
fn vteps(v: &[VtepInfo]) -> String {
    let mut s = String::new();
    for t in v {
        let vnis: Vec<String> = t.vnis.iter().map(|n| format!("{}:vlan{}", n.vni, n.vlan)).collect();
        let _ = writeln!(s, "vtep {} on {} at {}:{}  vnis {}", t.name, t.underlay, t.local, t.udp_port, vnis.join(" "));
        for m in &t.local_macs {
            let _ = writeln!(s, "  local   vni {:<8} {}", m.vni, m.mac);
        }
        for r in &t.learned.remotes {
            let vnis: Vec<String> = r.vnis.iter().map(|v| v.to_string()).collect();
            let _ = writeln!(s, "  remote  {:<15} floods vni {}", r.remote, vnis.join(","));
        }
        for m in &t.learned.macs {
            let _ = writeln!(s, "  remote  vni {:<8} {} behind {}", m.vni, m.mac, m.remote);
        }
    }
    s
}

/// `vrfs`: one block per VRF: its networks, then its neighbours.
fn vrfs(v: &[VrfInfo]) -> String {
    let mut s = String::new();
    for vrf in v {
        let _ = writeln!(s, "vrf {}: gateway MAC {}", vrf.name, vrf.gateway_mac);
        for n in &vrf.networks {
            let six = n.gateway6.as_deref().map(|g| format!(" and {g}")).unwrap_or_default();
            let _ = writeln!(s, "  network VLAN {}: gateway {}{six}", n.vlan, n.gateway);
        }
        for n in &vrf.neighbours {
            let _ = writeln!(s, "  neighbour {} at {} on {} (VLAN {})", n.address, n.mac, n.port, n.vlan);
        }
    }
    s
}

/// `mirrors`: a line a mirror (what it selects, where copies go, what they did), and the ports
/// it names that are absent.
fn mirrors(v: &[MirrorInfo]) -> String {
    let mut s = String::new();
    for m in v {
        let mut sel = Vec::new();
        if m.select_all {
            sel.push("all".to_string());
        }
        if !m.select_src_port.is_empty() {
            sel.push(format!("from {}", m.select_src_port.join(",")));
        }
        if !m.select_dst_port.is_empty() {
            sel.push(format!("to {}", m.select_dst_port.join(",")));
        }
        if !m.select_vlan.is_empty() {
            let v: Vec<String> = m.select_vlan.iter().map(|v| v.to_string()).collect();
            sel.push(format!("vlan {}", v.join(",")));
        }
        let snap = m.snaplen.map(|n| format!(", {n} bytes a copy")).unwrap_or_default();
        let state = if m.active { "" } else { " (inactive: no such output)" };
        let _ = writeln!(
            s,
            "mirror {}: {} -> {}{state}{snap}  copies {} ({} bytes) dropped {}",
            m.name,
            sel.join(" "),
            m.output_port,
            m.copies,
            m.copy_bytes,
            m.dropped
        );
        if !m.absent.is_empty() {
            let _ = writeln!(s, "  absent: {}", m.absent.join(", "));
        }
    }
    s
}

/// The result's JSON text read straight into its type (no `Value` in between: a `ports` reply
/// with a thousand ports is megabytes).
fn typed<T: DeserializeOwned>(v: &str) -> Result<T, String> {
    serde_json::from_str(v).map_err(|e| format!("malformed reply: {e}"))
}

/// The nonzero drop counters as `reason=count` (by name), or "0".
pub fn drops(d: &Drops) -> String {
    let mut parts: Vec<(&str, u64)> =
        DROP_REASONS.iter().zip(d.0).filter(|(_, n)| *n != 0).map(|((name, _), n)| (*name, n)).collect();
    parts.sort();
    let parts: Vec<String> = parts.into_iter().map(|(k, n)| format!("{k}={n}")).collect();
    if parts.is_empty() { "0".into() } else { parts.join(" ") }
}

/// What a port's migration state says, if it says anything (logging, or an announcement).
fn migration(m: &MigrationInfo) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(b) = m.log_bytes {
        parts.push(format!("dirty logging on ({} KiB log)", b.div_ceil(1024)));
    }
    if m.rarp_requests > 0 || m.announcements > 0 {
        parts.push(format!("{} RARP requested, {} announced", m.rarp_requests, m.announcements));
    }
    if m.announcements_refused > 0 {
        parts.push(format!("{} announcements refused (too many)", m.announcements_refused));
    }

    (!parts.is_empty()).then(|| parts.join(", "))
}

pub fn ports(ports: &[PortInfo]) -> String {
    ports.iter().map(port).collect()
}

fn port(p: &PortInfo) -> String {
    let mut s = format!("{} (id {}): {} {} {} [{}]\n", p.name, p.id, p.kind, p.mode, p.socket, p.state);
    let features = if p.features.is_empty() { "-".into() } else { p.features.join(" ") };
    let _ = writeln!(s, "  features: {features}");
    let c = &p.counters;
    let _ = writeln!(
        s,
        "  rx: {} packets {} bytes   tx: {} packets {} bytes   interrupts: {}",
        c.rx_packets, c.rx_bytes, c.tx_packets, c.tx_bytes, c.interrupts
    );
    let _ = writeln!(s, "  drops: {}", drops(&c.drops));
    if !p.allowed_macs.is_empty() {
        let _ = writeln!(s, "  allowed_macs: {}", p.allowed_macs.join(" "));
    }
    if !p.allowed_ips.is_empty() {
        let _ = writeln!(s, "  allowed_ips: {}", p.allowed_ips.join(" "));
    }
    if !p.security_groups.is_empty() {
        let n = p.connections.unwrap_or(0);
        let _ = writeln!(s, "  security_groups: {} ({n} connections tracked)", p.security_groups.join(" "));
    }
    if let Some(v) = vlan(&p.vlan) {
        let _ = writeln!(s, "  vlan: {v}");
    }
    if let Some(r) = rate_caps(&p.rate_caps) {
        let _ = writeln!(s, "  rate caps: {r}");
    }
    if let Some(m) = migration(&p.migration) {
        let _ = writeln!(s, "  migration: {m}");
    }
    s.extend(p.queues.iter().map(queue));
    if let Some(e) = &p.last_error {
        // A failed port's error is why it is not running; another port's is the last thing
        // that happened to its connection.
        let what = if p.state == "failed" { "failed" } else { "last event" };
        let _ = writeln!(s, "  {what}: {e}");
    }
    if p.log_lines_suppressed > 0 {
        let _ =
            writeln!(s, "  log lines suppressed (its frontend's, past the port's budget): {}", p.log_lines_suppressed);
    }
    s
}

/// `access 10`, `trunk 10,20-29`, `native-untagged 10 trunks 20`; None for a port without
/// VLAN config (a trunk of every VLAN).
fn vlan(v: &PortVlanInfo) -> Option<String> {
    let trunks = v.trunks.join(",");
    match (v.mode.as_str(), v.tag) {
        ("trunk", _) if trunks == "0-4095" => None,
        ("trunk", _) => Some(format!("trunk {trunks}")),
        ("tunnel", _) => Some(format!("tunnel {trunks}")),
        ("access", Some(t)) => Some(format!("access {t}")),
        (m, Some(t)) => Some(format!("{m} {t} trunks {trunks}")),
        (m, None) => Some(m.to_string()),
    }
}

/// `ingress 1000 pps (12 left) 8000000 bps (...)  egress ...`; None for a port without caps.
fn rate_caps(r: &RateCapsInfo) -> Option<String> {
    let t = &r.tokens;
    let one = |rate: u64, unit: &str, tokens: Option<i64>| {
        (rate != 0).then(|| format!("{rate} {unit} ({} left)", tokens.unwrap_or(0)))
    };
    let dir = |name: &str, pps: Option<String>, bps: Option<String>| {
        let parts: Vec<String> = [pps, bps].into_iter().flatten().collect();
        (!parts.is_empty()).then(|| format!("{name} {}", parts.join(" ")))
    };
    let parts: Vec<String> = [
        dir("ingress", one(r.ingress_pps, "pps", t.ingress_pps), one(r.ingress_bps, "bps", t.ingress_bps)),
        dir("egress", one(r.egress_pps, "pps", t.egress_pps), one(r.egress_bps, "bps", t.egress_bps)),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| format!("{}  burst {} ms", parts.join("  "), r.burst_ms))
}

/// One queue: a virtqueue's size and state, a receive queue's poll thread.
fn queue(q: &QueueInfo) -> String {
    let size = q.size.map_or(String::new(), |n| format!(" size {n}"));
    let state = match (&q.error, q.running) {
        (Some(e), _) => format!(" STOPPED: {e}"),
        (None, Some(true)) => " running".into(),
        (None, Some(false)) => " stopped".into(),
        (None, None) => String::new(),
    };
    let owner = q.poll_thread.map_or(String::new(), |t| format!(" poll thread {t}"));
    format!("  queue {} {}{size}{state}{owner}\n", q.index, q.kind.name())
}

pub fn stats(r: &StatsReply) -> String {
    let cleared = r.cleared_secs_ago.map_or(String::new(), |s| format!(", counters cleared {s:.0} s ago"));
    let mut s = format!("uptime {} s{cleared}\n", r.uptime_secs);
    s.extend(r.threads.iter().map(thread));
    if let Some(x) = &r.flow_export {
        let _ = writeln!(
            s,
            "flow export to {} (1 frame in {}): {} frames observed, {} flows held, {} records in {} messages",
            x.collector, x.sampling, x.observed, x.flows, x.records, x.messages
        );
        let _ = writeln!(
            s,
            "  lost: {} flows not recorded (tables full), {} bursts missed, {} messages refused by the socket",
            x.flows_not_recorded, x.bursts_missed, x.send_errors
        );
    }
    s
}

fn thread(t: &ThreadStats) -> String {
    let numa = t.numa_node.map_or("null".into(), |n| n.to_string());
    let mut s = format!("poll thread {} on core {} (NUMA node {numa}):\n", t.thread, t.core);
    let _ = writeln!(s, "  queues: {}", t.queues.join(" "));
    let _ = writeln!(
        s,
        "  iterations {}  busy {:.1}% ({} cycles)  idle {} cycles",
        t.iterations, t.busy_pct, t.busy_cycles, t.idle_cycles
    );
    let _ = writeln!(
        s,
        "  rx {} frames {} bytes  tx {} frames {} bytes  interrupts {}",
        t.rx_packets, t.rx_bytes, t.tx_packets, t.tx_bytes, t.interrupts
    );
    let _ = writeln!(
        s,
        "  {:.0} cycles/frame  avg burst taken {:.1}  avg batch delivered {:.1}",
        t.cycles_per_packet, t.avg_rx_burst, t.avg_tx_batch
    );
    if let Some(l) = &t.last_interval {
        let _ = writeln!(
            s,
            "  last {:.1} s: rx {:.0} frames/s  tx {:.0} frames/s  busy {:.1}%  {:.0} cycles/frame",
            l.seconds, l.rx_pps, l.tx_pps, l.busy_pct, l.cycles_per_packet
        );
    }
    let _ = writeln!(s, "  drops: {}", drops(&t.drops));
    s
}

pub fn rxq(queues: &[RxqInfo]) -> String {
    queues.iter().map(rxq_line).collect()
}

fn rxq_line(q: &RxqInfo) -> String {
    let last = q.last_interval.map_or(String::new(), |l| {
        format!(", {:.1}% last {:.1} s ({:.0} frames/s)", l.busy_share_pct, l.seconds, l.pps)
    });
    let numa = q.numa_node.map_or("null".into(), |n| n.to_string());
    format!(
        "thread {} core {}  {}:{}  numa {numa}  {} frames  busy share {:.1}% overall{last}\n",
        q.thread, q.core, q.port, q.queue, q.counters.packets, q.busy_share_pct
    )
}

pub fn fdb(entries: &[FdbEntry]) -> String {
    let mut s = String::from(" vlan  mac                port\n");
    s.extend(entries.iter().map(|e| format!("{:>5}  {}  {}\n", e.vlan, e.mac, e.port.as_deref().unwrap_or("?"))));
    s
}

pub fn flows(r: &FlowsReply) -> String {
    let mut s = String::new();
    if r.normal_only {
        s.push_str("no flows: every frame takes actions=NORMAL (MAC learning)\n");
    }
    for f in &r.flows {
        let _ = writeln!(
            s,
            " duration={:.3}s, n_packets={}, n_bytes={}, {}",
            f.duration_secs, f.n_packets, f.n_bytes, f.flow
        );
    }
    if r.missed_packets > 0 {
        let _ = writeln!(s, " (no flow matched: n_packets={}, n_bytes={})", r.missed_packets, r.missed_bytes);
    }
    s
}

pub fn trace(r: &TraceReply) -> String {
    r.steps.iter().map(|step| format!("{step}\n")).collect()
}

/// `trace --live`: one traced frame, its time (UTC, as tcpdump prints it) then its steps.
pub fn live_trace(r: &LiveTrace) -> String {
    let secs = r.time_ns / 1_000_000_000;
    let (h, m, sec, us) = (secs / 3600 % 24, secs / 60 % 60, secs % 60, r.time_ns / 1000 % 1_000_000);
    let mut s = format!("{h:02}:{m:02}:{sec:02}.{us:06} {}\n", r.port);
    s.extend(r.steps.iter().map(|step| format!("  {step}\n")));
    s
}

pub fn rebalance(r: &RebalanceReply) -> String {
    let mut s = format!(
        "{}: {} queues moved in {} us; load spread {:.2} -> {:.2}\n",
        r.policy,
        r.moved.len(),
        r.took_us,
        r.spread_before,
        r.spread_after
    );
    s.extend(r.moved.iter().map(|m| format!("  {m}\n")));
    s.extend(r.warnings.iter().map(|w| format!("  warning: {w}\n")));
    s
}

/// `move`: `queue` is the queue as asked for ("PORT:QUEUE").
pub fn moved(queue: &str, r: &MoveReply) -> String {
    if r.moved {
        format!("{queue}: thread {} -> {} in {} us\n", r.from, r.to, r.took_us)
    } else {
        format!("{queue}: already on thread {}\n", r.to)
    }
}

pub fn reload(r: &ReloadReply) -> String {
    format!("reloaded: {}\n", r.summary)
}

pub fn version(r: &VersionReply) -> String {
    format!("pvswitchd {}\n", r.version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tests::samples;

    #[test]
    fn ports_print_state_queues_and_nonzero_drops() {
        let text = ports(&[samples::port()]);
        let want = "\
vm1 (id 0): vhost-user server /run/pvswitch/vm1.sock [connected]
  features: MRG_RXBUF VERSION_1
  rx: 10 packets 0 bytes   tx: 0 packets 0 bytes   interrupts: 0
  drops: malformed=1 rx_ring_full=3
  vlan: native-untagged 10 trunks 20-29
  rate caps: ingress 1000 pps (5 left) 8000000 bps (64 left)  egress 2000 pps (0 left) 16000000 bps (-3 left)  burst 10 ms
  queue 0 guest_rx size 256 running
  queue 1 guest_tx size 256 STOPPED: descriptor loop poll thread 0
  queue 0 nic_rx poll thread 1
  last event: frontend closed
";
        assert_eq!(text, want);
        let failed = PortInfo { state: "failed".into(), ..samples::port() };
        assert!(ports(&[failed]).ends_with("  failed: frontend closed\n"));
        assert_eq!(drops(&Drops::default()), "0");
    }

    #[test]
    fn stats_print_each_thread_and_its_last_interval() {
        let text = stats(&samples::stats());
        assert!(text.starts_with("uptime 7 s, counters cleared 2 s ago\npoll thread 0 on core 0 (NUMA node 0):\n"));
        assert!(text.contains("  queues: vm1:0\n  iterations 0  busy 12.5% (0 cycles)  idle 0 cycles\n"), "{text}");
        assert!(text.contains("  last 1.0 s: rx 100 frames/s  tx 0 frames/s  busy 0.0%  0 cycles/frame\n"), "{text}");
        assert!(text.contains("  drops: malformed=1 rx_ring_full=3\n"), "{text}");
        assert!(
            text.ends_with(
                "flow export to 192.0.2.10:4739 (1 frame in 1000): 0 frames observed, 0 flows held, 3 records in 0 messages\n  \
                 lost: 0 flows not recorded (tables full), 0 bursts missed, 0 messages refused by the socket\n"
            ),
            "{text}"
        );
        let quiet = StatsReply { cleared_secs_ago: None, threads: vec![], flow_export: None, ..samples::stats() };
        assert_eq!(stats(&quiet), "uptime 7 s\n");
    }

    #[test]
    fn the_other_commands_print_one_line_each() {
        assert_eq!(
            rxq(&[samples::rxq()]),
            "thread 0 core 0  vm1:0  numa 0  10 frames  busy share 50.0% overall, 25.0% last 1.0 s (10 frames/s)\n"
        );
        assert_eq!(
            flows(&samples::flows()),
            " duration=1.250s, n_packets=2, n_bytes=128, priority=10,in_port=vm1 actions=output:vm2\n \
             (no flow matched: n_packets=1, n_bytes=60)\n"
        );
        assert_eq!(fdb(&[samples::fdb()]), " vlan  mac                port\n   10  02:00:00:00:00:01  vm1\n");
        assert_eq!(
            rebalance(&samples::rebalance()),
            "cycles: 1 queues moved in 30 us; load spread 0.50 -> 0.10\n  vm1:0 thread 0 -> 1\n  warning: w\n"
        );
        let m = MoveReply { moved: true, from: 0, to: 1, took_us: 4 };
        assert_eq!(moved("vm1:0", &m), "vm1:0: thread 0 -> 1 in 4 us\n");
        assert_eq!(moved("vm1:0", &MoveReply { moved: false, ..m }), "vm1:0: already on thread 1\n");
        assert_eq!(trace(&samples::trace()), "a\n");
        assert_eq!(reload(&ReloadReply { summary: "nothing changed".into() }), "reloaded: nothing changed\n");
    }

    #[test]
    fn render_reads_each_reply_into_its_type() {
        let v = serde_json::to_string(&vec![samples::port()]).unwrap();
        assert_eq!(render(&Request::Ports, &v), Ok(ports(&[samples::port()])));
        assert_eq!(render(&Request::Stats { clear: true }, r#"{"cleared": true}"#).unwrap(), "counters cleared\n");
        let e = render(&Request::Flows, &v).unwrap_err();
        assert!(e.starts_with("malformed reply: "), "{e}");
        let mut renamed = serde_json::to_value(samples::flows()).unwrap();
        let n = renamed.as_object_mut().unwrap().remove("missed_packets").unwrap();
        renamed["missed_frames"] = n;
        assert!(render(&Request::Flows, &renamed.to_string()).unwrap_err().contains("missed_packets"));
    }
}
