//! Fairness with the traffic generator: weighted shares follow the configured weights when the
//! poll thread is saturated, and when receive rings overflow the switch's drop counters agree
//! exactly with what the generator lost.

use crate::common;

use common::*;
use pvsgen::{Config, Dst, VmSpec};

fn vm(sw: &Switch, name: &str, dst: Dst, size: usize, rate: Option<f64>) -> VmSpec {
    VmSpec { name: name.into(), socket: sw.sock(name).into(), dst, size, rate, driver: Default::default() }
}

fn config(dir: &std::path::Path, switch_extra: &str, ports: &[(&str, &str)]) -> String {
    let mut t = format!(
        "[switch]\npoll_cores = [1]\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n{switch_extra}\n",
        dir.display()
    );
    for (name, extra) in ports {
        t += &format!("[[port]]\nname = \"{name}\"\ntype = \"vhost-user\"\nsocket = \"{name}.sock\"\n{extra}\n");
    }
    t
}

/// Three VMs with packet weights 1:2:4 send 9000-byte frames as fast as they can, each to its
/// own sink. Copying 9000 bytes per frame makes the switch the bottleneck on any machine (the
/// generator only writes a frame's first bytes), so every queue has a backlog and the shares
/// must follow the weights: ordered as them, and within 10% of 1/7, 2/7, 4/7. (With 1500-byte
/// frames a fast generator-side CPU was needed to load the switch, and the test could only
/// assert when it did.)
const JUMBO: &str = "mtu = 9000";

#[test]
fn weighted_shares_follow_weights() {
    let _g = serial();
    let dir = test_dir("fair-w");
    let big = "weight_bytes = 1073741824";
    let sw = Switch::start_config(
        dir.clone(),
        &config(
            &dir,
            "",
            &[
                ("a", &format!("weight_packets = 32\n{big}\n{JUMBO}")),
                ("b", &format!("weight_packets = 64\n{big}\n{JUMBO}")),
                ("c", &format!("weight_packets = 128\n{big}\n{JUMBO}")),
                ("sa", JUMBO),
                ("sb", JUMBO),
                ("sc", JUMBO),
            ],
        ),
    );
    let cfg = Config {
        cpus: vec![0],
        seconds: 3.0,
        qsize: 1024,
        vms: vec![
            vm(&sw, "a", Dst::Vm("sa".into()), 9000, None),
            vm(&sw, "b", Dst::Vm("sb".into()), 9000, None),
            vm(&sw, "c", Dst::Vm("sc".into()), 9000, None),
            vm(&sw, "sa", Dst::None, 64, None),
            vm(&sw, "sb", Dst::None, 64, None),
            vm(&sw, "sc", Dst::None, 64, None),
        ],
        ..Config::default()
    };
    // The poll thread's busiest second during the run (the switch samples once a second).
    let done = std::sync::atomic::AtomicBool::new(false);
    let (report, busy) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut max: f64 = 0.0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = sw.ctl("stats")["threads"][0]["last_interval"].clone();
                max = max.max(t["busy_pct"].as_f64().unwrap_or(0.0) / 100.0);
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            max
        });
        let r = pvsgen::run(&cfg);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, watcher.join().unwrap())
    });
    let report = report.unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    let sent = |n: &str| report.vms.iter().find(|v| v.name == n).unwrap().counters.sent as f64;
    let total = sent("a") + sent("b") + sent("c");
    let shares = [sent("a") / total, sent("b") / total, sent("c") / total];
    let busy = format!("poll thread {:.0}% busy in its busiest second", busy * 100.0);
    eprintln!("shares {shares:?}, {busy}");
    assert!(shares[0] < shares[1] && shares[1] < shares[2], "shares {shares:?} not ordered as weights 1:2:4 ({busy})");
    for (s, w) in shares.iter().zip([1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0]) {
        assert!((s / w - 1.0).abs() < 0.10, "shares {shares:?} vs 1/7, 2/7, 4/7 ({busy})");
    }
}

/// Two VMs flood one sink with a small ring and no retry: frames are dropped toward the sink,
/// and the switch's rx_ring_full count equals exactly the frames the generator lost; every
/// frame the senders put on their rings was taken by the switch.
#[test]
fn drop_counters_exact_when_rings_overflow() {
    let _g = serial();
    let dir = test_dir("fair-drop");
    let sw = Switch::start_config(dir.clone(), &config(&dir, "rx_retry_us = 0", &[("a", ""), ("b", ""), ("s", "")]));
    let cfg = Config {
        cpus: vec![0],
        seconds: 2.0,
        qsize: 256,
        vms: vec![
            vm(&sw, "a", Dst::Vm("s".into()), 64, None),
            vm(&sw, "b", Dst::Vm("s".into()), 64, None),
            vm(&sw, "s", Dst::None, 64, None),
        ],
        ..Config::default()
    };
    let report = pvsgen::run(&cfg).unwrap_or_else(|e| panic!("pvsgen: {e}\nswitch log:\n{}", sw.log()));
    eprint!("{}", report.table());
    let s = report.vms.iter().find(|v| v.name == "s").unwrap();
    let p = sw.port("s");
    let dropped = p["drops"]["rx_ring_full"].as_u64().unwrap();
    eprintln!("generator lost {}, switch dropped {dropped}", s.lost);
    assert_eq!(dropped, s.lost, "switch drops vs generator losses: {p}");
    assert_eq!(p["tx_packets"].as_u64().unwrap(), s.counters.rx_frames, "{p}");
    assert_eq!((s.duplicates, s.reordered), (0, 0));
    for v in report.vms.iter().filter(|v| v.name != "s") {
        let p = sw.port(&v.name);
        assert_eq!(p["rx_packets"].as_u64().unwrap(), v.counters.tx_frames, "{p}");
        assert_eq!(v.counters.tx_incomplete, 0);
    }
}
