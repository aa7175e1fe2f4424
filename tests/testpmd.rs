//! pvswitchd between DPDK testpmd virtio-user "VMs": exact delivery, multi-queue, reconnects.
//! Needs root, hugepages and dpdk-testpmd (scripts/install-deps.sh).

use crate::common;

use common::*;
use pvswitch::proto::{Cleared, Request};

fn delivery(name: &str, frame_len: usize, count: u32, queues: u16) {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let mtu = if frame_len > 1514 { 9000 } else { 1500 };
    // Frames wait for room in B's ring as long as it takes (backpressure, no loss): the test
    // must hold at any speed.
    let sw = Switch::start_with(
        name,
        &[1],
        &[PortSpec::server("a").mtu(mtu).queues(queues), PortSpec::server("b").mtu(mtu).queues(queues)],
        "rx_retry_us = 60000000",
    );
    let dir = sw.dir.clone();
    let mut sent = Vec::new();
    for q in 0..queues {
        let frames: Vec<Vec<u8>> = (0..count).map(|i| frame(MAC_B, MAC_A, frame_len, q as u8, i)).collect();
        write_pcap(&dir.join(format!("in{q}.pcap")), &frames);
        sent.extend(frames);
    }
    let PcapVms { a: mut vm_a, b: mut vm_b } = pcap_vms(&dir, &sw, queues, frame_len > 1514);
    // testpmd retries its own transmit to VM A for up to 10 s rather than dropping.
    vm_a.cmd("set fwd io retry");
    vm_a.cmd("set burst tx delay 100 retry 100000");
    vm_a.cmd("start");
    let total = count as u64 * queues as u64;
    let hellos = queues as u64;
    let mut last = String::new();
    let done = try_wait_for(|| {
        let (sa, sb) = (vm_a.port_stats(), vm_b.port_stats());
        let tx = sw.counters("b").tx_packets;
        last = format!("VM A stats {sa:?}, VM B stats {sb:?}, switch tx to B {tx}");
        (sa[0].0 == total && sa[1].1 == total && tx == total && sb[1].1 == total).then_some(())
    });
    assert!(
        done.is_some(),
        "not everything arrived: {last}\nport a {}\nport b {}",
        sw.port_info("a").json(),
        sw.port_info("b").json()
    );
    for vm in [vm_a, vm_b] {
        let out = vm.quit();
        assert!(out.contains("Bye"), "testpmd did not exit cleanly:\n{out}");
    }
    let mut got = Vec::new();
    for q in 0..queues {
        got.extend(read_pcap(&dir.join(format!("out{q}.pcap"))));
    }
    assert_delivered(&sent, &got);
    let a = sw.port_info("a");
    let b = sw.port_info("b");
    assert_eq!(a.counters.rx_packets, total, "{}", a.json());
    assert_eq!(a.counters.rx_bytes, total * frame_len as u64);
    // B's hello was flooded before A connected: a flood to a port that is down reaches
    // nobody and is not counted as a drop.
    assert_eq!(a.counters.tx_packets, 0, "{}", a.json());
    assert_eq!(b.counters.rx_packets, hellos, "{}", b.json());
    assert_eq!(b.counters.tx_packets, total, "{}", b.json());
    assert_eq!(b.counters.tx_bytes, total * frame_len as u64);
    for p in [&a, &b] {
        for ((k, _), v) in pvswitch::datapath::counters::DROP_REASONS.iter().zip(p.counters.drops.0) {
            assert_eq!(v, 0, "{} drop {k}", p.name);
        }
    }
    // The poll thread's own counters, and each receive queue's, agree with the ports'.
    let th = sw.thread_stats(0);
    assert_eq!(th.rx_packets, total + hellos, "{}", th.json());
    assert_eq!(th.tx_packets, total, "{}", th.json());
    assert_eq!(th.tx_bytes, total * frame_len as u64, "{}", th.json());
    let rxq = sw.rxq();
    let from_a: u64 = rxq.iter().filter(|q| q.port == "a").map(|q| q.counters.packets).sum();
    assert_eq!(from_a, total, "{}", rxq.json());
    let per_queue: u64 = a.queues.iter().filter_map(|q| q.rx_packets).sum();
    assert_eq!(per_queue, total, "{}", a.json());
    // stats --clear restarts what stats shows; ports keep their totals.
    let _: Cleared = sw.ask(&Request::Stats { clear: true });
    let th = sw.thread_stats(0);
    assert_eq!((th.rx_packets, th.tx_packets), (0, 0), "{}", th.json());
    assert_eq!(sw.counters("a").rx_packets, total);
}

#[test]
fn delivers_64_byte_frames_intact() {
    delivery("d64", 64, 20_000, 1);
}

#[test]
fn delivers_1500_byte_frames_intact() {
    delivery("d1500", 1500, 5_000, 1);
}

#[test]
fn delivers_9000_byte_frames_intact_over_merged_buffers() {
    delivery("d9000", 9000, 2_000, 1);
}

#[test]
fn delivers_over_two_queue_pairs() {
    delivery("mq", 64, 10_000, 2);
}
