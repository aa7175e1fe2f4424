//! EVPN between two "hosts" on one machine, with an unmodified FRR: each host is a pvswitchd
//! (adaptive polling, a VTEP on a veth underlay through net_af_packet) plus a network
//! namespace running FRR's zebra and bgpd (`advertise-all-vni`) and `pvs-evpn`. The two FRRs
//! peer over a veth of their own. Nothing about the other host is configured in either
//! pvswitchd: the remote VTEP, its flood list and its VMs' MACs all come from BGP.
//! Needs root, hugepages, dpdk-testpmd, ip, bridge and FRR (scripts/install-deps.sh).
#![cfg(feature = "dpdk")]

use crate::common;

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use pvswitch::proto::PortInfo;

/// Routing across the hosts: EVPN's MAC+IP routes as the VRFs' neighbours.
mod routed;

const NEEDS: &[Need] = &[
    Need::Root,
    Need::Cmd("ip"),
    Need::Cmd("bridge"),
    Need::Cmd("vtysh"),
    Need::Cmd("/usr/lib/frr/zebra"),
    Need::Cmd("/usr/lib/frr/bgpd"),
];

const IP1: &str = "192.168.100.1";
const IP2: &str = "192.168.100.2";
const MAC_A: &str = "02:00:00:00:0a:01";
const MAC_B: &str = "02:00:00:00:0a:02";
const MAC_B20: &str = "02:00:00:00:14:02";

/// One host's control plane: a network namespace with FRR and pvs-evpn.
struct Frr {
    net: Netns,
    evpn: Option<Child>,
}

impl Frr {
    fn new(ns: &str) -> Frr {
        Frr { net: Netns::new(ns), evpn: None }
    }

    fn ex(&self, args: &[&str]) -> String {
        self.net.ex(args)
    }

