//! Two real Linux guests (QEMU, TCG here) through pvswitchd: ping and iperf3 TCP both ways.
//! Linux negotiates EVENT_IDX and MRG_RXBUF, so this exercises the notification paths DPDK's
//! virtio-user does not. The guests run scripts/vm-pair.sh's jobs.

use crate::common;

use common::*;
use std::process::Command;

fn vm_pair(name: &str, specs: &[PortSpec], extra: &[&str]) {
    let Some(_g) = run_alone(QEMU) else { return };
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
        let p = sw.port_info(&s.name);
        let c = &p.counters;
        // The guests are gone now; what they negotiated is in the log.
        let feats = log.lines().find(|l| l.contains(&format!("{}: features", s.name))).unwrap_or("");
        assert!(feats.contains("EVENT_IDX") && feats.contains("MRG_RXBUF"), "{feats}\n{log}");
        assert!(c.rx_packets > 1000 && c.tx_packets > 1000, "{}", p.json());
        // Notifications honour the guest's EVENT_IDX and come at most once per used-ring
        // publish (a batch delivered, a burst of sent frames completed). (With offloads the
        // guests exchange few large frames, so "fewer interrupts than frames" no longer holds.)
        let publishes = c.tx_batches + c.rx_bursts;
        assert!(c.interrupts <= publishes, "{}", p.json());
        // Linux hands the switch TSO frames (offloads are on by default).
        assert!(c.rx_gso > 0, "no TSO frame from the guest: {}", p.json());
        assert_eq!(c.drops.get(DropReason::Malformed), 0, "{}", p.json());
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

/// How many times the guest reboots: the first reboot resets a device that was set up once,
/// the later ones one already reset (ten proved no more and cost the suite 40 s).
const BOOTS: usize = 4;

/// A guest that reboots several times in a row (the driver resets the device and re-creates its
/// rings on the same vhost-user connection each time) reaches its peer after every boot.
#[test]
fn a_linux_guest_rebooting_keeps_working() {
    let Some(_g) = run_alone(QEMU) else { return };
    let sw = Switch::start("qemu-reboot", &[1], &[PortSpec::server("vm1"), PortSpec::server("vm2")]);
    let root = env!("CARGO_MANIFEST_DIR");
    // The rebooting guest: reach the peer, say so, reboot. The peer: answer pings forever.
    let job_a = sw.dir.join("job-a.sh");
    std::fs::write(
        &job_a,
        "for i in $(seq 1 120); do ping -c 1 -W 1 10.10.0.2 >/dev/null 2>&1 && break; done\n\
         ping -c 3 -i 0.2 -W 2 10.10.0.2 && echo PVS-REBOOT-PING-OK\nsync\nreboot -f\n",
    )
    .unwrap();
    let job_b = sw.dir.join("job-b.sh");
    std::fs::write(&job_b, "while true; do sleep 1000; done\n").unwrap();
    let qemu = |name: &str, sock: &str, ip: &str, mac: &str, job: &std::path::Path, extra: &[&str]| {
        Command::new(format!("{root}/scripts/run-vm.sh"))
            .args(["--socket", &sw.sock(sock), "--name", name, "--ip", ip, "--mac", mac])
            .args(["--job", job.to_str().unwrap(), "--log", sw.dir.join(format!("{name}.log")).to_str().unwrap()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(sw.dir.join(format!("qemu-{name}.log"))).unwrap())
            .spawn()
            .expect("run scripts/run-vm.sh")
    };
    let mut vms = Qemus(vec![
        qemu("peer", "vm2", "10.10.0.2/24", "52:54:00:0b:0b:02", &job_b, &[]),
        qemu("rebooter", "vm1", "10.10.0.1/24", "52:54:00:0b:0b:01", &job_a, &["--reboot"]),
    ]);
    let log = sw.dir.join("rebooter.log");
    let mut boots = |want: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let ok = text.matches("PVS-REBOOT-PING-OK").count();
            if ok >= want {
                return;
            }
            for c in &mut vms.0 {
                if let Some(st) = c.try_wait().unwrap() {
                    panic!("QEMU exited ({st}) after {ok} good boots\n{text}\n{}", sw.log());
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{ok} of {want} boots reached the peer\n{text}\n{}",
                sw.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    boots(BOOTS);
    let p = sw.port_info("vm1");
    assert_eq!(p.connects, 1, "the guest's reboots must reuse its connection: {}", p.json());
    assert_eq!(p.counters.drops.get(DropReason::Malformed), 0, "{}", p.json());
    let setups = sw.log().matches("vm1: features").count();
    assert!(setups >= BOOTS, "the driver set the device up {setups} times in {BOOTS} boots");
    drop(vms);
}
