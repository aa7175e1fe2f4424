//! Security groups with real Linux guests (QEMU, TCG here): vm2 is in a group that lets TCP
//! 5201 in and nothing else. From vm1: iperf3 to 5201 runs, iperf3 to 5202 (a server listens
//! there too) never connects, ping gets nothing back; vm2's own connections out (ping, iperf3
//! to vm1) and their replies pass. Then the 5201 rule is removed by a live reload while a
//! stream to 5201 runs: the stream is cut at once (nothing more reaches vm2), counted
//! `security_group` on vm2. vm2's pings out are 2,000 bytes long: fragments each way, each
//! later fragment passing where its first did. Last, the same policy as OVS's own `ct` flows (vm2 without groups),
//! written as for OVS-DPDK, by a live reload: 5201 opens again, 5202 and ping in do not, vm2's
//! pings out and their replies pass, and the flows' zone lists the connections with their mark.

use crate::common;

use std::path::Path;

use common::*;
use pvswitch::proto::PortReply;

const WEB: &str = r#"
[[security_group]]
name = "web"
[[security_group.rule]]
direction = "ingress"
protocol = "tcp"
ports = 5201
"#;

const EMPTY: &str = r#"
[[security_group]]
name = "web"
"#;

/// Where pvswitchd serves Prometheus's text.
fn metrics_addr() -> String {
    format!("127.0.0.1:{}", 20464 + (std::process::id() % 1000) as u16)
}

fn metrics() -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(metrics_addr()).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn config(dir: &Path, group: &str) -> String {
    base(dir, "security_groups = [\"web\"]\n") + group
}

fn base(dir: &Path, vm2_more: &str) -> String {
    let mut text = Switch::config_text(dir, &[1], &[], &format!("metrics_listen = \"{}\"", metrics_addr()));
    text += "[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n";
    text += "[[port]]\nname = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\n\
             allowed_macs = [\"52:54:00:5e:00:02\"]\nallowed_ips = [\"10.40.0.2\"]\n";
    text + vm2_more
}

/// The group's policy as OVS flows for vm2: connections out, and TCP 5201 in (marked 1), open;
/// replies and related ICMP pass; nothing else.
const FLOWS: [&str; 7] = [
    "priority=10,arp,actions=normal",
    "priority=100,ip,ct_state=-trk,actions=ct(zone=1,table=1)",
    "table=1,priority=100,ip,in_port=vm2,ct_state=+trk+new,actions=ct(commit,zone=1),normal",
    "table=1,priority=100,tcp,in_port=vm1,tp_dst=5201,ct_state=+trk+new,actions=ct(commit,zone=1,exec(set_field:0x1->ct_mark)),normal",
    "table=1,priority=90,ip,ct_state=+trk+est,actions=normal",
    "table=1,priority=90,ip,ct_state=+trk+rel,actions=normal",
    "table=1,priority=1,actions=drop",
];

fn flows_config(dir: &Path) -> String {
    let list: String = FLOWS.iter().map(|f| format!("  \"{f}\",\n")).collect();
    format!("flows = [\n{list}]\n{}", base(dir, ""))
}

