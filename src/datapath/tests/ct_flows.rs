//! OVS's flow language for connection tracking in the data path (`datapath::pipeline`):
//! tables, `resubmit`, `goto_table`, `ct(commit,zone,table,exec(set_field->ct_mark))`,
//! `ct_state`/`ct_zone`/`ct_mark` matches and `ct_clear`, written as flows for OVS-DPDK are.
//! Each test says what OVS does with the same flows, frame by frame.

use std::sync::Arc;

use super::secgroups::{ACK, SYN, SYN_ACK, passes, tcp, v4};
use super::*;
use crate::conntrack::packet::build;
use crate::conntrack::{Conntrack, Limits, Timeouts};
use crate::datapath::counters::DropReason;
use crate::flow::table::FlowTable;
use crate::wire::protocol;

/// `vms` VMs on one thread, every MAC learned, the flows' tracker holding `per_zone`
/// connections a zone, and `flows` installed (ports named vm0, vm1, ...).
fn bench(vms: usize, per_zone: u32, flows: &[&str]) -> Bench {
    let mut b = Bench::new(BenchCfg { vms, ..BenchCfg::default() });
    b.flow_conntrack = Some(Arc::new(Conntrack::new(Limits { total: 4096, per_zone }, Timeouts::default())));
    for i in 0..vms {
        b.announce(i);
    }
    let id = |s: &str| s.strip_prefix("vm").and_then(|n| n.parse().ok());
    b.flows = Arc::new(FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap());
    b.post(0);
    b
}

/// Flow `text`'s packet count.
fn hits(b: &Bench, text: &str) -> u64 {
    let i = b.flows.entries().iter().position(|e| e.flow.to_ovs_string(&|p| format!("vm{p}")) == text);
    b.flows.totals(i.unwrap_or_else(|| panic!("no flow {text}"))).0
}

/// The stateful firewall of OVS's conntrack tutorial: vm0 may open connections to vm1, vm1
/// may only answer.
const FIREWALL: [&str; 5] = [
    "priority=10,arp,actions=normal",
    "priority=100,ip,ct_state=-trk,actions=ct(table=1)",
    "table=1,priority=100,ip,in_port=vm0,ct_state=+trk+new,actions=ct(commit),output:vm1",
    "table=1,priority=100,ip,ct_state=+trk+est,actions=normal",
    "table=1,priority=1,actions=drop",
];

#[test]
fn the_tutorial_firewall_lets_vm0_open_and_vm1_only_answer() {
    let mut b = bench(2, 1024, &FIREWALL);
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 80, SYN, 1000, 0)), "vm0's SYN: +new, committed");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 80, 40000, SYN_ACK, 9000, 1001)), "vm1's SYN+ACK: +est+rpl");
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 80, ACK, 1001, 9001)), "data");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 80, 40000, ACK, 9001, 1011)), "data back");
    assert!(!passes(&mut b, 1, 0, &tcp(1, 0, 40001, 22, SYN, 5, 0)), "vm1 may not open");
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 40000, 80, ACK, 1001 + (1 << 30), 9001)), "+inv: outside the window");
    let udp = v4(0, 1, protocol::UDP, &build::udp(5000, 53, 8));
    assert!(passes(&mut b, 0, 1, &udp), "UDP opens the same way");
    assert!(passes(&mut b, 1, 0, &v4(1, 0, protocol::UDP, &build::udp(53, 5000, 8))), "its answer");
    let ct = b.flow_conntrack.clone().unwrap();
    assert_eq!(ct.zone_len(0), 2, "two connections, committed in zone 0");
    assert_eq!(hits(&b, "priority=100,ip,ct_state=-trk actions=ct(table=1)"), 8);
    assert_eq!(hits(&b, "table=1,priority=100,ip,in_port=vm0,ct_state=+new+trk actions=ct(commit),output:vm1"), 2);
    assert_eq!(hits(&b, "table=1,priority=100,ip,ct_state=+est+trk actions=NORMAL"), 4);
    assert_eq!(hits(&b, "table=1,priority=1 actions=drop"), 2);
    assert_eq!(b.drops(1, DropReason::FlowDrop) + b.drops(0, DropReason::FlowDrop), 2);
    // Without ct(commit) nothing is stored: the same SYN from vm0 with a table that only
    // tracks stays +new, and vm1's answer is not +est.
    let mut b = bench(
        2,
        1024,
        &[
            "priority=100,ip,ct_state=-trk,actions=ct(table=1)",
            "table=1,ip,ct_state=+trk+new,in_port=vm0,actions=output:vm1",
            "table=1,ip,ct_state=+trk+est,actions=normal",
        ],
    );
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 80, SYN, 1000, 0)));
    assert!(!passes(&mut b, 1, 0, &tcp(1, 0, 80, 40000, SYN_ACK, 9000, 1001)), "no commit, no +est");
    assert_eq!(b.drops(1, DropReason::NoMatch), 1, "a miss in a later table is a drop, as OVS's");
}

