//! DPDK ports in the switch: a net_ring loopback between two testpmd VMs, a NIC that fails to
//! start, a veth pair into a network namespace (net_af_packet) that a VM answers pings on, and
//! that veth as a VLAN trunk to a Linux guest on the namespace's bridge.
//! Needs root, hugepages and dpdk-testpmd.
#![cfg(feature = "dpdk")]

use crate::common;

use std::process::{Command, Stdio};

use common::*;
use pvswitch::proto::{MoveReply, PortInfo, ThreadStats, WokenBy};

/// The veth pair and namespace a test sets up.
const NETNS: &[Need] = &[Need::Root, Need::Cmd("ip"), Need::Cmd("ping")];
/// A QEMU guest through a NIC port into a namespace: QEMU and the namespace's iperf3 server.
const GUEST_NIC: &[Need] = &[Need::Qemu, Need::GuestImage, Need::Cmd("ethtool"), Need::Cmd("iperf3")];

fn config(dir: &std::path::Path, vhost: &[&str], dpdk: &[(&str, &str)], flows: &[&str]) -> String {
    let mut c = String::new();
    if !flows.is_empty() {
        c += "flows = [\n";
        for f in flows {
            c += &format!("  \"{f}\",\n");
        }
        c += "]\n";
    }
    c += &format!(
        "[switch]\npoll_cores = [1]\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\nrx_retry_us = 60000000\n",
        dir.display()
    );
    for p in vhost {
        c += &format!("[[port]]\nname = \"{p}\"\ntype = \"vhost-user\"\nsocket = \"{p}.sock\"\n");
    }
    for (name, dev) in dpdk {
        c += &format!("[[port]]\nname = \"{name}\"\ntype = \"dpdk\"\ndevice = \"{dev}\"\n");
    }
    c
}

fn drops(p: &PortInfo) -> Vec<(&'static str, u64)> {
    nonzero_drops(&p.counters.drops)
}

/// VM A -> pvswitchd -> net_ring0 (its transmit ring is its receive ring) -> pvswitchd -> VM B,
/// by flows. Every frame leaves through the NIC and comes back in, intact and counted.
#[test]
fn ring_loopback_between_vms() {
    ring_loopback("nicring", "", "");
}

/// The same with adaptive polling: the thread sleeps when idle, at most `nic_poll_interval_us`
/// at a time because its NIC queue cannot wake it, and nothing is lost.
#[test]
fn ring_loopback_adaptive_polling() {
    ring_loopback(
        "nicringad",
        "poll_mode = \"adaptive\"\nidle_before_sleep_us = 200\n",
        "nic_poll_interval_us = 500\n",
    );
}

/// `switch_extra` goes into [switch], `dpdk` into a [dpdk] section.
fn ring_loopback(name: &str, switch_extra: &str, dpdk: &str) {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir(name);
    let text = config(
        &dir,
        &["a", "b"],
        &[("ring", "net_ring0")],
        &[
            "priority=10,in_port=a,actions=output:ring",
            "priority=10,in_port=ring,actions=output:b",
            "priority=0,actions=drop",
        ],
    );
    let text = text.replace("rx_retry_us = 60000000\n", &format!("rx_retry_us = 60000000\n{switch_extra}"));
    let text = if dpdk.is_empty() { text } else { format!("{text}[dpdk]\n{dpdk}") };
    let sw = Switch::start_config(dir.clone(), &text);
    if !switch_extra.is_empty() {
        // Idle: the thread sleeps, and its timer (no guest kicked) wakes it.
        let th = wait_for("the poll thread to sleep on its NIC timer", || {
            let th = sw.thread_stats(0);
            (th.sleeps > 10 && th.wakeups.timeout > 10).then_some(th)
        });
        eprintln!("adaptive: sleeps {} wakeups {}", th.sleeps, th.wakeups.json());
    }
    let ring = sw.port_info("ring");
    assert_eq!(ring.kind, "dpdk", "{}", ring.json());
    assert_eq!(ring.state, "running", "{}", ring.json());
    assert_eq!(ring.dpdk.as_ref().map(|d| d.driver.as_str()), Some("net_ring"), "{}", ring.json());
    // Fewer frames than either ring holds: a NIC cannot be held back, so a VM B that is
    // descheduled for a while must still find room.
    let sizes = [64usize, 65, 128, 511, 1000, 1514];
    let n = 480; // VM B posts 512 receive buffers
    let sent: Vec<Vec<u8>> = (0..n).map(|i| frame(MAC_B, MAC_A, sizes[i % sizes.len()], 1, i as u32)).collect();
    let bytes: u64 = sent.iter().map(|f| f.len() as u64).sum();
    write_pcap(&dir.join("in0.pcap"), &sent);
    let PcapVms { a: mut vm_a, b: vm_b } = pcap_vms_opts(&dir, &sw, 1, false, false);
    vm_a.cmd("start");
    let n = n as u64;
    let mut last = Vec::new();
    let done = try_wait_for(|| {
        last = sw.ports();
        (sw.counters("b").tx_packets >= n).then_some(())
    });
    assert!(done.is_some(), "not everything arrived: {:#}", last.json());
    // Let stragglers (there must be none) show up.
    std::thread::sleep(std::time::Duration::from_millis(300));
    vm_a.quit();
    vm_b.quit();
    assert_delivered(&sent, &read_pcap(&dir.join("out0.pcap")));
    let (a, b, ring) = (sw.port_info("a"), sw.port_info("b"), sw.port_info("ring"));
    let (ac, bc, rc) = (&a.counters, &b.counters, &ring.counters);
    assert_eq!((ac.rx_packets, ac.rx_bytes), (n, bytes), "{}", a.json());
    assert_eq!((rc.tx_packets, rc.tx_bytes), (n, bytes), "{}", ring.json());
    assert_eq!((rc.rx_packets, rc.rx_bytes), (n, bytes), "{}", ring.json());
    assert_eq!((bc.tx_packets, bc.tx_bytes), (n, bytes), "{}", b.json());
    assert_eq!(ac.tx_packets, 0, "{}", a.json());
    // B's hello matched the catch-all drop.
    assert_eq!(bc.rx_packets, 1, "{}", b.json());
    assert_eq!(drops(&b), vec![("flow_drop", 1)], "{}", b.json());
    assert!(drops(&a).is_empty() && drops(&ring).is_empty(), "{}\n{}", a.json(), ring.json());
    // DPDK's own counters agree.
    let st = ring.dpdk.as_ref().and_then(|d| d.stats).unwrap_or_else(|| panic!("no DPDK stats: {}", ring.json()));
    assert_eq!((st.opackets, st.ipackets), (n, n), "{}", ring.json());
    assert_eq!((st.imissed, st.oerrors), (0, 0), "{}", ring.json());
    // The NIC's receive queue is polled by thread 0 and shows in rxq.
    let rxq = sw.rxq();
    let q = rxq.iter().find(|q| q.port == "ring").expect("ring rxq");
    assert_eq!(q.counters.packets, n, "{}", rxq.json());
}