#[test]
fn a_group_allowing_tcp_5201_in_lets_iperf3_through_and_nothing_else_and_a_live_change_cuts() {
    let Some(_g) = run_alone(QEMU) else { return };
    let dir = test_dir("secgroups-qemu");
    let sw = Switch::start_config(dir.clone(), &config(&dir, WEB));
    // vm1 (no groups): waits until 5201 answers, then the checks, then a long stream.
    // `again`: a command run again while iperf3 could not connect (its server may refuse a
    // client right after the previous test ends), never once it ran.
    let job1 = r#"iperf3 -s -D
again() {
  n=0
  while :; do
    "$@" > /tmp/again 2>&1 && break
    grep -q "unable to connect" /tmp/again && [ $n -lt 10 ] || break
    n=$((n+1)); sleep 0.3
  done
  cat /tmp/again
}
i=0
until timeout 5 iperf3 -c 10.40.0.2 -t 1 >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 60 ] || break; sleep 0.5; done
again timeout 30 iperf3 -c 10.40.0.2 -t 3 -f m | grep receiver | sed "s/^/PVS-IPERF-5201 /"
timeout 6 iperf3 -c 10.40.0.2 -p 5202 -t 1 >/dev/null 2>&1 || echo PVS-5202-REFUSED
ping -c 3 -i 0.3 -W 1 10.40.0.2 2>&1 | grep -q ' 100% packet loss' && echo PVS-PING-IN-REFUSED
echo PVS-LONG-START
again timeout 40 iperf3 -c 10.40.0.2 -t 25 -i 1 -f m > /tmp/long
echo PVS-LONG-END
until timeout 5 iperf3 -c 10.40.0.2 -t 1 >/dev/null 2>&1; do sleep 0.5; done
echo PVS-FLOWS-5201-OPEN
timeout 6 iperf3 -c 10.40.0.2 -p 5202 -t 1 >/dev/null 2>&1 || echo PVS-FLOWS-5202-REFUSED
ping -c 3 -i 0.3 -W 1 10.40.0.2 2>&1 | grep -q ' 100% packet loss' && echo PVS-FLOWS-PING-IN-REFUSED
echo PVS-FLOWS-DONE
"#;
    // vm2 (in "web"): servers on 5201 and 5202; its own ping and iperf3 to vm1.
    let job2 = r#"iperf3 -s -D