#[test]
fn zones_keep_overlapping_addresses_apart_and_marks_are_set_and_matched() {
    // vm0 and vm2 share addresses (the same tuple), each in a zone of its own; each commit
    // marks its connection with its zone's number, and replies pass by mark.
    let mut b = bench(
        3,
        1024,
        &[
            "priority=100,ip,in_port=vm0,actions=ct(zone=10,table=1)",
            "priority=100,ip,in_port=vm2,actions=ct(zone=20,table=1)",
            "priority=90,ip,in_port=vm1,actions=ct(zone=10,table=2)",
            "table=1,ip,ct_state=+trk+new,ct_zone=10,actions=ct(commit,zone=10,exec(set_field:0xa->ct_mark)),output:vm1",
            "table=1,ip,ct_state=+trk+new,ct_zone=20,actions=ct(commit,zone=20,exec(set_field:0x14->ct_mark)),output:vm1",
            "table=2,ip,ct_state=+trk+est,ct_mark=0xa,ct_zone=10,actions=output:vm0",
        ],
    );
    let syn = tcp(0, 1, 40000, 80, SYN, 1000, 0);
    assert!(passes(&mut b, 0, 1, &syn), "vm0 opens in zone 10");
    let ct = b.flow_conntrack.clone().unwrap();
    assert_eq!((ct.zone_len(10), ct.zone_len(20)), (1, 0));
    // vm2 sends the very same frame: new in zone 20.
    let mut from2 = syn.clone();
    from2[6..12].copy_from_slice(&mac(2));
    b.vms[2].guest.send(&from2);
    b.settle(10);
    assert_eq!(b.vms[1].recv().len(), 1);
    assert_eq!((ct.zone_len(10), ct.zone_len(20)), (1, 1), "one connection in each zone");
    let marks: Vec<(u16, u32)> = ct.entries(None, 10).iter().map(|e| (e.zone, e.mark)).collect();
    assert!(marks.contains(&(10, 0xa)) && marks.contains(&(20, 0x14)), "{marks:?}");
    assert!(passes(&mut b, 1, 0, &tcp(1, 0, 80, 40000, SYN_ACK, 9000, 1001)), "vm1's answer, mark 0xa");
}

#[test]
fn resubmit_and_goto_table_run_in_order_with_the_rewritten_header() {
    // OVS: resubmit runs the other table's actions, then the rest of the list, with the
    // header as the other table left it; a miss in that table just returns.
    let mut b = bench(
        4,
        1024,
        &[
            "in_port=vm0,actions=mod_vlan_vid:5,resubmit(,2),resubmit(,7),strip_vlan,output:vm3",
            "table=2,dl_vlan=5,actions=output:vm1,goto_table:3",
            "table=2,priority=0,actions=output:vm2",
            "table=3,actions=mod_dl_dst:02:00:00:00:00:09,output:vm2",
        ],
    );
    let f = frame(mac(1), mac(0), 64, 1);
    b.vms[0].guest.send(&f);
    b.settle(10);
    let tagged = tagged(&f, 0x8100, 5);
    assert_eq!(b.vms[1].recv(), vec![tagged.clone()], "table 2's dl_vlan=5 flow, the tag on");
    let mut rewritten = tagged;
    rewritten[..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    assert_eq!(b.vms[2].recv(), vec![rewritten], "table 3's, after goto_table");
    let mut last = f.clone();
    last[..6].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    assert_eq!(b.vms[3].recv(), vec![last], "the rest of table 0's list: the tag off, table 3's address kept");
}

#[test]
fn a_resubmit_loop_is_dropped_and_ct_clear_forgets_the_state() {
    let mut b = bench(2, 1024, &["actions=resubmit(,1)", "table=1,actions=resubmit(,1)"]);
    assert!(!passes(&mut b, 0, 1, &frame(mac(1), mac(0), 64, 1)));
    assert_eq!(b.drops(0, DropReason::ResubmitLimit), 1);
    let mut b = bench(
        2,
        1024,
        &[
            "priority=100,ip,ct_state=-trk,actions=ct(table=1)",
            "table=1,ip,ct_state=+trk,actions=ct_clear,resubmit(,2)",
            "table=2,ct_state=-trk,actions=output:vm1",
        ],
    );
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 40000, 80, SYN, 1000, 0)), "untracked again in table 2");
}

#[test]
fn a_zone_full_of_connections_refuses_only_its_own_new_ones() {
    // vm0 in zone 1 and vm2 in zone 2, 8 connections a zone: vm0's ninth is dropped
    // (ct_limit), vm2's first still opens, vm0's established ones still pass.
    let mut b = bench(
        3,
        8,
        &[
            "priority=100,ip,in_port=vm0,actions=ct(commit,zone=1),output:vm1",
            "priority=100,ip,in_port=vm2,actions=ct(commit,zone=2),output:vm1",
        ],
    );
    for port in 0..8 {
        assert!(passes(&mut b, 0, 1, &tcp(0, 1, 1000 + port, 80, SYN, 1, 0)));
    }
    assert!(!passes(&mut b, 0, 1, &tcp(0, 1, 2000, 80, SYN, 1, 0)), "the ninth in zone 1");
    assert_eq!(b.drops(0, DropReason::CtLimit), 1);
    let mut from2 = tcp(0, 1, 2000, 80, SYN, 1, 0);
    from2[6..12].copy_from_slice(&mac(2));
    b.vms[2].guest.send(&from2);
    b.settle(10);
    assert_eq!(b.vms[1].recv().len(), 1, "zone 2's first");
    assert!(passes(&mut b, 0, 1, &tcp(0, 1, 1000, 80, ACK, 2, 0)), "an established one of zone 1");
}
