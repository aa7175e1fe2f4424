//! A reload applies every setting of the example configuration or says it cannot. Each key of
//! conf/pvswitch.example.toml (the commented ones too) is changed on its own on a running
//! pvswitchd and then changed back, and one of these holds:
//! - `Live`: the running switch follows, seen where it runs: the poll threads' own record of
//!   their tuning (`stats` `running`), the socket file, the data path's buckets and counters,
//!   the port replaced with the reply saying why;
//! - `Restart`: the reply names it as taking effect at restart;
//! - `Elsewhere`: another reload test checks the data path for it (named);
//! - `AtUse`: the control thread reads it from the running configuration each time it acts on
//!   it (placement, rebalancing, the next memory table), so there is no copy to go stale.
//!
//! A key the example gains without a case here fails the test.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use pvswitch::proto::{MirrorInfo, PollMode, PortInfo, RebalanceReply, Request, ThreadStats, VtepInfo, VxlanInfo};

enum Expect {
    Live(fn(&Switch, &Path, &str)),
    Restart(&'static str),
    Elsewhere(&'static str),
    AtUse(&'static str),
}
use Expect::*;

/// Where a case's lines go.
#[derive(Clone, Copy, PartialEq)]
enum At {
    Top,
    Switch,
    PortA,
    QueueA,
    Nic,
    Dpdk,
    /// A `[[vtep]]` on nic0, after everything else.
    Vtep,
    /// A `[[security_group]]` (or a `[[mirror]]`) of its own, after the base's group "web".
    Group,
}

struct Case {
    /// The example's section and key it covers.
    section: &'static str,
    key: &'static str,
    at: At,
    lines: &'static str,
    expect: Expect,
}

const fn case(section: &'static str, key: &'static str, at: At, lines: &'static str, expect: Expect) -> Case {
    Case { section, key, at, lines, expect }
}

/// The running switch's configuration with `extra` lines in section `at`: ports a and b
/// (vhost-user), nic0 (net_ring), one adaptive poll thread, a security group "web" no port is
/// in.
fn config(dir: &Path, at: At, extra: &str) -> String {
    let put = |here: At| if here == at { format!("{extra}\n") } else { String::new() };
    // The base's [switch] lines, less those the case sets itself.
    let key = |l: &str| l.split_once(" = ").map(|(k, _)| k.to_string());
    let own: Vec<String> = if at == At::Switch { extra.lines().filter_map(key).collect() } else { vec![] };
    let dir_line = format!("socket_dir = \"{}\"", dir.display());
    let base = ["poll_cores = [1]", &dir_line, "control_socket = \"ctl.sock\"", "poll_mode = \"adaptive\""];
    let base: String = base.iter().filter(|l| !own.contains(&key(l).unwrap())).map(|l| format!("{l}\n")).collect();
    format!(
        "{top}[switch]\n{base}{sw}\
         [[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"\n{a}{q}\
         [[port]]\nname = \"b\"\ntype = \"vhost-user\"\nsocket = \"b.sock\"\n\
         [[port]]\nname = \"nic0\"\ntype = \"dpdk\"\ndevice = \"net_ring0\"\n{nic}\
         [dpdk]\n{dpdk}{vtep}\
         [[security_group]]\nname = \"web\"\n{group}",
        top = put(At::Top),
        sw = put(At::Switch),
        a = put(At::PortA),
        q = if at == At::QueueA { format!("[[port.queue]]\n{extra}\n") } else { String::new() },
        nic = put(At::Nic),
        dpdk = put(At::Dpdk),
        vtep = put(At::Vtep),
        group = put(At::Group),
    )
}

/// A `[[vtep]]` on nic0 with `$extra` lines, one VNI and its remote 10.9.0.2 (`$remote`
/// lines replace the VNI's).
macro_rules! vtep {
    ($extra:literal) => {
        vtep!($extra, "[[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.9.0.2\"]\n")
    };
    ($extra:literal, $vni:literal) => {
        concat!("[[vtep]]\nname = \"vt\"\nunderlay = \"nic0\"\nlocal_ip = \"10.9.0.1/24\"\n", $extra, $vni)
    };
}

/// A `[[security_group]]` "g" with one ingress rule of `$extra` lines.
macro_rules! group {
    ($extra:literal) => {
        concat!("[[security_group]]\nname = \"g\"\n[[security_group.rule]]\ndirection = \"ingress\"\n", $extra)
    };
}

/// What a group's own key changes: the plans' rules, which datapath::tests::secgroups and
/// tests/secgroups.rs (QEMU guests, a rule removed live) check in the data path.
const GROUP_DATA_PATH: &str = "secgroups.rs";

fn groups_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("security groups changed"), "{summary}");
}

/// An `[ipfix]` table exporting to a port nobody listens on, with `$extra` lines.
macro_rules! ipfix {
    ($extra:literal) => {
        concat!("[ipfix]\ncollector = \"127.0.0.1:9\"\n", $extra)
    };
}

fn export_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("flow export changed"), "{summary}");
}

