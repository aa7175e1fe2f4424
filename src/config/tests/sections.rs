//! The section validators that had no test of their own: socket permissions, `[dpdk]`, the
//! rest of `[switch]` (control socket, metrics endpoint, poll cores, ranges), per-queue weights.

use super::super::*;

fn err(text: &str) -> ConfigError {
    Config::parse("t.toml", text).unwrap_err()
}

const PORT: &str = "[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"\n";

#[test]
fn socket_permissions() {
    let c = Config::parse("t.toml", PORT).unwrap();
    assert_eq!((c.control_socket_mode, c.ports[0].vhost_user().unwrap().socket_perms), (0o660, SocketPerms::default()));
    let c = Config::parse(
        "t.toml",
        &format!("[switch]\ncontrol_socket_mode = \"0o600\"\nsocket_mode = \"0666\"\nsocket_group = \"0\"\n{PORT}"),
    )
    .unwrap();
    assert_eq!(c.control_socket_mode, 0o600);
    assert_eq!(c.ports[0].vhost_user().unwrap().socket_perms, SocketPerms { mode: Some(0o666), gid: Some(0) });
    assert_eq!(c.defaults.socket_perms, SocketPerms { mode: Some(0o666), gid: Some(0) });
    let e = err("[switch]\nsocket_mode = \"0999\"\n");
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 15, "socket_mode: expected an octal mode such as \"0660\""));
    let e = err("[switch]\ncontrol_socket_mode = \"1777\"\n");
    assert_eq!((e.line, e.col), (2, 23), "{e}");
    assert!(e.message.starts_with("control_socket_mode:"), "{e}");
    let e = err("[switch]\n\nsocket_group = \"no-such-group-here\"\n");
    assert_eq!((e.line, e.col), (3, 16), "{e}");
    assert!(e.message.contains("no group \"no-such-group-here\" in /etc/group"), "{e}");
}

#[test]
fn dpdk_section() {
    let c = Config::parse("t.toml", "").unwrap();
    assert_eq!(c.dpdk, DpdkConfig::default());
    let c = Config::parse("t.toml", "[dpdk]\nnic_poll_interval_us = 7\n").unwrap();
    assert_eq!((c.dpdk.eal_args.as_ref(), c.dpdk.mbufs, c.dpdk.nic_poll_interval_us), (None, DEFAULT_MBUFS, 7));
    let e = err("[dpdk]\nmbufs = 1000\n");
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 9, "mbufs: expected a value from 1023 to 16777216"));
    let e = err("[dpdk]\nnic_poll_interval_us = 0\n");
    assert_eq!((e.line, e.col), (2, 24), "{e}");
    let e = err("[dpdk]\neal_args = \"--no-huge\"\n");
    assert_eq!(e.line, 2, "{e}");
}

#[test]
fn switch_section() {
    let c = Config::parse(
        "t.toml",
        "[switch]\nsocket_dir = \"/tmp/x\"\ncontrol_socket = \"ctl.sock\"\nmetrics_listen = \"127.0.0.1:9464\"\n",
    )
    .unwrap();
    assert_eq!(c.control_socket, PathBuf::from("/tmp/x/ctl.sock"));
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
    assert_eq!((c.burst, c.rx_retry_us, c.rxq_assign, c.auto_rebalance), (32, 100, RxqAssign::RoundRobin, false));
    let c = Config::parse("t.toml", "").unwrap();
    assert_eq!((c.control_socket.as_path(), c.metrics_listen), (Path::new(DEFAULT_CONTROL_SOCKET), None));
    let e = err("[switch]\nmetrics_listen = \"localhost\"\n");
    assert_eq!((e.line, e.col), (2, 18), "{e}");
    assert!(e.message.contains("expected ADDRESS:PORT"), "{e}");
    let e = err("[switch]\npoll_cores = []\n");
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 14, "poll_cores: expected at least one CPU id"));
    let e = err("[switch]\npoll_cores = [3, 1, 3]\n");
    assert_eq!(e.message, "poll_cores: CPU 3 listed twice");
    let e = err("[switch]\nburst = 33\n");
    assert_eq!((e.line, e.col, e.message.as_str()), (2, 9, "burst: expected a value from 1 to 32"));
    let e = err("[switch]\nrebalance_threshold_pct = 101\n");
    assert_eq!((e.line, e.col), (2, 27), "{e}");
    let e = err("[switch]\nmax_memory_regions = 9\n");
    assert_eq!(e.message, "max_memory_regions: expected a value from 1 to 8");
    let e = err("[switch]\npoll_cores = [1]\ncore_poll_mode = { \"x\" = \"busy\" }\n");
    assert_eq!((e.line, e.col), (3, 18), "{e}");
}

#[test]
fn queue_weights_and_port_limits() {
    let q = "[[port.queue]]\nindex = 0\nweight_bytes = 63\n";
    let e = err(&format!("{PORT}queues = 2\n{q}"));
    assert_eq!((e.line, e.col, e.message.as_str()), (8, 16, "weight_bytes: expected a value from 64 to 1073741824"));
    let c = Config::parse("t.toml", &format!("[switch]\nmax_guest_memory_mib = 2\n{PORT}max_memory_regions = 3\n"))
        .unwrap();
    assert_eq!((c.ports[0].mem_limits.max_bytes, c.ports[0].mem_limits.max_regions), (2 << 20, 3));
    let e = err(&format!("{PORT}mtu = 67\n"));
    assert_eq!((e.line, e.col, e.message.as_str()), (5, 7, "mtu: expected a value from 68 to 9216"));
}

#[test]
fn ipfix_section() {
    let c = Config::parse("t.toml", &format!("{PORT}[ipfix]\ncollector = \"[::1]:4739\"\nsampling = 100\n")).unwrap();
    let x = c.ipfix.unwrap();
    assert_eq!(
        (x.collector.to_string().as_str(), x.sampling, x.active_timeout_s, x.idle_timeout_s),
        ("[::1]:4739", 100, 60, 15)
    );
    assert!(Config::parse("t.toml", PORT).unwrap().ipfix.is_none());
    for (text, line, msg) in [
        ("[ipfix]\ncollector = \"collector.example\"\n", 2, "collector: expected an address and UDP port"),
        ("[ipfix]\ncollector = \"10.0.0.1:0\"\n", 2, "collector: port 0"),
        ("[ipfix]\ncollector = \"10.0.0.1:4739\"\nsampling = 0\n", 3, "sampling: expected a value from 1"),
        ("[ipfix]\ncollector = \"10.0.0.1:4739\"\nidle_timeout_s = 0\n", 3, "idle_timeout_s: expected"),
        ("[ipfix]\nsampling = 2\n", 1, "missing field `collector`"),
    ] {
        let e = err(text);
        assert!(e.line == line && e.message.contains(msg), "{text}: {e}");
    }
}
