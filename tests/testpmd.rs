//! pvswitchd between DPDK testpmd virtio-user "VMs": exact delivery, multi-queue, reconnects.
//! Needs root, hugepages and dpdk-testpmd (scripts/install-deps.sh).

mod common;

use common::*;
use std::path::Path;

/// Two testpmd "VMs", each a virtio-user port io-forwarded to a pcap port:
/// pcap(in) -> VM A -> pvswitchd -> VM B -> pcap(out).
/// VM B starts first and announces its MAC with one broadcast frame per queue, so the switch
/// learns it and A's traffic to it is known unicast (which waits for room in B's ring rather
/// than being flooded best-effort).
struct PcapVms {
    a: Testpmd,
    b: Testpmd,
}

fn pcap_vms(dir: &Path, sw: &Switch, queues: u16, jumbo: bool) -> PcapVms {
    let q = queues;
    let list = |key: &str, name: &dyn Fn(u16) -> String| -> String {
        (0..q).map(|i| format!(",{key}={}/{}", dir.display(), name(i))).collect()
    };
    write_pcap(&dir.join("hello.pcap"), &[frame([0xff; 6], MAC_B, 64, 0xff, 0)]);
    let qs = format!("--rxq={q}");
    let qt = format!("--txq={q}");
    let cores = format!("--nb-cores={q}");
    let args = vec!["--forward-mode=io", qs.as_str(), qt.as_str(), cores.as_str()];
    // Jumbo frames: VM A sends them from 10 KiB mbufs (pcap cannot scatter); VM B receives
    // them in 2 KiB mbufs with scatter on its virtio port only, so it posts small MRG_RXBUF
    // buffers and each frame spans several (num_buffers > 1).
    let (mut args_a, mut args_b) = (args.clone(), args);
    if jumbo {
        args_a.extend(["--mbuf-size=10240", "--max-pkt-len=9018"]);
        args_b.push("--max-pkt-len=9018");
    }
    let pid = std::process::id();
    let b = Testpmd::spawn(
        &format!("pvsb{pid}"),
        &[
            format!("net_virtio_user0,path={},queues={q},queue_size=1024", sw.sock("b")),
            format!(
                "net_pcap1{}{}",
                list("rx_pcap", &|_| "hello.pcap".into()),
                list("tx_pcap", &|i| format!("out{i}.pcap"))
            ),
        ],
        &args_b,
    );
    let mut b = b;
    if jumbo {
        b.cmd("port stop all");
        b.cmd("port config 0 rx_offload scatter on");
        b.cmd("port start all");
    }
    sw.wait_running("b", q as usize);
    b.cmd("start");
    let learned = try_wait_for(|| sw.ctl("fdb").as_array().unwrap().iter().any(|e| e["port"] == "b").then_some(()));
    assert!(learned.is_some(), "the switch never learned VM B's MAC; VM B:\n{}\nswitch: {}", b.output(), sw.port("b"));
    let a = Testpmd::spawn(
        &format!("pvsa{pid}"),
        &[
            format!(
                "net_pcap0{}{}",
                list("rx_pcap", &|i| format!("in{i}.pcap")),
                list("tx_pcap", &|i| format!("junk{i}.pcap"))
            ),
            format!("net_virtio_user1,path={},queues={q},queue_size=1024", sw.sock("a")),
        ],
        &args_a,
    );
    sw.wait_running("a", q as usize);
    PcapVms { a, b }
}

fn delivery(name: &str, frame_len: usize, count: u32, queues: u16) {
    let _g = serial();
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