/// A dpdk port whose device does not exist: shown failed with the error, and the vhost-user
/// ports switch as before.
#[test]
fn failed_nic_leaves_vhost_ports_working() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("nicfail");
    let text = config(&dir, &["a", "b"], &[("bad", "net_bogus0")], &[]);
    let sw = Switch::start_config(dir.clone(), &text);
    let bad = sw.port_info("bad");
    assert_eq!(bad.state, "failed", "{}", bad.json());
    let err = bad.last_error.as_deref().unwrap_or_default();
    assert!(err.contains("net_bogus0") && err.contains("device not found"), "{}", bad.json());
    assert!(sw.log().contains("net_bogus0"), "{}", sw.log());
    let n = 2000u32;
    let sent: Vec<Vec<u8>> = (0..n).map(|i| frame(MAC_B, MAC_A, 64, 0, i)).collect();
    write_pcap(&dir.join("in0.pcap"), &sent);
    let PcapVms { a: mut vm_a, b: vm_b } = pcap_vms(&dir, &sw, 1, false);
    vm_a.cmd("set fwd io retry");
    vm_a.cmd("set burst tx delay 100 retry 100000");
    vm_a.cmd("start");
    let ok = try_wait_for(|| (sw.counters("b").tx_packets >= n as u64).then_some(()));
    assert!(ok.is_some(), "frames to B: {:#}\nVM A: {}", sw.ports().json(), vm_a.output());
    vm_a.quit();
    vm_b.quit();
    assert_delivered(&sent, &read_pcap(&dir.join("out0.pcap")));
    // B's hello was flooded; the failed port got none of it, and no drop is charged to it.
    let bad = sw.port_info("bad");
    assert_eq!((bad.counters.tx_packets, bad.counters.rx_packets), (0, 0), "{}", bad.json());
    assert!(drops(&bad).is_empty(), "{}", bad.json());
}

/// Linux behind a NIC port: a network namespace (`net`) and the name of the switch's end
/// (`host_if`) of its link, a veth pair or a device `adopt` moves in.
struct Lan {
    net: Netns,
    host_if: String,
}

impl Lan {
    /// A veth pair into a namespace, 10.77.0.1/24 on its end `pvsns0`, the switch's end bare.
    fn new(tag: &str) -> Lan {
        let pid = std::process::id() % 100_000;
        let host_if = format!("pvh{tag}{pid}");
        Lan { net: Netns::behind_veth(&format!("pvs{tag}{pid}"), &host_if, "10.77.0.1/24"), host_if }
    }

