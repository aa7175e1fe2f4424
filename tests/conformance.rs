//! Any correct frontend works, not just the ones we test with. pvsgen's drivers differ in what
//! real virtio-net drivers differ in: EVENT_IDX, INDIRECT_DESC, IN_ORDER and MRG_RXBUF
//! negotiated or not; interrupts asked for (and only then the used rings looked at) or
//! polling with interrupts suppressed; descriptor ids reused first-in-first-out, last-in or at
//! random; one to three descriptors per frame (and chained receive buffers); ring sizes from
//! 64 to 32768; frames from 60 to 9000 bytes. Every combination of the binary knobs runs at
//! once, pairs of VMs sending to each other through pvswitchd (busy and adaptive polling), and
//! every frame must arrive once, in order, with its payload intact, with IN_ORDER's order
//! kept and no interrupt missed. Backpressure instead of drops (`rx_retry_us` of a minute)
//! makes this correct at any speed.

use crate::common;

use common::*;
use pvsgen::{Config, Driver, Dst, Reuse, VmSpec};

/// Checks every VM of a report: lossless, in order, intact, conformant.
fn check(report: &pvsgen::Report, sw: &Switch) {
    for v in &report.vms {
        let c = &v.counters;
        let what = format!("{} ({})", v.name, v.dst);
        assert!(c.sent > 0, "{what}: sent nothing\n{}", sw.log());
        assert_eq!(c.tx_incomplete, 0, "{what}: TX buffers never completed");
        assert_eq!(c.received, v.expected, "{what}: received {} of {}", c.received, v.expected);
        assert_eq!((v.lost, v.duplicates, v.reordered), (0, 0, 0), "{what}: lost, duplicated, reordered");
        assert_eq!(c.corrupt, 0, "{what}: corrupt frames");
        assert_eq!(c.misordered, 0, "{what}: used entries out of order under IN_ORDER, or unknown ids");
        assert_eq!(c.missed_interrupts, 0, "{what}: work found without an interrupt");
        assert_eq!(c.foreign, 0, "{what}: frames not addressed to it");
    }
    for p in sw.ctl("ports").as_array().unwrap() {
        assert!(p["queues"].as_array().unwrap().iter().all(|q| q["error"].is_null()), "a queue broke: {p}");
    }
}

/// Driver `i` of the matrix: the five binary knobs from `i`'s bits, the others rotating.
fn driver(i: usize) -> Driver {
    let bit = |b: usize| i & (1 << b) != 0;
    Driver {
        event_idx: bit(0),
        indirect: bit(1),
        in_order: bit(2),
        mrg_rxbuf: bit(3),
        interrupts: bit(4),
        reuse: [Reuse::Lifo, Reuse::Fifo, Reuse::Random][i % 3],
        chain: [1, 2, 3][(i / 3) % 3],
        qsize: Some([64, 256, 1024][(i / 2) % 3]),
        // With MRG_RXBUF, small buffers, so big frames span several of them.
        rx_buf: bit(3).then_some([256, 1024, 2048][i % 3]),
        verify: true,
        ..Driver::default()
    }
}

fn matrix(name: &str, poll: &str) {
    let _g = serial();
    let n = 32;
    let dir = test_dir(name);
    let ports: Vec<PortSpec> = (0..n).map(|i| PortSpec::server(&format!("v{i}")).mtu(9000)).collect();
    let extra = format!("rx_retry_us = 60000000\npoll_mode = \"{poll}\"\nidle_before_sleep_us = 200");
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &ports, &extra));
    let sizes = [60, 1500, 9000, 333];
    let vms = (0..n)
        .map(|i| VmSpec {
            name: format!("v{i}"),
            socket: sw.sock(&format!("v{i}")).into(),
            // Pairs (0,1), (2,3), ...: each VM sends to its partner, whose driver differs.
            dst: Dst::Vm(format!("v{}", i ^ 1)),
            size: sizes[(i / 2) % sizes.len()],
            rate: Some(2_000.0),
            driver: driver(i),
        })
        .collect();
    let cfg = Config { cpus: vec![0], seconds: 3.0, vms, ..Config::default() };
    let report = pvsgen::run(&cfg).unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    check(&report, &sw);
}

#[test]
fn every_driver_combination_busy_polling() {
    matrix("conf-busy", "busy");
}

#[test]
fn every_driver_combination_adaptive_polling() {
    matrix("conf-adaptive", "adaptive");
}

/// The largest rings the spec allows, with small and large frames and each reuse order.
#[test]
fn rings_of_32768() {
    let _g = serial();
    let dir = test_dir("conf-32k");
    let ports: Vec<PortSpec> = (0..4).map(|i| PortSpec::server(&format!("v{i}")).mtu(9000)).collect();
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &ports, "rx_retry_us = 60000000"));
    let vm = |i: usize, size: usize, driver: Driver| VmSpec {
        name: format!("v{i}"),
        socket: sw.sock(&format!("v{i}")).into(),
        dst: Dst::Vm(format!("v{}", i ^ 1)),
        size,
        rate: Some(20_000.0),
        driver: Driver { qsize: Some(32768), verify: true, ..driver },
    };
    let mrg =
        Driver { mrg_rxbuf: true, rx_buf: Some(1024), event_idx: true, reuse: Reuse::Random, ..Driver::default() };
    let chained = Driver { chain: 3, interrupts: true, reuse: Reuse::Fifo, in_order: true, ..Driver::default() };
    let cfg = Config {
        cpus: vec![0],
        seconds: 3.0,
        vms: vec![vm(0, 60, Driver::default()), vm(1, 4000, mrg), vm(2, 1500, chained), vm(3, 60, mrg)],
        ..Config::default()
    };
    let report = pvsgen::run(&cfg).unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    check(&report, &sw);
}
