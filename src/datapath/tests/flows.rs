//! Flow tables in the data path: a table on in_port alone (answered by port, a burst's
//! destination worked out once unless the flow is NORMAL) and a deeper one (keys extracted to
//! the table's depth, looked up in a second pass over the burst), each against what the flows
//! say frame by frame.

use std::sync::Arc;

use super::*;
use crate::datapath::counters::DropReason;
use crate::flow::table::FlowTable;

/// Installs `flows` (ports named vm0, vm1, ...) on thread 0, taken at its next step.
fn install(b: &mut Bench, flows: &[&str]) {
    let id = |s: &str| s.strip_prefix("vm").and_then(|n| n.parse().ok());
    b.flows = Arc::new(FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap());
    b.post(0);
}

/// An IPv4/UDP frame from `src` to `dst` whose IPv4 destination is 10.0.0.`ip`.
fn ipv4(dst: [u8; 6], src: [u8; 6], ip: u8, seq: u32) -> Vec<u8> {
    let mut f = frame(dst, src, 80, seq);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[20..22].copy_from_slice(&[0, 0]);
    f[23] = 17;
    f[26..30].copy_from_slice(&[10, 0, 0, 99]);
    f[30..34].copy_from_slice(&[10, 0, 0, ip]);
    f
}

#[test]
fn in_port_flows_send_each_burst_where_its_port_says_and_normal_still_decides_by_address() {
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    for i in 0..3 {
        b.announce(i);
    }
    install(&mut b, &["in_port=vm0,actions=output:vm2", "in_port=vm1,actions=normal", "priority=0,actions=drop"]);
    // vm0's frames all go to vm2, whatever their addresses.
    let from0: Vec<Vec<u8>> = (0..20).map(|i| frame(mac(i % 4), mac(0), 64, i as u32)).collect();
    // vm1's go where NORMAL sends each: known unicast to its port, unknown flooded.
    let unknown = [0x02, 7, 7, 7, 7, 7];
    let from1: Vec<Vec<u8>> =
        (0..21).map(|i| frame([mac(0), mac(2), unknown][i % 3], mac(1), 64, 100 + i as u32)).collect();
    // vm3 matches only the drop flow.
    let from3 = frame(mac(0), mac(3), 64, 200);
    for f in &from0 {
        b.vms[0].guest.send(f);
    }
    for f in &from1 {
        b.vms[1].guest.send(f);
    }
    b.vms[3].guest.send(&from3);
    b.settle(20);
    let want0: Vec<Vec<u8>> = from1.iter().enumerate().filter(|(i, _)| i % 3 != 1).map(|(_, f)| f.clone()).collect();
    let mut want2 = from0.clone();
    want2.extend(from1.iter().enumerate().filter(|(i, _)| i % 3 != 0).map(|(_, f)| f.clone()));
    let want3: Vec<Vec<u8>> = from1.iter().enumerate().filter(|(i, _)| i % 3 == 2).map(|(_, f)| f.clone()).collect();
    assert_eq!(b.vms[0].recv(), want0);
    let mut got2 = b.vms[2].recv();
    got2.sort();
    want2.sort();
    assert_eq!(got2, want2);
    assert_eq!(b.vms[3].recv(), want3, "vm3 gets vm1's floods only");
    assert!(b.vms[1].recv().is_empty());
    assert_eq!(b.drops(3, DropReason::FlowDrop), 1);
    assert_eq!(b.flows.totals(0), (20, 20 * 64));
    assert_eq!(b.flows.totals(1).0, 21);
}

#[test]
fn a_deeper_table_classifies_every_frame_of_a_burst_by_its_own_key() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    install(
        &mut b,
        &[
            "priority=10,in_port=vm0,ip,nw_dst=10.0.0.1,actions=output:vm1",
            "priority=10,in_port=vm0,ip,nw_dst=10.0.0.2,actions=output:vm2",
            "priority=20,in_port=vm1,ip,nw_dst=10.0.0.2,actions=drop",
            "priority=0,actions=drop",
        ],
    );
    // Runs of equal keys and changes between them, in one burst; 3 matches no output flow.
    let ips = [1, 1, 2, 1, 2, 2, 3, 1, 1, 1, 2, 3, 3, 2];
    let sent: Vec<Vec<u8>> = ips.iter().enumerate().map(|(i, &ip)| ipv4(mac(9), mac(0), ip, i as u32)).collect();
    for f in &sent {
        b.vms[0].guest.send(f);
    }
    // vm1's frame to .2 hits its own higher-priority drop, not vm0's output.
    b.vms[1].guest.send(&ipv4(mac(9), mac(1), 2, 99));
    b.settle(20);
    let to = |ip| sent.iter().zip(ips).filter(|&(_, i)| i == ip).map(|(f, _)| f.clone()).collect::<Vec<_>>();
    assert_eq!(b.vms[1].recv(), to(1));
    assert_eq!(b.vms[2].recv(), to(2));
    assert!(b.vms[0].recv().is_empty());
    assert_eq!(b.drops(0, DropReason::FlowDrop), 3);
    assert_eq!(b.drops(1, DropReason::FlowDrop), 1);
    let per_flow: Vec<u64> = (0..4).map(|i| b.flows.totals(i).0).collect();
    assert_eq!(per_flow, [6, 5, 1, 3]);
}

