//! One port on its own (`PortConfig::parse_one`, what an add-port request carries) and the
//! checks of a port against the others (`Config::check_port`, `Config::parse_port`).

use super::super::*;

const SWITCH: &str = "[switch]\npoll_cores = [0, 1]\nsocket_dir = \"/tmp/x\"\nweight_packets = 64\nmac_limit = 7\n";
const VM1: &str = "[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n";

fn running() -> Config {
    Config::parse("t.toml", &format!("{SWITCH}{VM1}")).unwrap()
}

#[test]
fn a_port_alone_takes_the_switch_defaults() {
    let d = running().defaults;
    let text = "name = \"vm3\"\ntype = \"vhost-user\"\nsocket = \"vm3.sock\"\nqueues = 2\nmode = \"client\"\n\
                [[queue]]\nindex = 1\naffinity = 1\n";
    let p = PortConfig::parse_one("add-port", text, &d).unwrap();
    let v = p.vhost_user().unwrap();
    assert_eq!((v.socket.as_path(), v.mode, v.queue_pairs), (Path::new("/tmp/x/vm3.sock"), SocketMode::Client, 2));
    assert_eq!((p.weight_packets, p.weight_bytes, p.mac_limit, p.mtu), (64, DEFAULT_WEIGHT_BYTES, 7, 1500));
    assert_eq!((p.queue_cfg[0].affinity, p.queue_cfg[1].affinity), (None, Some(1)));
    // The same keys in a file give the same port.
    let f =
        Config::parse("t.toml", &format!("{SWITCH}[[port]]\n{}", text.replace("[[queue]]", "[[port.queue]]"))).unwrap();
    assert_eq!(format!("{:?}", f.ports[0]), format!("{p:?}"));
    assert_eq!(PortDefaults::default(), Config::parse("t.toml", "").unwrap().defaults);
}

#[test]
fn a_port_alone_has_errors_positioned_in_its_text() {
    let d = PortDefaults::default();
    let err = |text: &str| PortConfig::parse_one("add-port", text, &d).unwrap_err();
    let e = err("name = \"vm3\"\ntype = \"vhost-user\"\nsocket = \"/s\"\nqueues = 0\n");
    assert_eq!((e.file.as_str(), e.line, e.col), ("add-port", 4, 10), "{e}");
    assert!(e.message.contains("queues: expected 1 to 64"), "{e}");
    assert_eq!(e.snippet, "queues = 0");
    let e = err("name = \"vm3\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n\nbogus = 1\n");
    assert_eq!((e.line, e.col), (5, 1), "{e}");
    assert!(e.message.contains("unknown field `bogus`"), "{e}");
    let e = err("name = \"a b\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n");
    assert_eq!((e.line, e.col), (1, 8), "{e}");
    let e = err("type = \"vhost-user\"\nsocket = \"/s\"\n");
    assert!(e.message.contains("missing field `name`"), "{e}");
    let e = err("name = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n[[queue]]\nindex = 1\n");
    assert_eq!((e.line, e.col), (5, 9), "{e}");
    assert!(e.message.contains("queue index 1: the port has 1 receive queues"), "{e}");
    // A [[port]] table is the file's form, not a port's keys.
    let e = err("[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n");
    assert!(e.message.contains("unknown field `port`"), "{e}");
}

#[test]
fn clashes_with_the_running_ports() {
    let c = running();
    let port = |text: &str| PortConfig::parse_one("add-port", text, &c.defaults).unwrap();
    let fresh = port("name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\n");
    assert_eq!(c.check_port(&fresh), Ok(()));
    let same_name = port("name = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\n");
    assert_eq!(c.check_port(&same_name), Err(PortClash::Name("vm1".into())));
    // Relative and absolute spellings of one path are one socket.
    let same_socket = port("name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"/tmp/x/vm1.sock\"\n");
    assert_eq!(c.check_port(&same_socket), Err(PortClash::Socket("/tmp/x/vm1.sock".into())));
    let pinned = port("name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\naffinity = 5\n");
    let clash = c.check_port(&pinned).unwrap_err();
    assert_eq!(clash.to_string(), "port vm2: affinity 5 is not one of poll_cores [0, 1]");

    // Positioned in the request's text, at the key that clashes.
    let e = c.parse_port("add-port", "type = \"vhost-user\"\nname = \"vm1\"\nsocket = \"vm2.sock\"\n").unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.col, e.message.as_str()), ("add-port", 2, 8, "duplicate port name \"vm1\""));
    let e = c.parse_port("add-port", "name = \"vm2\"\ntype = \"vhost-user\"\n\nsocket = \"vm1.sock\"\n").unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (4, 10, "duplicate socket path /tmp/x/vm1.sock"), "{e}");
    let e = c
        .parse_port(
            "add-port",
            "name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"s\"\n[[queue]]\nindex = 0\naffinity = 3\n",
        )
        .unwrap_err();
    assert_eq!((e.line, e.col), (1, 8), "{e}");
    assert!(e.message.contains("affinity 3"), "{e}");
    let p = c.parse_port("add-port", "name = \"vm2\"\ntype = \"vhost-user\"\nsocket = \"vm2.sock\"\n").unwrap();
    assert_eq!(p.name, "vm2");
}

#[test]
fn a_full_switch_takes_no_more_ports() {
    let mut text = String::new();
    for i in 0..MAX_PORTS {
        text += &format!("[[port]]\nname = \"p{i}\"\ntype = \"vhost-user\"\nsocket = \"/s{i}\"\n");
    }
    let c = Config::parse("t.toml", &text).unwrap();
    let e = c.parse_port("add-port", "name = \"one-more\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n").unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (1, 1, "at most 1024 ports (max_ports)"), "{e}");
    text += "[[port]]\nname = \"one-more\"\ntype = \"vhost-user\"\nsocket = \"/s\"\n";
    let e = Config::parse("t.toml", &text).unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (1, 1, "1025 ports: at most 1024 (max_ports)"), "{e}");
}

#[cfg(feature = "dpdk")]
#[test]
fn a_device_is_used_once() {
    let nic = |name: &str, dev: &str| format!("[[port]]\nname = \"{name}\"\ntype = \"dpdk\"\ndevice = \"{dev}\"\n");
    // The main file grants net_ring's instances to ports added at run time.
    let grant = "[dpdk]\nruntime_vdevs = [\"net_ring\"]\n";
    let c = Config::parse("t.toml", &format!("{}{}{grant}", nic("a", "net_ring0"), nic("b", "net_ring1"))).unwrap();
    assert_eq!(c.ports.len(), 2);
    // DPDK knows a device by its name, up to the first comma.
    let e = Config::parse("t.toml", &format!("{}{}", nic("a", "net_ring0"), nic("b", "net_ring0,nodeaction=x")))
        .unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (8, 10, "duplicate device \"net_ring0\""), "{e}");
    let e = c.parse_port("add-port", "name = \"c\"\ntype = \"dpdk\"\ndevice = \" net_ring1 \"\n").unwrap_err();
    assert_eq!((e.line, e.col, e.message.as_str()), (3, 10, "duplicate device \"net_ring1\""), "{e}");
    assert!(c.parse_port("add-port", "name = \"c\"\ntype = \"dpdk\"\ndevice = \"net_ring2\"\n").is_ok());
}
