//! Many vhost-user ports on one pvswitchd with two poll threads: every port forwards, and the
//! daemon's thread count is poll threads plus one control thread, whatever the port count.
//! 64 testpmd "VMs"; and 300 pvsgen VMs, whose idle queues are parked, each costing the
//! daemon a few open files and well under 256 KiB.

use crate::common;

use std::time::Instant;

use common::*;
use pvsgen::{Config, Dst, VmSpec};

/// 300 VMs (pvsgen in this process, 64-entry rings), each sending 20 frames a second to the
/// next, on two poll threads (adaptive polling, parking on): every VM gets every frame sent to
/// it; the daemon keeps 3 threads; per connected port it holds a few files and well under
/// 256 KiB; its idle queues park between frames; and the control commands answer.
#[test]
fn three_hundred_pvsgen_vms_two_poll_threads() {
    const N: usize = 300;
    // pvsgen runs in this process: its 300 VMs' files count against this process's limit.
    let Some(_g) = run_alone(&[Need::OpenFiles(pvsgen::fds_for(N))]) else { return };
    let names: Vec<String> = (0..N).map(|i| format!("vm{i}")).collect();
    let specs: Vec<PortSpec> = names.iter().map(|n| PortSpec::server(n)).collect();
    let sw = Switch::start_with("scale300", &[0, 1], &specs, "poll_mode = \"adaptive\"\n");
    let (threads0, fds0, rss0) = (sw.threads(), sw.fds(), sw.rss_kib());
    let vms: Vec<VmSpec> = (0..N)
        .map(|i| {
            let mut v = VmSpec {
                name: names[i].clone(),
                socket: sw.sock(&names[i]).into(),
                dst: Dst::Vm(names[(i + 1) % N].clone()),
                size: 64,
                rate: Some(20.0),
                driver: Default::default(),
            };
            v.driver.qsize = Some(64);
            v
        })
        .collect();
    let cfg = Config { cpus: vec![0], seconds: 4.0, qsize: 64, idle_sleep_us: 500, vms, ..Config::default() };
    let t0 = Instant::now();
    let generator = std::thread::spawn(move || pvsgen::run(&cfg));
    wait_for("every port connected", || {
        let ports = sw.ctl("ports");
        let up = ports.as_array().unwrap().iter().filter(|p| p["state"] == "connected").count();
        (up == N).then_some(())
    });
    let up = t0.elapsed();
    // Between their frames (50 ms apart), the VMs' queues park.
    let parked = wait_for("idle queues parked", || {
        let st = sw.ctl("stats");
        let parked: u64 = st["threads"].as_array().unwrap().iter().map(|t| t["parked"].as_u64().unwrap()).sum();
        (parked > N as u64 / 2).then_some(parked)
    });
    let (threads, fds, rss) = (sw.threads(), sw.fds(), sw.rss_kib());
    let t1 = Instant::now();
    let ports = sw.ctl("ports");
    let ports_took = t1.elapsed();
    assert_eq!(ports.as_array().unwrap().len(), N);
    let glob = sw.try_ctl_args("ports", &["vm1*"]).unwrap();
    assert_eq!(glob.as_array().unwrap().len(), 1 + 10 + 100, "ports vm1*: vm1, vm10..vm19, vm100..vm199");
    let rxq = sw.ctl("rxq");
    assert!(rxq.as_array().unwrap().iter().any(|q| q["parked"] == true), "rxq shows parked queues");
    let report = generator.join().unwrap().unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    for v in &report.vms {
        assert!(v.counters.sent > 0, "{} sent nothing", v.name);
        assert_eq!(v.counters.received, v.expected, "{}: received {} of {}", v.name, v.counters.received, v.expected);
        assert_eq!(v.lost, 0, "{} lost frames", v.name);
    }
    let st = sw.ctl("stats");
    let unparked: u64 =
        st["threads"].as_array().unwrap().iter().map(|t| t["parking"]["unparks_kick"].as_u64().unwrap()).sum();
    let per_port_kib = rss.saturating_sub(rss0) as f64 / N as f64;
    let per_port_fds = (fds - fds0) as f64 / N as f64;
    eprintln!(
        "{N} VMs: connected after {up:?}; threads {threads} ({threads0} before); {per_port_kib:.1} KiB and \
         {per_port_fds:.2} open files a port; {parked} queues parked at once, {unparked} brought back by a \
         kick; ports answered in {ports_took:?}"
    );
    assert_eq!((threads, threads0), (3, 3), "2 poll threads and the control thread, whatever the ports");
    assert!(per_port_kib < 256.0, "{per_port_kib:.1} KiB a port");
    assert!(per_port_fds <= 8.0, "{per_port_fds:.2} open files a port");
    assert!(unparked > 0, "no parked queue was brought back by its guest's kick");
}

#[test]
fn sixty_four_ports_two_poll_threads() {
    let Some(_g) = run_alone(TESTPMD) else { return };
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
