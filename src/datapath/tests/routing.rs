//! Routing at the edge (`[[vrf]]`), stepped: a VM's frame to its anycast gateway's MAC is
//! routed to a VM of another network of the same VRF (addresses, TTL, checksum, VLAN as a
//! router leaves them), ARP and ping for the gateway are answered by the switch, and what a
//! router must refuse is dropped with its reason: a TTL of 1, an address no network holds, an
//! address no port has, the gateway's MAC as a source, another VRF's networks.

use std::net::Ipv4Addr;

use super::*;
use crate::config::ips::IpPrefix;
use crate::config::vlan::PortVlan;
use crate::config::vrf::{NetworkConfig, VrfConfig};
use crate::datapath::counters::DropReason;
use crate::wire::MacAddr;
use crate::wire::arp::{self, arp_frame};
use crate::wire::checksum::checksum;

const GW: MacAddr = MacAddr([0x02, 0x00, 0x00, 0x00, 0x0a, 0x01]);

fn vrf(name: &str, nets: &[(u16, [u8; 4], u8)]) -> VrfConfig {
    VrfConfig {
        name: name.into(),
        gateway_mac: GW,
        networks: nets
            .iter()
            .map(|&(vlan, gw, prefix_len)| NetworkConfig {
                vlan,
                gateway: Ipv4Addr::from(gw),
                prefix_len,
                gateway6: None,
            })
            .collect(),
    }
}

/// An IPv4 frame: ICMP echo request (`proto` 1) or UDP (17), from `src` to `dst`.
fn ip_frame(dst: MacAddr, src: [u8; 6], from: [u8; 4], to: [u8; 4], proto: u8, ttl: u8, len: usize) -> Vec<u8> {
    let mut f = dst.0.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let total = (len - 14) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[8] = ttl;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&from);
    ip[16..20].copy_from_slice(&to);
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    let mut l4 = vec![0u8; len - 34];
    for (i, b) in l4.iter_mut().enumerate() {
        *b = i as u8;
    }
    if proto == 1 {
        (l4[0], l4[1], l4[2], l4[3]) = (8, 0, 0, 0);
        let c = checksum(&l4);
        l4[2..4].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&l4);
    f
}

/// VMs 0 and 1 on VLAN 10 and 20 (networks 10.0.1.0/24 and 10.0.2.0/24 of VRF "a"), each
/// with its address as port security; VM 2 on VLAN 30, VRF "b", with 10.0.2.5 too (an
/// address of VRF "a"'s, in another tenant); VM 3 a trunk of 10 and 20 without addresses.
fn bench() -> Bench {
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    let ports = [(10, "10.0.1.5"), (20, "10.0.2.5"), (30, "10.0.2.5")];
    for (i, (vlan, ip)) in ports.into_iter().enumerate() {
        b.policies[i].vlan = PortVlan::access(vlan);
        b.policies[i].allowed_macs = vec![MacAddr(mac(i))];
        b.policies[i].allowed_ips = vec![IpPrefix::parse(ip).unwrap()];
    }
    b.policies[3].vlan = PortVlan::trunk(&[10, 20]);
    b.vrfs = vec![vrf("a", &[(10, [10, 0, 1, 1], 24), (20, [10, 0, 2, 1], 24)]), vrf("b", &[(30, [10, 0, 2, 1], 24)])];
    b.post(0);
    b.step();
    b
}

/// What a router makes of `f` (untagged, IPv4 at 14): the new addresses, TTL one less, the
/// header checksum right for it.
fn routed(f: &[u8], dst: [u8; 6]) -> Vec<u8> {
    let mut r = f.to_vec();
    r[0..6].copy_from_slice(&dst);
    r[6..12].copy_from_slice(&GW.0);
    r[22] -= 1;
    r[24..26].copy_from_slice(&[0, 0]);
    let c = checksum(&r[14..34]);
    r[24..26].copy_from_slice(&c.to_be_bytes());
    r
}

