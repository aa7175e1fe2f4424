//! VMs come and go while others keep forwarding: server-mode ports (the VMM connects) and
//! client-mode ports (pvswitchd connects to a socket the VMM owns, and reconnects).

use crate::common;
use crate::frontend;

use common::*;

/// Waits until `port`'s received-frame counter grows past `from`; returns the new value.
fn grows(sw: &Switch, port: &str, from: u64) -> u64 {
    wait_for(&format!("port {port} to forward (rx_packets past {from})"), || {
        let n = sw.counters(port).rx_packets;
        (n > from).then_some(n)
    })
}

#[test]
fn vms_reconnect_while_others_keep_forwarding() {
    let Some(_g) = run_alone(TESTPMD) else { return };
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
        let before = sw.counters("s1").rx_packets;
        grows(&sw, "s1", before);
        grows(&sw, "s2", sw.counters("s2").rx_packets);
        vm.quit();
        wait_for("s1 to be listening again", || (sw.port_info("s1").state == "listening").then_some(()));
        seen = grows(&sw, "steady1", seen);

        // Client mode: the VMM owns the sockets; pvswitchd connects with backoff.
        let mut vm = mac_loop_vm(&sw, &format!("pvc{round}{pid}"), &["c1", "c2"], 3, true);
        sw.wait_running("c1", 1);
        sw.wait_running("c2", 1);
        vm.cmd("start tx_first");
        grows(&sw, "c1", sw.counters("c1").rx_packets);
        grows(&sw, "c2", sw.counters("c2").rx_packets);
        vm.quit();
        wait_for("c1 to be reconnecting", || (sw.port_info("c1").state == "connecting").then_some(()));
        seen = grows(&sw, "steady1", seen);
    }
    let p = sw.port_info("c1");
    assert!(p.connects >= 3, "{}", p.json());
    let p = sw.port_info("s1");
    assert!(p.connects >= 3, "{}", p.json());
    // The steady pair never lost a frame to the churn around it.
    let st = sw.port_info("steady1");
    for ((k, _), v) in pvswitch::datapath::counters::DROP_REASONS.iter().zip(st.counters.drops.0) {
        if *k != "rx_ring_full" {
            assert_eq!(v, 0, "steady1 drop {k}: {}", st.json());
        }
    }
    steady.quit();
}

/// One frontend's life on a port: set up, traffic both ways with the peer (every frame
/// arrives), GET_VRING_BASE (the switch reports where the rings stand: every frame sent
/// consumed), close.
fn cycle(vm: &mut frontend::Vm, peer: &mut frontend::Vm, i: u32) {
    use common::vms::{MAC_C, RX_BUF, recv_n};
    vm.post_rx_buffers(8, RX_BUF);
    let out: Vec<Vec<u8>> = (0..4).map(|k| frame(MAC_B, MAC_C, 64 + k * 100, 3, 4 * i + k as u32)).collect();
    for f in &out {
        vm.send(f);
    }
    assert_eq!(recv_n(peer, out.len()), out, "cycle {i}: frames from the new connection");
    let back: Vec<Vec<u8>> = (0..4).map(|k| frame(MAC_C, MAC_B, 80 + k * 50, 4, 4 * i + k as u32)).collect();
    for f in &back {
        peer.send(f);
    }
    assert_eq!(recv_n(vm, back.len()), back, "cycle {i}: frames to the new connection");
    let (_, tx_base) = vm.stop().unwrap_or_else(|e| panic!("cycle {i}: GET_VRING_BASE: {e}"));
    assert_eq!(tx_base, vm.raw_tx().avail_idx(), "cycle {i}: the switch has not consumed every frame sent");
}

/// A peer VM with MAC_B on port `name`, its MAC announced.
fn peer(sw: &Switch, name: &str) -> frontend::Vm {
    let mut p = frontend::Vm::connect(&sw.sock(name));
    p.post_rx_buffers(128, common::vms::RX_BUF);
    p.send(&frame([0xff; 6], MAC_B, 60, 9, 0));
    sw.wait_running(name, 1);
    p
}

/// 1000 frontends one after another on one server-mode port, each set up, used and closed:
/// every one works, none inherits anything from the one before.
#[test]
fn a_thousand_reconnects_server_mode() {
    let _g = serial();
    let sw = Switch::start("reconnect-1000s", &[1], &[PortSpec::server("peer"), PortSpec::server("vm")]);
    let mut p = peer(&sw, "peer");
    for i in 0..1000 {
        let mut vm = frontend::Vm::try_connect(&sw.sock("vm"), [frontend::RX_RING, frontend::TX_RING])
            .unwrap_or_else(|e| panic!("cycle {i}: setup: {e}\n{}", sw.log()));
        cycle(&mut vm, &mut p, i);
    }
    assert_eq!(sw.port_info("vm").connects, 1000);
    let vm = sw.port_info("vm");
    assert!(vm.counters.drops.0.iter().all(|v| *v == 0), "{}", vm.json());
    // What a frontend makes the log say is within its port's budget (20 lines, then one a
    // second), the rest counted: 1000 reconnects of about five lines each would be 5000.
    let lines = sw.log().lines().filter(|l| l.contains("port vm:") || l.contains(" vm: ")).count();
    let suppressed = sw.port_info("vm").log_lines_suppressed;
    eprintln!("{lines} log lines about vm, {suppressed} suppressed");
    assert!(lines < 200 && suppressed > 3000, "{lines} lines, {suppressed} suppressed");
}

/// The same with a client-mode port: the "VMM" listens, pvswitchd connects, the VMM closes
/// after each cycle and pvswitchd connects again.
#[test]
fn a_thousand_reconnects_client_mode() {
    let _g = serial();
    let dir = test_dir("reconnect-1000c");
    let ports = [PortSpec::server("peer"), PortSpec::server("vm").client()];
    let vmm = std::os::unix::net::UnixListener::bind(dir.join("vm.sock")).unwrap();
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &ports, ""));
    let mut p = peer(&sw, "peer");
    vmm.set_nonblocking(true).unwrap();
    for i in 0..1000 {
        let (s, _) = wait_for("pvswitchd to connect", || vmm.accept().ok());
        s.set_nonblocking(false).unwrap();
        let mut vm = frontend::Vm::on_stream(s).unwrap_or_else(|e| panic!("cycle {i}: setup: {e}\n{}", sw.log()));
        cycle(&mut vm, &mut p, i);
    }
    // pvswitchd is connected again already (or about to be): at least one per cycle.
    let vm = sw.port_info("vm");
    assert!(vm.connects >= 1000, "{}", vm.json());
}
