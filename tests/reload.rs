//! Live reload: `pvswitchctl reload` and SIGHUP apply a changed file to a running switch; a bad
//! file changes nothing; frames on unchanged ports keep flowing with zero loss throughout.

use crate::common;
use crate::frontend;

use common::*;
use frontend::Vm;
use pvswitch::proto::PollMode;
use std::path::Path;

fn ports_named(sw: &Switch) -> Vec<String> {
    sw.ports().into_iter().map(|p| p.name).collect()
}

fn base(dir: &Path, extra_ports: &[PortSpec], tail: &str) -> String {
    let mut ports = vec![PortSpec::server("a"), PortSpec::server("b")];
    ports.extend(extra_ports.iter().cloned());
    Switch::config_text(dir, &[1], &ports, "rx_retry_us = 60000000") + tail
}

#[test]
fn reload_adds_changes_and_removes_ports() {
    let _g = serial();
    let dir = test_dir("rl-ports");
    let sw = Switch::start_config(dir.clone(), &base(&dir, &[], ""));
    assert_eq!(ports_named(&sw), ["a", "b"]);

    sw.write_config(&base(&dir, &[PortSpec::server("c").queues(2)], ""));
    let r = sw.reload();
    assert!(r.summary.contains("1 added: c"), "{}", r.json());
    assert_eq!(ports_named(&sw), ["a", "b", "c"]);
    assert!(Path::new(&sw.sock("c")).exists());
    let c = sw.port_info("c");
    assert_eq!(c.queue_pairs, 2, "{}", c.json());

    // MTU and weights change in place: same port, same id, same socket, and the data path
    // applies them. Before: a 3000-byte frame from a is over its MTU; 100 frames made
    // available at once go in bursts of up to 32.
    let mut vm_a = Vm::connect(&sw.sock("a"));
    let mut vm_b = Vm::connect(&sw.sock("b"));
    sw.wait_running("a", 1);
    sw.wait_running("b", 1);
    vm_b.post_rx_buffers(256, 4096);
    let big = frame(MAC_B, MAC_A, 3000, 0, 0);
    vm_a.send(&big);
    wait_for("the big frame dropped", || (sw.counters("a").drops.get(DropReason::Mtu) == 1).then_some(()));
    let bursts = |sw: &Switch| sw.counters("a").rx_bursts;
    let send_100 = |vm_a: &mut Vm, vm_b: &mut Vm, seq: u32| {
        let frames: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC_B, MAC_A, 60, 1, seq + i)).collect();
        vm_a.send_all(&frames);
        let mut got = Vec::new();
        wait_for("100 frames at b", || {
            got.extend(vm_b.recv());
            (got.len() >= 100).then_some(())
        });
        vm_b.post_rx_buffers(got.len() as u16, 4096);
        assert_eq!(got, frames);
    };
    let b0 = bursts(&sw);
    send_100(&mut vm_a, &mut vm_b, 0);
    assert!(bursts(&sw) - b0 <= 10, "100 frames at once took {} bursts", bursts(&sw) - b0);

    let text = base(&dir, &[PortSpec::server("c").queues(2)], "")
        .replace("mtu = 1500", "mtu = 9000")
        .replace("name = \"a\"\n", "name = \"a\"\nweight_packets = 1\n");
    sw.write_config(&text);
    sw.reload();
    let a = sw.port_info("a");
    assert_eq!((a.mtu, a.id, a.weight_packets), (9000, 0, 1), "{}", a.json());
    assert_eq!(a.connects, 1, "the port was replaced, not changed: {}", a.json());
    // After: the big frame goes through; a visit takes one frame, so every burst is one frame.
    vm_a.send(&big);
    let got = wait_for("the big frame at b", || vm_b.recv().pop());
    assert_eq!(got, big);
    vm_b.post_rx_buffers(1, 4096);
    let b0 = bursts(&sw);
    send_100(&mut vm_a, &mut vm_b, 100);
    assert_eq!(bursts(&sw) - b0, 100, "weight_packets = 1 did not reach the data path");
    drop((vm_a, vm_b));

    // Removing c closes its socket; a new port takes the freed slot.
    sw.write_config(&base(&dir, &[], ""));
    sw.reload();
    assert_eq!(ports_named(&sw), ["a", "b"]);
    assert!(!Path::new(&sw.sock("c")).exists(), "c's socket is still there");
    sw.write_config(&base(&dir, &[PortSpec::server("d")], ""));
    sw.reload();
    assert_eq!(sw.port_info("d").id, 2);
    assert_eq!(sw.thread_stats(0).queues, ["a:0", "b:0", "d:0"]);
}

