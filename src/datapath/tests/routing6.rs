//! Routing at the edge for IPv6 (`gateway6`), stepped: a frame to the gateway's MAC is routed
//! with its hop limit one less; neighbour solicitations for the gateway (global and link-local)
//! and for a neighbour are answered by the switch, duplicate address detection floods; a ping
//! to the gateway comes back; what a router refuses gets ICMPv6 errors, never for an error.

use std::net::Ipv6Addr;

use super::*;
use crate::config::Gateway6;
use crate::config::ips::IpPrefix;
use crate::config::vlan::PortVlan;
use crate::config::vrf::{NetworkConfig, VrfConfig};
use crate::datapath::counters::DropReason;
use crate::wire::MacAddr;
use crate::wire::checksum::pseudo_header_v6;

const GW: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x0a, 0x01]);
/// fe80:: and GW's modified EUI-64.
const GW_LL: &str = "fe80::ff:fe00:a01";

fn a(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().unwrap().octets()
}

fn net(vlan: u16, gw4: [u8; 4], gw6: Option<&str>) -> NetworkConfig {
    let gateway6 = gw6.map(|g| Gateway6 { addr: g.parse().unwrap(), prefix_len: 64 });
    NetworkConfig { vlan, gateway: gw4.into(), prefix_len: 24, gateway6 }
}

/// vm0 on VLAN 10 (fd00:1::5), vm1 on VLAN 20 (fd00:2::5), networks of VRF "a" with IPv6
/// gateways; vm2 on VLAN 30 of VRF "b" (IPv4 only) with fd00:2::5 too; vm3 a trunk of 10 and
/// 20 without addresses.
fn bench() -> Bench {
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    let ports = [(10, "fd00:1::5"), (20, "fd00:2::5"), (30, "fd00:2::5")];
    for (i, (vlan, ip)) in ports.into_iter().enumerate() {
        b.policies[i].vlan = PortVlan::access(vlan);
        b.policies[i].allowed_macs = vec![MacAddr(mac(i))];
        b.policies[i].allowed_ips = vec![IpPrefix::parse(ip).unwrap()];
    }
    b.policies[3].vlan = PortVlan::trunk(&[10, 20]);
    let vrf = |name: &str, networks| VrfConfig { name: name.into(), gateway_mac: GW, networks };
    b.vrfs = vec![
        vrf("a", vec![net(10, [10, 0, 1, 1], Some("fd00:1::1")), net(20, [10, 0, 2, 1], Some("fd00:2::1"))]),
        vrf("b", vec![net(30, [10, 0, 2, 1], None)]),
    ];
    b.post(0);
    b.step();
    b
}

