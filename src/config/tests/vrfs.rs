//! `[[vrf]]`: a tenant's networks and their anycast gateway; each bad value refused at its
//! line, and a VLAN in one VRF's networks at most.

use super::super::*;

fn vrf(name: &str, mac: &str, nets: &[(&str, &str)]) -> String {
    let mut s = format!("[[vrf]]\nname = \"{name}\"\ngateway_mac = \"{mac}\"\n");
    for (vlan, gw) in nets {
        s += &format!("[[vrf.network]]\nvlan = {vlan}\ngateway = \"{gw}\"\n");
    }
    s
}

fn err(text: &str) -> (usize, String) {
    let e = Config::parse("t.toml", text).unwrap_err();
    (e.line, e.message)
}

#[test]
fn a_vrf_reads_its_networks_and_two_tenants_may_share_addresses() {
    let text = vrf("a", "02:00:00:00:01:01", &[("10", "10.0.1.1/24"), ("20", "10.0.2.254/23")])
        + &vrf("b", "02:00:00:00:01:01", &[("30", "10.0.1.1/24")]);
    let c = Config::parse("t.toml", &text).unwrap();
    assert_eq!(c.vrfs.len(), 2);
    let n = c.vrfs[0].networks[1];
    assert_eq!((n.vlan, n.gateway.to_string(), n.prefix_len), (20, "10.0.2.254".into(), 23));
    assert!(n.contains("10.0.3.9".parse().unwrap()) && !n.contains("10.0.4.1".parse().unwrap()));
    assert_eq!(c.vrfs[1].networks[0].vlan, 30);
}

#[test]
fn a_network_may_have_an_ipv6_gateway_and_a_bad_one_is_refused_at_its_line() {
    let text = "[[vrf]]\nname = \"a\"\ngateway_mac = \"02:00:00:00:01:01\"\n[[vrf.network]]\nvlan = 10\n\
                gateway = \"10.0.1.1/24\"\ngateway6 = \"fd00:1::1/64\"\n[[vrf.network]]\nvlan = 20\n\
                gateway = \"10.0.2.1/24\"\n";
    let c = Config::parse("t.toml", text).unwrap();
    let g = c.vrfs[0].networks[0].gateway6.unwrap();
    assert_eq!(g.to_string(), "fd00:1::1/64");
    assert!(g.contains("fd00:1::9".parse().unwrap()) && !g.contains("fd00:2::9".parse().unwrap()));
    assert_eq!(c.vrfs[0].networks[1].gateway6, None);
    // Line 7 is the first network's gateway6; line 11 the second's (added).
    let with = |g1: &str, g2: &str| {
        text.replace("fd00:1::1/64", g1)
            .replace("gateway = \"10.0.2.1/24\"\n", &format!("gateway = \"10.0.2.1/24\"\ngateway6 = \"{g2}\"\n"))
    };
    let cases = [
        (with("fd00:1::1", "fd00:2::1/64"), 7, "gateway6: expected the gateway's IPv6 address"),
        (with("10.0.1.1/24", "fd00:2::1/64"), 7, "gateway6: expected the gateway's IPv6 address"),
        (with("fd00:1::1/127", "fd00:2::1/64"), 7, "prefix length is 16 to 126"),
        (with("fd00:1::/64", "fd00:2::1/64"), 7, "the subnet-router anycast"),
        (with("fe80::1/64", "fd00:2::1/64"), 7, "not a unicast address a network routes"),
        (with("ff05::1/64", "fd00:2::1/64"), 7, "not a unicast address a network routes"),
        (with("::ffff:10.0.0.1/120", "fd00:2::1/64"), 7, "not a unicast address a network routes"),
        (with("fd00:1::1/64", "fd00:1::2/64"), 11, "gateway6: overlaps VLAN 10's network (fd00:1::1/64)"),
    ];
    for (text, line, msg) in cases {
        let (l, m) = err(&text);
        assert!(l == line && m.contains(msg), "{msg}: got line {l}: {m}");
    }
}

#[test]
fn bad_vrfs_are_refused_where_they_are_wrong() {
    // Lines: 1 [[vrf]], 2 name, 3 gateway_mac, then 3 a network (4 header, 5 vlan, 6 gateway).
    let one = |mac: &str, vlan: &str, gw: &str| vrf("a", mac, &[(vlan, gw)]);
    let cases = [
        (one("02:00:00:00:01:01", "0", "10.0.1.1/24"), 5, "vlan: expected a VLAN id from 1 to 4094"),
        (one("02:00:00:00:01:01", "10", "10.0.1.1"), 6, "gateway: expected the gateway's IPv4 address"),
        (one("02:00:00:00:01:01", "10", "10.0.1.1/31"), 6, "prefix length is 8 to 30"),
        (one("02:00:00:00:01:01", "10", "10.0.1.0/24"), 6, "its network's own address or its broadcast"),
        (one("02:00:00:00:01:01", "10", "10.0.1.255/24"), 6, "its network's own address or its broadcast"),
        (one("02:00:00:00:01:01", "10", "fd00::1/64"), 6, "gateway: expected the gateway's IPv4 address"),
        (one("01:00:5e:00:00:01", "10", "10.0.1.1/24"), 3, "gateway_mac: a gateway's MAC is a unicast address"),
        (one("nope", "10", "10.0.1.1/24"), 3, "gateway_mac: expected a MAC address"),
        (vrf("a b", "02:00:00:00:01:01", &[("10", "10.0.1.1/24")]), 2, "name: expected 1-64 characters"),
        (vrf("a", "02:00:00:00:01:01", &[]), 2, "expected 1 to 256 [[vrf.network]] tables"),
        (
            vrf("a", "02:00:00:00:01:01", &[("10", "10.0.1.1/24"), ("20", "10.0.1.129/25")]),
            9,
            "overlaps VLAN 10's network",
        ),
        (
            vrf("a", "02:00:00:00:01:01", &[("10", "10.0.1.1/24")])
                + &vrf("b", "02:00:00:00:01:02", &[("10", "10.9.0.1/24")]),
            11,
            "VLAN 10 is a network of vrf \"a\" already",
        ),
        (
            vrf("a", "02:00:00:00:01:01", &[("10", "10.0.1.1/24")])
                + &vrf("a", "02:00:00:00:01:02", &[("20", "10.9.0.1/24")]),
            8,
            "duplicate vrf \"a\"",
        ),
    ];
    for (text, line, want) in cases {
        let (l, msg) = err(&text);
        assert!(msg.contains(want), "{text}: {msg}");
        assert_eq!(l, line, "{text}: {msg}");
    }
}
