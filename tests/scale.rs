//! 64 vhost-user ports on one pvswitchd with two poll threads: every port forwards, and the
//! daemon's thread count is poll threads plus one control thread, whatever the port count.

mod common;

use common::*;

#[test]
fn sixty_four_ports_two_poll_threads() {
    if !require(TESTPMD) {
        return;
    }
    let _g = serial();
    let names: Vec<String> = (0..64).map(|i| format!("vm{i}")).collect();
    let specs: Vec<PortSpec> = names.iter().map(|n| PortSpec::server(n)).collect();
    let sw = Switch::start("scale", &[0, 1], &specs);
    let threads_idle = sw.threads();
    // testpmd handles at most 32 ports per process: two processes of 32 "VMs" each.
    let pid = std::process::id();
    let halves: Vec<Vec<&str>> = names.chunks(32).map(|c| c.iter().map(|s| s.as_str()).collect()).collect();
    let mut vms = Vec::new();
    for (h, ports) in halves.iter().enumerate() {
        let vm = mac_loop_vm(&sw, &format!("pvsc{h}{pid}"), ports, 0x10 + h as u8, false);
        for p in ports {
            sw.wait_running(p, 1);
        }
        vms.push(vm);
    }
    for vm in &mut vms {
        vm.cmd("start tx_first");
    }
    for n in &names {
        wait_for(&format!("port {n} to receive and send"), || {
            let p = sw.port(n);
            (p["rx_packets"].as_u64()? > 0 && p["tx_packets"].as_u64()? > 0).then_some(())
        });
    }
    let threads = sw.threads();
    let stats = sw.ctl("stats");
    let polled: usize =
        stats["threads"].as_array().unwrap().iter().map(|t| t["queues"].as_array().unwrap().len()).sum();
    assert_eq!(polled, 64, "every port's queue is polled by exactly one thread: {stats}");
    for t in stats["threads"].as_array().unwrap() {
        assert_eq!(t["queues"].as_array().unwrap().len(), 32, "round-robin placement: {t}");
    }
    // 2 poll threads + the control thread, with 64 ports connected, as with none.
    assert_eq!(threads, 3, "pvswitchd threads with 64 ports connected");
    assert_eq!(threads_idle, 3, "pvswitchd threads before any connection");
    for vm in vms {
        vm.quit();
    }
}
