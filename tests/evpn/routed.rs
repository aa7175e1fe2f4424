//! Two EVPN hosts routing one tenant through the same anycast gateway (`[[vrf]]` on both, the
//! VLANs' VNIs on both VTEPs): the other host's VMs come as EVPN MAC+IP routes and become the
//! VRFs' neighbours behind the tunnel (asymmetric IRB). The hosts are `super::Hosts`.

use super::*;
use common::frames;

/// `sw`'s VRF neighbours: (address, MAC, port).
fn neighbours(sw: &Switch) -> Vec<(String, String, String)> {
    let vrfs: Vec<pvswitch::proto::VrfInfo> = sw.ask(&pvswitch::proto::Request::Vrfs);
    let mut n: Vec<_> =
        vrfs.iter().flat_map(|v| &v.neighbours).map(|n| (n.address.clone(), n.mac.clone(), n.port.clone())).collect();
    n.sort();
    n
}

fn neighbour(ip: &str, mac: &str, port: &str) -> (String, String, String) {
    (ip.into(), mac.into(), port.into())
}

/// EVPN's MAC+IP routes (RFC 7432 type 2 with an address) between two hosts routing one tenant
/// through the same anycast gateway: each host's VMs' addresses (their ports' `allowed_ips` in
/// the tenant's networks) go out through pvs-evpn and zebra, and come back on the other host as
/// the VRF's neighbours behind the tunnel, IPv4 and IPv6. So a VM's ARP request or neighbour
/// solicitation for a VM on the other host is answered on its own host (nothing crosses the
/// underlay for it), and a frame to the gateway
/// for the other host's VM in the other network is routed on the sender's host into that
/// network's VNI and arrives as a router leaves it (asymmetric IRB: the host a frame enters
/// routes it). When the VM goes, EVPN withdraws its address there too.
#[test]
fn evpn_addresses_answer_arp_on_the_host_and_route_to_the_other_host() {
    use pvsgen::frontend::Vm;
    use pvswitch::wire::MacAddr;
    use pvswitch::wire::arp::{OP_REPLY, OP_REQUEST, arp_frame};
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let (a10, b10, b20) = ("10.10.0.1", "10.10.0.2", "10.20.0.2");
    let (pa10, pb10, pb20) = (
        format!("{MAC_A}@{a10},fd00:10::1"),
        format!("{MAC_B}@{b10},fd00:10::2"),
        format!("{MAC_B20}@{b20},fd00:20::2"),
    );
    let mut hosts = Hosts::new("r", &[("vm10", 10, &pa10)], &[("vm10", 10, &pb10), ("vm20", 20, &pb20)], 1500, "");
    let mut a = Vm::connect(&hosts.a.sock("vm10"));
    let mut vb10 = Vm::connect(&hosts.b.sock("vm10"));
    let mut vb20 = Vm::connect(&hosts.b.sock("vm20"));
    hosts.a.wait_running("vm10", 1);
    hosts.b.wait_running("vm10", 1);
    hosts.b.wait_running("vm20", 1);
    for vm in [&mut a, &mut vb10, &mut vb20] {
        vm.post_rx_buffers(32, common::vms::RX_BUF);
    }
    hosts.start_control();
    let (ta, tb) = ("vt-192.168.100.2", "vt-192.168.100.1");
    let t0 = Instant::now();
    wait_for("each host's VRF to have the other host's VMs as neighbours behind the tunnel", || {
        let (na, nb) = (neighbours(&hosts.a), neighbours(&hosts.b));
        (na.contains(&neighbour(b10, MAC_B, ta))
            && na.contains(&neighbour(b20, MAC_B20, ta))
            && na.contains(&neighbour("fd00:10::2", MAC_B, ta))
            && na.contains(&neighbour("fd00:20::2", MAC_B20, ta))
            && nb.contains(&neighbour(a10, MAC_A, tb))
            && nb.contains(&neighbour("fd00:10::1", MAC_A, tb)))
        .then_some(())
    });
    eprintln!("MAC+IP routes became neighbours {:?} after FRR started", t0.elapsed());
    // As zebra has them: local on one host, remote on the other.
    let arps = hosts.h1.vtysh("show evpn arp-cache vni 200");
    let line = arps.lines().find(|l| l.starts_with(b20)).unwrap_or_default().to_string();
    assert!(line.contains("remote") && line.contains(MAC_B20) && line.contains(IP2), "host 1's zebra:\n{arps}");
    // pvswitchd's own addresses of the other host's VMs are all it has: no local port's.
    assert_eq!(neighbours(&hosts.a).iter().filter(|n| n.2 == ta).count(), 4, "{:?}", neighbours(&hosts.a));

    // ARP for the VM on the other host, same network: answered on host 1 with its MAC.
    let (ma, mb): (MacAddr, MacAddr) = (MAC_A.parse().unwrap(), MAC_B.parse().unwrap());
    let over = tx_to(&hosts.a, ta);
    let ask = arp_frame(MacAddr::BROADCAST, OP_REQUEST, ma, a10.parse().unwrap(), MacAddr::ZERO, b10.parse().unwrap());
    a.send(&ask);
    let got = common::vms::recv_n(&mut a, 1);
    let want = arp_frame(ma, OP_REPLY, mb, b10.parse().unwrap(), ma, a10.parse().unwrap());
    assert_eq!(got, [want.to_vec()], "the reply, from host 1");
    assert_eq!(tx_to(&hosts.a, ta), over, "the request crossed the underlay");
    assert!(vb10.recv().is_empty(), "host 2's VM saw the request");
    // The same for IPv6: a neighbour solicitation answered on host 1 with host 2's VM's MAC.
    a.send(&solicitation(&ma, "fd00:10::1", "fd00:10::2"));
    let got = common::vms::recv_n(&mut a, 1);
    let r = &got[0];
    let target: std::net::Ipv6Addr = "fd00:10::2".parse().unwrap();
    assert_eq!((&r[6..12], r[54], &r[62..78], &r[80..86]), (&mb.0[..], 136, &target.octets()[..], &mb.0[..]));
    assert_eq!(tx_to(&hosts.a, ta), over, "the solicitation crossed the underlay");
    assert!(vb10.recv().is_empty(), "host 2's VM saw the solicitation");

    // A frame to the gateway for the VM in the other network on host 2: routed on host 1 into
    // VNI 200, it arrives from the gateway's MAC with its TTL one less.
    let f = frames::udp4(GW_MAC, MAC_A, [10, 10, 0, 1], [10, 20, 0, 2], 64);
    a.send(&f);
    let got = common::vms::recv_n(&mut vb20, 1);
    assert_eq!(got, [frames::routed(&f, MAC_B20, GW_MAC)], "host 2's VM in VLAN 20 got it as a router leaves it");
    assert!(vb10.recv().is_empty() && a.recv().is_empty());
    // And back: host 2 routes its VM's reply into VNI 100, to host 1's VM.
    let back = frames::udp4(GW_MAC, MAC_B20, [10, 20, 0, 2], [10, 10, 0, 1], 64);
    vb20.send(&back);
    let got = common::vms::recv_n(&mut a, 1);
    assert_eq!((&got[0][0..6], &got[0][6..12], got[0][22]), (&ma.0[..], &GW_MAC.parse::<MacAddr>().unwrap().0[..], 63));

    // Host 2's VM in VLAN 20 goes: EVPN withdraws its MAC and address; host 1 forgets both.
    let t1 = Instant::now();
    drop(vb20);
    wait_for("host 1 to forget the addresses of host 2's VM", || {
        (!neighbours(&hosts.a).iter().any(|n| n.0 == b20 || n.0 == "fd00:20::2")).then_some(())
    });
    eprintln!("withdrawn {:?} after the VM left", t1.elapsed());
    // A frame for it now is refused by host 1's router (no neighbour), not sent over.
    let over = tx_to(&hosts.a, ta);
    a.send(&f);
    wait_for("the frame refused for want of a neighbour", || {
        (hosts.a.counters("vm10").drops.get(DropReason::RouteNoNeighbour) >= 1).then_some(())
    });
    assert_eq!(tx_to(&hosts.a, ta), over);
    drop(vb10);
    drop(a);
    assert!(hosts.underlay_only_vteps() >= 2);
}

/// A neighbour solicitation from `smac` at `src` for `target`, to its solicited-node group (the
/// ICMPv6 checksum left 0: the switch answers from the fields).
fn solicitation(smac: &pvswitch::wire::MacAddr, src: &str, target: &str) -> Vec<u8> {
    let (s, t): (std::net::Ipv6Addr, std::net::Ipv6Addr) = (src.parse().unwrap(), target.parse().unwrap());
    let t = t.octets();
    let mut f = vec![0x33, 0x33, 0xff, t[13], t[14], t[15]];
    f.extend(smac.0);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0, 0, 32, 58, 255]);
    f.extend(s.octets());
    f.extend_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15]]);
    f.extend_from_slice(&[135, 0, 0, 0, 0, 0, 0, 0]);
    f.extend(t);
    f.extend_from_slice(&[1, 1]);
    f.extend(smac.0);
    f
}