    /// A namespace where the veth's end and tap `pvstap0` (for a QEMU guest, the "physical
    /// network") are ports of bridge br0, with no address: the namespace only forwards. The
    /// switch's end of the veth hands VLAN tags to af_packet in the frame.
    fn bridged(tag: &str) -> Lan {
        let pid = std::process::id() % 100_000;
        let mut net = Netns::new(&format!("pvs{tag}{pid}"));
        let host_if = format!("pvh{tag}{pid}");
        net.veth(&host_if, "pvsns0");
        sh(&["ethtool", "-K", &host_if, "rxvlan", "off", "txvlan", "off"]);
        net.ex(&["ip", "link", "add", "br0", "type", "bridge"]);
        net.ex(&["ip", "tuntap", "add", "pvstap0", "mode", "tap"]);
        for dev in ["pvsns0", "pvstap0"] {
            net.ex(&["ip", "link", "set", dev, "master", "br0"]);
            net.ex(&["ip", "link", "set", dev, "up"]);
        }
        net.ex(&["ip", "link", "set", "br0", "up"]);
        Lan { net, host_if }
    }

    /// A namespace with only its loopback; `host_if` names an interface a device will create
    /// (net_tap), which `adopt` moves in and configures as `new` does the veth's end.
    fn bare(tag: &str) -> Lan {
        let pid = std::process::id() % 100_000;
        Lan { net: Netns::new(&format!("pvs{tag}{pid}")), host_if: format!("pvt{tag}{pid}") }
    }

    /// Moves interface `dev` (in the host's namespace) into this one, with 10.77.0.1/24 and
    /// MTU `mtu`.
    fn adopt(&self, dev: &str, mtu: u32) {
        sh(&["ip", "link", "set", dev, "netns", &self.net.ns]);
        let ex = |args: &[&str]| self.net.ex(args);
        ex(&["sysctl", "-q", "-w", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]);
        ex(&["ip", "link", "set", dev, "mtu", &mtu.to_string()]);
        ex(&["ip", "addr", "add", "10.77.0.1/24", "dev", dev]);
        ex(&["ip", "link", "set", dev, "up"]);
    }

    /// (rx_packets, tx_packets) of the namespace's end.
    fn peer_counts(&self) -> (u64, u64) {
        let s = self.net.ex(&["cat", "/sys/class/net/pvsns0/statistics/rx_packets"]);
        let t = self.net.ex(&["cat", "/sys/class/net/pvsns0/statistics/tx_packets"]);
        (s.trim().parse().unwrap(), t.trim().parse().unwrap())
    }
}

/// Linux in a namespace <-> veth <-> net_af_packet <-> pvswitchd <-> testpmd VM (icmpecho
/// answers ARP and ping): pings from the namespace are answered, and the counters of the
/// namespace's interface, the switch's NIC port, DPDK and the VM's port agree.
#[test]
fn ping_through_af_packet_veth() {
    let Some(_g) = run_alone(&[TESTPMD, NETNS].concat()) else { return };
    let ns = Lan::new("p");
    let dir = test_dir("nicveth");
    let dev = format!("net_af_packet0,iface={}", ns.host_if);
    let text = config(&dir, &["vm"], &[("eth", dev.as_str())], &[]);
    let sw = Switch::start_config(dir.clone(), &text);
    let eth = sw.port_info("eth");
    assert_eq!(eth.state, "running", "{}\n{}", eth.json(), sw.log());
    assert_eq!(eth.dpdk.as_ref().map(|d| d.driver.as_str()), Some("net_af_packet"), "{}", eth.json());
    let mut vm = Testpmd::spawn(
        &format!("pvsvm{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:77:02", sw.sock("vm"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm", 1);
    vm.cmd("start");
    let (rx0, tx0) = ns.peer_counts();
    let count = 20;
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.net.ns, "ping", "-c", &count.to_string(), "-i", "0.05", "-W", "2", "10.77.0.2"])
        .output()
        .unwrap();
    assert!(std::path::Path::new("/usr/bin/ping").exists(), "ping missing: apt-get install iputils-ping");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("{count} received")), "ping failed:\n{text}\nswitch: {:#}", sw.ports().json());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (rx1, tx1) = ns.peer_counts();
    let (ns_rx, ns_tx) = (rx1 - rx0, tx1 - tx0);
    let (eth, vmp) = (sw.port_info("eth"), sw.port_info("vm"));
    // Before the pings nothing crossed; everything the namespace sent reached the VM, and
    // everything the VM answered reached the namespace.
    assert!(ns_tx >= count && ns_rx >= count, "namespace sent {ns_tx}, received {ns_rx}");
    assert_eq!(eth.counters.rx_packets, ns_tx, "{}", eth.json());
    assert_eq!(vmp.counters.tx_packets, ns_tx, "{}", vmp.json());
    assert_eq!(vmp.counters.rx_packets, ns_rx, "{}", vmp.json());
    assert_eq!(eth.counters.tx_packets, ns_rx, "{}", eth.json());
    let st = eth.dpdk.as_ref().and_then(|d| d.stats).unwrap_or_else(|| panic!("no DPDK stats: {}", eth.json()));
    assert_eq!((st.ipackets, st.opackets), (ns_tx, ns_rx), "{}", eth.json());
    assert!(drops(&eth).is_empty() && drops(&vmp).is_empty(), "{}\n{}", eth.json(), vmp.json());
    let vs = vm.port_stats();
    assert_eq!(vs[0], (ns_tx, ns_rx), "VM port stats");
    vm.quit();
}

