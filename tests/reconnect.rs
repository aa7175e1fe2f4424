//! VMs come and go while others keep forwarding: server-mode ports (the VMM connects) and
//! client-mode ports (pvswitchd connects to a socket the VMM owns, and reconnects).

mod common;

use common::*;

/// Waits until `port`'s received-frame counter grows past `from`; returns the new value.
fn grows(sw: &Switch, port: &str, from: u64) -> u64 {
    wait_for(&format!("port {port} to forward (rx_packets past {from})"), || {
        let n = sw.counter(port, "rx_packets");
        (n > from).then_some(n)
    })
}

#[test]
fn vms_reconnect_while_others_keep_forwarding() {
    let _g = serial();
    check_prerequisites();
    let sw = Switch::start(
        "reconnect",
        &[1],
        &[
            PortSpec::server("steady1"),
            PortSpec::server("steady2"),
            PortSpec::server("s1"),
            PortSpec::server("s2"),
            PortSpec::server("c1").client(),
            PortSpec::server("c2").client(),
        ],
    );
    let pid = std::process::id();
    let mut steady = mac_loop_vm(&sw, &format!("pvst{pid}"), &["steady1", "steady2"], 1, false);
    sw.wait_running("steady1", 1);
    sw.wait_running("steady2", 1);
    steady.cmd("start tx_first");
    let mut seen = grows(&sw, "steady1", 0);

    for round in 0..3 {
        // Server mode: the VM connects, forwards, goes away, comes back.
        let mut vm = mac_loop_vm(&sw, &format!("pvs{round}{pid}"), &["s1", "s2"], 2, false);
        sw.wait_running("s1", 1);
        sw.wait_running("s2", 1);
        vm.cmd("start tx_first");
        let before = sw.counter("s1", "rx_packets");
        grows(&sw, "s1", before);
        grows(&sw, "s2", sw.counter("s2", "rx_packets"));
        vm.quit();
        wait_for("s1 to be listening again", || (sw.port("s1")["state"] == "listening").then_some(()));
        seen = grows(&sw, "steady1", seen);

        // Client mode: the VMM owns the sockets; pvswitchd connects with backoff.
        let mut vm = mac_loop_vm(&sw, &format!("pvc{round}{pid}"), &["c1", "c2"], 3, true);
        sw.wait_running("c1", 1);
        sw.wait_running("c2", 1);
        vm.cmd("start tx_first");
        grows(&sw, "c1", sw.counter("c1", "rx_packets"));
        grows(&sw, "c2", sw.counter("c2", "rx_packets"));
        vm.quit();
        wait_for("c1 to be reconnecting", || (sw.port("c1")["state"] == "connecting").then_some(()));
        seen = grows(&sw, "steady1", seen);
    }
    let p = sw.port("c1");
    assert!(p["connects"].as_u64().unwrap() >= 3, "{p}");
    let p = sw.port("s1");
    assert!(p["connects"].as_u64().unwrap() >= 3, "{p}");
    // The steady pair never lost a frame to the churn around it.
    let st = sw.port("steady1");
    for (k, v) in st["drops"].as_object().unwrap() {
        if k != "rx_ring_full" {
            assert_eq!(v.as_u64(), Some(0), "steady1 drop {k}: {st}");
        }
    }
    steady.quit();
}
