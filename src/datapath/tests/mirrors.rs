//! Mirrors through the data path, stepped: both directions of a port copied once each to an
//! output that receives nothing else, a full output that never holds a source back, copies cut
//! to a snaplen, VLANs selected, and a mirror of a port that is not there.

use super::*;
use crate::config::MirrorConfig;
use crate::config::vlan::PortVlan;
use crate::datapath::counters::DropReason;

fn mirror(output: &str, src: &[&str], dst: &[&str]) -> MirrorConfig {
    MirrorConfig {
        name: format!("m-{output}"),
        output_port: output.into(),
        select_src_port: src.iter().map(|s| s.to_string()).collect(),
        select_dst_port: dst.iter().map(|s| s.to_string()).collect(),
        select_all: false,
        select_vlan: Vec::new(),
        snaplen: None,
    }
}

/// A bench of `vms` VMs with `mirrors`, posted to its thread.
fn bench(vms: usize, mirrors: Vec<MirrorConfig>) -> Bench {
    let mut b = Bench::new(BenchCfg { vms, ..BenchCfg::default() });
    b.mirrors = mirrors;
    b.post(0);
    b.step();
    b
}

/// vm2 mirrors vm0 both ways: what vm0 sends and what it is given reach vm2 once each, as
/// they were; vm2 is flooded nothing, learned nowhere, and what it sends goes nowhere.
#[test]
fn a_mirror_copies_both_directions_of_a_port_once_and_its_output_gets_nothing_else() {
    let mut b = bench(3, vec![mirror("vm2", &["vm0"], &["vm0"])]);
    // A broadcast from vm0: vm1 gets it; vm2 only the copy (it is no member of the flood).
    let bcast = frame([0xff; 6], mac(0), 60, 1);
    b.vms[0].guest.send(&bcast);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![bcast.clone()]);
    assert_eq!(b.vms[2].recv(), vec![bcast], "vm2 should get the copy alone");
    // vm1 -> vm0 (vm0 given it) and vm0 -> vm1 (vm0 sent it): one copy each, in order.
    let to0 = frame(mac(0), mac(1), 300, 2);
    let to1 = frame(mac(1), mac(0), 400, 3);
    b.vms[1].guest.send(&to0);
    b.settle(10);
    b.vms[0].guest.send(&to1);
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![to0.clone()]);
    assert_eq!(b.vms[1].recv(), vec![to1.clone()]);
    assert_eq!(b.vms[2].recv(), vec![to0, to1]);
    // The output's own frames go nowhere, and teach NORMAL nothing: a frame to its MAC is
    // unknown, flooded to the others but not to it.
    let from2 = frame([0xff; 6], mac(2), 60, 4);
    b.vms[2].guest.send(&from2);
    b.settle(10);
    assert!(b.vms[0].recv().is_empty() && b.vms[1].recv().is_empty(), "the output's frame was delivered");
    assert_eq!(b.drops(2, DropReason::MirrorOutput), 1);
    let to2 = frame(mac(2), mac(1), 80, 5);
    b.vms[1].guest.send(&to2);
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![to2.clone()], "a frame to the output's MAC is unknown, flooded");
    assert_eq!(b.vms[2].recv(), vec![to2], "vm2 gets it as the copy of what vm0 was given, once");
    assert_eq!(b.totals(2).tx_packets, 4);
}

/// A frame from a port one mirror selects as a source to a port it selects as a destination
/// is copied once.
#[test]
fn a_frame_selected_at_both_ends_is_copied_once() {
    let mut b = bench(3, vec![mirror("vm2", &["vm0", "vm1"], &["vm0", "vm1"])]);
    b.announce(0);
    b.announce(1);
    b.vms[2].recv();
    let f = frame(mac(1), mac(0), 200, 1);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f.clone()]);
    assert_eq!(b.vms[2].recv(), vec![f]);
}

/// An output that takes nothing (its guest reads no frame) drops the copies it has no room
/// for and counts them; the mirrored pair loses nothing and never waits, though frames to a
/// full guest wait here for ever (`retry_cycles`).
#[test]
fn a_full_output_drops_copies_and_never_holds_its_sources() {
    let mut b = bench(3, vec![mirror("vm2", &["vm0"], &[])]);
    b.vms[1].guest.send(&frame([0xff; 6], mac(1), 60, 0));
    b.settle(10);
    assert_eq!(b.vms[0].recv().len(), 1);
    let n = 600; // more than vm2's 256 receive buffers
    let mut got = 0;
    for i in 0..n {
        b.vms[0].guest.send(&frame(mac(1), mac(0), 100, i));
        if i % 100 == 99 {
            b.settle(20);
            got += b.vms[1].recv().len();
        }
    }
    b.settle(20);
    got += b.vms[1].recv().len();
    assert_eq!(got, n as usize, "the mirrored port lost frames");
    assert_eq!(b.totals(0).drops.0.iter().sum::<u64>(), 0);
    let full = b.drops(2, DropReason::RxRingFull);
    assert_eq!(b.vms[2].recv().len() as u64 + full, n as u64, "every copy is delivered or counted");
    assert!(full >= n as u64 - 256, "{full}");
}

/// `snaplen` cuts each copy; `select_vlan` copies only the frames of its VLANs.
#[test]
fn snaplen_cuts_copies_and_select_vlan_chooses_their_frames() {
    let mut m = mirror("vm3", &["vm0"], &[]);
    m.snaplen = Some(64);
    m.select_vlan = vec![10];
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    b.mirrors = vec![m];
    for (p, v) in b.policies.iter_mut().zip([PortVlan::trunk(&[10, 20]), PortVlan::access(10), PortVlan::access(20)]) {
        p.vlan = v;
    }
    b.post(0);
    b.step();
    let ten = frame([0xff; 6], mac(0), 300, 1);
    let twenty = frame([0xff; 6], mac(0), 300, 2);
    b.vms[0].guest.send(&tagged(&ten, 0x8100, 10));
    b.vms[0].guest.send(&tagged(&twenty, 0x8100, 20));
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![ten.clone()]);
    assert_eq!(b.vms[2].recv(), vec![twenty]);
    // The copy is the frame as vm0 sent it (tagged), cut to 64 bytes.
    assert_eq!(b.vms[3].recv(), vec![tagged(&ten, 0x8100, 10)[..64].to_vec()]);
}

/// A mirror naming a port that is not there copies the others'; one whose output is not there
/// copies nothing, and changes nothing else.
#[test]
fn a_mirror_of_absent_ports_copies_what_is_there() {
    let mut b = bench(3, vec![mirror("vm2", &["vm0", "vm9"], &[]), mirror("vm7", &["vm1"], &[])]);
    let f = frame([0xff; 6], mac(0), 60, 1);
    let g = frame([0xff; 6], mac(1), 60, 2);
    b.vms[0].guest.send(&f);
    b.vms[1].guest.send(&g);
    b.settle(10);
    assert_eq!(b.vms[0].recv(), vec![g.clone()]);
    assert_eq!(b.vms[1].recv(), vec![f.clone()]);
    assert_eq!(b.vms[2].recv(), vec![f]);
}
