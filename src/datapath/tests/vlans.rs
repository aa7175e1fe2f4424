//! VLANs and rate caps through the data path, stepped: access, trunk and native ports, per-VLAN
//! learning and flooding, what a port may not send, and token buckets that hold a sender's
//! ring (ingress) or drop toward a receiver (egress).

use super::*;
use crate::config::RateCaps;
use crate::config::vlan::{PortVlan, VlanMode};
use crate::datapath::counters::DropReason;

fn native(mode: VlanMode, tag: u16, trunks: &[u16]) -> PortVlan {
    PortVlan { mode, tag, ..PortVlan::trunk(trunks) }
}

/// A bench whose VMs have these VLAN configs, posted to its thread.
fn bench(vlans: Vec<PortVlan>) -> Bench {
    let mut b = Bench::new(BenchCfg { vms: vlans.len(), ..BenchCfg::default() });
    for (p, v) in b.policies.iter_mut().zip(vlans) {
        p.vlan = v;
    }
    b.post(0);
    b.step();
    b
}

/// Access ports 0, 1 on VLAN 10 and 2 on VLAN 20, trunk 3 of both: a broadcast stays in its
/// VLAN, leaves access ports untagged and the trunk tagged; a tagged frame from the trunk
/// reaches its VLAN's access port untagged.
#[test]
fn a_flood_never_leaves_its_vlan_and_each_port_gets_its_tagging() {
    let mut b =
        bench(vec![PortVlan::access(10), PortVlan::access(10), PortVlan::access(20), PortVlan::trunk(&[10, 20])]);
    let bcast = frame([0xff; 6], mac(0), 100, 1);
    b.vms[0].guest.send(&bcast);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![bcast.clone()]);
    assert_eq!(b.vms[3].recv(), vec![tagged(&bcast, 0x8100, 10)], "the trunk gets VLAN 10 tagged");
    assert!(b.vms[2].recv().is_empty(), "VLAN 20 saw VLAN 10's broadcast");

    let from_trunk = frame([0xff; 6], mac(3), 80, 2);
    b.vms[3].guest.send(&tagged(&from_trunk, 0x8100, 0x6000 | 20));
    b.settle(10);
    assert_eq!(b.vms[2].recv(), vec![from_trunk], "the tag is popped for the access port");
    assert!(b.vms[0].recv().is_empty() && b.vms[1].recv().is_empty(), "VLAN 10 saw VLAN 20's broadcast");

    // Unicast: learned per VLAN, so vm0 is known on 10 and goes to it alone.
    let uni = frame(mac(0), mac(3), 200, 3);
    b.vms[3].guest.send(&tagged(&uni, 0x8100, 10));
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![uni]);
    assert!(b.vms[1].recv().is_empty() && b.vms[2].recv().is_empty());
    assert_eq!(b.totals(3).drops.0.iter().sum::<u64>(), 0);
}

/// One MAC on two VLANs is two entries with their own ports; a MAC learned on one VLAN is
/// unknown (flooded, in the VLAN asked) on the other.
#[test]
fn the_same_mac_on_two_vlans_is_two_stations() {
    let mut b = bench(vec![PortVlan::access(10), PortVlan::access(20), PortVlan::trunk(&[10, 20])]);
    let shared = [0x02, 0xaa, 0, 0, 0, 1];
    for i in 0..2 {
        b.vms[i].guest.send(&frame([0xff; 6], shared, 60, i as u32));
    }
    b.settle(10);
    b.vms[2].recv();
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(shared), 10), Some(0));
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(shared), 20), Some(1));
    for (vid, to) in [(10u16, 0usize), (20, 1)] {
        let f = frame(shared, mac(2), 100, vid as u32);
        b.vms[2].guest.send(&tagged(&f, 0x8100, vid));
        b.settle(10);
        assert_eq!(b.vms[to].recv(), vec![f], "VLAN {vid}");
        assert!(b.vms[1 - to].recv().is_empty(), "VLAN {vid}'s frame reached the other VLAN");
    }
}

