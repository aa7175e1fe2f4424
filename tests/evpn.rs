//! EVPN between two "hosts" on one machine, with an unmodified FRR: each host is a pvswitchd
//! (adaptive polling, a VTEP on a veth underlay through net_af_packet) plus a network
//! namespace running FRR's zebra and bgpd (`advertise-all-vni`) and `pvs-evpn`. The two FRRs
//! peer over a veth of their own. Nothing about the other host is configured in either
//! pvswitchd: the remote VTEP, its flood list and its VMs' MACs all come from BGP.
//! Needs root, hugepages, dpdk-testpmd, ip, bridge and FRR (scripts/install-deps.sh).
#![cfg(feature = "dpdk")]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const NEEDS: &[Need] = &[
    Need::Root,
    Need::Cmd("ip"),
    Need::Cmd("bridge"),
    Need::Cmd("vtysh"),
    Need::Cmd("/usr/lib/frr/zebra"),
    Need::Cmd("/usr/lib/frr/bgpd"),
];

const MAC_A: &str = "02:00:00:00:0a:01";
const MAC_B: &str = "02:00:00:00:0a:02";
const MAC_B20: &str = "02:00:00:00:14:02";

fn sh(args: &[&str]) -> String {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// One host's control plane: a network namespace with FRR and pvs-evpn.
struct Frr {
    ns: String,
    evpn: Option<Child>,
}

impl Frr {
    fn new(ns: &str) -> Frr {
        let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
        sh(&["ip", "netns", "add", ns]);
        let f = Frr { ns: ns.to_string(), evpn: None };
        f.ex(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]);
        f.ex(&["ip", "link", "set", "lo", "up"]);
        f
    }

    fn ex(&self, args: &[&str]) -> String {
        sh(&[&["ip", "netns", "exec", &self.ns], args].concat())
    }

    /// Starts zebra and bgpd in the namespace, peering from `me` with `peer` (iBGP, AS 65000).
    fn start(&self, me: &str, peer: &str, logs: &std::path::Path) {
        let (etc, run) = (format!("/etc/frr/{}", self.ns), format!("/var/run/frr/{}", self.ns));
        sh(&["install", "-d", "-o", "frr", "-g", "frr", "-m", "0750", &etc]);
        sh(&["install", "-d", "-o", "frr", "-g", "frr", "-m", "0755", &run]);
        std::fs::write(
            format!("{etc}/frr.conf"),
            format!(
                "frr defaults datacenter\nrouter bgp 65000\n bgp router-id {me}\n no bgp default ipv4-unicast\n \
                 neighbor {peer} remote-as internal\n neighbor {peer} timers connect 1\n address-family l2vpn evpn\n  \
                 neighbor {peer} activate\n  advertise-all-vni\n exit-address-family\n"
            ),
        )
        .unwrap();
        std::fs::write(format!("{etc}/vtysh.conf"), "service integrated-vtysh-config\n").unwrap();
        sh(&["chown", "-R", "frr:frr", &etc]);
        sh(&["chown", "frr:frr", logs.to_str().unwrap()]);
        for d in ["zebra", "bgpd"] {
            let log = format!("file:{}/{}-{d}.log", logs.display(), self.ns);
            self.ex(&[&format!("/usr/lib/frr/{d}"), "-d", "-N", &self.ns, "-P", "0", "--log", &log]);
        }
        sh(&["vtysh", "-N", &self.ns, "-b"]);
    }

    /// Stops zebra and bgpd (each removes what it installed) and waits until they are gone.
    fn stop_daemons(&self) {
        for d in ["bgpd", "zebra"] {
            let Ok(pid) = std::fs::read_to_string(format!("/var/run/frr/{}/{d}.pid", self.ns)) else { continue };
            let pid = pid.trim().to_string();
            let _ = Command::new("kill").arg(&pid).status();
            wait_for(&format!("{d} to exit"), || {
                (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
            });
        }
    }

    fn vtysh(&self, cmd: &str) -> String {
        sh(&["vtysh", "-N", &self.ns, "-c", cmd])
    }

    /// Runs pvs-evpn in the namespace against `sw`.
    fn companion(&mut self, sw: &Switch, log: &std::path::Path) {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, env!("CARGO_BIN_EXE_pvs-evpn"), "--ctl"])
            .arg(sw.dir.join("ctl.sock"))
            .args(["--interval-ms", "100"])
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn pvs-evpn");
        self.evpn = Some(child);
    }
}

