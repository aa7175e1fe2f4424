//! Tests of the configuration parser: good files, and bad ones with exact error positions.

mod basics {
    use super::super::*;

    fn err(text: &str) -> ConfigError {
        Config::parse("t.toml", text).unwrap_err()
    }

    #[test]
    fn parses_defaults_and_ports() {
        let c = Config::parse(
            "t.toml",
            "[switch]\npoll_cores = [1]\nsocket_dir = \"/tmp/x\"\n\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\nqueues = 2\n",
        )
        .unwrap();
        assert_eq!(c.poll_cores, vec![1]);
        assert_eq!(c.defaults.weight_packets, 256);
        assert_eq!(c.defaults.weight_bytes, 512 * 1024);
        assert_eq!(c.ports[0].vhost_user().unwrap().socket, PathBuf::from("/tmp/x/vm1.sock"));
        assert_eq!(c.ports[0].vhost_user().unwrap().queue_pairs, 2);
        assert_eq!(c.ports[0].vhost_user().unwrap().mode, SocketMode::Server);
    }

    #[test]
    fn unknown_key_has_position() {
        let e = err("[switch]\npoll_cores = [1]\nbogus = 3\n");
        assert_eq!((e.line, e.col), (3, 1), "{e}");
        assert!(e.message.contains("unknown field `bogus`"), "{e}");
    }

    #[test]
    fn duplicate_name_and_socket() {
        let p = "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s1\"\n";
        let e = err(&format!("{p}{}", p.replace("/s1", "/s2")));
        assert_eq!((e.line, e.col), (6, 8), "{e}");
        assert!(e.message.contains("duplicate port name"));
        let e = err(&format!("{p}{}", p.replace("\"a\"", "\"b\"")));
        assert_eq!((e.line, e.col), (8, 10), "{e}");
    }

    #[test]
    fn bad_values() {
        let e = err("[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nmode = \"sideways\"\n");
        assert_eq!(e.line, 5);
        assert!(e.message.contains("\"server\" or \"client\""));
        let e = err("[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nqueues = 0\n");
        assert_eq!((e.line, e.col), (5, 10));
        let e = err("[[port]]\nname = \"a\"\ntype = \"tap\"\nsocket = \"/s\"\n");
        assert_eq!((e.line, e.col), (3, 8));
        let e = err("[switch]\nweight_packets = 0\n");
        assert_eq!((e.line, e.col), (2, 18));
        let e = err("[switch]\npoll_cores = [1, 1]\n");
        assert!(e.message.contains("twice"));
        let e = err("[[port]]\nname = \"a\"\n");
        assert!(e.message.contains("missing field"), "{e}");
    }

    #[test]
    fn total_guest_memory_is_bounded() {
        let c = Config::parse("t.toml", "[switch]\npoll_cores = [1]\n").unwrap();
        assert_eq!(c.max_total_guest_memory_mib, 64 << 20);
        let c = Config::parse("t.toml", "[switch]\nmax_total_guest_memory_mib = 1024\n").unwrap();
        assert_eq!(c.max_total_guest_memory_mib, 1024);
        let e = err("[switch]\nmax_total_guest_memory_mib = 67108865\n");
        assert_eq!((e.line, e.col), (2, 30), "{e}");
        assert!(e.message.contains("expected a value from 1 to 67108864"), "{e}");
    }
}

mod dpdk_tests {
    use super::super::*;

    const NIC: &str = "[[port]]\nname = \"nic\"\ntype = \"dpdk\"\ndevice = \"net_ring0\"\n";

    #[cfg(feature = "dpdk")]
    #[test]
    fn dpdk_ports_and_section() {
        let c = Config::parse(
            "t.toml",
            &format!(
                "{NIC}tx_queues = 2\nrx_ring = 512\nmtu = 9000\n[dpdk]\neal_args = [\"--no-huge\"]\nmbufs = 4095\n"
            ),
        )
        .unwrap();
        let d = c.ports[0].dpdk().unwrap();
        assert_eq!(
            (d.device.as_str(), d.rx_queues, d.tx_queues, d.rx_ring, d.tx_ring),
            ("net_ring0", 1, Some(2), 512, 1024)
        );
        assert!(d.offloads, "device offloads are on by default");
        let off = Config::parse("t.toml", &format!("{NIC}offloads = false\n")).unwrap();
        assert!(!off.ports[0].dpdk().unwrap().offloads);
        assert_eq!((c.ports[0].mtu, c.ports[0].vhost_user().is_none()), (9000, true));
        assert_eq!(c.dpdk.eal_args, Some(vec!["--no-huge".to_string()]));
        assert_eq!((c.dpdk.mbufs, c.dpdk.nic_poll_interval_us), (4095, 100));
        let e = Config::parse("t.toml", &format!("{NIC}socket = \"/s\"\n")).unwrap_err();
        assert_eq!((e.line, e.col), (5, 10), "{e}");
        assert!(e.message.contains("only for vhost-user"), "{e}");
        let e = Config::parse("t.toml", "[[port]]\nname = \"n\"\ntype = \"dpdk\"\n").unwrap_err();
        assert_eq!((e.line, e.col), (3, 8), "{e}");
        assert!(e.message.contains("needs `device`"), "{e}");
        let e = Config::parse("t.toml", &format!("{NIC}rx_queues = 0\n")).unwrap_err();
        assert_eq!((e.line, e.col), (5, 13), "{e}");
        let e = Config::parse("t.toml", &format!("{NIC}[dpdk]\nbogus = 1\n")).unwrap_err();
        assert_eq!(e.line, 6, "{e}");
    }