#[test]
fn a_frame_to_the_gateway_is_routed_to_the_other_network() {
    let mut b = bench();
    let f = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 5], 17, 64, 200);
    b.vms[0].guest.send(&f);
    b.settle(10);
    let got = b.vms[1].recv();
    assert_eq!(got, vec![routed(&f, mac(1))], "vm1 gets the frame as a router leaves it");
    assert_eq!(checksum(&got[0][14..34]), 0, "the IPv4 header checksum holds");
    assert!(b.vms[2].recv().is_empty() && b.vms[3].recv().is_empty(), "no copy elsewhere (VRF b's 10.0.2.5)");
    // And back, 1500 bytes (a frame longer than the switch's copy of its front).
    let back = ip_frame(GW, mac(1), [10, 0, 2, 5], [10, 0, 1, 5], 17, 2, 1514);
    b.vms[1].guest.send(&back);
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![routed(&back, mac(0))]);
    assert_eq!(b.totals(0).drops.0.iter().sum::<u64>() + b.totals(1).drops.0.iter().sum::<u64>(), 0);
}

#[test]
fn arp_and_ping_for_the_gateway_are_answered_by_the_switch() {
    let mut b = bench();
    let (me, gw) = (Ipv4Addr::new(10, 0, 1, 5), Ipv4Addr::new(10, 0, 1, 1));
    let ask = arp_frame(MacAddr::BROADCAST, arp::OP_REQUEST, MacAddr(mac(0)), me, MacAddr::ZERO, gw);
    b.vms[0].guest.send(&ask);
    b.settle(10);
    let want = arp_frame(MacAddr(mac(0)), arp::OP_REPLY, GW, gw, MacAddr(mac(0)), me);
    assert_eq!(b.vms[0].recv(), vec![want.to_vec()], "the gateway's ARP reply (padded to 60 bytes)");
    assert!(b.vms[3].recv().is_empty(), "the request for the gateway is not flooded");
    // An ARP request for someone else floods as ever.
    let other =
        arp_frame(MacAddr::BROADCAST, arp::OP_REQUEST, MacAddr(mac(0)), me, MacAddr::ZERO, [10, 0, 1, 9].into());
    b.vms[0].guest.send(&other);
    b.settle(10);
    assert_eq!(b.vms[3].recv(), vec![tagged(&other, 0x8100, 10)]);
    assert!(b.vms[0].recv().is_empty());

    // From the trunk, tagged: answered tagged.
    let ask = arp_frame(
        MacAddr::BROADCAST,
        arp::OP_REQUEST,
        MacAddr(mac(3)),
        [10, 0, 2, 7].into(),
        MacAddr::ZERO,
        [10, 0, 2, 1].into(),
    );
    b.vms[3].guest.send(&tagged(&ask, 0x8100, 20));
    b.settle(10);
    let want =
        arp_frame(MacAddr(mac(3)), arp::OP_REPLY, GW, [10, 0, 2, 1].into(), MacAddr(mac(3)), [10, 0, 2, 7].into());
    assert_eq!(b.vms[3].recv(), vec![tagged(&want, 0x8100, 20)]);

    // A ping to the gateway: the echo reply, addresses swapped, both checksums right.
    let ping = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 1, 1], 1, 64, 98);
    b.vms[0].guest.send(&ping);
    b.settle(10);
    let got = b.vms[0].recv();
    assert_eq!(got.len(), 1, "one echo reply");
    let r = &got[0];
    assert_eq!((&r[0..6], &r[6..12], r.len()), (&mac(0)[..], &GW.0[..], 98));
    assert_eq!(
        (&r[26..30], &r[30..34], r[34]),
        (&[10u8, 0, 1, 1][..], &[10u8, 0, 1, 5][..], 0),
        "from the gateway, type 0"
    );
    assert_eq!((checksum(&r[14..34]), checksum(&r[34..])), (0, 0), "IPv4 and ICMP checksums");
    assert_eq!(&r[38..], &ping[38..], "the identifier, sequence and data come back");
}

