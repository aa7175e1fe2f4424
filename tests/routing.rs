//! Routing at the edge (`[[vrf]]`) with real guests: two QEMU Linux guests in two dual-stack
//! networks of one tenant (VLANs 100 and 200), each with its default routes via the anycast
//! gateway, ping each other and the gateway over IPv4 and IPv6 (the guests' own router and
//! neighbour discovery find the gateway), traceroute through it (its time exceeded is the first hop) and
//! run iperf3 TCP both ways (TSO frames routed whole); the replies come back with the TTL and
//! hop limit a router leaves. With pvsgen as the VMs, a routed frame byte for byte and a TTL that runs out,
//! as `trace --live` tells them. The data path's own cases (TTL 1, unknown
//! addresses, the gateway's MAC as a source, two tenants with one address) are
//! `datapath::tests::routing`.

use crate::common;

use common::vms::{RX_BUF, recv_n};
use common::*;
use pvsgen::frontend::Vm;
use pvswitch::proto::{Request, VrfInfo};

const MAC_A: &str = "52:54:00:0b:01:05";
const MAC_B: &str = "52:54:00:0b:02:05";

/// Two ports in two networks of VRF "t", each guest's address its port's.
fn config(dir: &std::path::Path) -> String {
    let port = |name: &str, tag: u16, mac: &str, ip: &str| {
        format!(
            "[[port]]\nname = \"{name}\"\ntype = \"vhost-user\"\nsocket = \"{name}.sock\"\ntag = {tag}\n\
             allowed_macs = [\"{mac}\"]\nallowed_ips = [\"{ip}\", \"{}\"]\n",
            ip.replace("10.", "fd00:").replace(".0.", "::")
        )
    };
    format!(
        "[switch]\npoll_cores = [1]\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n{}{}\
         [[vrf]]\nname = \"t\"\ngateway_mac = \"02:00:00:00:01:01\"\n\
         [[vrf.network]]\nvlan = 100\ngateway = \"10.1.0.1/24\"\ngateway6 = \"fd00:1::1/64\"\n\
         [[vrf.network]]\nvlan = 200\ngateway = \"10.2.0.1/24\"\ngateway6 = \"fd00:2::1/64\"\n",
        dir.display(),
        port("vm1", 100, MAC_A, "10.1.0.5"),
        port("vm2", 200, MAC_B, "10.2.0.5"),
    )
}

#[test]
fn guests_in_two_networks_ping_and_run_tcp_through_their_gateway() {
    let Some(_g) = run_alone(QEMU) else { return };
    let dir = test_dir("routing-qemu");
    let sw = Switch::start_config(dir.clone(), &config(&dir));
    // What routing reaches, as pvswitchctl shows it.
    let vrfs: Vec<VrfInfo> = sw.ask(&Request::Vrfs);
    assert_eq!(vrfs.len(), 1);
    let nets: Vec<(u16, &str, Option<&str>)> =
        vrfs[0].networks.iter().map(|n| (n.vlan, n.gateway.as_str(), n.gateway6.as_deref())).collect();
    assert_eq!(nets, [(100, "10.1.0.1/24", Some("fd00:1::1/64")), (200, "10.2.0.1/24", Some("fd00:2::1/64"))]);
    let mut neigh: Vec<(&str, &str, &str, u16)> =
        vrfs[0].neighbours.iter().map(|n| (n.address.as_str(), n.mac.as_str(), n.port.as_str(), n.vlan)).collect();
    neigh.sort();
    assert_eq!(
        neigh,
        [
            ("10.1.0.5", MAC_A, "vm1", 100),
            ("10.2.0.5", MAC_B, "vm2", 200),
            ("fd00:1::5", MAC_A, "vm1", 100),
            ("fd00:2::5", MAC_B, "vm2", 200)
        ]
    );
    // IPv6's default route comes from the gateway's router advertisement.
    let server = "ip route add default via 10.2.0.1\nip addr add fd00:2::5/64 dev eth0\n\
                  iperf3 -s -B 10.2.0.5 >/dev/null 2>&1 &\nwhile true; do sleep 1000; done\n";
    let client = r#"ip route add default via 10.1.0.1
ip addr add fd00:1::5/64 dev eth0
P=10.2.0.5
i=0
until ping -c 1 -W 1 $P >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 120 ] || break; done
ping -c 5 -i 0.2 -W 2 $P | grep -E "ttl=|loss" | sed "s/^/PEER /"
ping -c 3 -i 0.2 -W 2 10.1.0.1 | grep -E "ttl=|loss" | sed "s/^/GATEWAY /"
traceroute -n -q 1 -w 2 -m 3 $P 2>&1 | sed "s/^/TRACE /"
i=0
until ip -6 route | grep -q "^default"; do i=$((i+1)); [ $i -lt 150 ] || break; sleep 0.2; done
i=0
until ping -6 -c 1 -W 1 fd00:2::5 >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 60 ] || break; sleep 0.2; done
ping -6 -c 5 -i 0.2 -W 2 fd00:2::5 | grep -E "ttl=|loss" | sed "s/^/PEER6 /"
ping -6 -c 3 -i 0.2 -W 2 fd00:1::1 | grep -E "ttl=|loss" | sed "s/^/GATEWAY6 /"
ip -6 route | sed "s/^/ROUTE6 /"
for args in "" "-R"; do
  n=0
  until out=$(timeout 30 iperf3 -c $P -t 2 -f m $args 2>&1); do n=$((n+1)); [ $n -lt 20 ] || break; sleep 0.5; done
  echo "$out" | grep -E "receiver" | sed "s/^/PVS-IPERF$args /"