    #[test]
    fn device_is_dpdk_only() {
        let e = Config::parse(
            "t.toml",
            "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\ndevice = \"net_ring0\"\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (5, 10), "{e}");
        assert!(e.message.contains("only for dpdk ports"), "{e}");
    }

    #[cfg(not(feature = "dpdk"))]
    #[test]
    fn dpdk_port_needs_the_feature() {
        let e = Config::parse("t.toml", NIC).unwrap_err();
        assert_eq!((e.line, e.col), (3, 8), "{e}");
        assert!(e.message.contains("this pvswitchd was built without DPDK support"), "{e}");
    }
}

mod flow_tests {
    use super::super::*;

    const PORTS: &str = "[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"/s1\"\n\
                         [[port]]\nname = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"/s2\"\n";

    fn err(flows: &str) -> ConfigError {
        Config::parse("t.toml", &format!("flows = [\n{flows}\n]\n{PORTS}")).unwrap_err()
    }

    #[test]
    fn good_flows_parse() {
        let c = Config::parse(
            "t.toml",
            &format!("flows = [\n  \"priority=100,in_port=vm1,ip,nw_dst=10.0.0.0/24,actions=output:vm2\",\n  \"actions=normal\",\n]\n{PORTS}"),
        )
        .unwrap();
        assert_eq!(c.flows.len(), 2);
    }

    #[test]
    fn flow_errors_point_into_the_string() {
        // Line 2 is the first flow line; the string starts at column 4 (after two spaces and the quote).
        let e = err("  \"in_port=vm9,actions=drop\"");
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("vm9"), "{e}");
        assert!(e.col >= 4 && e.col <= 12, "{e}");
        let e = err("  \"in_port=vm1,actions=output:nowhere\"");
        assert!(e.message.contains("nowhere"), "{e}");
        assert!(e.col > 20, "{e}");
        let e = err("  \"tp_dst=80,actions=drop\"");
        assert!(e.message.contains("tp_dst"), "{e}");
        let e = err("  \"priority=70000,actions=drop\"");
        assert!(e.message.contains("priority"), "{e}");
        let e = err("  \"ip,nw_dst=10.0.0.300,actions=drop\"");
        assert!(e.message.contains("nw_dst"), "{e}");
        let e = err("  \"in_port=vm1\"");
        assert!(e.message.contains("actions"), "{e}");
        let e = err("  \"dl_vlan=5000,actions=drop\"");
        assert!(e.message.contains("dl_vlan"), "{e}");
    }

    #[test]
    fn port_security_and_weights() {
        let c = Config::parse(
            "t.toml",
            "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nallowed_macs = [\"02:00:00:00:00:01\"]\nweight_packets = 64\n",
        )
        .unwrap();
        assert_eq!(c.ports[0].allowed_macs, vec![crate::wire::MacAddr([2, 0, 0, 0, 0, 1])]);
        assert_eq!((c.ports[0].weight_packets, c.ports[0].weight_bytes), (64, DEFAULT_WEIGHT_BYTES));
        let e = Config::parse(
            "t.toml",
            "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nallowed_macs = [\"02:00:00:00:00\"]\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.col), (5, 17), "{e}");
        let port = "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n";
        let c = Config::parse("t.toml", &format!("{port}allowed_ips = [\"10.0.0.5\", \"fd00::/64\"]\n")).unwrap();
        let ips: Vec<String> = c.ports[0].allowed_ips.iter().map(|p| p.to_string()).collect();
        assert_eq!(ips, ["10.0.0.5/32", "fd00::/64"]);
        let e =
            Config::parse("t.toml", &format!("{port}allowed_ips = [\"10.0.0.0/8\", \"10.0.0.1/24\"]\n")).unwrap_err();
        assert_eq!((e.line, e.col), (5, 30), "{e}");
        assert!(e.message.contains("host bits zero"), "{e}");
    }
}

mod placement_tests {
    use super::super::*;

    const PORT: &str = "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nqueues = 2\n";