/// A trunk to the physical network: the dpdk port (net_af_packet on a veth) carries VLANs 10
/// and 20 to a bridge in a namespace, where a Linux guest (the network's side) has an 802.1Q
/// interface on each. Two Linux guests on access ports, one per VLAN, ping and run TCP both
/// ways to their VLAN's interface at the same time; the guest's VLAN interfaces receive them
/// (so the tags were right), the switch learns the network's MAC on both VLANs behind the
/// trunk, and drops nothing for a VLAN.
#[test]
fn trunk_dpdk_port_carries_two_vlans_to_linux() {
    let Some(_g) = run_alone(&[NETNS, GUEST_NIC].concat()) else { return };
    let ns = Lan::bridged("v");
    let dir = test_dir("nictrunk");
    let text = format!(
        "{}[[port]]\nname = \"eth\"\ntype = \"dpdk\"\ndevice = \"net_af_packet0,iface={}\"\ntrunks = [10, 20]\n",
        config(&dir, &[], &[], &[]),
        ns.host_if
    );
    let text = ["v10", "v20"].iter().fold(text, |t, p| {
        t + &format!("[[port]]\nname = \"{p}\"\ntype = \"vhost-user\"\nsocket = \"{p}.sock\"\ntag = {}\n", &p[1..])
    });
    let sw = Switch::start_config(dir.clone(), &text);
    assert_eq!(sw.port_info("eth").state, "running", "{}", sw.log());
    let root = env!("CARGO_MANIFEST_DIR");
    let write_job = |name: &str, text: String| {
        let p = dir.join(format!("job-{name}.sh"));
        std::fs::write(&p, text).unwrap();
        p
    };
    let net_job = write_job(
        "net",
        r#"for v in 10 20; do
  ip link add link eth0 name eth0.$v type vlan id $v 2>/dev/null || vconfig add eth0 $v
  ip addr add 10.$v.0.1/24 dev eth0.$v
  ip link set eth0.$v up
done
iperf3 -s -B 10.10.0.1 -p 5210 >/dev/null 2>&1 &
iperf3 -s -B 10.20.0.1 -p 5220 >/dev/null 2>&1 &
while true; do
  echo PVS-COUNT $(cat /sys/class/net/eth0.10/statistics/rx_packets) $(cat /sys/class/net/eth0.20/statistics/rx_packets)
  sleep 1
done
"#
        .into(),
    );
    let vm_job = |v: u16| {
        format!(
            r#"P=10.{v}.0.1
i=0
until ping -c 1 -W 1 $P >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 120 ] || break; done
ping -c 5 -i 0.2 -W 2 $P | tail -n 2
for args in "" "-R"; do
  n=0
  until out=$(timeout 30 iperf3 -c $P -p 52{v} -t 2 -f m $args 2>&1); do n=$((n+1)); [ $n -lt 20 ] || break; sleep 0.5; done
  echo "$out" | grep -E "receiver" | sed "s/^/PVS-IPERF$args /"
done
"#
        )
    };
    let log = |name: &str| dir.join(format!("{name}.log"));
    let qemu = |cmd: &mut Command, name: &str, job: &std::path::Path| {
        cmd.args(["--name", name, "--job", job.to_str().unwrap(), "--log", log(name).to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("qemu-{name}.log"))).unwrap())
            .spawn()
            .expect("run scripts/run-vm.sh")
    };
    const NET_MAC: &str = "52:54:00:77:0a:01";
    let mut net = Command::new("ip");
    net.args(["netns", "exec", &ns.net.ns, &format!("{root}/scripts/run-vm.sh"), "--tap", "pvstap0", "--mac", NET_MAC]);
    let mut vms = vec![qemu(&mut net, "net", &net_job)];
    for v in [10u16, 20] {
        let job = write_job(&format!("v{v}"), vm_job(v));
        let mut cmd = Command::new(format!("{root}/scripts/run-vm.sh"));
        cmd.args(["--socket", &sw.sock(&format!("v{v}")), "--ip", &format!("10.{v}.0.2/24")]);
        vms.push(qemu(&mut cmd, &format!("v{v}"), &job));
    }
    let vms = Qemus(vms);
    let read = |name: &str| std::fs::read_to_string(log(name)).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    while !(read("v10").contains("PVS-JOB-EXIT") && read("v20").contains("PVS-JOB-EXIT")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the guests' jobs did not end\nv10:\n{}\nv20:\n{}\nnet:\n{}",
            read("v10"),
            read("v20"),
            read("net")
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // The network's VLAN interfaces' receive counters, a second after both jobs ended.
    let counts = |out: &str| -> Option<(u64, u64)> {
        let l = out.lines().rev().find(|l| l.starts_with("PVS-COUNT "))?;
        let mut n = l.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0));
        Some((n.next()?, n.next()?))
    };
    let seen = counts(&read("net"));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let (rx10, rx20) = counts(&read("net")).expect("the network guest's counters");
    drop(vms);
    let (eth, fdb) = (sw.port_info("eth"), sw.fdb());
    for v in ["v10", "v20"] {
        let out = read(v);
        eprintln!(
            "{v}: {}",
            out.lines().filter(|l| l.contains("PVS-") || l.contains("loss")).collect::<Vec<_>>().join(" | ")
        );
        assert!(out.contains(" 0% packet loss"), "{v} -> its VLAN's interface, ping:\n{out}\n{}", eth.json());
        assert!(out.contains("PVS-IPERF ") && out.contains("PVS-IPERF-R "), "{v}: iperf3 both ways:\n{out}");
    }
    // Each VLAN interface received its guest's TCP (thousands of segments), none the other's.
    assert!(rx10 > 1000 && rx20 > 1000, "the network's eth0.10/eth0.20 received {rx10}/{rx20} ({seen:?})");
    // Nothing the guests or the network sent on a VLAN was refused. What the trunk did refuse
    // is the network guest's own untagged IPv6 on eth0 (router solicitations, MLD, DAD: a
    // handful at boot), which a trunk without VLAN 0 drops as not allowed.
    assert_eq!(eth.counters.drops.get(DropReason::VlanStacked), 0, "{}", eth.json());
    assert!(eth.counters.drops.get(DropReason::VlanNotAllowed) < 50, "{}", eth.json());
    for v in ["v10", "v20"] {
        let p = sw.port_info(v);
        let refused = [DropReason::VlanNotAllowed, DropReason::VlanTagged, DropReason::VlanStacked]
            .map(|w| p.counters.drops.get(w));
        assert!(refused.iter().all(|n| *n == 0), "{v}: {}", p.json());
    }
    let on = |vlan: u16| fdb.iter().find(|e| e.mac == NET_MAC && e.vlan == vlan).cloned();
    for vlan in [10, 20] {
        assert_eq!(on(vlan).map(|e| e.port), Some(Some("eth".to_string())), "VLAN {vlan}: {}", fdb.json());
    }
}

