//! The traffic generator (tools/pvsgen, used here as a library: it is a dev-dependency, so no
//! binary path is needed) against a real pvswitchd with four VM ports: every frame arrives
//! exactly once and in order, and the switch's port counters agree exactly with the
//! generator's. Needs no hugepages and no DPDK.

use crate::common;

use common::*;
use pvsgen::{Config, Dst, VmSpec};

fn vm(sw: &Switch, name: &str, dst: Dst, size: usize, rate: f64) -> VmSpec {
    VmSpec { name: name.into(), socket: sw.sock(name).into(), dst, size, rate: Some(rate), driver: Default::default() }
}

fn four_ports(name: &str) -> Switch {
    let ports: Vec<PortSpec> = ["a", "b", "c", "d"].iter().map(|p| PortSpec::server(p)).collect();
    Switch::start(name, &[1], &ports)
}

#[test]
fn four_vms_exact_delivery_and_counters() {
    let _serial = serial();
    let sw = four_ports("pvsgen");
    // Modest rates (13.5 kpps in all, at most 6 kpps into one VM) and rings of 4096: a receive
    // ring holds 680 ms of traffic, so even when the generator's thread is descheduled for a
    // while on a busy machine (measured: stalls over 100 ms on two shared cores) no ring
    // fills, and nothing may be dropped (floods are best-effort: a full ring would miss them).
    let cfg = Config {
        cpus: vec![0],
        seconds: 2.0,
        qsize: 4096,
        vms: vec![
            vm(&sw, "a", Dst::Vm("b".into()), 64, 5_000.0),
            vm(&sw, "b", Dst::Vm("a".into()), 1500, 5_000.0),
            vm(&sw, "c", Dst::Vm("d".into()), 512, 2_500.0),
            vm(&sw, "d", Dst::Bcast, 64, 1_000.0),
        ],
        ..Config::default()
    };
    let report = pvsgen::run(&cfg).unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    let ports = sw.ctl("ports");
    for v in &report.vms {
        let c = &v.counters;
        assert!(c.sent > 0 || v.dst == "-", "{}: sent nothing", v.name);
        assert_eq!(c.tx_incomplete, 0, "{}: TX buffers never completed", v.name);
        assert_eq!(c.received, v.expected, "{}: received {} of {}", v.name, c.received, v.expected);
        assert_eq!((v.lost, v.duplicates, v.reordered), (0, 0, 0), "{}: lost, duplicated, reordered", v.name);
        assert_eq!(c.foreign, 0, "{}: frames not addressed to it", v.name);
        for f in &v.flows {
            assert_eq!(f.received, f.sent, "{} from {}", v.name, f.src);
        }
        // What the switch counted on this port: every frame the VM put on its TX ring
        // (hellos included) is rx, every frame the VM took from its RX ring is tx.
        let p = ports.as_array().unwrap().iter().find(|p| p["name"] == v.name.as_str()).unwrap();
        assert_eq!(p["rx_packets"].as_u64().unwrap(), c.tx_frames, "{}: switch rx vs generator tx", v.name);
        assert_eq!(p["tx_packets"].as_u64().unwrap(), c.rx_frames, "{}: switch tx vs generator rx", v.name);
        for (why, n) in p["drops"].as_object().unwrap() {
            assert_eq!(n.as_u64(), Some(0), "{}: switch dropped {n} ({why})", v.name);
        }
    }
    // Who gets what: a gets b's stream and d's broadcast, d gets c's, b gets a's and d's.
    let by = |n: &str| report.vms.iter().find(|v| v.name == n).unwrap();
    let sent = |n: &str| by(n).counters.sent;
    assert_eq!(by("a").expected, sent("b") + sent("d"));
    assert_eq!(by("b").expected, sent("a") + sent("d"));
    assert_eq!(by("c").expected, sent("d"));
    assert_eq!(by("d").expected, sent("c"));
    // Rate control: within 2 % of 5 kpps over the measurement.
    let r = sent("a") as f64 / report.seconds;
    assert!((r / 5_000.0 - 1.0).abs() < 0.02, "a sent at {r:.0} fps");
}

#[test]
fn pingpong_round_trips() {
    let _serial = serial();
    let sw = four_ports("pvsgen-ping");
    let cfg = Config {
        cpus: vec![0],
        seconds: 0.5,
        // The pinger's rate spaces its pings: effectively unlimited here (back to back).
        vms: vec![vm(&sw, "a", Dst::None, 64, 1e9), vm(&sw, "b", Dst::None, 64, 1.0)],
        pingpong: Some(("a".into(), "b".into())),
        ..Config::default()
    };
    let report = pvsgen::run(&cfg).unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    let p = report.vms[0].pingpong.as_ref().unwrap();
    assert!(p.rtt.samples > 100, "{p:?}");
    // Every ping but the one in flight at the end is answered (a ping answered after its
    // 100 ms timeout, when a busy machine stalled the switch, still counts as a pong).
    assert!(p.pongs == p.pings || p.pongs + 1 == p.pings, "{p:?}");
    assert!(p.rtt.samples + p.timeouts + 1 >= p.pings, "{p:?}");
    let b = &report.vms[1].counters;
    assert_eq!(b.pongs_sent, p.pongs);
}