    /// Starts zebra and bgpd in the namespace, peering from `me` with `peer` (iBGP, AS 65000).
    fn start(&self, me: &str, peer: &str, logs: &std::path::Path) {
        let (etc, run) = (format!("/etc/frr/{}", self.net.ns), format!("/var/run/frr/{}", self.net.ns));
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
            let log = format!("file:{}/{}-{d}.log", logs.display(), self.net.ns);
            self.ex(&[&format!("/usr/lib/frr/{d}"), "-d", "-N", &self.net.ns, "-P", "0", "--log", &log]);
        }
        sh(&["vtysh", "-N", &self.net.ns, "-b"]);
    }

    /// Stops zebra and bgpd (each removes what it installed) and waits until they are gone.
    fn stop_daemons(&self) {
        for d in ["bgpd", "zebra"] {
            let Ok(pid) = std::fs::read_to_string(format!("/var/run/frr/{}/{d}.pid", self.net.ns)) else { continue };
            let pid = pid.trim().to_string();
            let _ = Command::new("kill").arg(&pid).status();
            wait_for(&format!("{d} to exit"), || {
                (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
            });
        }
    }

    fn vtysh(&self, cmd: &str) -> String {
        sh(&["vtysh", "-N", &self.net.ns, "-c", cmd])
    }

    /// Runs pvs-evpn in the namespace against `sw`.
    fn companion(&mut self, sw: &Switch, log: &std::path::Path) {
        let out = std::fs::File::create(log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &self.net.ns, &pvs_evpn(), "--ctl"])
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
            if let Ok(pid) = std::fs::read_to_string(format!("/var/run/frr/{}/{d}.pid", self.net.ns)) {
                let _ = Command::new("kill").arg(pid.trim()).status();
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        // The namespace goes with `net`, after this.
        let _ = std::fs::remove_dir_all(format!("/etc/frr/{}", self.net.ns));
        let _ = std::fs::remove_dir_all(format!("/var/run/frr/{}", self.net.ns));
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

/// One host's pvswitchd: VMs (name, VLAN, configured MAC or "" for none; "MAC@IP,IP...": the
/// port's `allowed_ips` too, and the host routes tenant `VRF`), a VTEP at `local` on the `underlay` veth with
/// VNIs 100 (VLAN 10) and 200 (VLAN 20), no remotes and no data-plane learning on its tunnels
/// (EVPN says where remote MACs are), and `vtep_extra` keys (e.g. its mtu).
fn config(dir: &std::path::Path, local: &str, underlay: &str, ports: &[(&str, u16, &str)], vtep_extra: &str) -> String {
    let mut c = format!(
        "[switch]\npoll_cores = [1]\npoll_mode = \"adaptive\"\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n",
        dir.display()
    );
    let mut routed = false;
    for (name, tag, mac) in ports {
        c += &format!("[[port]]\nname = \"{name}\"\ntype = \"vhost-user\"\nsocket = \"{name}.sock\"\ntag = {tag}\n");
        let (mac, ip) = mac.split_once('@').unwrap_or((mac, ""));
        if !mac.is_empty() {
            c += &format!("allowed_macs = [\"{mac}\"]\n");
        }
        if !ip.is_empty() {
            let ips: Vec<String> = ip.split(',').map(|a| format!("\"{a}\"")).collect();
            c += &format!("allowed_ips = [{}]\n", ips.join(", "));
            routed = true;
        }
    }
    if routed {
        c += VRF;
    }
    c += &format!(
        "[[port]]\nname = \"uplink\"\ntype = \"dpdk\"\ndevice = \"net_af_packet0,iface={underlay}\"\n\
         [[vtep]]\nname = \"vt\"\nunderlay = \"uplink\"\nlocal_ip = \"{local}/24\"\nlearning = false\n{vtep_extra}\
         [[vtep.vni]]\nvni = 100\nvlan = 10\n[[vtep.vni]]\nvni = 200\nvlan = 20\n"
    );
    c
}

/// Tenant "t": VLANs 10 and 20 (VNIs 100 and 200), dual-stack, routed through an anycast
/// gateway, the same on both hosts.
const VRF: &str = "[[vrf]]\nname = \"t\"\ngateway_mac = \"02:00:00:00:fe:01\"\n\
                   [[vrf.network]]\nvlan = 10\ngateway = \"10.10.0.254/24\"\ngateway6 = \"fd00:10::fe/64\"\n\
                   [[vrf.network]]\nvlan = 20\ngateway = \"10.20.0.254/24\"\ngateway6 = \"fd00:20::fe/64\"\n";
const GW_MAC: &str = "02:00:00:00:fe:01";

/// Where `mac` on VLAN `vlan` is in `sw`'s MAC table.
fn fdb_port(sw: &Switch, mac: &str, vlan: u16) -> Option<String> {
    sw.fdb().into_iter().find(|e| e.mac == mac && e.vlan == vlan).and_then(|e| e.port)
}

fn tx_to(sw: &Switch, port: &str) -> u64 {
    sw.counters(port).tx_packets
}

/// A tunnel port's next hop's MAC (None until ARP resolved it).
fn next_hop_mac(sw: &Switch, tunnel: &str) -> Option<String> {
    let p = sw.port_info(tunnel);
    p.vxlan.unwrap_or_else(|| panic!("{tunnel} is not a tunnel")).next_hop_mac
}

/// What crossed the underlay, as seen by a raw socket on one end of it.
#[derive(Debug, Default)]
struct Tally {
    /// UDP to port 4789 from one VTEP address to the other.
    vxlan: u64,
    /// ARP between the VTEP addresses.
    arp: u64,
    /// Anything else (the first few, described).
    other: Vec<String>,
    other_count: u64,
}

impl Tally {
    fn count(&mut self, f: &[u8], vteps: [Ipv4Addr; 2]) {
        let be16 = |o: usize| f.get(o..o + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
        let ip = |o: usize| f.get(o..o + 4).map(|b| Ipv4Addr::new(b[0], b[1], b[2], b[3]));
        let between = |a: Option<Ipv4Addr>, b: Option<Ipv4Addr>| {
            a != b && a.is_some_and(|a| vteps.contains(&a)) && b.is_some_and(|b| vteps.contains(&b))
        };
        match be16(12) {
            Some(0x0800)
                if f.get(14) == Some(&0x45)
                    && f.get(23) == Some(&17)
                    && be16(36) == Some(4789)
                    && between(ip(26), ip(30)) =>
            {
                self.vxlan += 1
            }
            Some(0x0806) if between(ip(28), ip(38)) => self.arp += 1,
            _ => {
                self.other_count += 1;
                if self.other.len() < 8 {
                    let n = f.len().min(48);
                    self.other.push(format!("{} bytes: {:02x?}", f.len(), &f[..n]));
                }
            }
        }
    }
}

/// Raw sockets on both ends of the underlay, counting every frame that arrives at either end
/// until stopped. (Arrivals, not departures: DPDK's af_packet PMD sends past the kernel's
/// taps, so a raw socket does not see what the switch on its own end sends.)
struct Capture {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<Tally>>,
}

impl Capture {
    fn start(ifnames: &[&str], vteps: [Ipv4Addr; 2]) -> Capture {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = ifnames.iter().map(|i| Capture::listen(i, vteps, stop.clone())).collect();
        Capture { stop, threads }
    }

    fn listen(ifname: &str, vteps: [Ipv4Addr; 2], stop: Arc<AtomicBool>) -> JoinHandle<Tally> {
        let ifindex: i32 =
            std::fs::read_to_string(format!("/sys/class/net/{ifname}/ifindex")).unwrap().trim().parse().unwrap();
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket(2); the descriptor is owned by `sock` from here on.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, all as i32) };
        assert!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = all;
        sll.sll_ifindex = ifindex;
        let tv = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
        let rcvbuf: libc::c_int = 16 << 20;
        // SAFETY: the pointers and lengths describe the locals above, which outlive the calls.
        unsafe {
            let r = libc::bind(
                sock.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(r, 0, "bind to {ifname}: {}", std::io::Error::last_os_error());
            for (opt, val, len) in [
                (libc::SO_RCVTIMEO, &tv as *const libc::timeval as *const libc::c_void, size_of::<libc::timeval>()),
                (libc::SO_RCVBUF, &rcvbuf as *const libc::c_int as *const libc::c_void, size_of::<libc::c_int>()),
            ] {
                libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, opt, val, len as u32);
            }
        }
        std::thread::spawn(move || {
            let mut tally = Tally::default();
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: as above; recvfrom fills at most `buf.len()` bytes and `from`.
                let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
                let mut from_len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                let n = unsafe {
                    libc::recvfrom(
                        sock.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        0,
                        &mut from as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                        &mut from_len,
                    )
                };
                if n > 0 && from.sll_pkttype != libc::PACKET_OUTGOING {
                    tally.count(&buf[..n as usize], vteps);
                }
            }
            tally
        })
    }

    /// Stops listening; the tallies of both ends, summed.
    fn finish(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut sum = Tally::default();
        for t in self.threads.drain(..) {
            let t = t.join().unwrap();
            sum.vxlan += t.vxlan;
            sum.arp += t.arp;
            sum.other_count += t.other_count;
            sum.other.extend(t.other);
        }
        sum
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Two hosts on one machine: a veth underlay between two pvswitchd (A on `ua`, B on `ub`,
/// VTEPs IP1 and IP2), and two namespaces whose FRRs peer over a veth of their own. Dropped in
/// field order: the capture, FRR, the switches, the links.
struct Hosts {
    capture: Option<Capture>,
    h1: Frr,
    h2: Frr,
    a: Switch,
    b: Switch,
    db: PathBuf,
    ub: String,
    logs: PathBuf,
    _links: Links,
}

impl Hosts {
    /// Links, namespaces and both switches (their VMs' ports as `config` takes them; `mtu`:
    /// the underlay's, `vtep_extra`: keys of both VTEPs), with a capture on the underlay from
    /// before either switch starts. FRR and pvs-evpn wait for `start_control`.
    fn new(
        tag: &str,
        ports_a: &[(&str, u16, &str)],
        ports_b: &[(&str, u16, &str)],
        mtu: u32,
        vtep_extra: &str,
    ) -> Hosts {
        let pid = std::process::id() % 100_000;
        let (ua, ub) = (format!("pv{tag}a{pid}"), format!("pv{tag}b{pid}"));
        let links = Links(vec![ua.clone()]);
        let _ = Command::new("ip").args(["link", "del", &ua]).stderr(Stdio::null()).status();
        sh(&["ip", "link", "add", &ua, "type", "veth", "peer", "name", &ub]);
        for l in [&ua, &ub] {
            no_ipv6(l);
            sh(&["ip", "link", "set", l, "mtu", &mtu.to_string(), "up"]);
        }
        let logs = test_dir(&format!("evpn{tag}logs"));
        let (h1, h2) = (Frr::new(&format!("pv{tag}1h{pid}")), Frr::new(&format!("pv{tag}2h{pid}")));
        sh(&[
            "ip", "link", "add", "bgp0", "netns", &h1.net.ns, "type", "veth", "peer", "name", "bgp0", "netns",
            &h2.net.ns,
        ]);
        for (h, ip) in [(&h1, IP1), (&h2, IP2)] {
            h.ex(&["ip", "addr", "add", &format!("{ip}/24"), "dev", "bgp0"]);
            h.ex(&["ip", "link", "set", "bgp0", "up"]);
        }
        let capture = Capture::start(&[&ua, &ub], [IP1.parse().unwrap(), IP2.parse().unwrap()]);
        let (da, db) = (test_dir(&format!("evpn{tag}A")), test_dir(&format!("evpn{tag}B")));
        let a = Switch::start_config(da.clone(), &config(&da, IP1, &ua, ports_a, vtep_extra));
        let b = Switch::start_config(db.clone(), &config(&db, IP2, &ub, ports_b, vtep_extra));
        Hosts { capture: Some(capture), h1, h2, a, b, db, ub, logs, _links: links }
    }

    /// pvs-evpn first (the shadow objects, the local MACs), then FRR, which reads them at start.
    fn start_control(&mut self) {
        let Hosts { h1, h2, a, b, logs, .. } = self;
        h1.companion(a, &logs.join("pvs-evpn-1.log"));
        h2.companion(b, &logs.join("pvs-evpn-2.log"));
        wait_for("the shadow VXLAN devices", || {
            (h1.ex(&["ip", "-br", "link"]).contains("pvsx200") && h2.ex(&["ip", "-br", "link"]).contains("pvsx200"))
                .then_some(())
        });
        h1.start(IP1, IP2, logs);
        h2.start(IP2, IP1, logs);
    }

    /// Stops the capture: every frame on the underlay so far was VXLAN or ARP between the two
    /// VTEPs. Returns the count of VXLAN frames.
    fn underlay_only_vteps(&mut self) -> u64 {
        let t = self.capture.take().unwrap().finish();
        assert!(t.other.is_empty(), "the underlay carried {} other frames: {:#?}", t.other_count, t.other);
        eprintln!("underlay: {} VXLAN and {} ARP frames between the VTEPs, nothing else", t.vxlan, t.arp);
        t.vxlan
    }
}

#[test]
fn frr_evpn_carries_macs_and_flood_lists_between_two_pvswitchd() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    let pid = std::process::id() % 100_000;
    let mut hosts = Hosts::new("e", &[("vm10", 10, MAC_A)], &[("vm10", 10, MAC_B), ("vm20", 20, MAC_B20)], 1500, "");
    // The VMs: a configured MAC is exported while its VM is connected.
    let mut vm_a = Testpmd::spawn(
        &format!("pvsea{pid}"),
        &[format!("net_virtio_user0,path={},queues=1,mac={MAC_A}", hosts.a.sock("vm10"))],
        &["--forward-mode=macswap"],
    );
    let mut vm_b = Testpmd::spawn(
        &format!("pvseb{pid}"),
        &[
            format!("net_virtio_user0,path={},queues=1,mac={MAC_B}", hosts.b.sock("vm10")),
            format!("net_virtio_user1,path={},queues=1,mac={MAC_B20}", hosts.b.sock("vm20")),
        ],
        &["--forward-mode=rxonly", &format!("--eth-peer=0,{MAC_A}"), &format!("--eth-peer=1,{MAC_A}")],
    );
    hosts.a.wait_running("vm10", 1);
    hosts.b.wait_running("vm10", 1);
    hosts.b.wait_running("vm20", 1);
    hosts.start_control();

    // BGP up, routes exchanged: each pvswitchd has a tunnel port to the other, in both VNIs,
    // and the other's VM MACs behind it, before any frame crossed.
    let t0 = Instant::now();
    let (ta, tb) = ("vt-192.168.100.2", "vt-192.168.100.1");
    wait_for("EVPN to bring each host the other's MACs", || {
        (fdb_port(&hosts.a, MAC_B, 10).as_deref() == Some(ta)
            && fdb_port(&hosts.a, MAC_B20, 20).as_deref() == Some(ta)
            && fdb_port(&hosts.b, MAC_A, 10).as_deref() == Some(tb))
        .then_some(())
    });
    eprintln!("EVPN converged {:?} after FRR started", t0.elapsed());
    let pa = hosts.a.port_info(ta);
    assert_eq!(
        pa.vxlan.as_ref().map(|x| x.vnis.clone()),
        Some(vec!["100:10".to_string(), "200:20".to_string()]),
        "flood lists from type-3 routes: {}",
        pa.json()
    );
    let macs = hosts.h2.vtysh("show evpn mac vni 100");
    assert!(macs.contains(MAC_A) && macs.contains(MAC_B), "zebra on host 2 knows both MACs:\n{macs}");
    let remote_line = macs.lines().find(|l| l.contains(MAC_A)).unwrap_or_default();
    assert!(remote_line.contains("remote") && remote_line.contains("192.168.100.1"), "{remote_line}");

    // Each tunnel resolves its next hop (ARP on the underlay) as soon as it exists, before any
    // frame needs it: the first frames to cross are not lost to it.
    wait_for("both tunnels' next hops resolved, with no traffic", || {
        (next_hop_mac(&hosts.a, ta).is_some() && next_hop_mac(&hosts.b, tb).is_some()).then_some(())
    });
    assert_eq!(tx_to(&hosts.b, "vm10"), 0);
    // An idle EVPN host sleeps (issue 54): BGP up, tunnels resolved, every VM idle, each
    // switch's poll thread (its underlay an af_packet NIC, without interrupts: the timer backs
    // off to its ceiling) is awake under 2% of the time, read from its own counters.
    for sw in [&hosts.a, &hosts.b] {
        wait_for("the underlay's timer backed off to its ceiling", || {
            let r = sw.thread_stats(0).running;
            (r.nic_sleep_us == r.nic_poll_max_us).then_some(())
        });
    }
    let before = [hosts.a.thread_stats(0), hosts.b.thread_stats(0)];
    std::thread::sleep(Duration::from_secs(2));
    for (i, (sw, th0)) in [&hosts.a, &hosts.b].into_iter().zip(before).enumerate() {
        let th1 = sw.thread_stats(0);
        let polled = (th1.busy_cycles + th1.idle_cycles) - (th0.busy_cycles + th0.idle_cycles);
        let polling = polled as f64 / sw.stats().tsc_hz as f64;
        let asleep = th1.asleep_secs - th0.asleep_secs;
        let awake = polling / (polling + asleep);
        eprintln!("host {}: idle 2 s, {:.2}% awake, {} sleeps", i + 1, awake * 100.0, th1.sleeps - th0.sleeps);
        assert!(awake < 0.02, "host {}'s poll thread was awake {:.1}% of the time", i + 1, awake * 100.0);
    }
    // Traffic: B's VM sends 4 bursts to A's VM, which sends each frame back (macswap): every
    // frame makes the trip.
    vm_a.cmd("start");
    vm_b.cmd("set fwd rxonly");
    vm_b.cmd("set portlist 0");
    let before = tx_to(&hosts.b, "vm10");
    vm_b.cmd("start tx_first 4");
    let mut last = PortInfo::default();
    let back = try_wait_for(|| {
        last = hosts.b.port_info("vm10");
        (tx_to(&hosts.b, "vm10") >= before + 128).then_some(())
    });
    assert!(back.is_some(), "128 frames went out, not all came back: {}\nA: {:#}", last.json(), hosts.a.ports().json());
    assert_eq!(tx_to(&hosts.b, "vm20"), 0, "VNI 200's VM saw VNI 100's traffic");
    assert!(tx_to(&hosts.a, "vm10") >= 128, "host 1's VM got them");
    let up = hosts.a.port_info("uplink");
    assert!(nonzero_drops(&up.counters.drops).is_empty(), "underlay drops: {}", up.json());

    // pvswitchd restarts: the companion gives it everything again within a tick or so.
    let t1 = Instant::now();
    hosts.b.restart(false);
    wait_for("host 2 to have host 1's MAC back after its restart", || {
        (fdb_port(&hosts.b, MAC_A, 10).as_deref() == Some(tb)).then_some(())
    });
    eprintln!("host 2 back in step {:?} after its restart began", t1.elapsed());

    // FRR restarts on host 2 (zebra and bgpd): what it removed on the way down comes back.
    let t4 = Instant::now();
    hosts.h2.stop_daemons();
    let mut withdrawn = false;
    for _ in 0..20 {
        withdrawn |= fdb_port(&hosts.b, MAC_A, 10).is_none();
        if withdrawn {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("FRR down on host 2: host 1's MAC {} there", if withdrawn { "withdrawn" } else { "kept" });
    hosts.h2.start(IP2, IP1, &hosts.logs);
    wait_for("host 2 to have host 1's MAC back after FRR's restart", || {
        (fdb_port(&hosts.b, MAC_A, 10).as_deref() == Some(tb)).then_some(())
    });
    assert!(hosts.h2.vtysh("show evpn mac vni 100").contains(MAC_A));
    eprintln!("host 2 back in step {:?} after FRR's restart began", t4.elapsed());

    // The VM stops on host 1: its MAC is no longer local there, and EVPN withdraws it.
    let t2 = Instant::now();
    vm_a.quit();
    wait_for("host 2 to forget host 1's VM", || fdb_port(&hosts.b, MAC_A, 10).is_none().then_some(()));
    eprintln!("withdrawn on host 2 {:?} after host 1's VM was told to quit", t2.elapsed());

    // ... and starts again on host 2 with the same MAC: host 1 follows it there.
    hosts.b.write_config(&config(
        &hosts.db,
        IP2,
        &hosts.ub,
        &[("vm10", 10, MAC_B), ("vm20", 20, MAC_B20), ("vmmoved", 10, MAC_A)],
        "",
    ));
    let t3 = Instant::now();
    hosts.b.reload();
    let moved = Testpmd::spawn(
        &format!("pvsem{pid}"),
        &[format!("net_virtio_user0,path={},queues=1,mac={MAC_A}", hosts.b.sock("vmmoved"))],
        &["--forward-mode=rxonly"],
    );
    hosts.b.wait_running("vmmoved", 1);
    wait_for("host 1 to find the VM behind host 2", || {
        (fdb_port(&hosts.a, MAC_A, 10).as_deref() == Some(ta)).then_some(())
    });
    eprintln!("host 1 follows the VM to host 2 {:?} after it started there", t3.elapsed());
    moved.quit();
    vm_b.quit();
    // All along, the underlay carried VXLAN between the two VTEPs and their ARP, nothing else
    // (the 128-frame round trip alone is 256 VXLAN frames).
    assert!(hosts.underlay_only_vteps() >= 256);
}

/// A VM that moves while its old host still advertises it, as in a live migration (the
/// destination announces the VM before the source is gone): no configured MAC, so host 2
/// knows the VM only from its first frame there, a broadcast (as QEMU's RARP announcement).
/// Host 2 learns it on a local port and exports it; it becomes remote at host 2 in host 1's
/// zebra, and both switches agree and stay so. Usually by EVPN's MAC mobility (host 2's route
/// carries sequence number 1, beating host 1's); but the announcement floods to host 1 too,
/// whose switch learns the VM behind the tunnel, and when host 1's companion withdraws the
/// route before host 2's exports its own (their ticks race), host 2's route carries 0, as
/// EVPN has it for a MAC no one else advertises. Either way the VM moved.
#[test]
fn a_vm_announced_on_another_host_moves_there_by_mac_mobility() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS].concat()) else { return };
    const MAC_R: &str = "02:00:00:00:0a:77";
    let pid = std::process::id() % 100_000;
    let mut hosts = Hosts::new("m", &[("roam", 10, "")], &[("roam", 10, "")], 1500, "");
    hosts.start_control();
    let (ta, tb) = ("vt-192.168.100.2", "vt-192.168.100.1");
    let has_port = |sw: &Switch, name: &str| sw.ports().iter().any(|p| p.name == name);
    wait_for("EVPN's flood lists: a tunnel each way", || {
        (has_port(&hosts.a, ta) && has_port(&hosts.b, tb)).then_some(())
    });
    // The VM announces itself (one burst of broadcasts from its MAC) on `sw`'s port "roam".
    let announce = |prefix: String, sw: &Switch| {
        let mut vm = Testpmd::spawn(
            &prefix,
            &[format!("net_virtio_user0,path={},queues=1,mac={MAC_R}", sw.sock("roam"))],
            &["--forward-mode=rxonly", "--eth-peer=0,ff:ff:ff:ff:ff:ff"],
        );
        sw.wait_running("roam", 1);
        vm.cmd("start tx_first 1");
        vm
    };
    let source = announce(format!("pvsms{pid}"), &hosts.a);
    wait_for("host 2's zebra to have the VM behind host 1", || {
        let macs = hosts.h2.vtysh("show evpn mac vni 100");
        macs.lines().any(|l| l.contains(MAC_R) && l.contains("remote") && l.contains(IP1)).then_some(())
    });
    assert_eq!(fdb_port(&hosts.a, MAC_R, 10).as_deref(), Some("roam"));

    let t0 = Instant::now();
    let dest = announce(format!("pvsmd{pid}"), &hosts.b);
    let moved = |h: &Frr, vtep: &str, local: bool| {
        let macs = h.vtysh("show evpn mac vni 100");
        let line = macs.lines().find(|l| l.contains(MAC_R)).unwrap_or_default().to_string();
        if local { line.contains("local") } else { line.contains("remote") && line.contains(vtep) }
    };
    wait_for("both zebras to have the VM at host 2", || {
        (moved(&hosts.h1, IP2, false) && moved(&hosts.h2, "", true)).then_some(())
    });
    eprintln!("the VM is at host 2 in both zebras {:?} after it announced itself there", t0.elapsed());
    // And it stays there, in both switches, while the source VM (silent) is still connected:
    // no sync with the old route moves it back.
    for _ in 0..10 {
        assert_eq!(fdb_port(&hosts.b, MAC_R, 10).as_deref(), Some("roam"), "host 2: the VM is local");
        assert_eq!(fdb_port(&hosts.a, MAC_R, 10).as_deref(), Some(ta), "host 1: behind host 2");
        assert!(moved(&hosts.h1, IP2, false), "{}", hosts.h1.vtysh("show evpn mac vni 100"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let seq = hosts.h1.vtysh(&format!("show evpn mac vni 100 mac {MAC_R}"));
    assert!(seq.contains(&format!("Remote VTEP: {IP2}")), "host 1's zebra: behind host 2:\n{seq}");
    let mobility = seq.contains("Remote Seq: 1");
    assert!(mobility || seq.contains("Remote Seq: 0"), "sequence number 1 (mobility) or 0 (withdrawn first):\n{seq}");
    eprintln!(
        "moved {}",
        if mobility { "by MAC mobility (Remote Seq: 1)" } else { "after host 1 withdrew it (Remote Seq: 0)" }
    );
    source.quit();
    dest.quit();
    assert!(hosts.underlay_only_vteps() > 0);
}

/// Two QEMU guests (Linux, TCG) on VNI 100, one on each host: they ping and run TCP (iperf3
/// both ways) through the tunnel that EVPN set up, while host 2's VM on VNI 200 (a testpmd)
/// gets nothing, their broadcasts (ARP) included. zebra lists each guest's MAC as local on its
/// host and remote on the other, and the underlay carries only VXLAN and ARP between the VTEPs.
#[test]
fn qemu_guests_on_two_evpn_hosts_ping_and_run_tcp() {
    let Some(_g) = run_alone(&[TESTPMD, NEEDS, QEMU].concat()) else { return };
    const GA: &str = "52:54:00:64:00:01";
    const GB: &str = "52:54:00:64:00:02";
    // A jumbo underlay, so the guests keep their 1500-byte MTU inside the tunnel.
    let mut hosts =
        Hosts::new("q", &[("vm10", 10, GA)], &[("vm10", 10, GB), ("vm20", 20, MAC_B20)], 9000, "mtu = 1500\n");
    hosts.start_control();
    let pid = std::process::id() % 100_000;
    let mut vm20 = Testpmd::spawn(
        &format!("pvseq{pid}"),
        &[format!("net_virtio_user0,path={},queues=1,mac={MAC_B20}", hosts.b.sock("vm20"))],
        &["--forward-mode=rxonly"],
    );
    vm20.cmd("start");
    hosts.b.wait_running("vm20", 1);
    let job2 = "iperf3 -s -B 10.100.0.2 >/dev/null 2>&1 &\nwhile true; do sleep 1000; done\n";
    let (da, db) = (hosts.a.dir.clone(), hosts.b.dir.clone());
    let server = Qemus(vec![guest(&hosts.b, &db, "vm10", "10.100.0.2/24", GB, job2)]);
    // Host 1's guest pings and runs iperf3 both ways, then stays (a VM gone is a MAC withdrawn).
    let (client, out) =
        guest_ping_iperf(&da, &hosts.a.sock("vm10"), "10.100.0.1/24", "10.100.0.2", "vm10", Some(GA), 600);
    assert!(out.contains(" 0% packet loss"), "host 1's guest -> host 2's guest ping:\n{out}");
    assert!(out.contains("PVS-IPERF ") && out.contains("PVS-IPERF-R "), "iperf3 both ways:\n{out}");
    // Each guest's MAC: local on its host, remote (behind the other VTEP) on the other.
    let (ta, tb) = ("vt-192.168.100.2", "vt-192.168.100.1");
    assert_eq!(fdb_port(&hosts.a, GB, 10).as_deref(), Some(ta));
    assert_eq!(fdb_port(&hosts.b, GA, 10).as_deref(), Some(tb));
    for (h, local, remote, vtep) in [(&hosts.h1, GA, GB, IP2), (&hosts.h2, GB, GA, IP1)] {
        let macs = h.vtysh("show evpn mac vni 100");
        let line = |m: &str| macs.lines().find(|l| l.contains(m)).unwrap_or_default().to_string();
        assert!(line(local).contains("local"), "{}: {local} not local:\n{macs}", h.net.ns);
        assert!(line(remote).contains("remote") && line(remote).contains(vtep), "{}: {remote}:\n{macs}", h.net.ns);
    }
    drop((client, server));
    assert_eq!(tx_to(&hosts.b, "vm20"), 0, "VNI 200's VM got VNI 100's frames");
    for sw in [&hosts.a, &hosts.b] {
        let up = sw.port_info("uplink");
        assert!(nonzero_drops(&up.counters.drops).is_empty(), "underlay drops: {}", up.json());
    }
    assert!(hosts.underlay_only_vteps() > 1000, "the guests' TCP crossed the underlay");
    vm20.quit();
}

/// The pvs-evpn binary (a crate of its own in the workspace, built beside pvswitchd).
fn pvs_evpn() -> String {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_pvswitchd")).with_file_name("pvs-evpn");
    assert!(exe.exists(), "{} is missing: cargo build --release --workspace", exe.display());
    exe.display().to_string()
}