/// A `[[vrf]]` "t" with one network, of `$extra` lines after its name.
macro_rules! vrf {
    ($extra:literal) => {
        concat!("[[vrf]]\nname = \"t\"\n", $extra, "[[vrf.network]]\nvlan = 100\ngateway = \"10.1.0.1/24\"\n")
    };
}

fn vrfs_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("vrfs changed"), "{summary}");
}

/// A `[[mirror]]` "m" of `$extra` lines (after its name and output, b).
macro_rules! mirror {
    ($extra:literal) => {
        concat!("[[mirror]]\nname = \"m\"\noutput_port = \"b\"\n", $extra)
    };
}

/// The running mirror, after a reload that said mirrors changed.
fn mirror_now(sw: &Switch, summary: &str) -> MirrorInfo {
    assert!(summary.contains("mirrors changed"), "{summary}");
    let mut m = sw.mirrors();
    assert_eq!(m.len(), 1, "{}", m.json());
    assert_eq!((m[0].name.as_str(), m[0].output_port.as_str(), m[0].active), ("m", "b", true), "{}", m.json());
    m.remove(0)
}

/// The tunnel port of a `vtep!` case's remote.
fn tunnel(sw: &Switch, remote: &str) -> PortInfo {
    let p = sw.port_info(&format!("vt-{remote}"));
    assert_eq!(p.kind, "vxlan", "{}", p.json());
    p
}

/// The tunnel port of a `vtep!` case's remote: its `vxlan` object.
fn tunnel_vxlan(sw: &Switch, remote: &str) -> VxlanInfo {
    let p = tunnel(sw, remote);
    p.vxlan.clone().unwrap_or_else(|| panic!("no vxlan: {}", p.json()))
}

fn vtep(sw: &Switch) -> VtepInfo {
    let mut v = sw.vteps();
    assert_eq!(v.len(), 1, "{}", v.json());
    v.remove(0)
}

