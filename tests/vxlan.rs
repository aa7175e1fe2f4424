//! VXLAN in the data path, against Linux's own VXLAN: a namespace whose kernel has one VXLAN
//! device per VNI (an independent implementation of RFC 7348) reaches two testpmd VMs on two
//! VLANs of pvswitchd through its VTEP on a veth underlay (net_af_packet). Pings cross in
//! both directions per VNI, a VNI never leaks into the other VLAN (broadcasts included), and
//! hostile underlay input (an unknown VNI, short or bad VXLAN headers, garbage UDP) is dropped
//! and counted on the underlay while the tenants keep working. Capture sees both sides: the
//! underlay's frames with their outer headers, the tunnel's inner ones, a guest's TSO frames
//! segmented for the wire.
//! Needs root, hugepages, dpdk-testpmd, ip and ping.
#![cfg(feature = "dpdk")]

use crate::common;

use std::process::{Command, Stdio};

use common::*;
use pvswitch::proto::{PortInfo, PortReply, VniInfo, VxlanInfo};

const NEEDS: &[Need] = &[Need::Root, Need::Cmd("ip"), Need::Cmd("ping"), Need::Cmd("python3")];
/// A QEMU guest through the tunnel: QEMU, the guest image and the namespace's iperf3 server.
const GUEST: &[Need] = &[Need::Qemu, Need::GuestImage, Need::Cmd("ethtool"), Need::Cmd("iperf3")];

/// A namespace "the other host": a veth into it (10.77.0.1/24 inside, the switch's end bare),
/// and a kernel VXLAN device per VNI toward the switch's VTEP at 10.77.0.2.
struct Peer {
    net: Netns,
    host_if: String,
}

impl Peer {
    fn new(tag: &str) -> Peer {
        let pid = std::process::id() % 100_000;
        let host_if = format!("pvh{tag}{pid}");
        Peer { net: Netns::behind_veth(&format!("pvs{tag}{pid}"), &host_if, "10.77.0.1/24"), host_if }
    }

    fn ex(&self, args: &[&str]) -> String {
        self.net.ex(args)
    }

    /// Room on the underlay for 1500-byte inner frames behind 50 bytes of headers.
    fn jumbo_underlay(&self) {
        sh(&["ip", "link", "set", &self.host_if, "mtu", "1600"]);
        self.ex(&["ip", "link", "set", "pvsns0", "mtu", "1600"]);
    }

    /// Kernel VXLAN device `vxN` for VNI `vni`, address `addr` on it.
    fn vni(&self, vni: u32, addr: &str) {
        self.vni_from(vni, addr, "10.77.0.1");
    }

    /// The same from VTEP address `local` (one of the namespace's).
    fn vni_from(&self, vni: u32, addr: &str, local: &str) {
        let dev = format!("vx{vni}");
        let id = vni.to_string();
        self.ex(&[
            "ip",
            "link",
            "add",
            &dev,
            "type",
            "vxlan",
            "id",
            &id,
            "local",
            local,
            "remote",
            "10.77.0.2",
            "dstport",
            "4789",
        ]);
        self.ex(&["ip", "addr", "add", addr, "dev", &dev]);
        self.ex(&["ip", "link", "set", &dev, "up"]);
    }

    /// Pings `addr` `n` times; the number of replies.
    fn ping(&self, addr: &str, n: u32) -> u32 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.net.ns, "ping", "-c", &n.to_string(), "-i", "0.05", "-W", "1", addr])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.split(", ").find_map(|s| s.strip_suffix(" received").and_then(|n| n.trim().parse().ok())).unwrap_or(0)
    }

    /// Sends raw Ethernet frames (hex) out of the namespace's end of the underlay, as any
    /// host on that segment could: any source MAC, any addresses.
    fn raw(&self, frames: &[String]) {
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)\ns.bind(('pvsns0',0))\nfor f in [{}]:\n    s.send(bytes.fromhex(f))\n",
            frames.iter().map(|f| format!("'{f}'")).collect::<Vec<_>>().join(",")
        );
        self.ex(&["python3", "-c", &script]);
    }

    /// The namespace's MAC on the underlay.
    fn mac(&self) -> String {
        self.ex(&["cat", "/sys/class/net/pvsns0/address"]).trim().to_string()
    }

    /// Sends UDP datagrams with these payloads (hex) from address `from` to the switch's VTEP,
    /// port 4789.
    fn udp_to_vtep(&self, from: &str, payloads: &[&str]) {
        let script = format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('{from}',0))\nfor p in [{}]:\n    s.sendto(bytes.fromhex(p),('10.77.0.2',4789))\n",
            payloads.iter().map(|p| format!("'{p}'")).collect::<Vec<_>>().join(",")
        );
        self.ex(&["python3", "-c", &script]);
    }
}

