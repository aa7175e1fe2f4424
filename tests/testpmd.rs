//! pvswitchd between DPDK testpmd virtio-user "VMs": exact delivery, multi-queue, reconnects.
//! Needs root, hugepages and dpdk-testpmd (scripts/install-deps.sh).

mod common;

use common::*;
use std::path::Path;

/// One testpmd with four ports: pcap(in) -> virtio A -> pvswitchd -> virtio B -> pcap(out).
/// io forwarding pairs ports (0,1) and (2,3), so every frame read from `in` is sent by VM A,
/// and every frame VM B receives is written to `out`.
fn pcap_vms(dir: &Path, sw: &Switch, queues: u16, mbuf_args: &[&str]) -> Testpmd {
    let q = queues;
    let inputs: String = (0..q).map(|i| format!(",rx_pcap={}/in{i}.pcap", dir.display())).collect();
    let outputs: String = (0..q).map(|i| format!(",tx_pcap={}/out{i}.pcap", dir.display())).collect();
    let empties: String = (0..q).map(|_| format!(",rx_pcap={}/empty.pcap", dir.display())).collect();
    let junk: String = (0..q).map(|i| format!(",tx_pcap={}/junk{i}.pcap", dir.display())).collect();
    write_pcap(&dir.join("empty.pcap"), &[]);
    let vdevs = vec![
        format!("net_pcap0{inputs}{junk}"),
        format!("net_virtio_user1,path={},queues={q},queue_size=1024", sw.sock("a")),
        format!("net_virtio_user2,path={},queues={q},queue_size=1024", sw.sock("b")),
        format!("net_pcap3{empties}{outputs}"),
    ];
    let qs = format!("--rxq={q}");
    let qt = format!("--txq={q}");
    let mut args = vec!["--forward-mode=io", qs.as_str(), qt.as_str()];
    args.extend_from_slice(mbuf_args);
    Testpmd::spawn(&format!("pvs{}", std::process::id()), &vdevs, &args)
}

fn delivery(name: &str, frame_len: usize, count: u32, queues: u16) {
    let _g = serial();
    let mtu = if frame_len > 1514 { 9000 } else { 1500 };
    let sw = Switch::start(name, &[1], &[PortSpec::server("a").mtu(mtu).queues(queues), PortSpec::server("b").mtu(mtu).queues(queues)]);
    let dir = sw.dir.clone();
    let mut sent = Vec::new();
    for q in 0..queues {
        let frames: Vec<Vec<u8>> = (0..count).map(|i| frame(MAC_B, MAC_A, frame_len, q as u8, i)).collect();
        write_pcap(&dir.join(format!("in{q}.pcap")), &frames);
        sent.extend(frames);
    }
    // Jumbo frames arrive in 2 KiB mbufs: scatter makes virtio-user take MRG_RXBUF chains of
    // several buffers (num_buffers > 1) and send multi-descriptor chains.
    let jumbo: &[&str] = if frame_len > 1514 { &["--enable-scatter", "--max-pkt-len=9018"] } else { &[] };
    let mut vm = pcap_vms(&dir, &sw, queues, jumbo);
    sw.wait_running("a", queues as usize);
    sw.wait_running("b", queues as usize);
    vm.cmd("set fwd io retry");
    vm.cmd("start");
    let total = count as u64 * queues as u64;
    // Frames VM A managed to hand to its TX ring (testpmd drops the rest itself if the
    // switch is slower than the pcap reader) must all come out of VM B.
    wait_for("testpmd to read every input frame", || {
        let s = vm.port_stats();
        (s.first()?.0 == total).then_some(())
    });
    let sent_by_a = wait_for("VM A's transmit count to settle", || {
        let s = vm.port_stats();
        assert!(s.len() >= 4, "stats: {s:?}\n{}", vm.output());
        let a = s[1].1;
        let b = vm.port_stats()[1].1;
        (a == b).then_some(a)
    });
    let mut last = String::new();
    let done = try_wait_for(|| {
        let tx = sw.counter("b", "tx_packets");
        let s = vm.port_stats();
        last = format!("sent by A {sent_by_a}, switch tx to B {tx}, testpmd stats {s:?}, port a {}, port b {}", sw.port("a"), sw.port("b"));
        (tx == sent_by_a && s[3].1 == tx).then_some(())
    });
    assert!(done.is_some(), "VM B did not receive what A sent: {last}");
    let out = vm.quit();
    assert!(out.contains("Bye"), "testpmd did not exit cleanly:\n{out}");
    let mut got = Vec::new();
    for q in 0..queues {
        got.extend(read_pcap(&dir.join(format!("out{q}.pcap"))));
    }
    assert_eq!(sent_by_a, total, "testpmd itself dropped frames before they reached the switch");
    assert_delivered(&sent, &got);
    let a = sw.port("a");
    let b = sw.port("b");
    assert_eq!(a["rx_packets"].as_u64(), Some(total), "{a}");
    assert_eq!(a["rx_bytes"].as_u64(), Some(total * frame_len as u64));
    assert_eq!(b["tx_packets"].as_u64(), Some(total), "{b}");
    assert_eq!(b["tx_bytes"].as_u64(), Some(total * frame_len as u64));
    for p in [&a, &b] {
        for (k, v) in p["drops"].as_object().unwrap() {
            assert_eq!(v.as_u64(), Some(0), "{} drop {k}", p["name"]);
        }
    }
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