/// An IPv6 frame from `src` to `dst` with next header `nh` and `payload`, hop limit `hops`;
/// an ICMPv6 payload gets its checksum.
fn ip6(dmac: [u8; 6], smac: [u8; 6], src: &str, dst: &str, hops: u8, nh: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = [&dmac[..], &smac, &[0x86, 0xdd]].concat();
    let mut p = payload.to_vec();
    if nh == 58 {
        p[2..4].copy_from_slice(&[0, 0]);
        let c = pseudo_header_v6(src.parse().unwrap(), dst.parse().unwrap(), 58, p.len() as u32).add_bytes(&p).finish();
        p[2..4].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    f.extend_from_slice(&[nh, hops]);
    f.extend_from_slice(&a(src));
    f.extend_from_slice(&a(dst));
    f.extend_from_slice(&p);
    f
}

fn udp(n: usize) -> Vec<u8> {
    let mut p: Vec<u8> = (0..n).map(|i| i as u8).collect();
    p[..8].copy_from_slice(&[0x30, 0x39, 0x00, 0x35, 0, n as u8, 0, 0]);
    p
}

/// A neighbour solicitation from `src` (MAC `smac`) for `target`, to its solicited-node group.
fn ns(smac: [u8; 6], src: &str, target: &str) -> Vec<u8> {
    let t = a(target);
    let group = format!("ff02::1:ff{:02x}:{:02x}{:02x}", t[13], t[14], t[15]);
    let mut p = vec![135, 0, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&t);
    p.extend_from_slice(&[1, 1]);
    p.extend_from_slice(&smac);
    ip6([0x33, 0x33, 0xff, t[13], t[14], t[15]], smac, src, &group, 255, 58, &p)
}

/// Whether the ICMPv6 message of IPv6 frame `r` (untagged) has a right checksum.
fn icmp6_ok(r: &[u8]) -> bool {
    let (src, dst) = (Ipv6Addr::from(a_of(&r[22..38])), Ipv6Addr::from(a_of(&r[38..54])));
    pseudo_header_v6(src, dst, 58, (r.len() - 54) as u32).add_bytes(&r[54..]).fold() == 0xffff
}

fn a_of(b: &[u8]) -> [u8; 16] {
    b.try_into().unwrap()
}

#[test]
fn an_ipv6_frame_to_the_gateway_is_routed_with_its_hop_limit_one_less() {
    let mut b = bench();
    let f = ip6(GW.0, mac(0), "fd00:1::5", "fd00:2::5", 64, 17, &udp(100));
    b.vms[0].guest.send(&f);
    b.settle(10);
    let mut want = f.clone();
    want[0..6].copy_from_slice(&mac(1));
    want[6..12].copy_from_slice(&GW.0);
    want[21] = 63;
    assert_eq!(b.vms[1].recv(), vec![want], "vm1 gets it as a router leaves it");
    assert!(b.vms[2].recv().is_empty() && b.vms[3].recv().is_empty(), "no copy elsewhere (VRF b's fd00:2::5)");
    // To the trunk's VLAN 20 there is no neighbour without addresses; back from vm1, long.
    let back = ip6(GW.0, mac(1), "fd00:2::5", "fd00:1::5", 2, 17, &udp(1400));
    b.vms[1].guest.send(&back);
    b.settle(10);
    let got = b.vms[0].recv();
    assert_eq!(got.len(), 1);
    assert_eq!((&got[0][..12], got[0][21], &got[0][22..]), (&[&mac(0)[..], &GW.0].concat()[..], 1, &back[22..]));
}

#[test]
fn solicitations_for_the_gateway_and_neighbours_are_answered_and_dad_floods() {
    let mut b = bench();
    for target in ["fd00:1::1", GW_LL] {
        b.vms[0].guest.send(&ns(mac(0), "fd00:1::5", target));
        b.settle(10);
        let got = b.vms[0].recv();
        assert_eq!(got.len(), 1, "{target}: one advertisement");
        let r = &got[0];
        assert_eq!(
            (&r[0..6], &r[6..12], &r[12..14], r[20], r[21]),
            (&mac(0)[..], &GW.0[..], &[0x86, 0xdd][..], 58, 255)
        );
        assert_eq!((a_of(&r[22..38]), a_of(&r[38..54])), (a(target), a("fd00:1::5")), "{target}: to the asker");
        assert_eq!((r[54], r[55], r[58]), (136, 0, 0xe0), "{target}: NA with router, solicited, override");
        assert_eq!((a_of(&r[62..78]), &r[78..80], &r[80..86]), (a(target), &[2u8, 1][..], &GW.0[..]));
        assert!(icmp6_ok(r), "{target}: checksum");
        assert!(b.vms[3].recv().is_empty(), "{target}: the solicitation flooded");
    }
    // For vm1's address, from the trunk in VLAN 20: vm1's MAC, from the switch, not a router.
    b.vms[3].guest.send(&tagged(&ns(mac(3), "fd00:2::7", "fd00:2::5"), 0x8100, 20));
    b.settle(10);
    let got = b.vms[3].recv();
    assert_eq!(got.len(), 1, "suppression's advertisement");
    let r = untagged(&got[0]);
    assert_eq!((&r[6..12], r[58], &r[80..86]), (&mac(1)[..], 0x60, &mac(1)[..]));
    assert!(icmp6_ok(&r));
    assert!(b.vms[1].recv().is_empty(), "the solicitation reached vm1");
    // Duplicate address detection (from ::) for the same address floods as ever.
    let dad = ns(mac(3), "::", "fd00:2::5");
    b.vms[3].guest.send(&tagged(&dad, 0x8100, 20));
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![dad]);
    assert!(b.vms[3].recv().is_empty());
    // A ping to the gateway: the echo reply from it, the checksum right, the data back.
    let mut echo = vec![128, 0, 0, 0, 0x12, 0x34, 0, 1];
    echo.extend(0..56u8);
    let ping = ip6(GW.0, mac(0), "fd00:1::5", "fd00:1::1", 64, 58, &echo);
    b.vms[0].guest.send(&ping);
    b.settle(10);
    let got = b.vms[0].recv();
    assert_eq!(got.len(), 1, "one echo reply");
    let r = &got[0];
    assert_eq!((a_of(&r[22..38]), a_of(&r[38..54]), r[54]), (a("fd00:1::1"), a("fd00:1::5"), 129));
    assert!(icmp6_ok(r), "echo reply checksum");
    assert_eq!(&r[58..], &ping[58..]);
}