/// Waits until tunnel `name`'s next hop is resolved; its MAC.
fn resolved(sw: &Switch, name: &str) -> String {
    wait_for(&format!("{name}'s next hop to be resolved"), || vxlan(&sw.port_info(name)).next_hop_mac.clone())
}

/// A MAC in the hex of a frame.
fn hex_mac(m: &str) -> String {
    m.replace(':', "")
}

/// An ARP frame (hex): `op` 1 request, 2 reply; Ethernet from `src` to `dst`.
fn arp_hex(dst: &str, src: &str, op: u16, sha: &str, spa: [u8; 4], tha: &str, tpa: [u8; 4]) -> String {
    let ip = |a: [u8; 4]| a.iter().map(|b| format!("{b:02x}")).collect::<String>();
    format!(
        "{}{}0806000108000604{op:04x}{}{}{}{}",
        hex_mac(dst),
        hex_mac(src),
        hex_mac(sha),
        ip(spa),
        hex_mac(tha),
        ip(tpa)
    )
}

/// A VXLAN frame (hex) on the underlay: Ethernet from `src` to `dst`, IPv4 10.77.0.1 ->
/// 10.77.0.2, UDP 49152 -> 4789, VNI `vni`, then the inner frame `inner` (hex).
fn vxlan_hex(dst: &str, src: &str, vni: u32, inner: &str) -> String {
    let n = inner.len() / 2;
    let ip = format!("4500{:04x}00000000401100000a4d00010a4d0002", 20 + 8 + 8 + n);
    let udp = format!("c00012b5{:04x}0000", 8 + 8 + n);
    format!("{}{}0800{ip}{udp}08000000{vni:06x}00{inner}", hex_mac(dst), hex_mac(src))
}

fn drops(p: &PortInfo) -> Vec<(&'static str, u64)> {
    nonzero_drops(&p.counters.drops)
}