#[test]
fn bad_reload_is_rejected_and_changes_nothing() {
    let _g = serial();
    let dir = test_dir("rl-bad");
    let mut sw = Switch::start_config(dir.clone(), &base(&dir, &[], ""));
    let bad = "[[port]]\nname = \"c\"\ntype = \"vhost-user\"\nsocket = \"c.sock\"\nbogus = 1\n";
    sw.write_config(&base(&dir, &[], bad));
    let e = sw.try_reload().unwrap_err();
    assert!(e.contains("pvswitch.toml:") && e.contains("unknown field `bogus`"), "{e}");
    assert!(e.contains("running configuration unchanged"), "{e}");
    assert_eq!(ports_named(&sw), ["a", "b"]);

    // SIGHUP with the same bad file: logged, daemon alive, nothing changed.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(sw.child.id() as i32, libc::SIGHUP) };
    wait_for("SIGHUP rejection in the log", || sw.log().contains("SIGHUP: reload rejected").then_some(()));
    assert!(sw.alive());
    assert_eq!(ports_named(&sw), ["a", "b"]);

    // A good file through SIGHUP applies.
    sw.write_config(&base(&dir, &[PortSpec::server("c")], ""));
    // SAFETY: as above.
    unsafe { libc::kill(sw.child.id() as i32, libc::SIGHUP) };
    wait_for("port c after SIGHUP", || (ports_named(&sw).len() == 3).then_some(()));
}

/// Settings a running pvswitchd reads only at start (a poll thread's burst and retry time, its
/// polling mode, the metrics socket, DPDK's) are named in the reload's answer, never ignored in
/// silence; a reload that changes none of them says nothing of restarting.
#[test]
fn reload_names_the_settings_that_wait_for_a_restart() {
    let _g = serial();
    let dir = test_dir("rl-restart");
    let ports = [PortSpec::server("a"), PortSpec::server("b")];
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &ports, "rx_retry_us = 1000"));
    let r = sw.reload();
    assert!(!r.summary.contains("restart"), "nothing changed: {}", r.json());

    let changed = "rx_retry_us = 2000\nburst = 16\npoll_mode = \"adaptive\"\nmetrics_listen = \"127.0.0.1:0\"\n[dpdk]\nmbufs = 16384";
    sw.write_config(&Switch::config_text(&dir, &[1], &ports, changed));
    let r = sw.reload();
    let summary = &r.summary;
    for name in ["metrics_listen", "[dpdk] eal_args and mbufs"] {
        assert!(summary.contains(name), "{name} not named: {summary}");
    }
    assert!(summary.contains("take effect at restart"), "{summary}");
    // Applied live, so not named as waiting.
    for name in ["burst", "rx_retry_us", "polling mode"] {
        assert!(!summary.contains(name), "{name} named: {summary}");
    }
    assert!(summary.contains("poll threads retuned"), "{summary}");
    assert_eq!(ports_named(&sw), ["a", "b"]);
}

