//! Two real Linux guests (QEMU, TCG here) through pvswitchd: ping and iperf3 TCP both ways.
//! Linux negotiates EVENT_IDX and MRG_RXBUF, so this exercises the notification paths DPDK's
//! virtio-user does not. The guests run scripts/vm-pair.sh's jobs.

mod common;

use common::*;
use std::process::Command;

fn vm_pair(name: &str, specs: &[PortSpec], extra: &[&str]) {
    let _g = serial();
    let sw = Switch::start(name, &[1], specs);
    let root = env!("CARGO_MANIFEST_DIR");
    let logdir = sw.dir.join("vm-pair");
    let out = Command::new(format!("{root}/scripts/vm-pair.sh"))
        .arg(sw.sock(&specs[0].name))
        .arg(sw.sock(&specs[1].name))
        .args(["--logdir", logdir.to_str().unwrap()])
        .args(extra)
        .output()
        .expect("run scripts/vm-pair.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    assert!(out.status.success(), "vm-pair failed:\n{text}\npvswitchd log:\n{}", sw.log());
    let log = sw.log();
    for s in specs {
        let p = sw.port(&s.name);
        // The guests are gone now; what they negotiated is in the log.
        let feats = log.lines().find(|l| l.contains(&format!("{}: features", s.name))).unwrap_or("");
        assert!(feats.contains("EVENT_IDX") && feats.contains("MRG_RXBUF"), "{feats}\n{log}");
        assert!(p["rx_packets"].as_u64().unwrap() > 1000 && p["tx_packets"].as_u64().unwrap() > 1000, "{p}");
        // Notifications are batched and honour the guest's EVENT_IDX: far fewer
        // interrupts than frames.
        assert!(p["interrupts"].as_u64().unwrap() < p["tx_packets"].as_u64().unwrap(), "{p}");
        assert_eq!(p["drops"]["malformed"], 0, "{p}");
    }
}

#[test]
fn two_linux_guests_ping_and_iperf3() {
    vm_pair("qemu", &[PortSpec::server("vm1"), PortSpec::server("vm2")], &[]);
}

#[test]
fn two_linux_guests_jumbo_frames() {
    vm_pair(
        "qemu-jumbo",
        &[PortSpec::server("vm1").mtu(9000), PortSpec::server("vm2").mtu(9000)],
        &["--mtu", "9000", "--pings", "5", "--iperf-time", "3"],
    );
}

#[test]
fn two_linux_guests_switch_as_client() {
    vm_pair(
        "qemu-client",
        &[PortSpec::server("vm1").client(), PortSpec::server("vm2").client()],
        &["--vhost-server", "--pings", "5", "--iperf-time", "3"],
    );
}