    #[test]
    fn polling_and_placement_options() {
        let c = Config::parse(
            "t.toml",
            &format!(
                "[switch]\npoll_cores = [0, 1]\npoll_mode = \"adaptive\"\nidle_before_sleep_us = 50\n\
                 core_poll_mode = {{ \"1\" = \"busy\" }}\nrxq_assign = \"group\"\nauto_rebalance = true\n{PORT}\
                 [[port.queue]]\nindex = 1\nweight_packets = 8\naffinity = 1\n"
            ),
        )
        .unwrap();
        assert_eq!(c.sleep_after_us(0), Some(50));
        assert_eq!(c.sleep_after_us(1), None);
        assert_eq!(c.rxq_assign, crate::config::RxqAssign::Group);
        assert!(c.auto_rebalance && c.rxq_isolate);
        let q = &c.ports[0].queue_cfg;
        assert_eq!((q[0].weight_packets, q[0].affinity), (DEFAULT_WEIGHT_PACKETS, None));
        assert_eq!((q[1].weight_packets, q[1].affinity), (8, Some(1)));
    }

    #[test]
    fn placement_option_errors() {
        let e = Config::parse("t.toml", &format!("[switch]\npoll_cores = [0]\n{PORT}[[port.queue]]\nindex = 2\n"))
            .unwrap_err();
        assert!(e.message.contains("queue index 2"), "{e}");
        let e = Config::parse("t.toml", &format!("[switch]\npoll_cores = [0]\n{PORT}affinity = 3\n")).unwrap_err();
        assert!(e.message.contains("affinity 3"), "{e}");
        let e = Config::parse("t.toml", "[switch]\nrxq_assign = \"random\"\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 14), "{e}");
        let e = Config::parse("t.toml", "[switch]\npoll_mode = \"lazy\"\n").unwrap_err();
        assert!(e.message.contains("\"busy\" or \"adaptive\""), "{e}");
        let e =
            Config::parse("t.toml", "[switch]\npoll_cores = [1]\ncore_poll_mode = { \"2\" = \"busy\" }\n").unwrap_err();
        assert!(e.message.contains("not in poll_cores"), "{e}");
        let e = Config::parse("t.toml", "[switch]\npoll_cores = \"many\"\n").unwrap_err();
        assert!(e.message.contains("\"auto\""), "{e}");
        let c = Config::parse("t.toml", "[switch]\npoll_cores = \"auto\"\n").unwrap();
        assert!(!c.poll_cores.is_empty());
    }
}

mod dropins;
mod mirrors;
mod one_port;
mod sections;
mod tenant;
mod vrfs;
// A vtep's underlay is a dpdk port, which a build without DPDK refuses.
#[cfg(feature = "dpdk")]
mod vtep;

mod runtime_devices {
    use crate::config::DpdkConfig;

    fn grants(g: &[&str]) -> DpdkConfig {
        DpdkConfig { runtime_vdevs: g.iter().map(|s| s.to_string()).collect(), ..DpdkConfig::default() }
    }

    /// What a port added at run time may pass to DPDK: PCI addresses with harmless
    /// arguments; vdevs only as granted, whole or (a bare driver name) without arguments.
    #[test]
    fn run_time_devices_name_nothing_of_the_host_unless_granted() {
        let none = grants(&[]);
        for ok in ["0000:03:00.0", "03:00.1", "0000:af:1f.7,rxq_pkt_len=2048", "0000:03:00.0,dv_flow_en=1"] {
            none.runtime_device(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            "net_pcap1,tx_pcap=/some/file",
            "net_vhost3,iface=/some/path.sock",
            "net_af_packet0,iface=eth0",
            "net_tap0,iface=tap9",
            "net_null0",
            "0000:03:00.0,path=/etc/passwd",
            "0000:03:00.0,x=a/b",
            "0000:03:00",
            "00:03:00.0",
        ] {
            let e = none.runtime_device(bad).unwrap_err();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        let g = grants(&["net_null", "net_af_packet1,iface=veth7"]);
        for ok in ["net_null0", "net_null12", "net_af_packet1,iface=veth7"] {
            g.runtime_device(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["net_null0,size=64", "net_af_packet1,iface=eth0", "net_af_packet2,iface=veth7", "net_nullx"] {
            let e = g.runtime_device(bad).unwrap_err();
            assert!(e.contains("granted: net_null, net_af_packet1,iface=veth7"), "{bad}: {e}");
        }
    }

    #[test]
    fn runtime_vdevs_are_virtual_devices() {
        let c = crate::config::Config::parse("t.toml", "[dpdk]\nruntime_vdevs = [\"net_ring\"]\n").unwrap();
        assert_eq!(c.dpdk.runtime_vdevs, ["net_ring"]);
        let e = crate::config::Config::parse("t.toml", "[dpdk]\nruntime_vdevs = [\"0000:03:00.0\"]\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 18), "{e}");
        assert!(e.message.contains("expected a virtual device"), "{e}");
    }
}
