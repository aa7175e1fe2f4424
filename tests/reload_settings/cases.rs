//! The cases of `every_setting_of_the_example_is_applied_live_or_named`: one per key of the
//! example configuration, with where its lines go and what a reload of it must show.

use super::*;

pub(super) const CASES: &[Case] = &[
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
