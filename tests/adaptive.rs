//! Adaptive polling: a poll thread sleeps on its guests' kicks when idle, and no frame is lost
//! across sleeps; control changes reach a sleeping thread.

use crate::common;

use common::*;

fn thread_stat(sw: &Switch, field: &str) -> u64 {
    sw.ctl("stats")["threads"][0][field].as_u64().unwrap()
}

fn wakeups(sw: &Switch, kind: &str) -> u64 {
    sw.ctl("stats")["threads"][0]["wakeups"][kind].as_u64().unwrap()
}

/// VM A sends 200,000 frames to VM B, pausing several times for a random while; during each
/// pause the switch's thread goes to sleep (awaited on its counter) and the next frames must
/// wake it through the guest's kick. Every frame arrives, in order.
#[test]
fn no_frame_lost_across_sleeps() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let sw = Switch::start_with(
        "adaptive",
        &[1],
        &[PortSpec::server("a"), PortSpec::server("b")],
        "rx_retry_us = 60000000\npoll_mode = \"adaptive\"\nidle_before_sleep_us = 200",
    );
    let dir = sw.dir.clone();
    let count = 200_000u32;
    let frames: Vec<Vec<u8>> = (0..count).map(|i| frame(MAC_B, MAC_A, 64 + (i % 7) as usize * 100, 0, i)).collect();
    write_pcap(&dir.join("in0.pcap"), &frames);
    let PcapVms { a: mut vm_a, b: mut vm_b } = pcap_vms(&dir, &sw, 1, false);
    vm_a.cmd("set fwd io retry");
    vm_a.cmd("set burst tx delay 100 retry 100000");
    let total = count as u64;
    let mut x = std::process::id() as u64 | 1;
    let mut pauses = 0;
    let mut kicked_awake = 0;
    while sw.counter("b", "tx_packets") < total {
        wait_for("the poll thread to sleep", || {
            (sw.ctl("stats")["threads"][0]["sleeping"] == serde_json::json!(true)).then_some(())
        });
        let kicks = wakeups(&sw, "kick");
        vm_a.cmd("start");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(std::time::Duration::from_millis(1 + x % 10));
        vm_a.cmd("stop");
        pauses += 1;
        if wakeups(&sw, "kick") > kicks {
            kicked_awake += 1;
        }
        assert!(pauses < 1000, "traffic does not finish: b {}", sw.port("b"));
    }
    assert!(kicked_awake >= 1, "no guest kick ever woke the thread in {pauses} pauses");
    wait_for("VM B got everything", || (vm_b.port_stats()[1].1 == total).then_some(()));
    vm_a.quit();
    vm_b.quit();
    assert_delivered(&frames, &read_pcap(&dir.join("out0.pcap")));
    let b = sw.port("b");
    for (k, v) in b["drops"].as_object().unwrap() {
        assert_eq!(v.as_u64(), Some(0), "b drop {k}");
    }
}

/// A sleeping thread adopts a new plan at once: the reload that adds a port returns without the
/// control thread's adoption timeout, and the wake-up is counted as a control wake-up.
#[test]
fn control_change_reaches_a_sleeping_thread() {
    let _g = serial();
    let dir = test_dir("adaptive-ctl");
    let extra = "poll_mode = \"adaptive\"\nidle_before_sleep_us = 100";
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &[PortSpec::server("a")], extra));
    wait_for("the poll thread to sleep", || (thread_stat(&sw, "sleeps") > 0).then_some(()));
    let control = wakeups(&sw, "control");
    sw.write_config(&Switch::config_text(&dir, &[1], &[PortSpec::server("a"), PortSpec::server("b")], extra));
    sw.ctl("reload");
    assert!(wakeups(&sw, "control") > control);
    assert!(!sw.log().contains("has not adopted"), "{}", sw.log());
    let queues = sw.ctl("stats")["threads"][0]["queues"].clone();
    assert_eq!(queues, serde_json::json!(["a:0", "b:0"]));
    let st = sw.ctl("stats")["threads"][0].clone();
    assert_eq!(st["poll_mode"], "adaptive");
    let hist: u64 = st["wake_latency_us"].as_array().unwrap().iter().map(|b| b["count"].as_u64().unwrap()).sum();
    assert!(hist > 0, "{st}");
}
