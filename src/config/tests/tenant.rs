//! The tenant settings of a port: VLANs (`vlan_mode`, `tag`, `trunks`) and rate caps, each
//! bad value refused at its own line and column.

use super::super::*;
use crate::config::vlan::{PortVlan, VlanMode};

fn port(keys: &str) -> String {
    format!("[[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"\n{keys}")
}

fn vlan(keys: &str) -> PortVlan {
    Config::parse("t.toml", &port(keys)).unwrap_or_else(|e| panic!("{keys}: {e}")).ports[0].vlan.clone()
}

/// The error for `keys` (the port's fifth line on): its line, column and message.
fn err(keys: &str) -> (usize, usize, String) {
    let e = Config::parse("t.toml", &port(keys)).unwrap_err();
    (e.line, e.col, e.message)
}

#[test]
fn vlan_modes_and_their_defaults() {
    assert!(vlan("").is_default(), "no VLAN keys: a trunk of every VLAN");
    assert_eq!(vlan("tag = 10\n"), PortVlan::access(10));
    assert_eq!(vlan("vlan_mode = \"access\"\ntag = 4094\n"), PortVlan::access(4094));
    let t = vlan("trunks = [0, 10, \"20-22\"]\n");
    assert_eq!((t.mode, t.trunks.ranges()), (VlanMode::Trunk, vec![(0, 0), (10, 10), (20, 22)]));
    let n = vlan("vlan_mode = \"native-untagged\"\ntag = 5\ntrunks = [\"6-7\"]\n");
    assert_eq!((n.mode, n.tag, n.trunks.ranges()), (VlanMode::NativeUntagged, 5, vec![(6, 7)]));
    let n = vlan("vlan_mode = \"native-tagged\"\ntag = 5\n");
    assert_eq!((n.mode, n.tag, n.trunks.is_all()), (VlanMode::NativeTagged, 5, true));
}

#[test]
fn bad_vlan_config_is_refused_where_it_is_written() {
    for (keys, line, col, want) in [
        ("tag = 0\n", 5, 7, "tag: expected a VLAN id from 1 to 4094"),
        ("tag = 4095\n", 5, 7, "tag: expected a VLAN id from 1 to 4094"),
        ("vlan_mode = \"access\"\ntag = -1\n", 6, 7, "tag: expected a VLAN id from 1 to 4094"),
        ("tag = 10\ntrunks = [20]\n", 6, 10, "trunks: a port with a tag is an access port"),
        ("vlan_mode = \"access\"\ntag = 10\ntrunks = [20]\n", 7, 10, "trunks: an access port carries only"),
        ("vlan_mode = \"access\"\n", 5, 13, "vlan_mode = \"access\" needs a tag"),
        ("vlan_mode = \"trunk\"\ntag = 3\n", 6, 7, "tag: a trunk port has no tag"),
        ("vlan_mode = \"hybrid\"\n", 5, 13, "vlan_mode: expected \"access\", \"trunk\""),
        ("trunks = [10, \"5-12\"]\n", 5, 15, "trunks: VLAN 10 is listed twice (ranges overlap)"),
        ("trunks = [\"12-5\"]\n", 5, 11, "trunks: the range \"12-5\" runs backwards"),
        ("trunks = [4095]\n", 5, 11, "trunks: expected VLAN ids from 0 to 4094"),
        ("trunks = [\"1-x\"]\n", 5, 11, "trunks: expected VLAN ids"),
        ("trunks = []\n", 5, 10, "trunks: an empty list carries no VLAN"),
        ("vlan_mode = \"native-tagged\"\ntag = 3\ntrunks = [0]\n", 7, 11, "trunks: expected VLAN ids from 1 to 4094"),
    ] {
        let (l, c, m) = err(keys);
        assert!(m.starts_with(want), "{keys:?}: {m}");
        assert_eq!((l, c), (line, col), "{keys:?}: {m}");
    }
}

#[test]
fn rate_caps_and_their_limits() {
    let c = Config::parse("t.toml", &port("")).unwrap();
    assert_eq!(c.ports[0].rates, RateCaps::default());
    let c = Config::parse(
        "t.toml",
        &port("ingress_pps = 1000\ningress_bps = 8000000\negress_pps = 7\negress_bps = 1\nrate_burst_ms = 50\n"),
    )
    .unwrap();
    let want = RateCaps { ingress_pps: 1000, ingress_bps: 8_000_000, egress_pps: 7, egress_bps: 1, burst_ms: 50 };
    assert_eq!(c.ports[0].rates, want);
    for (keys, col, want) in [
        ("ingress_pps = -1\n", 15, "ingress_pps: expected a rate from 0 (no cap) to 1000000000"),
        ("egress_bps = 1000000000001\n", 14, "egress_bps: expected a rate from 0 (no cap) to 1000000000000"),
        ("rate_burst_ms = 0\n", 17, "rate_burst_ms: expected a value from 1 to 1000"),
        ("rate_burst_ms = 1001\n", 17, "rate_burst_ms: expected a value from 1 to 1000"),
    ] {
        let (l, c, m) = err(keys);
        assert_eq!((l, c, m.as_str()), (5, col, want), "{keys:?}");
    }
}