#[test]
fn malformed_headers_under_a_deep_table_drop_only_their_own_frames() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    install(
        &mut b,
        &[
            "priority=10,ip,nw_dst=10.0.0.1,actions=output:vm1",
            "priority=10,ip,nw_dst=10.0.0.0,actions=output:vm0",
            "priority=20,udp,tp_dst=7,actions=drop",
            "priority=0,actions=drop",
        ],
    );
    // vm2 sends headers that lie: cut short, IHL past the frame, version 6, total length below
    // the header or past the frame, all toward an address no flow sends anywhere.
    let mut hostile = Vec::new();
    for (i, (at, v)) in [(14, 0x4f), (14, 0x65), (16, 0), (17, 5), (16, 0xff), (14, 0x41)].into_iter().enumerate() {
        let mut f = ipv4(mac(9), mac(2), 9, i as u32);
        f[at] = v;
        hostile.push(f.clone());
        f.truncate(14 + i * 5);
        hostile.push(f);
    }
    let (mut to1, mut to0) = (Vec::new(), Vec::new());
    for round in 0..4u32 {
        for (i, f) in hostile.iter().enumerate() {
            b.vms[2].guest.send(f);
            if i % 3 == 0 {
                let a = ipv4(mac(1), mac(0), 1, round * 100 + i as u32);
                let c = ipv4(mac(0), mac(1), 0, round * 100 + i as u32);
                b.vms[0].guest.send(&a);
                b.vms[1].guest.send(&c);
                to1.push(a);
                to0.push(c);
            }
        }
        b.settle(20);
    }
    assert_eq!(b.vms[1].recv(), to1, "the honest pair's frames, intact and in order");
    assert_eq!(b.vms[0].recv(), to0);
    assert!(b.vms[2].recv().is_empty());
    let t = b.totals(2);
    assert_eq!(t.rx_packets, 4 * hostile.len() as u64, "every hostile frame taken and completed");
    assert_eq!(b.vms[2].guest.tx_pending(), 0);
    assert_eq!(b.drops(2, DropReason::FlowDrop) + b.drops(2, DropReason::Runt), 4 * hostile.len() as u64);
}

/// Port security holds for every frame of a burst, whichever way the table answers: NORMAL,
/// flows on in_port alone (which otherwise read a burst's later frames not at all), and a
/// deeper table. vm0 may send from mac(0) only; its burst alternates that with a spoofed
/// source, and only the genuine frames arrive, in order.
#[test]
fn port_security_checks_every_frame_of_a_burst_in_every_table_mode() {
    use crate::datapath::plan::PortPolicy;
    let tables: [&[&str]; 3] = [
        &[],
        &["in_port=vm0,actions=output:vm1", "priority=0,actions=drop"],
        &["ip,nw_dst=10.0.0.5,actions=output:vm1", "priority=0,actions=drop"],
    ];
    for (t, flows) in tables.iter().enumerate() {
        let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
        b.policies[0] = PortPolicy { allowed_macs: vec![crate::wire::MacAddr(mac(0))], ..Default::default() };
        b.post(0);
        b.announce(1);
        if !flows.is_empty() {
            install(&mut b, flows);
        }
        let burst: Vec<Vec<u8>> = (0..20).map(|i| ipv4(mac(1), mac(if i % 2 == 0 { 0 } else { 9 }), 5, i)).collect();
        for f in &burst {
            b.vms[0].guest.send(f);
        }
        b.settle(20);
        let want: Vec<Vec<u8>> = burst.iter().step_by(2).cloned().collect();
        let got = b.vms[1].recv();
        assert!(got == want, "table {t}: {} frames arrived, the {} genuine ones wanted", got.len(), want.len());
        assert_eq!(b.drops(0, DropReason::PortSecurity), 10, "table {t}");
    }
}