#[test]
fn what_a_router_must_refuse_is_dropped_with_its_reason() {
    let mut b = bench();
    // Each with the ICMP error the sender gets back (type, code), if any.
    let cases = [
        // No network of VRF a holds it: net unreachable.
        (ip_frame(GW, mac(0), [10, 0, 1, 5], [192, 168, 0, 1], 17, 64, 100), DropReason::NoRoute, Some((3, 0))),
        // In a network, but no port has it: host unreachable.
        (ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 99], 17, 64, 100), DropReason::RouteNoNeighbour, Some((3, 1))),
        // To a broadcast address: no network holds it, and no error answers it.
        (ip_frame(GW, mac(0), [10, 0, 1, 5], [255, 255, 255, 255], 17, 64, 100), DropReason::NoRoute, None),
        // A source address that is not vm0's: port security's, before routing looks.
        (ip_frame(GW, mac(0), [10, 0, 1, 99], [10, 0, 2, 5], 17, 64, 100), DropReason::IpSpoofed, None),
        // A header that lies about its length.
        (
            {
                let mut f = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 5], 17, 64, 100);
                f[16..18].copy_from_slice(&1000u16.to_be_bytes());
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
        let back: Vec<(u8, u8, Vec<u8>)> = b.vms[0].recv().iter().map(|r| (r[34], r[35], r[42..].to_vec())).collect();
        match icmp {
            Some((ty, code)) => assert_eq!(back, [(*ty, *code, f[14..42].to_vec())], "{why:?}: the error quoting it"),
            None => assert!(back.is_empty(), "{why:?}: answered"),
        }
    }
    // The gateway's MAC as a source, from the trunk (no port security of its own): nobody
    // but the switch is the gateway.
    let f = ip_frame(MacAddr([0xff; 6]), GW.0, [10, 0, 1, 5], [10, 0, 1, 9], 17, 64, 100);
    b.vms[3].guest.send(&tagged(&f, 0x8100, 10));
    b.settle(10);
    assert_eq!(b.drops(3, DropReason::PortSecurity), 1);
    assert!(b.vms[0].recv().is_empty(), "the gateway's impostor was switched");
    // VRF b's VM cannot reach VRF a's 10.0.1.5 through its gateway (its VRF has no such
    // network), though the address exists next door.
    let f = ip_frame(GW, mac(2), [10, 0, 2, 5], [10, 0, 1, 5], 17, 64, 100);
    b.vms[2].guest.send(&f);
    b.settle(10);
    assert_eq!(b.drops(2, DropReason::NoRoute), 1);
    assert!(b.vms[0].recv().is_empty(), "VRF b reached VRF a");
    assert_eq!(b.vms[2].recv().iter().map(|r| (r[34], r[35])).collect::<Vec<_>>(), [(3, 0)], "net unreachable");
    // The tenants still route.
    let ok = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 5], 17, 64, 100);
    b.vms[0].guest.send(&ok);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![routed(&ok, mac(1))]);
}