/// What a port may not send is dropped, counted per reason, and nothing else stops.
#[test]
fn frames_a_port_may_not_send_are_dropped_per_reason() {
    let mut b =
        bench(vec![PortVlan::access(10), PortVlan::trunk(&[10, 20]), PortVlan::access(20), PortVlan::access(10)]);
    let f = frame([0xff; 6], mac(0), 100, 1);
    // A tagged frame on an access port, even of its own VLAN.
    b.vms[0].guest.send(&tagged(&f, 0x8100, 10));
    b.vms[0].guest.send(&tagged(&f, 0x8100, 20));
    // On the trunk: a VLAN it does not carry, untagged (VLAN 0, not listed), QinQ, two tags.
    let g = frame([0xff; 6], mac(1), 100, 2);
    b.vms[1].guest.send(&tagged(&g, 0x8100, 30));
    b.vms[1].guest.send(&g);
    b.vms[1].guest.send(&tagged(&tagged(&g, 0x8100, 20), 0x88a8, 10));
    b.vms[1].guest.send(&tagged(&tagged(&g, 0x8100, 20), 0x8100, 10));
    b.vms[1].guest.send(&tagged(&g, 0x9100, 10));
    // And one good frame after them all.
    b.vms[1].guest.send(&tagged(&g, 0x8100, 20));
    b.settle(10);
    assert_eq!(b.drops(0, DropReason::VlanTagged), 2);
    assert_eq!(b.drops(1, DropReason::VlanNotAllowed), 2);
    assert_eq!(b.drops(1, DropReason::VlanStacked), 3);
    assert_eq!(b.vms[2].recv(), vec![g], "the good frame after the bad ones");
    assert!(b.vms[3].recv().is_empty() && b.vms[0].recv().is_empty());
    assert_eq!((b.vms[0].guest.tx_pending(), b.vms[1].guest.tx_pending()), (0, 0), "dropped frames were not completed");
}

/// Native ports: untagged frames join the native VLAN; it leaves untagged (native-untagged) or
/// tagged (native-tagged); other trunk VLANs leave tagged; a priority tag (VID 0) counts as
/// untagged and is rewritten to the VLAN, keeping its priority.
#[test]
fn native_ports_tag_as_their_mode_says() {
    let mut b = bench(vec![
        PortVlan::access(10),
        native(VlanMode::NativeUntagged, 10, &[20]),
        native(VlanMode::NativeTagged, 10, &[20]),
        PortVlan::access(20),
    ]);
    let f = frame([0xff; 6], mac(0), 100, 1);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f.clone()], "native-untagged: its native VLAN untagged");
    assert_eq!(b.vms[2].recv(), vec![tagged(&f, 0x8100, 10)], "native-tagged: its native VLAN tagged");
    assert!(b.vms[3].recv().is_empty());
    // From the native-untagged port: untagged is VLAN 10; a priority tag too, kept with its PCP
    // toward a tagged port.
    let g = frame([0xff; 6], mac(1), 100, 2);
    b.vms[1].guest.send(&tagged(&g, 0x8100, 0xa000));
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![g.clone()]);
    assert_eq!(b.vms[2].recv(), vec![tagged(&g, 0x8100, 0xa000 | 10)], "the priority is kept");
    // VLAN 20 from the native-tagged port reaches the native-untagged port tagged.
    let h = frame([0xff; 6], mac(2), 100, 3);
    b.vms[2].guest.send(&tagged(&h, 0x8100, 20));
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![tagged(&h, 0x8100, 20)]);
    assert_eq!(b.vms[3].recv(), vec![h]);
    assert!(b.vms[0].recv().is_empty());
}

/// A port's MAC limit bounds its entries across every VLAN: a trunk flooding source MACs
/// over many VLANs learns at most its limit, and others' entries stay.
#[test]
fn a_mac_flood_across_vlans_is_bounded_by_the_ports_limit() {
    let trunk: Vec<u16> = (1..=100).collect();
    let mut b = bench(vec![PortVlan::trunk(&trunk), PortVlan::access(5)]);
    b.mac.set_limit(0, 50);
    b.vms[1].guest.send(&frame([0xff; 6], mac(1), 60, 0));
    b.settle(10);
    for v in 1..=100u16 {
        for k in 0..4u8 {
            let src = [0x02, 0xbb, 0, 0, k, v as u8];
            b.vms[0].guest.send(&tagged(&frame([0xff; 6], src, 60, v as u32), 0x8100, v));
        }
        b.settle(10);
    }
    assert_eq!(b.mac.learned(0), 50);
    assert!(b.totals(0).learn_refused >= 350);
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(mac(1)), 5), Some(1), "another port's entry went");
}

/// Without VLAN config anywhere, tagged frames go through untouched (no VLAN work at all).
#[test]
fn without_vlan_config_tags_pass_as_they_are() {
    let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
    let f = tagged(&tagged(&frame([0xff; 6], mac(0), 100, 1), 0x8100, 7), 0x88a8, 3);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f]);
}