fn thread(sw: &Switch) -> ThreadStats {
    sw.thread_stats(0)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn stat(sw: &Switch, port: &str) -> std::fs::Metadata {
    std::fs::symlink_metadata(sw.sock(port)).unwrap()
}

fn replaced(summary: &str, port: &str, why: &str) {
    assert!(summary.contains(&format!("replaced: {port} ({why})")), "{summary}");
}

const CASES: &[Case] = &[
    case(
        "",
        "flows",
        At::Top,
        "flows = [\"actions=drop\"]\n",
        Elsewhere("reload.rs reload_under_traffic_loses_nothing"),
    ),
    case(
        "switch",
        "poll_cores",
        At::Switch,
        "",
        Elsewhere("placement.rs reload_adds_and_removes_poll_cores_under_traffic"),
    ),
    case(
        "switch",
        "poll_cores_per_node",
        At::Switch,
        "poll_cores_per_node = 2",
        AtUse("with poll_cores = \"auto\": placement"),
    ),
    case(
        "switch",
        "socket_dir",
        At::Switch,
        "",
        Live(|sw, dir, s| {
            // Relative socket paths move with it: the ports are replaced at the new paths; the
            // control socket stays until a restart.
            replaced(s, "a", "socket");
            assert!(s.contains("control socket changes take effect at restart"), "{s}");
            assert!(dir.join("alt/a.sock").exists());
            assert_eq!(sw.port_info("a").socket, dir.join("alt/a.sock").display().to_string());
        }),
    ),
    case("switch", "control_socket", At::Switch, "control_socket = \"other.sock\"", Restart("control socket changes")),
    case(
        "switch",
        "control_socket_mode",
        At::Switch,
        "control_socket_mode = \"0600\"",
        Restart("control socket changes"),
    ),
    case(
        "switch",
        "socket_mode",
        At::Switch,
        "socket_mode = \"0604\"",
        Live(|sw, _, s| {
            assert!(s.contains("socket_mode/socket_group"), "{s}");
            assert_eq!(stat(sw, "a").mode() & 0o777, 0o604);
            assert_eq!(sw.port_info("a").id, 0, "not replaced");
        }),
    ),
    case(
        "switch",
        "socket_group",
        At::Switch,
        "socket_group = \"daemon\"",
        Live(|sw, _, s| {
            assert!(s.contains("socket_mode/socket_group"), "{s}");
            assert_eq!(stat(sw, "b").gid(), 1, "group daemon");
        }),
    ),
    case(
        "switch",
        "weight_packets",
        At::Switch,
        "weight_packets = 8",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "switch",
        "weight_bytes",
        At::Switch,
        "weight_bytes = 4096",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "switch",
        "ports_dir",
        At::Switch,
        "ports_dir = \"pd2\"",
        Live(|sw, _, _| {
            assert!(sw.ports().iter().any(|p| p.name == "c"), "port c from pd2/c.toml");
        }),
    ),
    case(
        "switch",
        "max_ports",
        At::Switch,
        "max_ports = 3",
        Live(|sw, _, _| {
            let e = sw.try_ctl_args("add-port", &["d", "type=vhost-user", "socket=d.sock"]).unwrap_err();
            assert!(e.contains("at most 3 ports"), "{e}");
        }),
    ),
    case("switch", "burst", At::Switch, "burst = 7", Live(|sw, _, _| assert_eq!(thread(sw).running.burst, 7))),
    case(
        "switch",
        "rx_retry_us",
        At::Switch,
        "rx_retry_us = 2500",
        Live(|sw, _, _| assert_eq!(thread(sw).running.rx_retry_us, 2500)),
    ),
    case("switch", "metrics_listen", At::Switch, "metrics_listen = \"127.0.0.1:0\"", Restart("metrics_listen")),
    case(
        "switch",
        "poll_mode",
        At::Switch,
        "poll_mode = \"busy\"",
        Live(|sw, _, _| {
            assert_eq!(thread(sw).running.idle_before_sleep_us, None);
            assert_eq!(thread(sw).poll_mode, PollMode::Busy);
            wait_for("the thread awake", || (!thread(sw).sleeping).then_some(()));
        }),
    ),
    case(
        "switch",
        "idle_before_sleep_us",
        At::Switch,
        "idle_before_sleep_us = 1234",
        Live(|sw, _, _| assert_eq!(thread(sw).running.idle_before_sleep_us, Some(1234))),
    ),
    case(
        "switch",
        "park_after_us",
        At::Switch,
        "park_after_us = 0",
        Live(|sw, _, _| {
            assert_eq!(thread(sw).running.park_after_us, 0);
            wait_for("no queue parked", || (thread(sw).parked == 0).then_some(()));
        }),
    ),
    case(
        "switch",
        "park_check_us",
        At::Switch,
        "park_check_us = 777",
        Live(|sw, _, _| assert_eq!(thread(sw).running.park_check_us, 777)),
    ),
    case(
        "switch",
        "core_poll_mode",
        At::Switch,
        "core_poll_mode = { \"1\" = \"busy\" }",
        Live(|sw, _, _| assert_eq!(thread(sw).poll_mode, PollMode::Busy)),
    ),
    case(
        "switch",
        "rxq_assign",
        At::Switch,
        "rxq_assign = \"cycles\"",
        Live(|sw, _, _| assert_eq!(sw.ask::<RebalanceReply>(&Request::Rebalance { mode: None }).policy, "cycles")),
    ),
    case("switch", "rxq_isolate", At::Switch, "rxq_isolate = false", AtUse("placement")),
    case("switch", "auto_rebalance", At::Switch, "auto_rebalance = true", AtUse("the rebalancing timer")),
    case("switch", "rebalance_interval_s", At::Switch, "rebalance_interval_s = 5", AtUse("the rebalancing timer")),
    case(
        "switch",
        "rebalance_threshold_pct",
        At::Switch,
        "rebalance_threshold_pct = 50",
        AtUse("the rebalancing timer"),
    ),
    case(
        "switch",
        "rebalance_improvement_pct",
        At::Switch,
        "rebalance_improvement_pct = 10",
        AtUse("the rebalancing timer"),
    ),
    case(
        "switch",
        "mac_limit",
        At::Switch,
        "mac_limit = 3",
        Live(|sw, _, s| {
            assert!(s.contains("mac_limit"), "{s}");
            assert_eq!(sw.port_info("b").mac_limit, 3);
        }),
    ),
    case(
        "switch",
        "max_guest_memory_mib",
        At::Switch,
        "max_guest_memory_mib = 8",
        Elsewhere("hostile.rs memory_table_over_the_ports_limit"),
    ),
    case("switch", "max_memory_regions", At::Switch, "max_memory_regions = 2", AtUse("the next memory table")),
    case(
        "switch",
        "max_total_guest_memory_mib",
        At::Switch,
        "max_total_guest_memory_mib = 4096",
        AtUse("the next memory table"),
    ),
    case(
        "switch",
        "ct_max_connections",
        At::Switch,
        "ct_max_connections = 4096",
        Restart("ct_max_connections and ct_max_per_port"),
    ),
    case(
        "switch",
        "ct_max_per_port",
        At::Switch,
        "ct_max_per_port = 16",
        Restart("ct_max_connections and ct_max_per_port"),
    ),
    case(
        "port",
        "name",
        At::PortA,
        "",
        Live(|sw, _, s| {
            assert!(s.contains("1 added: a2"), "{s}");
            assert!(sw.ports().iter().all(|p| p.name != "a"));
        }),
    ),
    case(
        "port",
        "type",
        At::PortA,
        "",
        Live(|sw, _, s| {
            replaced(s, "a", "type");
            assert_eq!(sw.port_info("a").kind, "dpdk");
        }),
    ),
    case(
        "port",
        "socket",
        At::PortA,
        "",
        Live(|sw, _, s| {
            replaced(s, "a", "socket");
            assert!(Path::new(&sw.sock("a-new")).exists());
        }),
    ),
    case(
        "port",
        "mode",
        At::PortA,
        "mode = \"client\"",
        Live(|sw, _, s| {
            replaced(s, "a", "mode");
            assert_eq!(sw.port_info("a").mode, "client");
        }),
    ),
    case(
        "port",
        "queues",
        At::PortA,
        "queues = 2",
        Live(|sw, _, s| {
            replaced(s, "a", "queues");
            assert_eq!(sw.port_info("a").queue_pairs, 2);
        }),
    ),
    case("port", "mtu", At::PortA, "mtu = 9000", Elsewhere("reload.rs reload_adds_changes_and_removes_ports")),
    case(
        "port",
        "weight_packets",
        At::PortA,
        "weight_packets = 8",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "port",
        "weight_bytes",
        At::PortA,
        "weight_bytes = 4096",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "port",
        "allowed_macs",
        At::PortA,
        "allowed_macs = [\"52:54:00:00:00:01\"]",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "port",
        "allowed_ips",
        At::PortA,
        "allowed_ips = [\"10.0.0.5\", \"fd00::/64\"]",
        Live(|sw, _, s| {
            assert!(s.contains("allowed_ips"), "{s}");
            assert_eq!(sw.port_info("a").allowed_ips, strings(&["10.0.0.5/32", "fd00::/64"]));
        }),
    ),
    case(
        "port",
        "security_groups",
        At::PortA,
        "security_groups = [\"web\"]",
        Live(|sw, _, s| {
            assert!(s.contains("security_groups"), "{s}");
            let a = sw.port_info("a");
            assert_eq!((a.security_groups, a.connections), (strings(&["web"]), Some(0)));
        }),
    ),
    case("security_group", "name", At::Group, "[[security_group]]\nname = \"g\"\n", Live(groups_changed)),
    case(
        "security_group",
        "allow_all_egress",
        At::Group,
        "[[security_group]]\nname = \"g\"\nallow_all_egress = false\n",
        Live(groups_changed),
    ),
    case("security_group.rule", "direction", At::Group, group!(""), Live(groups_changed)),
    // Flow export: a new exporter in the plans (tests/ipfix.rs reads its records).
    case("ipfix", "collector", At::Group, ipfix!(""), Live(export_changed)),
    case("ipfix", "sampling", At::Group, ipfix!("sampling = 100\n"), Live(export_changed)),
    case("ipfix", "active_timeout_s", At::Group, ipfix!("active_timeout_s = 10\n"), Live(export_changed)),
    case("ipfix", "idle_timeout_s", At::Group, ipfix!("idle_timeout_s = 2\n"), Live(export_changed)),
    case("ipfix", "max_flows", At::Group, ipfix!("max_flows = 1024\n"), Live(export_changed)),
    case("ipfix", "observation_domain_id", At::Group, ipfix!("observation_domain_id = 9\n"), Live(export_changed)),
    // VRFs: made with each plan (`datapath::tests::routing` routes through them).
    case("vrf", "name", At::Group, vrf!("gateway_mac = \"02:00:00:00:01:01\"\n"), Live(vrfs_changed)),
    case("vrf", "gateway_mac", At::Group, vrf!("gateway_mac = \"02:00:00:00:01:02\"\n"), Live(vrfs_changed)),
    case("vrf.network", "vlan", At::Group, vrf!("gateway_mac = \"02:00:00:00:01:01\"\n"), Live(vrfs_changed)),
    case("vrf.network", "gateway", At::Group, vrf!("gateway_mac = \"02:00:00:00:01:01\"\n"), Live(vrfs_changed)),
    // Mirrors: made with each plan, as the data path tests (`datapath::tests::mirrors`) and
    // tests/mirrors.rs (a mirror added by a reload, copies seen) check.
    case("mirror", "name", At::Group, mirror!("select_all = true\n"), Live(|sw, _, s| drop(mirror_now(sw, s)))),
    case("mirror", "output_port", At::Group, mirror!("select_all = true\n"), Live(|sw, _, s| drop(mirror_now(sw, s)))),
    case(
        "mirror",
        "select_src_port",
        At::Group,
        mirror!("select_src_port = [\"a\"]\n"),
        Live(|sw, _, s| assert_eq!(mirror_now(sw, s).select_src_port, strings(&["a"]))),
    ),
    case(
        "mirror",
        "select_dst_port",
        At::Group,
        mirror!("select_dst_port = [\"a\", \"vm9\"]\n"),
        Live(|sw, _, s| assert_eq!(mirror_now(sw, s).absent, strings(&["vm9"]))),
    ),
    case(
        "mirror",
        "select_all",
        At::Group,
        mirror!("select_all = true\n"),
        Live(|sw, _, s| assert!(mirror_now(sw, s).select_all)),
    ),
    case(
        "mirror",
        "select_vlan",
        At::Group,
        mirror!("select_all = true\nselect_vlan = [100]\n"),
        Live(|sw, _, s| assert_eq!(mirror_now(sw, s).select_vlan, vec![100])),
    ),
    case(
        "mirror",
        "snaplen",
        At::Group,
        mirror!("select_all = true\nsnaplen = 128\n"),
        Live(|sw, _, s| assert_eq!(mirror_now(sw, s).snaplen, Some(128))),
    ),
    case("security_group.rule", "ethertype", At::Group, group!("ethertype = \"ipv6\"\n"), Elsewhere(GROUP_DATA_PATH)),
    case("security_group.rule", "protocol", At::Group, group!("protocol = \"udp\"\n"), Elsewhere(GROUP_DATA_PATH)),
    case(
        "security_group.rule",
        "ports",
        At::Group,
        group!("protocol = \"tcp\"\nports = \"80-443\"\n"),
        Elsewhere(GROUP_DATA_PATH),
    ),
    case("security_group.rule", "remote", At::Group, group!("remote = \"10.0.0.0/8\"\n"), Elsewhere(GROUP_DATA_PATH)),
    case(
        "security_group.rule",
        "remote_group",
        At::Group,
        group!("remote_group = \"web\"\n"),
        Elsewhere(GROUP_DATA_PATH),
    ),
    case(
        "port",
        "mac_limit",
        At::PortA,
        "mac_limit = 4",
        Live(|sw, _, s| {
            assert!(s.contains("a (mac_limit)"), "{s}");
            assert_eq!(sw.port_info("a").mac_limit, 4);
        }),
    ),
    case(
        "port",
        "max_guest_memory_mib",
        At::PortA,
        "max_guest_memory_mib = 8",
        Elsewhere("hostile.rs memory_table_over_the_ports_limit"),
    ),
    case(
        "port",
        "offloads",
        At::PortA,
        "offloads = false",
        Live(|sw, _, s| {
            // Not replaced: a connected guest keeps what it negotiated; the next one is offered none.
            assert!(s.contains("offloads (from the guest's next connection)"), "{s}");
            assert!(!s.contains("replaced"), "{s}");
            assert_eq!(sw.port_info("a").offloads.map(|o| o.offered), Some(false));
        }),
    ),
    case("port", "affinity", At::PortA, "affinity = 1", AtUse("placement")),
    case(
        "port",
        "tag",
        At::PortA,
        "tag = 10",
        Elsewhere("vlans.rs vlans_keep_tenants_apart_and_trunks_carry_them_tagged"),
    ),
    case(
        "port",
        "vlan_mode",
        At::PortA,
        "vlan_mode = \"trunk\"\ntrunks = [20]",
        Live(|sw, _, s| {
            assert!(!s.contains("replaced"), "{s}");
            let v = sw.port_info("a").vlan;
            assert_eq!((v.mode.as_str(), v.trunks.clone()), ("trunk", strings(&["20"])), "{}", v.json());
        }),
    ),
    case(
        "port",
        "ingress_pps",
        At::PortA,
        "ingress_pps = 1000",
        Live(|sw, _, _| assert!(sw.port_info("a").rate_caps.tokens.ingress_pps.is_some())),
    ),
    case(
        "port",
        "ingress_bps",
        At::PortA,
        "ingress_bps = 1000000",
        Live(|sw, _, _| assert!(sw.port_info("a").rate_caps.tokens.ingress_bps.is_some())),
    ),
    case(
        "port",
        "egress_pps",
        At::PortA,
        "egress_pps = 1000",
        Live(|sw, _, _| assert!(sw.port_info("a").rate_caps.tokens.egress_pps.is_some())),
    ),
    case(
        "port",
        "egress_bps",
        At::PortA,
        "egress_bps = 1000000",
        Live(|sw, _, _| assert!(sw.port_info("a").rate_caps.tokens.egress_bps.is_some())),
    ),
    case(
        "port",
        "rate_burst_ms",
        At::PortA,
        "egress_pps = 1000\nrate_burst_ms = 500",
        Live(|sw, _, _| {
            // The bucket holds 500 ms of 1000 frames/s.
            assert_eq!(sw.port_info("a").rate_caps.tokens.egress_pps, Some(500))
        }),
    ),
    case(
        "port.queue",
        "index",
        At::QueueA,
        "index = 0\nweight_packets = 8",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "port.queue",
        "weight_packets",
        At::QueueA,
        "index = 0\nweight_packets = 8",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case(
        "port.queue",
        "weight_bytes",
        At::QueueA,
        "index = 0\nweight_bytes = 4096",
        Elsewhere("reload.rs reload_adds_changes_and_removes_ports"),
    ),
    case("port.queue", "affinity", At::QueueA, "index = 0\naffinity = 1", AtUse("placement")),
    case(
        "port",
        "device",
        At::Nic,
        "",
        Live(|sw, _, s| {
            replaced(s, "nic0", "device");
            assert_eq!(sw.port_info("nic0").device.as_deref(), Some("net_ring1"));
        }),
    ),
    case("port", "rx_queues", At::Nic, "rx_queues = 2", Live(|_, _, s| replaced(s, "nic0", "rx_queues/tx_queues"))),
    case("port", "tx_queues", At::Nic, "tx_queues = 2", Live(|_, _, s| replaced(s, "nic0", "rx_queues/tx_queues"))),
    case("port", "rx_ring", At::Nic, "rx_ring = 512", Live(|_, _, s| replaced(s, "nic0", "rx_ring/tx_ring"))),
    case("port", "tx_ring", At::Nic, "tx_ring = 512", Live(|_, _, s| replaced(s, "nic0", "rx_ring/tx_ring"))),
    case(
        "dpdk",
        "eal_args",
        At::Dpdk,
        "eal_args = [\"--no-huge\", \"-m\", \"256\"]",
        Restart("[dpdk] eal_args and mbufs"),
    ),
    case("dpdk", "mbufs", At::Dpdk, "mbufs = 4095", Restart("[dpdk] eal_args and mbufs")),
    case(
        "dpdk",
        "nic_poll_interval_us",
        At::Dpdk,
        "nic_poll_interval_us = 777",
        Live(|sw, _, _| assert_eq!(thread(sw).running.nic_poll_interval_us, 777)),
    ),
    case(
        "dpdk",
        "nic_poll_max_us",
        At::Dpdk,
        "nic_poll_max_us = 7777",
        Live(|sw, _, _| assert_eq!(thread(sw).running.nic_poll_max_us, 7777)),
    ),
    case(
        "dpdk",
        "runtime_vdevs",
        At::Dpdk,
        "runtime_vdevs = [\"net_null\"]",
        AtUse("add-port, set-port and the port directory's files (tests/portcmds.rs)"),
    ),
    case("vtep", "name", At::Vtep, vtep!(""), Live(|sw, _, _| assert_eq!(vtep(sw).name, "vt"))),
    case("vtep", "underlay", At::Vtep, vtep!(""), Live(|sw, _, _| assert_eq!(vtep(sw).underlay, "nic0"))),
    case(
        "vtep",
        "local_ip",
        At::Vtep,
        vtep!(""),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.9.0.2").local, "10.9.0.1")),
    ),
    case(
        "vtep",
        "gateway",
        At::Vtep,
        vtep!("gateway = \"10.9.0.254\"\n", "[[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.8.0.2\"]\n"),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.8.0.2").next_hop, "10.9.0.254")),
    ),
    case(
        "vtep",
        "next_hop_mac",
        At::Vtep,
        vtep!("next_hop_mac = \"02:00:00:00:09:fe\"\n"),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.9.0.2").next_hop_mac.as_deref(), Some("02:00:00:00:09:fe"))),
    ),
    case(
        "vtep",
        "udp_port",
        At::Vtep,
        vtep!("udp_port = 4790\n"),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.9.0.2").udp_port, 4790)),
    ),
    case("vtep", "mtu", At::Vtep, vtep!("mtu = 1400\n"), Live(|sw, _, _| assert_eq!(tunnel(sw, "10.9.0.2").mtu, 1400))),
    case(
        "vtep",
        "learning",
        At::Vtep,
        vtep!("learning = false\n"),
        Live(|sw, _, _| assert!(!tunnel_vxlan(sw, "10.9.0.2").learning)),
    ),
    case(
        "vtep.vni",
        "vni",
        At::Vtep,
        vtep!("", "[[vtep.vni]]\nvni = 300\nvlan = 30\nremotes = [\"10.9.0.2\"]\n"),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.9.0.2").vnis, strings(&["300:30"]))),
    ),
    case(
        "vtep.vni",
        "vlan",
        At::Vtep,
        vtep!(""),
        Live(|sw, _, _| assert_eq!(tunnel(sw, "10.9.0.2").vlan.trunks, strings(&["10"]))),
    ),
    case(
        "vtep.vni",
        "remotes",
        At::Vtep,
        vtep!(""),
        Live(|sw, _, _| assert_eq!(tunnel_vxlan(sw, "10.9.0.2").remote, "10.9.0.2")),
    ),
];

/// The keys conf/pvswitch.example.toml sets or shows commented out, by section.
fn example_keys() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/pvswitch.example.toml")).unwrap();
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim();
        // A section header, or one shown commented out (`# [[mirror]]`).
        let header = l.strip_prefix('#').map(str::trim).filter(|h| {
            let name = h.trim_matches(|c| c == '[' || c == ']');
            h.starts_with('[') && h.ends_with(']') && name.chars().all(|c| c.is_ascii_lowercase() || "_.".contains(c))
        });
        if let Some(s) = header.or(Some(l)).and_then(|h| h.strip_prefix('[')) {
            section = s.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        // `key = ...`, or a commented-out `# key = ...` (a word, a space, an equals sign).
        let l = l.strip_prefix('#').map_or(l, str::trim);
        if let Some((k, _)) = l.split_once(" = ")
            && !k.is_empty()
            && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            keys.insert((section.clone(), k.to_string()));
        }
    }
    keys
}

