//! Live queue moves: hundreds of moves and rebalances between two poll threads while frames
//! flow; nothing is lost, duplicated or reordered within a queue.

use crate::common;

use common::*;
use pvswitch::proto::MoveReply;

/// Two sequence-numbered streams of `count` frames, one per queue of VM A, toward VM B (both
/// testpmd, through pcap files), started: returns the VMs and every frame sent.
fn two_streams(sw: &Switch, count: u32, len: impl Fn(u32) -> usize) -> (PcapVms, Vec<Vec<u8>>) {
    let mut sent = Vec::new();
    for q in 0..2u8 {
        let frames: Vec<Vec<u8>> = (0..count).map(|i| frame(MAC_B, MAC_A, len(i), q, i)).collect();
        write_pcap(&sw.dir.join(format!("in{q}.pcap")), &frames);
        sent.extend(frames);
    }
    let mut vms = pcap_vms(&sw.dir, sw, 2, false);
    vms.a.cmd("set fwd io retry");
    vms.a.cmd("set burst tx delay 100 retry 100000");
    vms.a.cmd("start");
    (vms, sent)
}

/// Waits for VM B to have everything, stops both VMs and checks that per stream (= per sending
/// queue) every frame arrived once, in order.
fn check_streams(sw: &Switch, vms: PcapVms, sent: &[Vec<u8>]) {
    let PcapVms { a: vm_a, b: mut vm_b } = vms;
    let total = sent.len() as u64;
    wait_for("VM B got everything", || (vm_b.port_stats()[1].1 == total).then_some(()));
    vm_a.quit();
    vm_b.quit();
    let mut got = Vec::new();
    for q in 0..2 {
        got.extend(read_pcap(&sw.dir.join(format!("out{q}.pcap"))));
    }
    assert_delivered(sent, &got);
}

#[test]
fn hundreds_of_moves_while_frames_flow() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let sw = Switch::start_with(
        "moves",
        &[0, 1],
        &[PortSpec::server("a").queues(2), PortSpec::server("b").queues(2)],
        "rx_retry_us = 60000000",
    );
    let (vms, sent) = two_streams(&sw, 250_000, |i| 64 + (i % 3) as usize * 32);
    let total = sent.len() as u64;
    let (mut moves, mut during) = (0u32, 0u32);
    let mut before = 0;
    loop {
        let r = match moves % 4 {
            0 => sw.try_ctl_args("move", &["a:0", &((moves / 4) % 2).to_string()]),
            1 => sw.try_ctl_args("move", &["a:1", &((moves / 4) % 2).to_string()]),
            2 => sw.try_ctl_args("rebalance", &["roundrobin"]),
            _ => sw.try_ctl_args("rebalance", &["group"]),
        };
        r.unwrap_or_else(|e| panic!("move {moves}: {e}"));
        moves += 1;
        let after = sw.counters("b").tx_packets;
        if before > 0 && after < total {
            during += 1;
        }
        before = after;
        if after == total && moves >= 200 {
            break;
        }
        assert!(moves < 100_000, "traffic does not finish: b {}", sw.port_info("b").json());
    }
    assert!(during >= 100, "only {during} of {moves} moves and rebalances happened while frames were flowing");
    check_streams(&sw, vms, &sent);
    for p in ["a", "b"] {
        let p = sw.port_info(p);
        for ((k, _), v) in pvswitch::datapath::counters::DROP_REASONS.iter().zip(p.counters.drops.0) {
            assert_eq!(v, 0, "{} drop {k}", p.name);
        }
    }
    // The per-queue counters followed the queues across threads.
    let rxq = sw.rxq();
    let from_a: u64 = rxq.iter().filter(|q| q.port == "a").map(|q| q.counters.packets).sum();
    assert_eq!(from_a, total, "{}", rxq.json());
}

#[test]
fn bad_move_requests_get_errors() {
    let _g = serial();
    let sw = Switch::start("badmove", &[0, 1], &[PortSpec::server("a")]);
    for args in [&["a:0"][..], &["a:0", "7"], &["zz:0", "1"], &["a:5", "1"], &["a", "1"], &["a:x", "1"]] {
        let e = sw.try_ctl_args("move", args).unwrap_err();
        assert!(e.contains("move"), "{args:?}: {e}");
    }
    let e = sw.try_ctl_args("rebalance", &["sideways"]).unwrap_err();
    assert!(e.contains("rebalance"), "{e}");
    let r: MoveReply = sw.ask_args("move", &["a:0", "1"]);
    assert_eq!(r.to, 1);
    assert_eq!(sw.thread_stats(1).queues, ["a:0"]);
}

/// A reload that adds a poll core starts a thread and moves queues onto it; one that removes a
/// core moves its queues away and stops its thread; frames keep flowing, all of them, in order.
#[test]
fn reload_adds_and_removes_poll_cores_under_traffic() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("cores");
    let ports = [PortSpec::server("a").queues(2), PortSpec::server("b").queues(2)];
    let cfg = |cores: &[usize]| Switch::config_text(&dir, cores, &ports, "rx_retry_us = 60000000");
    let sw = Switch::start_config(dir.clone(), &cfg(&[1]));
    let (vms, sent) = two_streams(&sw, 100_000, |_| 64);
    let total = sent.len() as u64;
    let cores_of = |sw: &Switch| -> Vec<u64> {
        let mut c: Vec<u64> = sw.stats().threads.iter().map(|t| t.core as u64).collect();
        c.sort();
        c
    };
    let mut round = 0;
    while sw.counters("b").tx_packets < total || round < 4 {
        let cores: &[usize] = if round % 2 == 0 { &[0, 1] } else { &[0] };
        sw.write_config(&cfg(cores));
        let r = sw.reload();
        assert!(r.summary.contains("poll cores"), "{}", r.json());
        assert_eq!(cores_of(&sw), cores.iter().map(|&c| c as u64).collect::<Vec<_>>());
        let polled: usize = sw.stats().threads.iter().map(|t| t.queues.len()).sum();
        assert_eq!(polled, 4, "every queue polled once");
        round += 1;
        assert!(round < 10_000, "traffic does not finish");
    }
    check_streams(&sw, vms, &sent);
    // The thread of a removed core really stopped: pvswitchd runs one poll thread + control.
    assert_eq!(sw.threads(), if round % 2 == 0 { 2 } else { 3 });
}