#[test]
fn what_a_router_refuses_gets_icmpv6_errors_never_for_an_error() {
    let mut b = bench();
    let cases = [
        (ip6(GW.0, mac(0), "fd00:1::5", "fd00:2::5", 1, 17, &udp(60)), DropReason::TtlExceeded, Some((3, 0))),
        (ip6(GW.0, mac(0), "fd00:1::5", "fd00:9::5", 64, 17, &udp(60)), DropReason::NoRoute, Some((1, 0))),
        (ip6(GW.0, mac(0), "fd00:1::5", "fd00:2::99", 64, 17, &udp(60)), DropReason::RouteNoNeighbour, Some((1, 3))),
        // An ICMPv6 error whose hop limit runs out: not answered.
        (ip6(GW.0, mac(0), "fd00:1::5", "fd00:2::5", 1, 58, &[1, 0, 0, 0, 0, 0, 0, 0]), DropReason::TtlExceeded, None),
        // Link-local and multicast destinations are not routed.
        (ip6(GW.0, mac(0), "fd00:1::5", "fe80::1", 64, 17, &udp(60)), DropReason::NoRoute, None),
        (ip6(GW.0, mac(0), "fd00:1::5", "ff0e::1", 64, 17, &udp(60)), DropReason::NoRoute, None),
        // A source that is not vm0's: port security's.
        (ip6(GW.0, mac(0), "fd00:1::99", "fd00:2::5", 64, 17, &udp(60)), DropReason::IpSpoofed, None),
        // A payload length beyond the frame.
        (
            {
                let mut f = ip6(GW.0, mac(0), "fd00:1::5", "fd00:2::5", 64, 17, &udp(60));
                f[18..20].copy_from_slice(&900u16.to_be_bytes());
                f
            },
            DropReason::RouteBadHeader,
            None,
        ),
    ];
    for (f, why, icmp) in &cases {
        let before = b.drops(0, *why);
        b.vms[0].guest.send(f);
        b.settle(10);
        assert_eq!(b.drops(0, *why), before + 1, "{why:?}");
        for i in 1..4 {
            assert!(b.vms[i].recv().is_empty(), "{why:?}: vm{i} got a copy");
        }
        let back = b.vms[0].recv();
        match icmp {
            Some((ty, code)) => {
                assert_eq!(back.len(), 1, "{why:?}: one error");
                let r = &back[0];
                assert_eq!((a_of(&r[22..38]), a_of(&r[38..54])), (a("fd00:1::1"), a("fd00:1::5")), "{why:?}");
                assert_eq!((r[54], r[55]), (*ty, *code), "{why:?}");
                // As much as an answer holds: the header and 42 bytes (traceroute6 needs 8).
                let room = crate::datapath::frame::FRONT_MAX - 14 - 48;
                assert_eq!(&r[62..], &f[14..14 + room], "{why:?}: the packet quoted");
                assert!(icmp6_ok(r), "{why:?}: checksum");
            }
            None => assert!(back.is_empty(), "{why:?}: answered"),
        }
    }
    // VRF b's network has no IPv6 gateway: nothing IPv6 is routed or answered there.
    b.vms[2].guest.send(&ip6(GW.0, mac(2), "fd00:2::5", "fd00:1::5", 64, 17, &udp(60)));
    b.vms[2].guest.send(&ns(mac(2), "fd00:2::5", "fd00:1::1"));
    b.settle(10);
    assert_eq!(b.drops(2, DropReason::NoRoute), 1);
    assert!(b.vms[0].recv().is_empty() && b.vms[2].recv().is_empty(), "VRF b reached VRF a, or was answered");
}

/// A tagged frame without its tag.
fn untagged(f: &[u8]) -> Vec<u8> {
    [&f[..12], &f[16..]].concat()
}

/// A router solicitation (from a guest's link-local address, or from ::) gets the gateway's
/// advertisement: from its link-local address, a default router, its MAC, the network's prefix
/// on-link and not for autoconfiguration. Not flooded to other VMs.
#[test]
fn a_router_solicitation_gets_the_gateways_advertisement() {
    let mut b = bench();
    let m = mac(0);
    let iid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
    let ll = Ipv6Addr::from(iid).to_string();
    for (src, to) in [(ll.as_str(), ll.as_str()), ("::", "ff02::1")] {
        let rs = ip6([0x33, 0x33, 0, 0, 0, 2], m, src, "ff02::2", 255, 58, &[133, 0, 0, 0, 0, 0, 0, 0]);
        b.vms[0].guest.send(&rs);
        b.settle(10);
        let got = b.vms[0].recv();
        assert_eq!(got.len(), 1, "{src}: one advertisement");
        let r = &got[0];
        assert_eq!((&r[0..6], &r[6..12], r[21]), (&m[..], &GW.0[..], 255), "{src}: to the asker, hop limit 255");
        assert_eq!((a_of(&r[22..38]), a_of(&r[38..54])), (a(GW_LL), a(to)), "{src}: from the gateway's link-local");
        let ra = &r[54..];
        assert_eq!((ra[0], ra[1], ra[4], ra[5], u16::from_be_bytes([ra[6], ra[7]])), (134, 0, 64, 0, 1800));
        assert_eq!((&ra[16..18], &ra[18..24]), (&[1u8, 1][..], &GW.0[..]), "the gateway's MAC");
        assert_eq!(&ra[24..28], &[3, 4, 64, 0x80], "a /64 prefix, on-link, no autoconfiguration");
        assert_eq!(a_of(&ra[40..56]), a("fd00:1::"));
        assert!(icmp6_ok(r), "{src}: checksum");
        assert!(b.vms[3].recv().is_empty(), "{src}: the solicitation flooded");
    }
    // In VRF b's network (no IPv6 gateway) nobody answers.
    b.vms[2].guest.send(&ip6([0x33, 0x33, 0, 0, 0, 2], mac(2), "::", "ff02::2", 255, 58, &[133, 0, 0, 0, 0, 0, 0, 0]));
    b.settle(10);
    assert!(b.vms[2].recv().is_empty());
}