#[test]
fn every_setting_of_the_example_is_applied_live_or_named() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("rl-every");
    std::fs::create_dir_all(dir.join("pd2")).unwrap();
    std::fs::write(dir.join("pd2/c.toml"), "name = \"c\"\ntype = \"vhost-user\"\nsocket = \"c.sock\"\n").unwrap();
    let sw = Switch::start_config(dir.clone(), &config(&dir, At::Top, ""));
    let base_ids: Vec<u16> = ["a", "b", "nic0"].iter().map(|p| sw.port_info(p).id).collect();

    let covered: BTreeSet<(String, String)> = CASES.iter().map(|c| (c.section.into(), c.key.into())).collect();
    let missing: Vec<_> = example_keys().difference(&covered).cloned().collect();
    assert!(missing.is_empty(), "example settings no case here changes: {missing:?}");

    for c in CASES {
        // Cases whose change is a port's identity spell the whole port.
        let text = match (c.section, c.key) {
            (_, "socket_dir") => config(&dir, At::Top, "").replace(
                &format!("socket_dir = \"{}\"", dir.display()),
                &format!("socket_dir = \"{}\"", dir.join("alt").display()),
            ),
            ("port", "name") => config(&dir, At::Top, "").replace("name = \"a\"", "name = \"a2\""),
            (_, "type") => config(&dir, At::Top, "").replace(
                "name = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"",
                "name = \"a\"\ntype = \"dpdk\"\ndevice = \"net_ring7\"",
            ),
            ("port", "socket") => config(&dir, At::Top, "").replace("socket = \"a.sock\"", "socket = \"a-new.sock\""),
            (_, "device") => config(&dir, At::Top, "").replace("net_ring0", "net_ring1"),
            _ => config(&dir, c.at, c.lines),
        };
        if c.key == "socket_dir" {
            std::fs::create_dir_all(dir.join("alt")).unwrap();
        }
        sw.write_config(&text);
        let summary = match sw.try_reload() {
            Ok(r) => r.summary,
            Err(e) => panic!("{}.{}: reload refused: {e}\n{text}", c.section, c.key),
        };
        match &c.expect {
            Live(check) => check(&sw, &dir, &summary),
            Restart(name) => {
                assert!(summary.contains(name) && summary.contains("take effect at restart"), "{}: {summary}", c.key)
            }
            Elsewhere(test) => assert!(!summary.contains("restart"), "{}: {summary} (its data path: {test})", c.key),
            AtUse(place) => assert!(!summary.contains("restart"), "{}: {summary} (read at use by {place})", c.key),
        }
        // And back: the reply for that says nothing of restarting either way but the same.
        sw.write_config(&config(&dir, At::Top, ""));
        let back = sw.reload().summary;
        if !matches!(c.expect, Restart(_)) {
            assert!(!back.contains("restart") || c.key == "socket_dir", "{} back: {back}", c.key);
        }
        for p in ["a", "b"] {
            let port = sw.port_info(p);
            assert_eq!(port.state, "listening", "{} back: port {p}: {}", c.key, port.json());
        }
    }
    // Ports never replaced by a case kept their ids.
    assert_eq!(sw.port_info("b").id, base_ids[1]);
    // The poll thread runs the file's tuning again.
    let r = thread(&sw).running;
    assert_eq!((r.burst, r.rx_retry_us), (32, 100), "{}", r.json());
}
