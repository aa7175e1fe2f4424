//! `[[vrf]]`: a tenant's routing at the edge. A VRF is one tenant's address space: its
//! networks (each a VLAN of this switch, so also the VNI a VTEP maps to it) and, on each, an
//! anycast gateway: the same address and MAC on every host, so a VM's default gateway is on
//! its own host wherever it runs. pvswitchd answers ARP for the gateway address and routes
//! between the VRF's networks itself; a VLAN is in at most one VRF, and two VRFs may use the
//! same addresses (nothing is routed between them).
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

use super::error::{ConfigError, Ctx};
use super::raw::{RawVrf, RawVrfNetwork};
use crate::config::vlan::MAX_VID;
use crate::wire::MacAddr;

/// The most VRFs, and networks in one.
pub const MAX_VRFS: usize = 256;
pub const MAX_NETWORKS: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VrfConfig {
    pub name: String,
    /// The anycast gateway's MAC, on every network of the VRF.
    pub gateway_mac: MacAddr,
    pub networks: Vec<NetworkConfig>,
}

/// One network of a VRF: a VLAN, and the gateway's address in it with the network's prefix;
/// and for a dual-stack network, the gateway's IPv6 address and prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkConfig {
    pub vlan: u16,
    pub gateway: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway6: Option<Gateway6>,
}

/// A network's IPv6 gateway: its address and the network's prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateway6 {
    pub addr: Ipv6Addr,
    pub prefix_len: u8,
}

impl Gateway6 {
    /// The network's mask, as a number.
    pub fn mask(&self) -> u128 {
        u128::MAX.checked_shl(128 - self.prefix_len as u32).unwrap_or(0)
    }

    /// Whether `a` is in the network.
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        (u128::from(a) ^ u128::from(self.addr)) & self.mask() == 0
    }
}

impl std::fmt::Display for Gateway6 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl NetworkConfig {
    /// The network's mask, as a number.
    pub fn mask(&self) -> u32 {
        u32::MAX.checked_shl(32 - self.prefix_len as u32).unwrap_or(0)
    }

    /// Whether `a` is in the network.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        (u32::from(a) ^ u32::from(self.gateway)) & self.mask() == 0
    }
}

/// The file's `[[vrf]]` tables: names unique, a unicast gateway MAC, each network a VLAN in no
/// other network (of this VRF or another) with a gateway address that is a host of its prefix,
/// and no two networks of one VRF overlapping.
pub(super) fn validate(raw: &[RawVrf], cx: &Ctx) -> Result<Vec<VrfConfig>, ConfigError> {
    if raw.len() > MAX_VRFS {
        return Err(cx.err(None, format!("{} VRFs: at most {MAX_VRFS}", raw.len())));
    }
    let mut vrfs: Vec<VrfConfig> = Vec::new();
    for v in raw {
        let name = &cx.name(&v.name, "vrf", |n| vrfs.iter().any(|o| o.name == n))?;
        let gateway_mac: MacAddr = v.gateway_mac.get_ref().parse().map_err(|_| {
            cx.err(Some(v.gateway_mac.span()), "gateway_mac: expected a MAC address (02:00:00:00:00:01)")
        })?;
        if !gateway_mac.is_unicast() || gateway_mac == MacAddr::ZERO {
            return Err(cx.err(Some(v.gateway_mac.span()), "gateway_mac: a gateway's MAC is a unicast address"));
        }
        if v.network.is_empty() || v.network.len() > MAX_NETWORKS {
            return Err(cx.err(
                Some(v.name.span()),
                format!("vrf \"{name}\": expected 1 to {MAX_NETWORKS} [[vrf.network]] tables"),
            ));
        }
        let mut networks: Vec<NetworkConfig> = Vec::new();
        for n in &v.network {
            let net = network(n, name, &vrfs, &networks, cx)?;
            networks.push(net);
        }
        vrfs.push(VrfConfig { name: name.clone(), gateway_mac, networks });
    }
    Ok(vrfs)
}