impl Drop for Frr {
    fn drop(&mut self) {
        if let Some(mut c) = self.evpn.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for d in ["bgpd", "zebra"] {
            if let Ok(pid) = std::fs::read_to_string(format!("/var/run/frr/{}/{d}.pid", self.ns)) {
                let _ = Command::new("kill").arg(pid.trim()).status();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{}", self.ns));
        let _ = std::fs::remove_dir_all(format!("/var/run/frr/{}", self.ns));
    }
}

struct Links(Vec<String>);

impl Drop for Links {
    fn drop(&mut self) {
        for l in &self.0 {
            let _ = Command::new("ip").args(["link", "del", l]).stderr(Stdio::null()).status();
        }
    }
}

fn config(dir: &std::path::Path, local: &str, underlay: &str, ports: &[(&str, u16, &str)]) -> String {
    let mut c = format!(
        "[switch]\npoll_cores = [1]\npoll_mode = \"adaptive\"\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n",
        dir.display()
    );
    for (name, tag, mac) in ports {
        c += &format!(
            "[[port]]\nname = \"{name}\"\ntype = \"vhost-user\"\nsocket = \"{name}.sock\"\ntag = {tag}\nallowed_macs = [\"{mac}\"]\n"
        );
    }
    c += &format!(
        "[[port]]\nname = \"uplink\"\ntype = \"dpdk\"\ndevice = \"net_af_packet0,iface={underlay}\"\n\
         [[vtep]]\nname = \"vt\"\nunderlay = \"uplink\"\nlocal_ip = \"{local}/24\"\n\
         [[vtep.vni]]\nvni = 100\nvlan = 10\n[[vtep.vni]]\nvni = 200\nvlan = 20\n"
    );
    c
}

/// Where `mac` on VLAN `vlan` is in `sw`'s MAC table.
fn fdb_port(sw: &Switch, mac: &str, vlan: u64) -> Option<String> {
    let fdb = sw.ctl("fdb");
    fdb.as_array()?
        .iter()
        .find(|e| e["mac"] == mac && e["vlan"] == vlan)
        .and_then(|e| e["port"].as_str().map(String::from))
}

fn tx_to(sw: &Switch, port: &str) -> u64 {
    sw.counter(port, "tx_packets")
}

#[test]
fn frr_evpn_carries_macs_and_flood_lists_between_two_pvswitchd() {
    if !require(&[TESTPMD, NEEDS].concat()) {
        return;
    }
    let _g = serial();
    let pid = std::process::id() % 100_000;
    let (ua, ub) = (format!("pvua{pid}"), format!("pvub{pid}"));
    let links = Links(vec![ua.clone()]);
    let _ = Command::new("ip").args(["link", "del", &ua]).stderr(Stdio::null()).status();
    sh(&["ip", "link", "add", &ua, "type", "veth", "peer", "name", &ub]);
    for l in [&ua, &ub] {
        sh(&["sysctl", "-qw", &format!("net.ipv6.conf.{l}.disable_ipv6=1")]);
        sh(&["ip", "link", "set", l, "up"]);
    }
    let logs = test_dir("evpnlogs");
    let (mut h1, mut h2) = (Frr::new(&format!("pvsh1{pid}")), Frr::new(&format!("pvsh2{pid}")));
    sh(&["ip", "link", "add", "bgp0", "netns", &h1.ns, "type", "veth", "peer", "name", "bgp0", "netns", &h2.ns]);
    for (h, ip) in [(&h1, "192.168.100.1/24"), (&h2, "192.168.100.2/24")] {
        h.ex(&["ip", "addr", "add", ip, "dev", "bgp0"]);
        h.ex(&["ip", "link", "set", "bgp0", "up"]);
    }
    let (da, db) = (test_dir("evpnA"), test_dir("evpnB"));
    let a = Switch::start_config(da.clone(), &config(&da, "192.168.100.1", &ua, &[("vm10", 10, MAC_A)]));
    let mut b = Switch::start_config(
        db.clone(),
        &config(&db, "192.168.100.2", &ub, &[("vm10", 10, MAC_B), ("vm20", 20, MAC_B20)]),
    );
    // The VMs: a configured MAC is exported while its VM is connected.
    let mut vm_a = Testpmd::spawn(
        &format!("pvsea{pid}"),
        &[format!("net_virtio_user0,path={},queues=1,mac={MAC_A}", a.sock("vm10"))],
        &["--forward-mode=macswap"],
    );
    let mut vm_b = Testpmd::spawn(
        &format!("pvseb{pid}"),
        &[
            format!("net_virtio_user0,path={},queues=1,mac={MAC_B}", b.sock("vm10")),
            format!("net_virtio_user1,path={},queues=1,mac={MAC_B20}", b.sock("vm20")),
        ],
        &["--forward-mode=rxonly", &format!("--eth-peer=0,{MAC_A}"), &format!("--eth-peer=1,{MAC_A}")],
    );
    a.wait_running("vm10", 1);
    b.wait_running("vm10", 1);
    b.wait_running("vm20", 1);
    // pvs-evpn first (the shadow objects, the local MACs), then FRR, which reads them at start.
    h1.companion(&a, &logs.join("pvs-evpn-1.log"));
    h2.companion(&b, &logs.join("pvs-evpn-2.log"));
    wait_for("the shadow VXLAN devices", || {
        (h1.ex(&["ip", "-br", "link"]).contains("pvsx200") && h2.ex(&["ip", "-br", "link"]).contains("pvsx200"))
            .then_some(())
    });
    h1.start("192.168.100.1", "192.168.100.2", &logs);
    h2.start("192.168.100.2", "192.168.100.1", &logs);

    // BGP up, routes exchanged: each pvswitchd has a tunnel port to the other, in both VNIs,
    // and the other's VM MACs behind it, before any frame crossed.
    let t0 = Instant::now();
    let (ta, tb) = ("vt-192.168.100.2", "vt-192.168.100.1");
    wait_for("EVPN to bring each host the other's MACs", || {
        (fdb_port(&a, MAC_B, 10).as_deref() == Some(ta)
            && fdb_port(&a, MAC_B20, 20).as_deref() == Some(ta)
            && fdb_port(&b, MAC_A, 10).as_deref() == Some(tb))
        .then_some(())
    });
    eprintln!("EVPN converged {:?} after FRR started", t0.elapsed());
    let pa = a.port(ta);
    assert_eq!(pa["vxlan"]["vnis"], serde_json::json!(["100:10", "200:20"]), "flood lists from type-3 routes: {pa}");
    let macs = h2.vtysh("show evpn mac vni 100");
    assert!(macs.contains(MAC_A) && macs.contains(MAC_B), "zebra on host 2 knows both MACs:\n{macs}");
    let remote_line = macs.lines().find(|l| l.contains(MAC_A)).unwrap_or_default();
    assert!(remote_line.contains("remote") && remote_line.contains("192.168.100.1"), "{remote_line}");

    // Each tunnel resolves its next hop (ARP on the underlay) as soon as it exists, before any
    // frame needs it: the first frames to cross are not lost to it.
    wait_for("both tunnels' next hops resolved, with no traffic", || {
        (a.port(ta)["vxlan"]["next_hop_mac"].is_string() && b.port(tb)["vxlan"]["next_hop_mac"].is_string())
            .then_some(())
    });
    assert_eq!(tx_to(&b, "vm10"), 0);
    // Traffic: B's VM sends 4 bursts to A's VM, which sends each frame back (macswap): every
    // frame makes the trip.
    vm_a.cmd("start");
    vm_b.cmd("set fwd rxonly");
    vm_b.cmd("set portlist 0");
    let before = tx_to(&b, "vm10");
    vm_b.cmd("start tx_first 4");
    let mut last = Value::Null;
    let back = try_wait_for(|| {
        last = b.port("vm10");
        (tx_to(&b, "vm10") >= before + 128).then_some(())
    });
    assert!(back.is_some(), "128 frames went out, not all came back: {last}\nA: {:#}", a.ctl("ports"));
    assert_eq!(tx_to(&b, "vm20"), 0, "VNI 200's VM saw VNI 100's traffic");
    assert!(tx_to(&a, "vm10") >= 128, "host 1's VM got them");
    let up = a.port("uplink");
    assert!(up["drops"].as_object().unwrap().values().all(|v| v.as_u64() == Some(0)), "underlay drops: {up}");

    // pvswitchd restarts: the companion gives it everything again within a tick or so.
    let t1 = Instant::now();
    b.restart(false);
    wait_for("host 2 to have host 1's MAC back after its restart", || {
        (fdb_port(&b, MAC_A, 10).as_deref() == Some(tb)).then_some(())
    });
    eprintln!("host 2 back in step {:?} after its restart began", t1.elapsed());

    // FRR restarts on host 2 (zebra and bgpd): what it removed on the way down comes back.
    let t4 = Instant::now();
    h2.stop_daemons();
    let mut withdrawn = false;
    for _ in 0..20 {
        withdrawn |= fdb_port(&b, MAC_A, 10).is_none();
        if withdrawn {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("FRR down on host 2: host 1's MAC {} there", if withdrawn { "withdrawn" } else { "kept" });
    h2.start("192.168.100.2", "192.168.100.1", &logs);
    wait_for("host 2 to have host 1's MAC back after FRR's restart", || {
        (fdb_port(&b, MAC_A, 10).as_deref() == Some(tb)).then_some(())
    });
    assert!(h2.vtysh("show evpn mac vni 100").contains(MAC_A));
    eprintln!("host 2 back in step {:?} after FRR's restart began", t4.elapsed());

    // The VM stops on host 1: its MAC is no longer local there, and EVPN withdraws it.
    let t2 = Instant::now();
    vm_a.quit();
    wait_for("host 2 to forget host 1's VM", || fdb_port(&b, MAC_A, 10).is_none().then_some(()));
    eprintln!("withdrawn on host 2 {:?} after host 1's VM was told to quit", t2.elapsed());

    // ... and starts again on host 2 with the same MAC: host 1 follows it there.
    b.write_config(&config(
        &db,
        "192.168.100.2",
        &ub,
        &[("vm10", 10, MAC_B), ("vm20", 20, MAC_B20), ("vmmoved", 10, MAC_A)],
    ));
    let t3 = Instant::now();
    b.ctl("reload");
    let moved = Testpmd::spawn(
        &format!("pvsem{pid}"),
        &[format!("net_virtio_user0,path={},queues=1,mac={MAC_A}", b.sock("vmmoved"))],
        &["--forward-mode=rxonly"],
    );
    b.wait_running("vmmoved", 1);
    wait_for("host 1 to find the VM behind host 2", || (fdb_port(&a, MAC_A, 10).as_deref() == Some(ta)).then_some(()));
    eprintln!("host 1 follows the VM to host 2 {:?} after it started there", t3.elapsed());
    moved.quit();
    vm_b.quit();
    drop((h1, h2));
    drop(links);
}