/// Each poll-thread setting a reload changes reaches the running thread (its data path, not
/// the control side's copy): burst, the polling mode and the retry time of a full ring.
#[test]
fn reload_retunes_running_poll_threads() {
    let _g = serial();
    let dir = test_dir("rl-tune");
    let text = |extra: &str| base(&dir, &[], "").replace("rx_retry_us = 60000000", extra);
    let sw = Switch::start_config(dir.clone(), &text("rx_retry_us = 60000000"));
    let mut vm_a = Vm::connect(&sw.sock("a"));
    let mut vm_b = Vm::connect(&sw.sock("b"));
    sw.wait_running("a", 1);
    sw.wait_running("b", 1);
    let thread = |sw: &Switch| sw.thread_stats(0);

    // rx_retry_us: once b's MAC is learned, a frame toward b, whose ring has no buffer,
    // waits (60 s) ...
    vm_b.send(&frame([0xff; 6], MAC_B, 60, 9, 0));
    wait_for("b's MAC learned", || sw.fdb().iter().any(|e| e.port.as_deref() == Some("b")).then_some(()));
    vm_a.send(&frame(MAC_B, MAC_A, 60, 0, 0));
    // (It stays in a's ring meanwhile: nothing counts it yet.)
    assert_eq!(sw.counters("b").drops.get(DropReason::RxRingFull), 0);
    // ... until a reload says frames wait 0 us: the thread holding it drops it at once.
    sw.write_config(&text("rx_retry_us = 0"));
    sw.reload();
    wait_for("the waiting frame dropped under the new retry time", || {
        (sw.counters("b").drops.get(DropReason::RxRingFull) == 1).then_some(())
    });

    // burst: 100 frames made available at once go in visits of at most 4.
    vm_b.post_rx_buffers(256, 4096);
    sw.write_config(&text("rx_retry_us = 60000000\nburst = 4"));
    sw.reload();
    let b0 = sw.counters("a").rx_bursts;
    let frames: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC_B, MAC_A, 60, 1, i)).collect();
    vm_a.send_all(&frames);
    let mut got = Vec::new();
    wait_for("100 frames at b", || {
        got.extend(vm_b.recv());
        (got.len() >= 100).then_some(())
    });
    assert_eq!(got, frames);
    let bursts = sw.counters("a").rx_bursts - b0;
    assert!(bursts >= 25, "100 frames in {bursts} bursts under burst = 4");

    // The polling mode: busy never sleeps; adaptive sleeps once idle; busy again wakes it.
    assert_eq!(thread(&sw).sleeps, 0);
    sw.write_config(&text("rx_retry_us = 60000000\npoll_mode = \"adaptive\"\nidle_before_sleep_us = 1000"));
    sw.reload();
    wait_for("the thread asleep", || (thread(&sw).sleeping).then_some(()));
    assert_eq!(thread(&sw).poll_mode, PollMode::Adaptive);
    sw.write_config(&text("rx_retry_us = 60000000"));
    sw.reload();
    wait_for("the thread awake", || (!thread(&sw).sleeping).then_some(()));
    let sleeps = thread(&sw).sleeps;
    // Frames still flow, and a thread told to poll busily does not sleep again.
    vm_b.post_rx_buffers(100, 4096);
    let more: Vec<Vec<u8>> = (0..50).map(|i| frame(MAC_B, MAC_A, 60, 2, i)).collect();
    vm_a.send_all(&more);
    let mut got = Vec::new();
    wait_for("50 more frames at b", || {
        got.extend(vm_b.recv());
        (got.len() >= 50).then_some(())
    });
    assert_eq!(got, more);
    let t = thread(&sw);
    assert_eq!((t.sleeps, t.poll_mode), (sleeps, PollMode::Busy), "{}", t.json());
}

/// 64-byte frames from VM A to VM B through pvswitchd while the file is reloaded again and
/// again, adding and removing another port and replacing the flow table:
/// every frame arrives, in order, and nothing is dropped.
#[test]
fn reload_under_traffic_loses_nothing() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("rl-traffic");
    let sw = Switch::start_config(dir.clone(), &base(&dir, &[], ""));
    let count: u32 = 300_000;
    let frames: Vec<Vec<u8>> = (0..count).map(|i| frame(MAC_B, MAC_A, 64, 0, i)).collect();
    write_pcap(&dir.join("in0.pcap"), &frames);
    let PcapVms { a: mut vm_a, b: mut vm_b } = pcap_vms(&dir, &sw, 1, false);
    vm_a.cmd("set fwd io retry");
    vm_a.cmd("set burst tx delay 100 retry 100000");
    vm_a.cmd("start");
    let total = count as u64;
    // Alternately: a third port and a flow table that forwards with NORMAL, or neither.
    let flows = "flows = [\"priority=10,in_port=a,actions=normal\", \"priority=10,in_port=b,actions=normal\", \"priority=5,actions=drop\"]\n";
    let configs = [format!("{flows}{}", base(&dir, &[PortSpec::server("c")], "")), base(&dir, &[], "")];
    let mut during = 0;
    let mut reloads = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        let before = sw.counters("b").tx_packets;
        sw.write_config(&configs[reloads % 2]);
        sw.reload();
        reloads += 1;
        let after = sw.counters("b").tx_packets;
        if before > 0 && after > before && after < total {
            during += 1;
        }
        if after == total {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not everything arrived: port b {}", sw.port_info("b").json());
    }
    assert!(during >= 3, "only {during} of {reloads} reloads happened while frames were flowing");
    let (sa, sb) = (vm_a.port_stats(), vm_b.port_stats());
    let got_b = try_wait_for(|| (vm_b.port_stats()[1].1 == total).then_some(()));
    assert!(got_b.is_some(), "VM B stats {sa:?} {sb:?}");
    for vm in [vm_a, vm_b] {
        vm.quit();
    }
    assert_delivered(&frames, &read_pcap(&dir.join("out0.pcap")));
    for p in ["a", "b"] {
        let p = sw.port_info(p);
        for ((k, _), v) in pvswitch::datapath::counters::DROP_REASONS.iter().zip(p.counters.drops.0) {
            assert_eq!(v, 0, "{} drop {k}", p.name);
        }
    }
}