/// One `[[vrf.network]]` of VRF `name`: a VLAN no network of `vrfs` or of this VRF (`mine`, so
/// far) has, gateways that overlap none of this VRF's networks.
fn network(
    n: &RawVrfNetwork,
    name: &str,
    vrfs: &[VrfConfig],
    mine: &[NetworkConfig],
    cx: &Ctx,
) -> Result<NetworkConfig, ConfigError> {
    let vlan = *n.vlan.get_ref();
    if !(1..=MAX_VID as i64).contains(&vlan) {
        return Err(cx.err(Some(n.vlan.span()), format!("vlan: expected a VLAN id from 1 to {MAX_VID}")));
    }
    let vlan = vlan as u16;
    let taken = vrfs.iter().find(|o| o.networks.iter().any(|x| x.vlan == vlan)).map(|o| o.name.as_str());
    if let Some(other) = taken.or(mine.iter().any(|x| x.vlan == vlan).then_some(name)) {
        return Err(cx.err(Some(n.vlan.span()), format!("vlan: VLAN {vlan} is a network of vrf \"{other}\" already")));
    }
    let (gateway, prefix_len) = gateway4(&n.gateway, cx)?;
    let gateway6 = n.gateway6.as_ref().map(|g| gateway6(g, cx)).transpose()?;
    let net = NetworkConfig { vlan, gateway, prefix_len, gateway6 };
    if let Some(o) = mine.iter().find(|o| o.contains(gateway) || net.contains(o.gateway)) {
        return Err(cx.err(
            Some(n.gateway.span()),
            format!("gateway: overlaps VLAN {}'s network ({}/{}) in the same vrf", o.vlan, o.gateway, o.prefix_len),
        ));
    }
    let overlaps6 =
        |o: &NetworkConfig| o.gateway6.zip(gateway6).is_some_and(|(a, b)| a.contains(b.addr) || b.contains(a.addr));
    if let Some(o) = mine.iter().find(|o| overlaps6(o)) {
        return Err(cx.err(
            n.gateway6.as_ref().map(|g| g.span()),
            format!("gateway6: overlaps VLAN {}'s network ({}) in the same vrf", o.vlan, o.gateway6.unwrap()),
        ));
    }
    Ok(net)
}

/// A network's `gateway`: an IPv4 address with its prefix length, 8 to 30, a host of it (not
/// the network's own address nor its broadcast).
fn gateway4(g: &toml::Spanned<String>, cx: &Ctx) -> Result<(Ipv4Addr, u8), ConfigError> {
    let bad = |m: &str| cx.err(Some(g.span()), format!("gateway: {m}"));
    let expected = "expected the gateway's IPv4 address and its network's prefix length (10.0.1.1/24)";
    let (gateway, prefix_len) = address_and_length::<Ipv4Addr>(g, 8..=30, &bad, expected)?;
    let mask = u32::MAX << (32 - prefix_len);
    let host = u32::from(gateway) & !mask;
    if host == 0 || host == !mask {
        return Err(bad(&format!("{gateway} is its network's own address or its broadcast, not a host")));
    }
    Ok((gateway, prefix_len))
}

/// `ADDRESS/LENGTH` with the length in `lengths`, written without leading zeros; errors made
/// by `bad` (`expected` for a malformed value).
fn address_and_length<A: std::str::FromStr>(
    g: &toml::Spanned<String>,
    lengths: std::ops::RangeInclusive<u8>,
    bad: &dyn Fn(&str) -> ConfigError,
    expected: &str,
) -> Result<(A, u8), ConfigError> {
    let (addr, len) = g.get_ref().split_once('/').ok_or_else(|| bad(expected))?;
    let addr: A = addr.parse().map_err(|_| bad(expected))?;
    let prefix_len: u8 = len
        .parse()
        .ok()
        .filter(|l: &u8| lengths.contains(l) && len == l.to_string())
        .ok_or_else(|| bad(&format!("a network's prefix length is {} to {}", lengths.start(), lengths.end())))?;
    Ok((addr, prefix_len))
}

/// A network's `gateway6`: a global unicast or unique local address with its prefix length,
/// 16 to 126, not the network's own address (the subnet-router anycast, RFC 4291 2.6.1).
fn gateway6(g: &toml::Spanned<String>, cx: &Ctx) -> Result<Gateway6, ConfigError> {
    let bad = |m: &str| cx.err(Some(g.span()), format!("gateway6: {m}"));
    let expected = "expected the gateway's IPv6 address and its network's prefix length (fd00:1::1/64)";
    let (addr, prefix_len) = address_and_length::<Ipv6Addr>(g, 16..=126, &bad, expected)?;
    let gw = Gateway6 { addr, prefix_len };
    let a = u128::from(addr);
    if addr.is_multicast() || addr.is_loopback() || addr.is_unspecified() || a >> 118 == 0x3fa || a >> 32 == 0xffff {
        return Err(bad(&format!("{addr} is not a unicast address a network routes (link-local, multicast, mapped)")));
    }
    if a & !gw.mask() == 0 {
        return Err(bad(&format!("{addr} is its network's own address (the subnet-router anycast), not a host")));
    }
    Ok(gw)
}