/// Port security by address, in each table mode: vm0 may send from 10.0.0.99 only (its frames'
/// source here); a burst alternating that with a spoofed source, and a gratuitous ARP claiming
/// another's address, delivers only the genuine frames, in order, and counts the rest.
#[test]
fn allowed_ips_checks_every_frame_of_a_burst_in_every_table_mode() {
    use crate::config::ips::IpPrefix;
    use crate::datapath::plan::PortPolicy;
    let tables: [&[&str]; 3] = [
        &[],
        &["in_port=vm0,actions=output:vm1", "priority=0,actions=drop"],
        &["ip,nw_dst=10.0.0.5,actions=output:vm1", "arp,actions=output:vm1", "priority=0,actions=drop"],
    ];
    for (t, flows) in tables.iter().enumerate() {
        let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
        b.policies[0] = PortPolicy { allowed_ips: vec![IpPrefix::parse("10.0.0.99").unwrap()], ..Default::default() };
        b.post(0);
        b.announce(1);
        if !flows.is_empty() {
            install(&mut b, flows);
        }
        let mut burst: Vec<Vec<u8>> = (0..20)
            .map(|i| {
                let mut f = ipv4(mac(1), mac(0), 5, i);
                if i % 2 == 1 {
                    f[29] = 98;
                }
                // Longer than the front NORMAL copies: the check reads deeper itself.
                if i % 4 >= 2 {
                    f.resize(300, 0);
                }
                f
            })
            .collect();
        // A gratuitous ARP from vm0 for 10.0.0.5 (another's), to vm1's MAC.
        let mut arp = frame(mac(1), mac(0), 60, 99);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        arp[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
        arp[22..28].copy_from_slice(&mac(0));
        arp[28..32].copy_from_slice(&[10, 0, 0, 5]);
        burst.push(arp);
        for f in &burst {
            b.vms[0].guest.send(f);
        }
        b.settle(21);
        let want: Vec<Vec<u8>> = burst[..20].iter().step_by(2).cloned().collect();
        let got = b.vms[1].recv();
        assert!(got == want, "table {t}: {} frames arrived, the {} genuine ones wanted", got.len(), want.len());
        assert_eq!(b.drops(0, DropReason::IpSpoofed), 11, "table {t}");
    }
}

/// The flows cells' traffic, frame layout by frame layout, through each table mode: every burst
/// arrives whole (a short run of `step_cycles`, so the measure below stays true).
#[test]
fn both_frame_layouts_forward_under_every_table_mode() {
    for one_desc in [false, true] {
        step_cycles(one_desc, 50);
    }
}

/// Cycles a frame of one poll-thread step, in-process (`cargo test --release --lib --
/// --ignored classify_cost --nocapture`): 32-frame bursts of 64-byte IPv4 frames from vm0 to
/// vm1, spread over 500 destination addresses, under NORMAL, two in_port flows, and 1,000
/// exact nw_dst flows (the flows cells of tools/bench_matrix.py). Frames and rings are in this
/// core's cache, so this is the data path's compute cost alone, for comparing its variants;
/// the VM-to-VM cost is in tools/bench_matrix.py. Each frame's virtio-net header in a
/// descriptor of its own (pvsgen's layout), then in the frame's (virtio-user's). With the
/// `stage-profile` feature, also the cycles a frame of each stage. Ignored: it measures (a few
/// seconds, and meaningful only in a release build); the test above runs the same path.
#[test]
#[ignore]
fn classify_cost() {
    for (round, one_desc) in [false, true, false, true].into_iter().enumerate() {
        let layout = if one_desc { "one descriptor" } else { "two descriptors" };
        for (name, per_frame, stages) in step_cycles(one_desc, 20_000) {
            println!("round {round} {layout:15} {name:8} {per_frame:6.1} cycles a frame {stages}");
        }
    }
}

/// `bursts` bursts from vm0 to vm1 under each table of `classify_cost`, each checked to arrive
/// whole; returns each table's name, the cycles a frame of a step after the first 1,000
/// bursts (0 for a shorter run), and its stage profile (empty without `stage-profile`).
fn step_cycles(one_desc: bool, bursts: usize) -> Vec<(&'static str, f64, String)> {
    let ip_frame = |i: usize| {
        let mut f = ipv4(mac(1), mac(0), 0, i as u32);
        f.truncate(64);
        f[16..18].copy_from_slice(&50u16.to_be_bytes());
        f[30..34].copy_from_slice(&[10, 253, (i / 256) as u8, (i % 256) as u8]);
        f
    };
    let frames: Vec<Vec<u8>> = (0..500).map(ip_frame).collect();
    let exact: Vec<String> = (0..500)
        .flat_map(|i| {
            [
                format!("priority=10,in_port=vm0,ip,nw_dst=10.253.{}.{},actions=output:vm1", i / 256, i % 256),
                format!("priority=10,in_port=vm1,ip,nw_dst=10.253.{}.{},actions=output:vm0", i / 256, i % 256),
            ]
        })
        .chain(["priority=0,actions=drop".to_string()])
        .collect();
    let tables: [(&str, Vec<String>); 3] = [
        ("normal", vec![]),
        ("in_port", vec!["in_port=vm0,actions=output:vm1".into(), "in_port=vm1,actions=output:vm0".into()]),
        ("flows1k", exact),
    ];
    let mut out = Vec::new();
    for (name, flows) in tables {
        let mut b = Bench::new(BenchCfg::default());
        b.announce(1);
        if !flows.is_empty() {
            let f: Vec<&str> = flows.iter().map(|s| s.as_str()).collect();
            install(&mut b, &f);
        }
        let (mut cycles, mut n) = (0u64, 0u64);
        for burst in 0..bursts {
            let batch: Vec<&Vec<u8>> = (0..32).map(|j| &frames[(burst * 32 + j) % frames.len()]).collect();
            if one_desc {
                b.vms[0].guest.send_all_one_desc(&batch);
            } else {
                b.vms[0].guest.send_all(&batch);
            }
            let t0 = crate::counter::cycles();
            let got = b.step();
            let t1 = crate::counter::cycles();
            let recv = b.vms[1].recv();
            if burst == 999 {
                crate::datapath::profile::take_guest_profile();
            }
            if burst >= 1000 {
                cycles += t1 - t0;
                n += got as u64;
            }
            assert_eq!(recv.len(), 32, "{name}, burst {burst}");
            assert!(recv.iter().zip(&batch).all(|(r, s)| r == *s), "{name}, burst {burst}: frames changed");
        }
        let stages = crate::datapath::profile::take_guest_profile().unwrap_or_default();
        out.push((name, cycles as f64 / n.max(1) as f64, stages));
    }
    out
}

/// A TCP/IPv4 frame to port `dport` with `opts` bytes of IPv4 options (a multiple of 4, at
/// most 40; NOPs), `len` bytes in all, optionally behind an 802.1Q tag.
fn tcp_with_options(dst: [u8; 6], src: [u8; 6], opts: usize, dport: u16, len: usize, vlan: Option<u16>) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    if let Some(v) = vlan {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let ip = f.len();
    let ihl = (20 + opts) / 4;
    let total = (len - ip) as u16;
    f.extend_from_slice(&[0x40 | ihl as u8, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend(std::iter::repeat_n(1u8, opts));
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(len, 0xab);
    f
}

/// A rule on a transport port sees that port however deep IPv4 options push it: 40 bytes of
/// options put a TCP frame's ports past the 64 bytes the switch first copies, and before
/// `tcp,tp_dst=22,actions=drop` let every such frame through. Short frames, long ones, tagged
/// ones and every option length are dropped alike; other ports still pass.
#[test]
fn a_transport_rule_sees_the_port_behind_any_ipv4_options() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(1);
    install(&mut b, &["priority=10,tcp,tp_dst=22,actions=drop", "priority=0,actions=normal"]);
    let mut blocked = 0u64;
    let mut passed = Vec::new();
    for opts in (0..=40).step_by(4) {
        for len in [100, 1000] {
            for vlan in [None, Some(7)] {
                b.vms[0].guest.send(&tcp_with_options(mac(1), mac(0), opts, 22, len, vlan));
                blocked += 1;
                let ok = tcp_with_options(mac(1), mac(0), opts, 2222, len, vlan);
                b.vms[0].guest.send(&ok);
                passed.push(ok);
            }
        }
        b.settle(10);
    }
    assert_eq!(b.vms[1].recv(), passed, "every frame to port 2222 arrives, none to 22");
    assert_eq!(b.drops(0, DropReason::FlowDrop), blocked, "each frame to port 22 dropped by the rule");
}