/// A QEMU Linux guest (TCG) <-> pvswitchd <-> net_af_packet <-> veth <-> a namespace: ping both
/// ways and iperf3 TCP both ways between two real TCP stacks. The guest image comes from
/// scripts/build-guest.sh (PVS_GUEST_DIR overrides where it is looked for).
#[test]
fn qemu_guest_ping_and_iperf3_through_af_packet_veth() {
    let Some(_g) = run_alone(&[NETNS, GUEST_NIC].concat()) else { return };
    let ns = Lan::new("q");
    let dev = format!("net_af_packet0,iface={}", ns.host_if);
    let (eth, vmp) = qemu_guest_through(&ns, "nicqemu", &dev, &[], |_| {});
    // The guest sends 64 KiB TSO frames with partial checksums (offloads are on); af_packet
    // has no offloads, so the switch cut them into segments with complete checksums, which
    // the namespace's kernel verified (`qemu_guest_through` checks its counter).
    let nic = eth.dpdk.as_ref().unwrap_or_else(|| panic!("not a NIC: {}", eth.json()));
    assert!(!nic.offloads.tx_tso4, "{}", eth.json());
    assert!(eth.counters.sw_segmented > 0, "no TSO frame was segmented for the NIC: {}", eth.json());
    assert_eq!(eth.counters.hw_offloaded, 0, "{}", eth.json());
    assert!(eth.counters.tx_packets > vmp.counters.rx_packets, "{}\n{}", eth.json(), vmp.json());
    assert_eq!(vmp.counters.data_valid, 0, "af_packet verifies no checksum: {}", vmp.json());
    assert_eq!(nic.stats.map(|s| s.opackets), Some(eth.counters.tx_packets), "{}", eth.json());
}