done
"#;
    let b = KillOnDrop(guest(&sw, &dir, "vm2", "10.2.0.5/24", MAC_B, server));
    let a = KillOnDrop(guest(&sw, &dir, "vm1", "10.1.0.5/24", MAC_A, client));
    await_jobs(&dir, &["vm1"]);
    let out = guest_log(&dir, "vm1");
    let lines = |tag: &str| out.lines().filter(|l| l.starts_with(tag)).collect::<Vec<_>>().join("\n");
    let (peer, gw) = (lines("PEER "), lines("GATEWAY "));
    eprintln!("{peer}\n{gw}\n{}\n{}\n{}", lines("PEER6 "), lines("GATEWAY6 "), lines("PVS-IPERF"));
    assert!(peer.contains(" 0% packet loss"), "vm1 -> vm2 through the gateway:\n{out}\n{}", sw.log());
    // vm2's replies crossed one router: Linux sends with TTL 64.
    assert!(peer.contains("ttl=63") && !peer.contains("ttl=64"), "{peer}");
    assert!(gw.contains(" 0% packet loss") && gw.contains("ttl=64"), "the gateway answers ping:\n{gw}");
    // traceroute: the first hop is the gateway (its time exceeded), the second vm2.
    let trace = lines("TRACE ");
    let hop = |n: &str, addr: &str| {
        trace.lines().any(|l| l["TRACE ".len()..].trim_start().starts_with(n) && l.contains(addr))
    };
    assert!(hop("1 ", "10.1.0.1") && hop("2 ", "10.2.0.5"), "traceroute through the gateway:\n{trace}");
    // IPv6: the peer through the gateway (busybox prints the hop limit as ttl=), and the
    // gateway's own echo replies.
    let (peer6, gw6) = (lines("PEER6 "), lines("GATEWAY6 "));
    assert!(peer6.contains(" 0% packet loss") && peer6.contains("ttl=63"), "IPv6 vm1 -> vm2:\n{out}");
    assert!(gw6.contains(" 0% packet loss") && gw6.contains("ttl=64"), "the gateway answers ping -6:\n{out}");
    // The default route the gateway's advertisement gave: its link-local address (fe80:: and
    // 02:00:00:00:01:01's modified EUI-64).
    let route6 = lines("ROUTE6 ");
    assert!(route6.contains("default via fe80::ff:fe00:101 dev eth0"), "router advertisement:\n{route6}");
    assert!(out.contains("PVS-IPERF ") && out.contains("PVS-IPERF-R "), "iperf3 both ways:\n{out}");
    drop((a, b));
    for p in ["vm1", "vm2"] {
        let c = sw.counters(p);
        assert!(c.rx_gso > 0, "{p} sent TSO frames, routed whole");
        for why in
            [DropReason::RouteBadHeader, DropReason::RouteNoNeighbour, DropReason::NoRoute, DropReason::Malformed]
        {
            assert_eq!(c.drops.get(why), 0, "{p}: {why:?}");
        }
    }
}

/// An IPv4/UDP frame from `src` (MAC, address) to the gateway's MAC, for `dst`, with `ttl`.
fn to_gateway(src: &str, from: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    frames::udp4("02:00:00:00:01:01", src, from, dst, ttl)
}

/// Frame `f` (from `to_gateway`) as the gateway routes it to vm2.
fn routed_to_vm2(f: &[u8]) -> Vec<u8> {
    frames::routed(f, MAC_B, "02:00:00:00:01:01")
}