/// Ingress cap: over it, the sender's frames stay in its ring (backpressure, no drop); the
/// bucket's depth went at once, the rest later.
#[test]
fn an_ingress_cap_leaves_frames_in_the_senders_ring() {
    let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
    b.announce(1);
    // 1000 frames a second, 10 ms deep: 10 frames at once, one a millisecond after.
    b.vms[0].port.rates.apply(&RateCaps { ingress_pps: 1000, burst_ms: 10, ..RateCaps::default() });
    for i in 0..60 {
        b.vms[0].guest.send(&frame(mac(1), mac(0), 100, i));
    }
    let t0 = std::time::Instant::now();
    b.settle(5);
    let first = b.vms[1].recv().len() as u64;
    let allowed = 10 + t0.elapsed().as_millis() as u64 + 1;
    assert!(first >= 10 && first <= allowed, "{first} frames went at once (bucket of 10)");
    assert!(b.vms[0].guest.tx_pending() >= 60 - first as u16, "frames were taken beyond the cap");
    assert!(b.totals(0).rate_held > 0);
    assert_eq!(b.totals(0).drops.0.iter().sum::<u64>(), 0, "backpressure, not loss");
    // The rest goes as tokens come: all of it, eventually, none dropped.
    let mut got = first;
    while got < 60 {
        b.step();
        got += b.vms[1].recv().len() as u64;
    }
    assert!(t0.elapsed().as_millis() >= 40, "60 frames at 1000/s with 10 at once took {:?}", t0.elapsed());
    b.vms[0].port.rates.apply(&RateCaps::default());
}

/// Egress cap: frames to a capped port beyond its bucket are dropped and counted; the sender
/// is not held back, and an uncapped port beside it gets everything.
#[test]
fn an_egress_cap_drops_and_counts_beyond_the_bucket() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.vms[1].port.rates.apply(&RateCaps { egress_pps: 1000, burst_ms: 10, ..RateCaps::default() });
    let t0 = std::time::Instant::now();
    for i in 0..100 {
        b.vms[0].guest.send(&frame([0xff; 6], mac(0), 100, i));
    }
    b.settle(10);
    let got = b.vms[1].recv().len() as u64;
    let allowed = 10 + t0.elapsed().as_millis() as u64 + 1;
    assert!(got >= 10 && got <= allowed, "{got} frames through a bucket of 10");
    assert_eq!(b.drops(1, DropReason::RateCap), 100 - got);
    assert_eq!(b.vms[2].recv().len(), 100, "the uncapped port lost frames");
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
}

/// Flows see the frame as it came; their NORMAL switches by VLAN (after the flow's own
/// rewrites), and an explicit output sends the frame as it is.
#[test]
fn flows_normal_switches_by_vlan_and_outputs_send_as_is() {
    use crate::flow::table::FlowTable;
    use std::sync::Arc;
    let mut b =
        bench(vec![PortVlan::access(10), PortVlan::access(20), PortVlan::trunk(&[10, 20]), PortVlan::access(10)]);
    let names = ["vm0", "vm1", "vm2", "vm3"];
    let id = |n: &str| names.iter().position(|&x| x == n).map(|i| i as u16);
    let flows = [
        // The trunk's VLAN 10 goes to VLAN 20 instead, through NORMAL.
        "priority=20,in_port=vm2,dl_vlan=10,actions=mod_vlan_vid:20,normal",
        "priority=10,dl_type=0x88b5,actions=normal",
        "priority=5,actions=output:vm1",
    ];
    b.flows = Arc::new(FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap());
    b.post(0);
    let f = frame([0xff; 6], mac(0), 100, 1);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[2].recv(), vec![tagged(&f, 0x8100, 10)]);
    assert_eq!(b.vms[3].recv(), vec![f.clone()]);
    assert!(b.vms[1].recv().is_empty());
    // Rewritten to VLAN 20 by the flow: its NORMAL floods VLAN 20. (NORMAL judges the rewritten
    // frame by the input port's rules, as OVS does: a tag pushed on an access port's frame is
    // a tagged frame on an access port.)
    let g = frame([0xff; 6], mac(2), 100, 2);
    b.vms[2].guest.send(&tagged(&g, 0x8100, 10));
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![g.clone()]);
    assert!(b.vms[0].recv().is_empty() && b.vms[3].recv().is_empty(), "VLAN 10 saw a frame the flow moved to VLAN 20");
    // An explicit output: as the frame came, whatever the VLANs.
    let mut arp = frame([0xff; 6], mac(0), 100, 3);
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    b.vms[0].guest.send(&arp);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![arp]);
}