/// The same through net_tap, whose interface is moved into the namespace: a device with TX
/// checksum and TSO offloads (done by its driver) and RX checksum verification. The guest's
/// 64 KiB TSO frames go to it whole, one mbuf chain each, for the device to segment and
/// checksum; the namespace's kernel verifies every checksum. Frames from the namespace arrive
/// with their TCP/UDP checksums verified by the device and reach the guest marked DATA_VALID.
#[test]
fn qemu_guest_iperf3_through_tap_with_device_offloads() {
    let Some(_g) = run_alone(&[NETNS, GUEST_NIC].concat()) else { return };
    let ns = Lan::bare("t");
    let iface = ns.host_if.clone();
    let dev = format!("net_tap0,iface={iface}");
    // net_tap (DPDK 22.11) refuses to segment into frames longer than its MTU (1500, its
    // most) counting the Ethernet header; an MTU of 1480 in the namespace makes TCP choose
    // segments that fit (the switch sends larger ones to software segmentation).
    let (eth, vmp) = qemu_guest_through(&ns, "nictap", &dev, &[], |_| ns.adopt(&iface, 1480));
    let nic = eth.dpdk.as_ref().unwrap_or_else(|| panic!("not a NIC: {}", eth.json()));
    let o = &nic.offloads;
    assert_eq!((o.tx_tso4, o.tx_checksum, o.rx_checksum), (true, true, true), "{}", eth.json());
    // Handed whole: no segmentation in software, and fewer frames sent than the device put on
    // the wire (it segmented them).
    assert!(eth.counters.hw_offloaded > 0, "no frame was handed to the device whole: {}", eth.json());
    assert_eq!(eth.counters.sw_segmented, 0, "{}", eth.json());
    assert_eq!(eth.counters.drops.get(DropReason::NicRefused), 0, "{}", eth.json());
    let wire = nic.stats.unwrap_or_else(|| panic!("no DPDK stats: {}", eth.json())).opackets;
    assert!(
        wire > eth.counters.tx_packets,
        "the device should have sent more frames than it was given: {}",
        eth.json()
    );
    // The guest negotiated GUEST_CSUM: the namespace's TCP frames reached it marked DATA_VALID.
    assert!(vmp.counters.data_valid > 1000, "{}", vmp.json());
}

/// The same with flows that rewrite the guest's source MAC on the way out: each 64 KiB frame
/// reaches the device as a new Ethernet header (the flow's) followed by the guest's bytes, in
/// one chain. (A VLAN push would also move the device's header lengths; this kernel has no
/// 802.1Q to receive it in the namespace, so `a_device_job_says_what_a_nic_needs` and the data
/// path's offset tests cover that part.)
#[test]
fn qemu_guest_iperf3_through_tap_with_a_rewritten_source_mac() {
    let Some(_g) = run_alone(&[NETNS, GUEST_NIC].concat()) else { return };
    let ns = Lan::bare("m");
    let iface = ns.host_if.clone();
    let dev = format!("net_tap0,iface={iface}");
    let flows = [
        "priority=10,in_port=vm,actions=mod_dl_src:02:00:00:00:00:99,output:eth",
        "priority=10,in_port=eth,actions=output:vm",
    ];
    let (eth, vmp) = qemu_guest_through(&ns, "nictapmac", &dev, &flows, |_| ns.adopt(&iface, 1480));
    assert!(eth.counters.hw_offloaded > 0, "no frame was handed to the device whole: {}", eth.json());
    assert_eq!(eth.counters.sw_segmented, 0, "{}", eth.json());
    assert_eq!(eth.counters.drops.get(DropReason::NicRefused), 0, "{}", eth.json());
    assert!(vmp.counters.data_valid > 1000, "{}", vmp.json());
}