/// Through a running pvswitchd, with pvsgen as the VMs: a frame to the gateway reaches vm2 as
/// a router leaves it, one whose TTL runs out comes back as time exceeded, and
/// `trace --live` says which was which.
#[test]
fn routed_frames_and_what_trace_live_says_of_them() {
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64)]) else { return };
    let dir = test_dir("routing-trace");
    let sw = Switch::start_config(dir.clone(), &config(&dir));
    let (mut a, mut b) = (Vm::connect(&sw.sock("vm1")), Vm::connect(&sw.sock("vm2")));
    sw.wait_running("vm1", 1);
    sw.wait_running("vm2", 1);
    a.post_rx_buffers(16, RX_BUF);
    b.post_rx_buffers(16, RX_BUF);
    let (child, err) = start_trace(&sw, &["-c", "2", "vm1"]);
    let f = to_gateway(MAC_A, [10, 1, 0, 5], [10, 2, 0, 5], 64);
    a.send(&f);
    let got = recv_n(&mut b, 1);
    assert_eq!(got, [routed_to_vm2(&f)], "vm2 gets the frame as a router leaves it");
    a.send(&to_gateway(MAC_A, [10, 1, 0, 5], [10, 2, 0, 5], 1));
    let back = recv_n(&mut a, 1);
    assert_eq!(
        (back[0][23], back[0][34], &back[0][26..30]),
        (1, 11, &[10u8, 1, 0, 1][..]),
        "time exceeded from the gateway"
    );
    let (t, end) = traces(child, err);
    assert!(end.contains("2 frames traced"), "{end}");
    let words: Vec<String> = t.iter().map(pvswitch::ctl::human::live_trace).collect();
    assert_eq!(t[0].outputs, ["vm2"], "{}", words[0]);
    assert!(t[0].steps.iter().any(|s| s.contains("routed: to vm2 in VLAN 200")), "{}", words[0]);
    assert_eq!(t[1].outputs, ["vm1"], "{}", words[1]);
    assert!(t[1].steps.iter().any(|s| s.contains("answered by the switch")), "{}", words[1]);
    assert_eq!(sw.counters("vm1").drops.get(DropReason::TtlExceeded), 1);
}

/// A tenant's VM that floods its gateway with everything a router must refuse or answer
/// (TTL 1, a destination no network holds, an address no port has, a spoofed source, the
/// gateway's own MAC as its source) beside two VMs that route to each other through the same
/// gateway, in a running pvswitchd: every one of their frames arrives as a router leaves it,
/// the flooder gets no more ICMP errors than its budget (a burst of 10, then 100 a second),
/// and every refused frame is counted against it, with its reason, none against the others.
#[test]
fn a_vm_flooding_its_gateway_leaves_routed_neighbours_alone() {
    let Some(_g) = run_alone(&[Need::Root, Need::Hugepages(64)]) else { return };
    let dir = test_dir("routing-flood");
    const MAC_E: &str = "52:54:00:0b:01:09";
    let text = config(&dir).replace(
        "[[vrf]]",
        "[[port]]\nname = \"evil\"\ntype = \"vhost-user\"\nsocket = \"evil.sock\"\ntag = 100\n\
         allowed_ips = [\"10.1.0.9\"]\n[[vrf]]",
    );
    let sw = Switch::start_config(dir.clone(), &text);
    let (mut a, mut b, mut e) =
        (Vm::connect(&sw.sock("vm1")), Vm::connect(&sw.sock("vm2")), Vm::connect(&sw.sock("evil")));
    for p in ["vm1", "vm2", "evil"] {
        sw.wait_running(p, 1);
    }
    b.post_rx_buffers(64, RX_BUF);
    e.post_rx_buffers(200, RX_BUF);
    let bad = [
        (to_gateway(MAC_E, [10, 1, 0, 9], [10, 2, 0, 5], 1), DropReason::TtlExceeded),
        (to_gateway(MAC_E, [10, 1, 0, 9], [10, 9, 0, 5], 64), DropReason::NoRoute),
        (to_gateway(MAC_E, [10, 1, 0, 9], [10, 2, 0, 77], 64), DropReason::RouteNoNeighbour),
        (to_gateway(MAC_E, [10, 7, 7, 7], [10, 2, 0, 5], 64), DropReason::IpSpoofed),
        (to_gateway("02:00:00:00:01:01", [10, 1, 0, 9], [10, 2, 0, 5], 64), DropReason::PortSecurity),
    ];
    let good = to_gateway(MAC_A, [10, 1, 0, 5], [10, 2, 0, 5], 64);
    let flood: Vec<&[u8]> = (0..125).map(|i| bad[i % bad.len()].0.as_slice()).collect();
    let (rounds, per_round) = (100, 8);
    let t0 = std::time::Instant::now();
    let mut got = Vec::new();
    for _ in 0..rounds {
        e.send_all(&flood);
        a.send_all(&vec![good.as_slice(); per_round]);
        got.extend(recv_n(&mut b, per_round));
    }
    let secs = t0.elapsed().as_secs_f64();
    let want = routed_to_vm2(&good);
    assert_eq!(got.len(), rounds * per_round);
    assert!(got.iter().all(|f| *f == want), "a routed frame changed on the way");
    // Every refused frame counted against the flooder, with its reason.
    let sent = rounds * flood.len();
    let drops = sw.counters("evil").drops;
    for (_, why) in &bad {
        assert_eq!(drops.get(*why) as usize, sent / bad.len(), "{why:?}: {}", drops.json());
    }
    // Errors within the budget: the switch sent no more than a burst and 100 a second.
    let errors = e.recv().len() as f64;
    assert!(errors >= 10.0, "the first errors were not sent: {errors}");
    assert!(errors <= 10.0 + 100.0 * secs + 1.0, "{errors} ICMP errors in {secs:.2} s");
    for p in ["vm1", "vm2"] {
        let c = sw.counters(p);
        assert!(nonzero_drops(&c.drops).is_empty(), "{p}: {}", c.json());
    }
    eprintln!("{sent} refused frames and {} routed in {secs:.2} s; {errors} errors to the flooder", got.len());
}