/// A tunnel port's `vxlan` (panics, showing the port, if it has none).
fn vxlan(p: &PortInfo) -> &VxlanInfo {
    p.vxlan.as_ref().unwrap_or_else(|| panic!("not a tunnel: {}", p.json()))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn config(dir: &std::path::Path, uplink: &str) -> String {
    format!(
        "[switch]\npoll_cores = [1]\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n\
         [[port]]\nname = \"vm10\"\ntype = \"vhost-user\"\nsocket = \"vm10.sock\"\ntag = 10\n\
         [[port]]\nname = \"vm20\"\ntype = \"vhost-user\"\nsocket = \"vm20.sock\"\ntag = 20\n\
         [[port]]\nname = \"uplink\"\ntype = \"dpdk\"\ndevice = \"net_af_packet0,iface={uplink}\"\n\
         [[vtep]]\nname = \"vt\"\nunderlay = \"uplink\"\nlocal_ip = \"10.77.0.2/24\"\n\
         [[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.77.0.1\"]\n\
         [[vtep.vni]]\nvni = 200\nvlan = 20\nremotes = [\"10.77.0.1\"]\n",
        dir.display()
    )
}

#[test]
fn linux_vxlan_reaches_vms_per_vni_and_bad_underlay_input_is_counted() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let peer = Peer::new("x");
    peer.vni(100, "192.168.100.1/24");
    peer.vni(200, "192.168.200.1/24");
    let dir = test_dir("vxlan");
    let sw = Switch::start_config(dir.clone(), &config(&dir, &peer.host_if));
    let tunnel = "vt-10.77.0.1";
    let t = sw.port_info(tunnel);
    assert_eq!((t.kind.as_str(), t.state.as_str()), ("vxlan", "running"), "{}\n{}", t.json(), sw.log());
    assert_eq!(vxlan(&t).vnis, strings(&["100:10", "200:20"]), "{}", t.json());
    assert_eq!(t.vlan.mode, "tunnel", "{}", t.json());
    // One testpmd, two VMs: icmpecho answers ARP and ping on the port it came in on.
    let mut vms = Testpmd::spawn(
        &format!("pvsvx{}", std::process::id()),
        &[
            format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:0a:02", sw.sock("vm10")),
            format!("net_virtio_user1,path={},queues=1,mac=02:00:00:00:14:02", sw.sock("vm20")),
        ],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm10", 1);
    sw.wait_running("vm20", 1);
    vms.cmd("start");
    // The remote is believed only from its next hop, resolved by our own ARP (at once).
    resolved(&sw, tunnel);

    // VNI 100 -> VLAN 10 only: everything, its ARP broadcast first, reaches vm10 and not vm20.
    let n = 10;
    assert_eq!(peer.ping("192.168.100.2", n), n, "VNI 100 ping\n{:#}", sw.ports().json());
    let (vm10, vm20) = (sw.port_info("vm10"), sw.port_info("vm20"));
    assert_eq!(vm20.counters.tx_packets, 0, "VNI 100 leaked into VLAN 20: {}", vm20.json());
    assert!(vm10.counters.tx_packets > n as u64, "{}", vm10.json());
    let t = sw.port_info(tunnel);
    assert!(vxlan(&t).next_hop_mac.is_some(), "next hop resolved by ARP: {}", t.json());
    assert!(t.counters.rx_packets > n as u64 && t.counters.tx_packets >= n as u64, "{}", t.json());
    let fdb = sw.fdb();
    let behind_tunnel = fdb.iter().filter(|e| e.port.as_deref() == Some(tunnel) && e.vlan == 10).count();
    assert!(behind_tunnel >= 1, "the peer's vx100 MAC is learned behind the tunnel on VLAN 10: {}", fdb.json());

    // VNI 200 -> VLAN 20, the same way.
    let before10 = sw.counters("vm10").tx_packets;
    assert_eq!(peer.ping("192.168.200.2", n), n, "VNI 200 ping\n{:#}", sw.ports().json());
    assert_eq!(sw.counters("vm10").tx_packets, before10, "VNI 200 leaked into VLAN 10");

    // Hostile underlay input: a VNI the VTEP does not carry, then raw datagrams to port
    // 4789: a cut VXLAN header, a VXLAN header without the I flag, an inner frame of 4 bytes.
    peer.vni(300, "192.168.30.1/24");
    assert_eq!(peer.ping("192.168.30.2", 3), 0, "VNI 300 is nobody's");
    let inner = "ffffffffffff020000000001080045000014000000004011000000000000000000000000";
    peer.udp_to_vtep(
        "10.77.0.1",
        &["08000000", &format!("00000000000064 00{inner}").replace(' ', ""), "0800000000006400deadbeef"],
    );
    let up = wait_for("the underlay to count every bad frame", || {
        let u = sw.port_info("uplink");
        let d = &u.counters.drops;
        (d.get(DropReason::VxlanUnknownVni) >= 1
            && d.get(DropReason::VxlanBadOuter) >= 2
            && d.get(DropReason::VxlanBadInner) >= 1)
            .then_some(u)
    });
    eprintln!("underlay drops: {:?}", drops(&up));
    assert!(drops(&sw.port_info("vm10")).is_empty() && drops(&sw.port_info("vm20")).is_empty());
    // Split horizon for unicast: a frame from a second remote VTEP (10.77.0.3, given by
    // vtep-sync as a control plane would) to the MAC behind the first is not sent back into
    // the underlay, nor anywhere else.
    let behind_first: Vec<String> = sw
        .fdb()
        .iter()
        .filter(|e| e.port.as_deref() == Some(tunnel) && e.vlan == 10)
        .map(|e| e.mac.replace(':', ""))
        .collect();
    peer.ex(&["ip", "addr", "add", "10.77.0.3/24", "dev", "pvsns0"]);
    let _: PortReply = sw.ask_args("vtep-sync", &["vt", r#"{"remotes": [{"remote": "10.77.0.3", "vnis": [100]}]}"#]);
    resolved(&sw, "vt-10.77.0.3");
    let before = (sw.counters(tunnel).tx_packets, sw.counters("vm10").tx_packets);
    let hairpin = format!("0800000000006400{}020000000c03{}", behind_first[0], &inner[24..]);
    peer.udp_to_vtep("10.77.0.3", &[&hairpin]);
    // Counted on the port it came in by, the second tunnel.
    let second = wait_for("the hairpinned frame to be dropped", || {
        let p = sw.port_info("vt-10.77.0.3");
        (drops(&p) == vec![("vxlan_split_horizon", 1)]).then_some(p)
    });
    assert_eq!(second.counters.rx_packets, 1, "{}", second.json());
    assert_eq!((sw.counters(tunnel).tx_packets, sw.counters("vm10").tx_packets), before, "the hairpin went out");
    let _: PortReply = sw.ask_args("vtep-sync", &["vt", "{}"]);

    // And the tenants still work.
    assert_eq!(peer.ping("192.168.100.2", 3), 3, "VNI 100 after the bad input");
    assert_eq!(peer.ping("192.168.200.2", 3), 3, "VNI 200 after the bad input");
    vms.quit();
}

/// Capture on both sides of a tunnel: the underlay's capture is the wire (VXLAN, outer
/// headers and all, both ways, a filter on outer and inner fields; with `--drops`, a bad
/// datagram with its reason), the tunnel port's is the tenant's frames as it sent and was
/// given them (untagged), byte for byte the inner frames of the underlay's.
#[test]
fn the_underlay_is_captured_outer_and_the_tunnel_inner() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS, &[Need::Cmd("tcpdump")]].concat()) else { return };
    let peer = Peer::new("c");
    peer.vni(100, "192.168.100.1/24");
    let dir = test_dir("vxlancap");
    let sw = Switch::start_config(dir.clone(), &config(&dir, &peer.host_if));
    let tunnel = "vt-10.77.0.1";
    let mut vms = Testpmd::spawn(
        &format!("pvsvc{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:0a:02", sw.sock("vm10"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm10", 1);
    vms.cmd("start");
    resolved(&sw, tunnel);
    // Both ends have their ARP answered before the captures start: what follows is ICMP.
    assert_eq!(peer.ping("192.168.100.2", 1), 1);
    let (outer, inner) = (dir.join("outer.pcapng"), dir.join("inner.pcapng"));
    // VXLAN (to port 4789, both ways) whose inner frame is IPv4 ICMP: byte 39 of the UDP
    // datagram is the inner IPv4 protocol (8 UDP, 8 VXLAN, 14 Ethernet, 9).
    let wire =
        start_capture(&sw, &outer, &["uplink", "-c", "10", "udp", "dst", "port", "4789", "and", "udp[39]", "=", "1"]);
    let tenant = start_capture(&sw, &inner, &[tunnel, "-c", "10", "icmp"]);
    assert_eq!(peer.ping("192.168.100.2", 5), 5);
    for (child, err) in [wire, tenant] {
        let end = end_of(child, err);
        assert!(end.contains("10 packets captured") && end.contains("count reached"), "{end}");
    }
    let (_, outer_recs) = read_pcapng(&outer);
    let (_, inner_recs) = read_pcapng(&inner);
    let way =
        |recs: &[Rec], w: u32| -> Vec<Vec<u8>> { recs.iter().filter(|r| r.way == w).map(|r| r.data.clone()).collect() };
    let (wire_in, wire_out) = (way(&outer_recs, 1), way(&outer_recs, 2));
    let (tenant_in, tenant_out) = (way(&inner_recs, 1), way(&inner_recs, 2));
    assert_eq!([wire_in.len(), wire_out.len(), tenant_in.len(), tenant_out.len()], [5, 5, 5, 5]);
    for (w, from, to) in [(&wire_in, [10, 77, 0, 1], [10, 77, 0, 2]), (&wire_out, [10, 77, 0, 2], [10, 77, 0, 1])] {
        for f in w.iter() {
            // Outer IPv4 from -> to, UDP to 4789, VXLAN with the I flag and VNI 100.
            assert_eq!(
                (&f[12..14], f[23], &f[26..30], &f[30..34]),
                (&[8u8, 0][..], 17, &from[..], &to[..]),
                "{f:02x?}"
            );
            assert_eq!(
                (&f[36..38], &f[42..46], &f[46..50]),
                (&[0x12u8, 0xb5][..], &[8u8, 0, 0, 0][..], &[0u8, 0, 100, 0][..])
            );
        }
    }
    // The tunnel's frames are the wire's inner frames, as they were (untagged).
    let inners = |w: &[Vec<u8>]| -> Vec<Vec<u8>> { w.iter().map(|f| f[50..].to_vec()).collect() };
    assert_eq!(tenant_in, inners(&wire_in), "what the tunnel sent is what the wire carried in");
    assert_eq!(tenant_out, inners(&wire_out), "what the tunnel was given is what the wire carried out");
    assert!(tenant_in.iter().all(|f| f[34] == 8) && tenant_out.iter().all(|f| f[34] == 0), "requests in, replies out");
    // tcpdump reads both: VXLAN on the wire, and ICMP inside.
    let lines = tcpdump(&outer, &[]).join("\n");
    assert_eq!(lines.matches("VXLAN, flags [I] (0x08), vni 100").count(), 10, "{lines}");
    assert_eq!(lines.matches("ICMP echo").count(), 10, "{lines}");
    assert_eq!(tcpdump(&inner, &["icmp"]).len(), 10);

    // A datagram to the VTEP too short for VXLAN: dropped on the underlay, and captured with
    // its reason.
    let drops = dir.join("drops.pcapng");
    let bad = start_capture(
        &sw,
        &drops,
        &["uplink", "--drops", "-c", "1", "udp", "dst", "port", "4789", "and", "less", "60"],
    );
    peer.udp_to_vtep("10.77.0.1", &["08000000"]);
    let end = end_of(bad.0, bad.1);
    assert!(end.contains("1 packets captured"), "{end}");
    let (_, recs) = read_pcapng(&drops);
    assert_eq!(recs[0].comment.as_deref(), Some("dropped: vxlan_bad_outer"), "{recs:?}");
    assert_eq!(peer.ping("192.168.100.2", 2), 2, "the tenant after the captures");
    vms.quit();
}

/// A remote VTEP outside the underlay's subnet is reached through the `gateway`: its tunnel's
/// next hop is the gateway's address, resolved by ARP, and the outer headers still go to the
/// remote's address. The namespace plays both gateway (10.77.0.1) and remote VTEP (10.78.0.1,
/// on its loopback).
#[test]
fn a_remote_beyond_the_subnet_is_reached_through_the_gateway() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let peer = Peer::new("g");
    peer.ex(&["ip", "addr", "add", "10.78.0.1/32", "dev", "lo"]);
    peer.vni_from(100, "192.168.100.1/24", "10.78.0.1");
    let dir = test_dir("vxlangw");
    let text = config(&dir, &peer.host_if)
        .replace("local_ip = \"10.77.0.2/24\"\n", "local_ip = \"10.77.0.2/24\"\ngateway = \"10.77.0.1\"\n")
        .replace("remotes = [\"10.77.0.1\"]", "remotes = [\"10.78.0.1\"]");
    let sw = Switch::start_config(dir.clone(), &text);
    let mut vms = Testpmd::spawn(
        &format!("pvsgw{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:0a:02", sw.sock("vm10"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm10", 1);
    vms.cmd("start");
    assert_eq!(peer.ping("192.168.100.2", 5), 5, "ping through the gateway\n{:#}", sw.ports().json());
    let t = sw.port_info("vt-10.78.0.1");
    let gw_mac = peer.ex(&["cat", "/sys/class/net/pvsns0/address"]);
    assert_eq!(vxlan(&t).next_hop, "10.77.0.1", "{}", t.json());
    assert_eq!(vxlan(&t).next_hop_mac.as_deref(), Some(gw_mac.trim()), "the gateway's MAC: {}", t.json());
    let uplink = sw.port_info("uplink");
    assert!(drops(&uplink).is_empty(), "{}", uplink.json());
    vms.quit();
}

/// `vtep-sync`, as a control plane uses it: a whole state each time (remotes become tunnel
/// ports, MACs entries behind them; what a sync leaves out goes), kept across reloads, and a
/// bad state (garbage, an unknown VNI or VTEP, this VTEP's own address, a multicast MAC, an
/// address of a MAC that is not remote, or of no host) refused with its reason and nothing
/// changed.
#[test]
fn vtep_sync_takes_whole_states_and_refuses_bad_ones() {
    let Some(_g) = run_alone(&[Need::Root]) else { return };
    let dir = test_dir("vtepsync");
    let text = format!(
        "[switch]\npoll_cores = [1]\npoll_mode = \"adaptive\"\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n\
         [[port]]\nname = \"vm10\"\ntype = \"vhost-user\"\nsocket = \"vm10.sock\"\ntag = 10\nallowed_macs = [\"02:00:00:00:0a:01\"]\n\
         [[port]]\nname = \"uplink\"\ntype = \"dpdk\"\ndevice = \"net_null0\"\n\
         [[vtep]]\nname = \"vt\"\nunderlay = \"uplink\"\nlocal_ip = \"10.9.0.1/24\"\n\
         [[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.9.0.9\"]\n[[vtep.vni]]\nvni = 200\nvlan = 20\n",
        dir.display()
    );
    let sw = Switch::start_config(dir.clone(), &text);
    let tunnels = |sw: &Switch| -> Vec<(String, Vec<String>)> {
        let mut v: Vec<(String, Vec<String>)> =
            sw.ports().iter().filter(|p| p.kind == "vxlan").map(|p| (p.name.clone(), vxlan(p).vnis.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let behind = |sw: &Switch, mac: &str| -> Option<String> {
        sw.fdb().iter().find(|e| e.mac == mac).map(|e| e.port.clone().expect("a port"))
    };
    // vm10's configured MAC is not exported while no VM is connected to it.
    let v = &sw.vteps()[0];
    assert_eq!(v.local_macs, vec![], "{}", v.json());
    assert_eq!(v.vnis, vec![VniInfo { vni: 100, vlan: 10 }, VniInfo { vni: 200, vlan: 20 }], "{}", v.json());
    assert_eq!(tunnels(&sw), vec![("vt-10.9.0.9".into(), strings(&["100:10"]))]);

    let state = r#"{"remotes": [{"remote": "10.9.0.2", "vnis": [100, 200]}],
                    "macs": [{"vni": 100, "mac": "02:00:00:00:00:07", "remote": "10.9.0.3"}]}"#;
    let r: PortReply = sw.ask_args("vtep-sync", &["vt", state]);
    assert!(r.summary.contains("2 remotes, 1 remote MACs"), "{}", r.json());
    let want = vec![
        ("vt-10.9.0.2".to_string(), strings(&["100:10", "200:20"])),
        ("vt-10.9.0.3".to_string(), strings(&["100:10"])),
        ("vt-10.9.0.9".to_string(), strings(&["100:10"])),
    ];
    assert_eq!(tunnels(&sw), want);
    assert_eq!(behind(&sw, "02:00:00:00:00:07").as_deref(), Some("vt-10.9.0.3"));
    let same: PortReply = sw.ask_args("vtep-sync", &["vt", state]);
    assert!(same.summary.ends_with("unchanged"), "{}", same.json());

    for (vtep, bad, why) in [
        ("vt", "not json", "malformed state"),
        ("vt", r#"{"remotes": [], "extra": 1}"#, "unknown field"),
        ("vt", r#"{"remotes": [{"remote": "10.9.0.2", "vnis": [300]}]}"#, "VNI 300 is not on this vtep"),
        ("vt", r#"{"remotes": [{"remote": "10.9.0.1", "vnis": [100]}]}"#, "10.9.0.1 is not a remote"),
        ("vt", r#"{"remotes": [{"remote": "10.9.0", "vnis": [100]}]}"#, "is not an IPv4 address"),
        ("vt", r#"{"macs": [{"vni": 100, "mac": "01:00:5e:00:00:01", "remote": "10.9.0.2"}]}"#, "not a unicast MAC"),
        // An address for a MAC the state does not put behind a remote, and one that is no
        // host's: a control plane cannot make the VRFs route to them.
        ("vt", r#"{"neighbours": [{"vni": 100, "ip": "10.10.0.7", "mac": "02:00:00:00:00:07"}]}"#, "not a remote MAC"),
        (
            "vt",
            r#"{"macs": [{"vni": 100, "mac": "02:00:00:00:00:07", "remote": "10.9.0.3"}],
                "neighbours": [{"vni": 200, "ip": "10.10.0.7", "mac": "02:00:00:00:00:07"}]}"#,
            "not a remote MAC of the VNI",
        ),
        (
            "vt",
            r#"{"macs": [{"vni": 100, "mac": "02:00:00:00:00:07", "remote": "10.9.0.3"}],
                "neighbours": [{"vni": 100, "ip": "224.0.0.5", "mac": "02:00:00:00:00:07"}]}"#,
            "not a unicast address",
        ),
        ("nope", r#"{}"#, "no vtep \"nope\""),
    ] {
        let e = sw.try_ctl_args("vtep-sync", &[vtep, bad]).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert_eq!(tunnels(&sw), want, "a refused sync changes nothing");

    // A reload keeps what the control plane said; a sync without it takes it away.
    sw.reload();
    assert_eq!(tunnels(&sw), want, "a reload keeps learned remotes");
    assert_eq!(behind(&sw, "02:00:00:00:00:07").as_deref(), Some("vt-10.9.0.3"));
    let _: PortReply = sw.ask_args("vtep-sync", &["vt", "{}"]);
    assert_eq!(tunnels(&sw), vec![("vt-10.9.0.9".into(), strings(&["100:10"]))]);
    assert_eq!(behind(&sw, "02:00:00:00:00:07"), None, "a withdrawn MAC leaves the table");
}

/// A QEMU guest (Linux, TCG) on VLAN 10 reaches Linux's VXLAN in the namespace through the
/// tunnel: ping both ways and iperf3 both ways. The guest sends TSO frames and partial
/// checksums, which the tunnel port takes none of: segmented and completed in software, then
/// encapsulated; the namespace's kernel sees no bad checksum. Overlay MTU 1500 on an underlay
/// of 1600.
#[test]
fn qemu_guest_tcp_through_the_tunnel() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS, GUEST].concat()) else { return };
    let peer = Peer::new("q");
    peer.jumbo_underlay();
    peer.vni(100, "192.168.100.1/24");
    peer.ex(&["ip", "link", "set", "vx100", "mtu", "1500"]);
    let dir = test_dir("vxlanguest");
    let text = config(&dir, &peer.host_if)
        .replace("local_ip = \"10.77.0.2/24\"\n", "local_ip = \"10.77.0.2/24\"\nmtu = 1500\n");
    let sw = Switch::start_config(dir.clone(), &text);
    let _iperf = KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", &peer.net.ns, "iperf3", "-s", "-B", "192.168.100.1"])
            .stdout(Stdio::null())
            .spawn()
            .expect("iperf3 server"),
    );
    // The underlay's capture: what left on the wire of the guest's TSO frames, segmented for
    // the tunnel (which takes no offload) then encapsulated, each within the underlay's MTU.
    let segments = dir.join("segments.pcapng");
    let wire =
        start_capture(&sw, &segments, &["uplink", "--direction", "out", "-c", "20", "udp", "and", "greater", "1400"]);
    let (vm, out) = guest_ping_iperf(&dir, &sw.sock("vm10"), "192.168.100.2/24", "192.168.100.1", "pvsvx", None, 240);
    let end = end_of(wire.0, wire.1);
    assert!(end.contains("20 packets captured"), "{end}");
    let (_, recs) = read_pcapng(&segments);
    // 1500 bytes of IPv4 in a 14-byte Ethernet header, behind 50 of VXLAN's.
    assert!(
        recs.iter().all(|r| r.data.len() <= 1564 && r.data[50 + 23] == 6),
        "{:?}",
        recs.iter().map(|r| r.data.len()).collect::<Vec<_>>()
    );
    assert!(out.contains(" 0% packet loss"), "guest -> namespace ping:\n{out}");
    assert!(out.contains("PVS-IPERF ") && out.contains("PVS-IPERF-R "), "iperf3 both ways:\n{out}");
    assert_eq!(peer.ping("192.168.100.2", 5), 5, "namespace -> guest ping");
    let snmp = peer.ex(&["cat", "/proc/net/snmp"]);
    let tcp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let (names, vals): (Vec<&str>, Vec<&str>) = (tcp[0].split(' ').collect(), tcp[1].split(' ').collect());
    let csum_errors = names.iter().position(|n| *n == "InCsumErrors").map(|i| vals[i]).unwrap();
    assert_eq!(csum_errors, "0", "the namespace's kernel saw bad TCP checksums:\n{snmp}");
    let vmp = sw.port_info("vm10");
    assert!(vmp.counters.rx_gso > 0, "the guest sent TSO frames: {}", vmp.json());
    let t = sw.port_info("vt-10.77.0.1");
    assert!(t.counters.sw_segmented > 0, "segmented in software for the tunnel: {}", t.json());
    assert_eq!(t.counters.drops.get(DropReason::Mtu), 0, "{}", t.json());
    drop(vm);
}

/// Another host on the underlay's segment tries to take a VM's traffic (issue 48's F4): it
/// claims the remote VTEP's address by ARP (gratuitous, and as an unasked reply to us), and
/// sends VXLAN with the remote's address as outer source and the local VM's MAC as inner
/// source. Nothing moves: the tunnel's next hop is still the remote's MAC, the VM's MAC stays
/// on its port (`allowed_macs`), the frames are dropped on the underlay
/// (`vxlan_not_from_next_hop`); the genuine remote sending the VM's MAC as inner source is
/// refused learning (a tunnel learns no MAC a local port owns); the pings go on, 20 of 20.
#[test]
fn the_underlay_cannot_steal_a_tenant() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let peer = Peer::new("s");
    peer.vni(100, "192.168.100.1/24");
    let dir = test_dir("vxlansteal");
    const VM: &str = "02:00:00:00:0a:02";
    let text = config(&dir, &peer.host_if).replace("tag = 10\n", &format!("tag = 10\nallowed_macs = [\"{VM}\"]\n"));
    let sw = Switch::start_config(dir.clone(), &text);
    let tunnel = "vt-10.77.0.1";
    let mut vms = Testpmd::spawn(
        &format!("pvsst{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac={VM}", sw.sock("vm10"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm10", 1);
    vms.cmd("start");
    let genuine = resolved(&sw, tunnel);
    assert_eq!(genuine, peer.mac(), "the next hop is the remote's own MAC");
    assert_eq!(peer.ping("192.168.100.2", 20), 20, "before");
    let ours = sw.port_info("uplink").dpdk.and_then(|d| d.mac).expect("the underlay's MAC");
    let evil = "02:ee:00:00:00:66";
    let bcast = "ff:ff:ff:ff:ff:ff";
    let remote = [10, 77, 0, 1];
    let inner = format!("ffffffffffff{}88b5{}", hex_mac(VM), "00".repeat(46));
    peer.raw(&[
        // Gratuitous: "10.77.0.1 is at evil".
        arp_hex(bcast, evil, 2, evil, remote, bcast, remote),
        arp_hex(bcast, evil, 1, evil, remote, "00:00:00:00:00:00", remote),
        // An unasked reply to us.
        arp_hex(&ours, evil, 2, evil, remote, &ours, [10, 77, 0, 2]),
        // VXLAN from the remote's address, but not from its MAC, claiming the VM's.
        vxlan_hex(&ours, evil, 100, &inner),
        vxlan_hex(&ours, evil, 100, &inner),
    ]);
    let up = try_wait_for(|| {
        let u = sw.port_info("uplink");
        (u.counters.drops.get(DropReason::VxlanNotFromNextHop) >= 2).then_some(u)
    })
    .unwrap_or_else(|| panic!("the forged VXLAN frames were not dropped as such: {:#}", sw.port_info("uplink").json()));
    eprintln!("underlay drops: {:?}", drops(&up));
    assert_eq!(vxlan(&sw.port_info(tunnel)).next_hop_mac.as_deref(), Some(genuine.as_str()), "the next hop moved");
    let on = |sw: &Switch| sw.fdb().iter().find(|e| e.mac == VM).map(|e| e.port.clone().expect("a port"));
    assert_eq!(on(&sw).as_deref(), Some("vm10"), "the VM's MAC moved");
    // The genuine remote itself claiming the VM's MAC: not learned behind its tunnel.
    let refused = sw.counters(tunnel).learn_refused;
    peer.raw(&[vxlan_hex(&ours, &genuine, 100, &inner)]);
    wait_for("the remote's claim to be refused", || (sw.counters(tunnel).learn_refused > refused).then_some(()));
    assert_eq!(on(&sw).as_deref(), Some("vm10"), "a tunnel learned a MAC a local port owns");
    assert_eq!(peer.ping("192.168.100.2", 20), 20, "after");
    vms.quit();
}

/// A VTEP with no remote yet (after a restart, before its control plane syncs; issue 48's
/// F9): its underlay is still the VTEP's. A VM's broadcasts do not leave raw on the underlay,
/// raw 802.1Q frames injected there reach no VM and nothing is learned from them, so nothing
/// of theirs is offered to EVPN.
#[test]
fn an_underlay_without_remotes_carries_no_tenant_frame() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let peer = Peer::new("n");
    let dir = test_dir("vxlannone");
    let text = config(&dir, &peer.host_if).replace("remotes = [\"10.77.0.1\"]\n", "");
    let sw = Switch::start_config(dir.clone(), &text);
    assert!(!sw.ports().iter().any(|p| p.kind == "vxlan"), "no tunnel");
    // What leaves on the underlay, seen from the namespace.
    let mut capture = Command::new("ip")
        .args(["netns", "exec", &peer.net.ns, "python3", "-c", CAPTURE])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(capture.stdout.as_mut().unwrap()), &mut ready).unwrap();
    assert_eq!(ready.trim(), "ready", "the capture did not start");
    let mut vms = Testpmd::spawn(
        &format!("pvsnr{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:0a:02", sw.sock("vm10"))],
        &["--forward-mode=txonly", "--eth-peer=0,ff:ff:ff:ff:ff:ff", "--txpkts=64"],
    );
    sw.wait_running("vm10", 1);
    vms.cmd("start tx_first 4");
    wait_for("the VM's broadcasts", || (sw.counters("vm10").rx_packets >= 100).then_some(()));
    vms.cmd("stop");
    // Raw frames into the underlay: tagged for VLAN 10 and 20, and untagged, from a MAC.
    let src = "02:ee:00:00:00:99";
    let tagged = |vid: u16| format!("ffffffffffff{}8100{vid:04x}88b5{}", hex_mac(src), "00".repeat(46));
    let untagged = format!("ffffffffffff{}88b5{}", hex_mac(src), "00".repeat(50));
    let to_vm = sw.counters("vm10").tx_packets;
    peer.raw(&[tagged(10), tagged(20), untagged.clone(), tagged(10)]);
    wait_for("the injected frames to be dropped on the underlay", || {
        (sw.counters("uplink").drops.get(DropReason::UnderlayOther) >= 4).then_some(())
    });
    assert_eq!(sw.counters("vm10").tx_packets, to_vm, "an injected frame reached the VM");
    let fdb = sw.fdb();
    assert!(!fdb.iter().any(|e| e.port.as_deref() == Some("uplink")), "learned on the underlay: {}", fdb.json());
    let v = &sw.vteps()[0];
    assert!(!v.local_macs.iter().any(|m| m.mac.contains(src)), "offered to EVPN: {}", v.json());
    let out = String::from_utf8(kill_capture(capture)).unwrap();
    let raw: Vec<&str> = out.lines().filter(|l| !l.starts_with("0806")).collect();
    assert!(raw.is_empty(), "frames that left on the underlay, neither ARP nor VXLAN: {raw:?}");
    vms.quit();
}

/// Prints the ethertype and source MAC of every frame arriving on pvsns0 (not ours), one a
/// line, until killed.
const CAPTURE: &str = r#"import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(('pvsns0', 0))
print('ready', flush=True)
while True:
    f, a = s.recvfrom(65535)
    if a[2] == socket.PACKET_OUTGOING:
        continue
    print(f[12:14].hex(), f[6:12].hex(), flush=True)
"#;

/// Stops a capture and returns what it printed.
fn kill_capture(mut c: std::process::Child) -> Vec<u8> {
    let _ = c.kill();
    let mut out = Vec::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = std::io::Read::read_to_end(&mut o, &mut out);
    }
    let _ = c.wait();
    out
}