/// Starts pvswitchd with VM port `vm` and NIC port `eth` (device `dev`), calls `adopt` once
/// it runs, then has a QEMU guest ping the namespace (10.77.0.1) and run iperf3 both ways to
/// it; the namespace pings back. Checks that everything the NIC received reached the guest,
/// that the namespace's kernel saw no bad TCP checksum, and returns `ports` for eth and vm.
fn qemu_guest_through(
    ns: &Lan,
    name: &str,
    dev: &str,
    flows: &[&str],
    adopt: impl FnOnce(&Switch),
) -> (PortInfo, PortInfo) {
    let dir = test_dir(name);
    let text = config(&dir, &["vm"], &[("eth", dev)], flows);
    let sw = Switch::start_config(dir.clone(), &text);
    assert_eq!(sw.port_info("eth").state, "running", "{}", sw.log());
    adopt(&sw);
    // What the NIC received before the guest is there (net_tap's interface talks IPv6 in the
    // host's namespace until it moves) went nowhere: count from once its queue is drained.
    let rx = || sw.counters("eth").rx_packets;
    let mut before = rx();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        match rx() {
            n if n == before => break,
            n => before = n,
        }
    }
    let mut iperf = KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", &ns.net.ns, "iperf3", "-s", "-B", "10.77.0.1"])
            .stdout(Stdio::null())
            .spawn()
            .expect("iperf3 server"),
    );
    let (vm, out) = guest_ping_iperf(&dir, &sw.sock("vm"), "10.77.0.2/24", "10.77.0.1", "pvsnic", None, 180);
    assert!(out.contains(" 0% packet loss"), "guest -> namespace ping:\n{out}");
    assert!(out.contains("PVS-IPERF ") && out.contains("PVS-IPERF-R "), "iperf3 both ways:\n{out}");
    // And from the namespace's Linux to the guest's.
    let p = Command::new("ip")
        .args(["netns", "exec", &ns.net.ns, "ping", "-c", "5", "-i", "0.2", "-W", "2", "10.77.0.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&p.stdout);
    assert!(text.contains(" 0% packet loss"), "namespace -> guest ping:\n{text}");
    let (eth, vmp) = (sw.port_info("eth"), sw.port_info("vm"));
    // Everything the NIC received went to the guest (the guest and the namespace are the only
    // talkers; flooding with two ports is a copy to the other one). A NIC cannot be held back:
    // what found the guest's ring full was dropped, and counted.
    let to_vm = vmp.counters.tx_packets + vmp.counters.drops.get(DropReason::RxRingFull);
    assert_eq!(eth.counters.rx_packets, before + to_vm, "{}\n{}", eth.json(), vmp.json());
    // TCP would have stalled on a bad checksum; the namespace kernel's counter stays 0.
    let snmp = ns.net.ex(&["cat", "/proc/net/snmp"]);
    let tcp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Tcp:")).collect();
    let (names, vals): (Vec<&str>, Vec<&str>) = (tcp[0].split(' ').collect(), tcp[1].split(' ').collect());
    let csum_errors = names.iter().position(|n| *n == "InCsumErrors").map(|i| vals[i]).unwrap();
    assert_eq!(csum_errors, "0", "the namespace's kernel saw bad TCP checksums:\n{snmp}");
    assert!(eth.counters.rx_packets > 1000, "{}", eth.json());
    let st = eth.dpdk.as_ref().and_then(|d| d.stats);
    assert_eq!(st.map(|s| s.ipackets), Some(eth.counters.rx_packets), "{}", eth.json());
    drop(vm);
    iperf.0.kill().ok();
    (eth, vmp)
}

/// Pings from the namespace to the VM; the replies.
fn pings(ns: &Lan, n: u32) -> u32 {
    let out = Command::new("ip")
        .args(["netns", "exec", &ns.net.ns, "ping", "-c", &n.to_string(), "-i", "0.05", "-W", "2", "10.77.0.2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(", ").find_map(|s| s.strip_suffix(" received").and_then(|n| n.trim().parse().ok())).unwrap_or(0)
}

/// The thread polling `eth`'s receive queue, and its stats.
fn nic_thread(sw: &Switch) -> (usize, ThreadStats) {
    let rxq = sw.rxq();
    let q = rxq.iter().find(|q| q.port == "eth").unwrap_or_else(|| panic!("{:#}", rxq.json()));
    let t = q.thread;
    (t, sw.thread_stats(t))
}

/// An idle host with a NIC sleeps (issue 54): with adaptive polling, an af_packet NIC on a veth
/// (no receive interrupts: the thread wakes on a timer that backs off from
/// `nic_poll_interval_us` to `nic_poll_max_us` while nothing comes) and a VM that sends
/// nothing, the NIC's poll thread is awake under 2% of the time, read from its own counters
/// (cycles polling against time asleep). Before, each 100 us sleep was followed by a whole
/// `idle_before_sleep_us` of polling: 91% of a core. Then, after the idle period: pings through
/// the NIC are answered, a flood of 200 frames (less than the NIC's ring and the VM's) arrives whole,
/// and the NIC's queue moved to the other thread while both sleep is still served.
#[test]
fn an_idle_host_with_a_nic_sleeps_and_wakes_for_its_frames() {
    let Some(_g) = run_alone(&[TESTPMD, NETNS].concat()) else { return };
    let ns = Lan::new("i");
    let dir = test_dir("nicidle");
    let dev = format!("net_af_packet0,iface={}", ns.host_if);
    let text = config(&dir, &["vm"], &[("eth", dev.as_str())], &[])
        .replace("poll_cores = [1]\n", "poll_cores = [0, 1]\npoll_mode = \"adaptive\"\n");
    let sw = Switch::start_config(dir.clone(), &text);
    let mut vm = Testpmd::spawn(
        &format!("pvsid{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:77:02", sw.sock("vm"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm", 1);
    vm.cmd("start");
    // The backoff reaches its ceiling while nothing comes.
    let (t, _) = nic_thread(&sw);
    wait_for("the NIC's thread to back off to nic_poll_max_us", || {
        let th = sw.thread_stats(t);
        (th.running.nic_sleep_us == th.running.nic_poll_max_us).then_some(())
    });
    let hz = sw.stats().tsc_hz as f64;
    let sample = |th: &ThreadStats| ((th.busy_cycles as f64 + th.idle_cycles as f64) / hz, th.asleep_secs, th.sleeps);
    let (_, th0) = nic_thread(&sw);
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (_, th1) = nic_thread(&sw);
    let ((p0, a0, s0), (p1, a1, s1)) = (sample(&th0), sample(&th1));
    let (polling, asleep) = (p1 - p0, a1 - a0);
    let awake = polling / (polling + asleep);
    eprintln!(
        "idle 3 s: {polling:.4} s polling, {asleep:.3} s asleep ({:.2}% awake), {} sleeps; running {}",
        awake * 100.0,
        s1 - s0,
        th1.running.json()
    );
    assert!(asleep > 2.0, "asleep only {asleep} s of 3");
    assert!(awake < 0.02, "the NIC's thread was awake {:.1}% of the time", awake * 100.0);

    // The first frames after the idle period: pings answered.
    assert_eq!(pings(&ns, 5), 5, "pings after an idle period\n{:#}", sw.ports().json());
    // A flood after an idle period, within the NIC's ring (net_af_packet's: 512 frames) and
    // the VM's (testpmd's: 256; a NIC's frames to a full guest ring drop at once, and testpmd
    // on a loaded machine may not drain 400 in time): every frame arrives.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (before, eth_before) = (sw.counters("vm").tx_packets, sw.counters("eth").rx_packets);
    let flood = r#"import socket
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('pvsns0', 0))
f = bytes.fromhex('ffffffffffff0200000077ee88b5') + bytes(50)
for i in range(200):
    s.send(f)
"#;
    ns.net.ex(&["python3", "-c", flood]);
    let arrived = try_wait_for(|| (sw.counters("vm").tx_packets >= before + 200).then_some(()));
    assert!(
        arrived.is_some(),
        "of 200 frames, the NIC took {} and the VM got {}: {:#}",
        sw.counters("eth").rx_packets - eth_before,
        sw.counters("vm").tx_packets - before,
        sw.ports().json()
    );
    let eth = sw.port_info("eth");
    assert!(drops(&eth).is_empty(), "{}", eth.json());

    // The NIC's queue moves to the other thread while both sleep; it is served there.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let other = 1 - t;
    let _: MoveReply = sw.ask_args("move", &["eth:0", &other.to_string()]);
    assert_eq!(nic_thread(&sw).0, other);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(pings(&ns, 5), 5, "pings after the move\n{:#}", sw.rxq().json());
    vm.quit();
}

/// A NIC with receive interrupts (issue 54): net_tap's queue file is readable while frames
/// wait, and an idle thread sleeps on it with no NIC timer at all (`nic_sleep_us` 0, `rxq`
/// says the queue wakes its thread by interrupt). Only the interrupt can then wake the thread
/// for the NIC's frames: pings from the namespace after an idle second are answered, those
/// wake-ups are counted as interrupts, and no timer ever woke it.
#[test]
fn a_nic_with_receive_interrupts_wakes_its_sleeping_thread() {
    let Some(_g) = run_alone(&[TESTPMD, NETNS].concat()) else { return };
    let ns = Lan::bare("r");
    let iface = ns.host_if.clone();
    let dir = test_dir("nicintr");
    let dev = format!("net_tap0,iface={iface}");
    // Two threads: net_tap wants as many TX queues as RX queues, so it gets one, shared.
    let text = config(&dir, &["vm"], &[("eth", dev.as_str())], &[])
        .replace("poll_cores = [1]\n", "poll_cores = [0, 1]\npoll_mode = \"adaptive\"\n");
    let sw = Switch::start_config(dir.clone(), &text);
    let eth = sw.port_info("eth");
    assert_eq!(eth.state, "running", "{}\n{}", eth.json(), sw.log());
    ns.adopt(&iface, 1500);
    let mut vm = Testpmd::spawn(
        &format!("pvsir{}", std::process::id()),
        &[format!("net_virtio_user0,path={},queues=1,mac=02:00:00:00:77:02", sw.sock("vm"))],
        &["--forward-mode=icmpecho"],
    );
    sw.wait_running("vm", 1);
    vm.cmd("start");
    let rxq = sw.rxq();
    let woken = |port: &str| rxq.iter().find(|q| q.port == port).and_then(|q| q.woken_by);
    assert_eq!((woken("eth"), woken("vm")), (Some(WokenBy::Interrupt), Some(WokenBy::Kick)), "{:#}", rxq.json());
    let (t, _) = nic_thread(&sw);
    wait_for("the NIC's thread asleep without a timer", || {
        let th = sw.thread_stats(t);
        (th.sleeping && th.sleeps > 0 && th.running.nic_sleep_us == 0).then_some(())
    });
    std::thread::sleep(std::time::Duration::from_secs(1));
    let before = sw.thread_stats(t);
    assert_eq!(pings(&ns, 5), 5, "pings to a sleeping thread\n{:#}\n{}", sw.ports().json(), before.json());
    let after = sw.thread_stats(t);
    assert!(after.wakeups.interrupt > before.wakeups.interrupt, "no wake-up by interrupt: {}", after.json());
    assert_eq!(after.wakeups.timeout, 0, "a timer woke the thread: {}", after.json());
    vm.quit();
}
