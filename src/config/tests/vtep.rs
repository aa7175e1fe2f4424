//! `[[vtep]]`: a VXLAN tunnel endpoint makes one "vxlan" port per remote endpoint, a trunk of
//! the VLANs whose VNIs list it; each bad value is refused at its own line and column.

use super::super::*;
use crate::config::vlan::{PortVlan, VlanMode};

/// A file with a dpdk port "up" and a vhost-user port "vm", then `vtep`.
fn file(vtep: &str) -> String {
    format!(
        "[[port]]\nname = \"up\"\ntype = \"dpdk\"\ndevice = \"net_null0\"\n\
         [[port]]\nname = \"vm\"\ntype = \"vhost-user\"\nsocket = \"vm.sock\"\ntag = 10\n{vtep}"
    )
}

const GOOD: &str = "[[vtep]]\nname = \"v\"\nunderlay = \"up\"\nlocal_ip = \"10.0.0.1/24\"\n\
    [[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.0.0.2\", \"10.0.0.3\"]\n\
    [[vtep.vni]]\nvni = 200\nvlan = 20\nremotes = [\"10.0.0.3\"]\n";

/// The error for `text` appended to GOOD's first 4 lines (the vtep's own keys): line, column, message.
fn err(vtep: &str) -> (usize, usize, String) {
    let e = Config::parse("t.toml", &file(vtep)).unwrap_err();
    (e.line, e.col, e.message)
}

#[test]
fn each_remote_is_a_tunnel_port_carrying_the_vlans_of_its_vnis() {
    let c = Config::parse("t.toml", &file(GOOD)).unwrap();
    let names: Vec<&str> = c.ports.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["up", "vm", "v-10.0.0.2", "v-10.0.0.3"]);
    let (two, three) = (&c.ports[2], &c.ports[3]);
    assert_eq!(two.type_name(), "vxlan");
    assert_eq!(two.vlan, PortVlan::tunnel(&[10]));
    assert_eq!(three.vlan, PortVlan::tunnel(&[10, 20]));
    assert_eq!(three.vlan.mode, VlanMode::Tunnel);
    let v = three.vxlan().unwrap();
    assert_eq!((v.udp_port, v.prefix_len, v.vnis.clone()), (4789, 24, vec![(100, 10), (200, 20)]));
    assert_eq!((two.mtu, two.endpoint.rx_queues()), (1450, 0), "no queues: its frames come on the underlay's");
}

#[test]
fn bad_vteps_are_refused_where_they_are_wrong() {
    let line = |s: &str| 9 + s.lines().count();
    let cases: &[(&str, &str)] = &[
        ("[[vtep]]\nname = \"v\"\nunderlay = \"vm\"\nlocal_ip = \"10.0.0.1\"\n", "is not a dpdk port"),
        ("[[vtep]]\nname = \"v\"\nunderlay = \"nic9\"\nlocal_ip = \"10.0.0.1\"\n", "no port named"),
        ("[[vtep]]\nname = \"v\"\nunderlay = \"up\"\nlocal_ip = \"10.0.0.1/33\"\n", "local_ip: expected"),
        ("[[vtep]]\nname = \"v\"\nunderlay = \"up\"\nlocal_ip = \"224.0.0.1\"\n", "local_ip: expected"),
        ("[[vtep]]\nname = \"v!\"\nunderlay = \"up\"\nlocal_ip = \"10.0.0.1\"\n", "name: expected"),
    ];
    for (text, want) in cases {
        let (l, _, m) = err(text);
        assert!(m.contains(want), "{text}: {m}");
        assert!((10..=line(text)).contains(&l), "{text}: line {l}");
    }
    let base = "[[vtep]]\nname = \"v\"\nunderlay = \"up\"\nlocal_ip = \"10.0.0.1/24\"\n[[vtep.vni]]\n";
    for (vni, want, at) in [
        ("vni = 0\nvlan = 10\n", "vni: expected a VNI from 1 to 16777215", (15, 7)),
        ("vni = 16777216\nvlan = 10\n", "vni: expected", (15, 7)),
        ("vni = 5\nvlan = 4095\n", "vlan: expected a VLAN id from 1 to 4094", (16, 8)),
        ("vni = 5\nvlan = 10\nremotes = [\"10.0.0.1\"]\n", "10.0.0.1 is not a remote", (17, 12)),
        ("vni = 5\nvlan = 10\nremotes = [\"10.0.0\"]\n", "remotes: expected an IPv4 address", (17, 12)),
        ("vni = 5\nvlan = 10\n[[vtep.vni]]\nvni = 5\nvlan = 11\n", "vni: 5 is mapped twice", (18, 7)),
        ("vni = 5\nvlan = 10\n[[vtep.vni]]\nvni = 6\nvlan = 10\n", "vlan: VLAN 10 has a VNI already", (19, 8)),
        ("vni = 5\nvlan = 10\nbogus = 1\n", "unknown field `bogus`", (17, 1)),
    ] {
        let (l, c, m) = err(&format!("{base}{vni}"));
        assert!(m.contains(want), "{vni}: {m}");
        assert_eq!((l, c), at, "{vni}: {m}");
    }
    let second = format!("{GOOD}[[vtep]]\nname = \"w\"\nunderlay = \"up\"\nlocal_ip = \"10.0.1.1\"\n");
    let (_, _, m) = err(&second);
    assert!(m.contains("is a second vtep's underlay"), "{m}");
}

/// A flow naming an underlay is refused where it names it: its frames are the VTEP's, and a
/// flow that sent tenants' frames there would put them on the physical network unencapsulated.
#[test]
fn flows_may_not_name_an_underlay() {
    for flow in ["in_port=up,actions=normal", "actions=output:up", "priority=5,in_port=vm,actions=up"] {
        let text = format!("flows = [\"{flow}\"]\n{}", file(GOOD));
        let e = Config::parse("t.toml", &text).unwrap_err();
        assert!(e.message.contains("port \"up\" is vtep \"v\"'s underlay"), "{flow}: {}", e.message);
        assert_eq!((e.line, e.col), (1, 11 + flow.find("up").unwrap()), "{flow}: {}", e.message);
    }
    let ok = format!("flows = [\"in_port=vm,actions=v-10.0.0.2\"]\n{}", file(GOOD));
    Config::parse("t.toml", &ok).unwrap();
    // An underlay whose name is part of an earlier word of the flow ("in", in "in_port"): the
    // column is where the flow names the port, not where the letters first appear.
    let renamed = file(GOOD).replace("\"up\"", "\"in\"");
    let flow = "in_port=vm,actions=output:in";
    let e = Config::parse("t.toml", &format!("flows = [\"{flow}\"]\n{renamed}")).unwrap_err();
    assert!(e.message.contains("port \"in\" is vtep \"v\"'s underlay"), "{}", e.message);
    assert_eq!((e.line, e.col), (1, 11 + flow.rfind("in").unwrap()), "{}", e.message);
}