iperf3 -s -p 5202 -D
i=0
until ping -c 1 -W 1 10.40.0.1 >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 120 ] || break; done
ping -c 3 -i 0.3 -W 2 10.40.0.1 2>&1 | grep -q ' 0% packet loss' && echo PVS-PING-OUT-OK
n=0
until out=$(timeout 30 iperf3 -c 10.40.0.1 -t 2 -f m 2>&1); do n=$((n+1)); [ $n -lt 20 ] || break; sleep 0.5; done
echo "$out" | grep receiver | sed "s/^/PVS-IPERF-OUT /"
while true; do ping -c 1 -W 1 -s 2000 10.40.0.1 >/dev/null 2>&1 && echo PVS-OUT-OK; sleep 2; done
"#;
    let _vms = Qemus(vec![
        guest(&sw, &dir, "vm2", "10.40.0.2/24", "52:54:00:5e:00:02", job2),
        guest(&sw, &dir, "vm1", "10.40.0.1/24", "52:54:00:5e:00:01", job1),
    ]);
    let log = |name: &str| guest_log(&dir, name);
    let all = || format!("vm1:\n{}\nvm2:\n{}\npvswitchd:\n{}", log("vm1"), log("vm2"), sw.log());
    wait_long("vm1's checks", || log("vm1").contains("PVS-LONG-START"), &all);
    let (l1, l2) = (log("vm1"), log("vm2"));
    assert!(l1.contains("PVS-IPERF-5201 ") && l1.contains("receiver"), "iperf3 to 5201 did not run\n{}", all());
    assert!(l1.contains("PVS-5202-REFUSED"), "iperf3 reached 5202\n{}", all());
    assert!(l1.contains("PVS-PING-IN-REFUSED"), "vm1's ping reached vm2\n{}", all());
    wait_long("vm2's own connections", || log("vm2").contains("PVS-IPERF-OUT "), &all);
    assert!(l2.contains("PVS-PING-OUT-OK") || log("vm2").contains("PVS-PING-OUT-OK"), "{}", all());
    let vm2 = sw.port_info("vm2");
    assert_eq!(vm2.security_groups, ["web"], "{}", vm2.json());
    let refused = vm2.counters.drops.get(DropReason::SecurityGroup);
    assert!(refused >= 2, "5202's SYNs and the pings, counted on vm2: {}", vm2.json());
    // vm2's pings out are of 2,000 bytes: two fragments each way, the later following the first.
    wait_long("vm2's fragmented pings out and their replies", || log("vm2").contains("PVS-OUT-OK"), &all);

    // The long stream to 5201 flows; the rule goes, live.
    let tx = || sw.counters("vm2").tx_packets;
    let before = tx();
    wait_for("the long stream to reach vm2", || (tx() > before + 500).then_some(()));
    sw.write_config(&config(&dir, EMPTY));
    let summary = sw.reload();
    eprintln!("{}", summary.json());
    let cut_at = tx();
    let drops = || sw.counters("vm2").drops.get(DropReason::SecurityGroup);
    let d0 = drops();
    wait_for("the cut stream's frames to be refused", || (drops() > d0 + 5).then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(2));
    let after = tx() - cut_at;
    assert!(after < 20, "{after} frames reached vm2 after its rule was removed\n{}", all());
    assert!(sw.log().contains("connections cut"), "{}", sw.log());

    // What the table holds: the stream's connections into vm2, cut; vm2's own out, not.
    let ct = sw.conntrack(Some("vm2"));
    let conns = &ct.connections;
    let cut_in = conns.iter().filter(|c| c.opened == "ingress" && c.dport == 5201 && c.cut).count();
    assert!(cut_in >= 2, "the control and data connections to 5201, cut: {:#}", ct.json());
    assert!(conns.iter().all(|c| c.port == "vm2"), "{:#}", ct.json());
    assert_eq!(ct.ports.first().map(|z| z.port.as_str()), Some("vm2"), "{:#}", ct.json());
    let flushed: PortReply = sw.ask_args("conntrack-flush", &["vm2"]);
    let n: u64 = flushed.summary.split(' ').next().unwrap().parse().unwrap();
    assert!(n >= cut_in as u64, "{} after {:#}", flushed.json(), ct.json());
    assert!(sw.try_ctl_args("conntrack", &["nosuch"]).unwrap_err().contains("no port"));
    let m = metrics();
    for line in [
        "# TYPE pvswitch_conntrack_connections gauge",
        "pvswitch_conntrack_connections{port=\"vm2\"} ",
        "pvswitch_conntrack_limit 262144",
        "pvswitch_conntrack_refused_total{reason=\"port_limit\"} 0",
    ] {
        assert!(m.contains(line), "missing {line} in\n{m}");
    }
    assert!(!m.contains("pvswitch_conntrack_connections{port=\"vm1\"}"), "vm1 has no groups:\n{m}");

    // The same policy as OVS's ct flows, vm2 without groups, live.
    let outs = || log("vm2").matches("PVS-OUT-OK").count();
    sw.write_config(&flows_config(&dir));
    eprintln!("{}", sw.reload().json());
    let o0 = outs();
    wait_long("vm1's checks under the flows", || log("vm1").contains("PVS-FLOWS-DONE"), &all);
    let l1 = log("vm1");
    assert!(l1.contains("PVS-FLOWS-5201-OPEN"), "{}", all());
    assert!(l1.contains("PVS-FLOWS-5202-REFUSED"), "iperf3 reached 5202 under the flows\n{}", all());
    assert!(l1.contains("PVS-FLOWS-PING-IN-REFUSED"), "vm1's ping reached vm2 under the flows\n{}", all());
    wait_long("vm2's pings out under the flows", || outs() >= o0 + 2, &all);
    let dump = sw.flows();
    let hits = |text: &str| {
        let f = dump.flows.iter().find(|f| f.flow.contains(text));
        f.unwrap_or_else(|| panic!("no flow {text} in {:#}", dump.json())).n_packets
    };
    assert!(hits("tp_dst=5201,ct_state=+new+trk") >= 1, "{:#}", dump.json());
    assert!(hits("ip,in_port=vm2,ct_state=+new+trk") >= 2, "vm2's pings out: {:#}", dump.json());
    assert!(hits("ct_state=+est+trk") >= 100, "{:#}", dump.json());
    assert!(hits("table=1,priority=1 actions=drop") >= 2, "5202's SYNs and the pings in: {:#}", dump.json());
    let ct = sw.conntrack(Some("zone=1"));
    let conns = &ct.connections;
    assert!(conns.iter().any(|c| c.dport == 5201 && c.mark == 1 && c.zone == 1), "{:#}", ct.json());
    assert!(conns.iter().any(|c| c.protocol == "icmp" && c.src == "10.40.0.2" && c.mark == 0), "{:#}", ct.json());
    assert_eq!(ct.flow_zones.first().map(|z| z.zone), Some(1), "{:#}", ct.json());
    let m = metrics();
    assert!(m.contains("pvswitch_flow_conntrack_connections{zone=\"1\"} "), "{m}");
}

/// Waits up to 10 minutes (guests boot slowly under TCG) for `done`.
fn wait_long(what: &str, done: impl Fn() -> bool, all: &dyn Fn() -> String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}\n{}", all());
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