/// ARP suppression: a request for a neighbour's address (a port's `allowed_ips` in the
/// network) is answered by the switch with that port's MAC and reaches nobody; a probe (a VM
/// checking its own address is free) and a request from the address's own port flood as ever.
#[test]
fn arp_for_a_known_address_is_answered_on_the_askers_host() {
    let mut b = bench();
    let vm0 = Ipv4Addr::new(10, 0, 1, 5);
    let ask = arp_frame(MacAddr::BROADCAST, arp::OP_REQUEST, MacAddr(mac(3)), [10, 0, 1, 7].into(), MacAddr::ZERO, vm0);
    b.vms[3].guest.send(&tagged(&ask, 0x8100, 10));
    b.settle(10);
    let want = arp_frame(MacAddr(mac(3)), arp::OP_REPLY, MacAddr(mac(0)), vm0, MacAddr(mac(3)), [10, 0, 1, 7].into());
    assert_eq!(b.vms[3].recv(), vec![tagged(&want, 0x8100, 10)], "vm0's MAC, from the switch");
    assert!(b.vms[0].recv().is_empty(), "the request was flooded");
    // vm0's own probe for its address (sender 0.0.0.0): a broadcast as ever.
    let probe =
        arp_frame(MacAddr::BROADCAST, arp::OP_REQUEST, MacAddr(mac(0)), [0, 0, 0, 0].into(), MacAddr::ZERO, vm0);
    b.vms[0].guest.send(&probe);
    b.settle(10);
    assert_eq!(b.vms[3].recv(), vec![tagged(&probe, 0x8100, 10)]);
    assert!(b.vms[0].recv().is_empty());
    // An address of another network (vm1's 10.0.2.5, asked for in VLAN 10): not answered.
    let other = arp_frame(
        MacAddr::BROADCAST,
        arp::OP_REQUEST,
        MacAddr(mac(3)),
        [10, 0, 1, 7].into(),
        MacAddr::ZERO,
        [10, 0, 2, 5].into(),
    );
    b.vms[3].guest.send(&tagged(&other, 0x8100, 10));
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![other], "flooded in VLAN 10");
    assert!(b.vms[3].recv().is_empty() && b.vms[1].recv().is_empty());
}

/// A frame whose TTL runs out at the gateway is dropped and answered with ICMP time exceeded
/// from the gateway's address, quoting its header: traceroute through the gateway works. The
/// answers are rate-limited (a burst of 10, then 100 a second per poll thread), an ICMP error
/// is never answered with one, and the frame never goes on.
#[test]
fn a_ttl_that_runs_out_is_answered_with_time_exceeded_a_few_times() {
    let mut b = bench();
    let f = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 5], 17, 1, 100);
    b.vms[0].guest.send(&f);
    b.settle(10);
    let got = b.vms[0].recv();
    assert_eq!(got.len(), 1, "one time exceeded");
    let r = &got[0];
    assert_eq!((&r[0..6], &r[6..12], &r[12..14]), (&mac(0)[..], &GW.0[..], &[8u8, 0][..]));
    assert_eq!(
        (r[23], &r[26..30], &r[30..34]),
        (1, &[10u8, 0, 1, 1][..], &[10u8, 0, 1, 5][..]),
        "ICMP, gateway to sender"
    );
    assert_eq!((r[34], r[35]), (11, 0), "time exceeded in transit");
    assert_eq!(&r[42..], &f[14..14 + 28], "the header and 8 bytes quoted");
    assert_eq!((checksum(&r[14..34]), checksum(&r[34..])), (0, 0));
    assert_eq!(b.drops(0, DropReason::TtlExceeded), 1);
    assert!(b.vms[1].recv().is_empty(), "it went on");
    // 40 more at once: counted, but only the rest of the burst answered.
    for _ in 0..40 {
        b.vms[0].guest.send(&f);
    }
    b.settle(20);
    let n = b.vms[0].recv().len();
    assert!((1..=10).contains(&n), "{n} answers to 40 expired frames");
    assert_eq!(b.drops(0, DropReason::TtlExceeded), 41);
    // An ICMP error with TTL 1 (type 3) gets none.
    let mut err = ip_frame(GW, mac(0), [10, 0, 1, 5], [10, 0, 2, 5], 1, 1, 100);
    err[34] = 3;
    b.vms[0].guest.send(&err);
    b.settle(10);
    assert!(b.vms[0].recv().is_empty());
    assert_eq!(b.drops(0, DropReason::TtlExceeded), 42);
    // vm0 spent its own budget, not its neighbours': vm3's traceroute (from the trunk, in
    // VLAN 10) still gets its time exceeded, at once.
    let mine = ip_frame(GW, mac(3), [10, 0, 1, 7], [10, 0, 2, 5], 17, 1, 100);
    b.vms[3].guest.send(&tagged(&mine, 0x8100, 10));
    b.settle(10);
    let got = b.vms[3].recv();
    assert_eq!(got.len(), 1, "vm3's time exceeded, after vm0 spent its budget");
    assert_eq!((got[0][38], got[0][39]), (11, 0));
}
