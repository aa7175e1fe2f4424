//! pvswitchd between DPDK testpmd virtio-user "VMs": exact delivery, multi-queue, reconnects.
//! Needs root, hugepages and dpdk-testpmd (scripts/install-deps.sh).

use crate::common;

use common::*;

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
        let tx = sw.counter("b", "tx_packets");
        last = format!("VM A stats {sa:?}, VM B stats {sb:?}, switch tx to B {tx}");
        (sa[0].0 == total && sa[1].1 == total && tx == total && sb[1].1 == total).then_some(())
    });
    assert!(done.is_some(), "not everything arrived: {last}\nport a {}\nport b {}", sw.port("a"), sw.port("b"));
    for vm in [vm_a, vm_b] {
        let out = vm.quit();
        assert!(out.contains("Bye"), "testpmd did not exit cleanly:\n{out}");
    }
    let mut got = Vec::new();
    for q in 0..queues {
        got.extend(read_pcap(&dir.join(format!("out{q}.pcap"))));
    }
    assert_delivered(&sent, &got);
    let a = sw.port("a");
    let b = sw.port("b");
    assert_eq!(a["rx_packets"].as_u64(), Some(total), "{a}");
    assert_eq!(a["rx_bytes"].as_u64(), Some(total * frame_len as u64));
    // B's hello was flooded before A connected: a flood to a port that is down reaches
    // nobody and is not counted as a drop.
    assert_eq!(a["tx_packets"].as_u64(), Some(0), "{a}");
    assert_eq!(b["rx_packets"].as_u64(), Some(hellos), "{b}");
    assert_eq!(b["tx_packets"].as_u64(), Some(total), "{b}");
    assert_eq!(b["tx_bytes"].as_u64(), Some(total * frame_len as u64));
    for p in [&a, &b] {
        for (k, v) in p["drops"].as_object().unwrap() {
            assert_eq!(v.as_u64(), Some(0), "{} drop {k}", p["name"]);
        }
    }
    // The poll thread's own counters, and each receive queue's, agree with the ports'.
    let st = sw.ctl("stats");
    let th = &st["threads"][0];
    assert_eq!(th["rx_packets"].as_u64(), Some(total + hellos), "{th}");
    assert_eq!(th["tx_packets"].as_u64(), Some(total), "{th}");
    assert_eq!(th["tx_bytes"].as_u64(), Some(total * frame_len as u64), "{th}");
    let rxq = sw.ctl("rxq");
    let from_a: u64 =
        rxq.as_array().unwrap().iter().filter(|q| q["port"] == "a").map(|q| q["packets"].as_u64().unwrap()).sum();
    assert_eq!(from_a, total, "{rxq}");
    let per_queue: u64 = a["queues"].as_array().unwrap().iter().filter_map(|q| q["rx_packets"].as_u64()).sum();
    assert_eq!(per_queue, total, "{a}");
    // stats --clear restarts what stats shows; ports keep their totals.
    sw.try_ctl_args("stats", &["--clear"]).unwrap();
    let th = sw.ctl("stats")["threads"][0].clone();
    assert_eq!((th["rx_packets"].as_u64(), th["tx_packets"].as_u64()), (Some(0), Some(0)), "{th}");
    assert_eq!(sw.counter("a", "rx_packets"), total);
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
