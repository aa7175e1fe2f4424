//! `[[vtep]]`: a VXLAN tunnel endpoint on a dpdk port (its underlay), and the tenant networks
//! it carries, each a VNI across hosts mapped to a VLAN on this one (`[[vtep.vni]]`, with the
//! remote endpoints its broadcasts go to). Each remote endpoint becomes a port of its own, of
//! type "vxlan", named `VTEP-REMOTE_IP`: a trunk of the VLANs whose VNIs list it, with its own
//! counters, learned MACs and flood membership, as a VM is.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use toml::Spanned;

use super::endpoint::Endpoint;
use super::error::{ConfigError, Ctx};
use super::port::PortConfig;
use super::raw::RawVtep;
use super::switch::PortDefaults;
use super::tenant::RateCaps;
use crate::mem::MemLimits;
use crate::wire::vlan::{MAX_VID, PortVlan};
use crate::wire::vxlan;

/// A remote tunnel endpoint's port: where it is, and the VTEP it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    /// The `[[vtep]]` it belongs to.
    pub vtep: String,
    /// The dpdk port its frames leave and arrive through.
    pub underlay: String,
    pub local: Ipv4Addr,
    pub prefix_len: u8,
    /// The underlay router, for remotes outside the local subnet.
    pub gateway: Option<Ipv4Addr>,
    pub udp_port: u16,
    pub remote: Ipv4Addr,
    /// Every (VNI, VLAN) of the VTEP.
    pub vnis: Vec<(u32, u16)>,
}

impl VxlanConfig {
    /// The address whose MAC the outer headers go to: the remote itself, or the gateway when
    /// the remote is outside the local subnet.
    pub fn next_hop(&self) -> Ipv4Addr {
        let mask = if self.prefix_len == 0 { 0 } else { u32::MAX << (32 - self.prefix_len as u32) };
        let on_link = (u32::from(self.local) ^ u32::from(self.remote)) & mask == 0;
        match self.gateway {
            Some(g) if !on_link => g,
            _ => self.remote,
        }
    }
}

/// The overlay MTU when `[[vtep]]` does not say: 1500 on the underlay, less the 50 bytes of
/// outer headers.
pub const DEFAULT_MTU: u32 = 1450;

/// Checks `[[vtep]]` tables against the ports (`ports`: the file's and the drop-ins') and
/// returns the tunnel ports they make.
pub(super) fn validate(
    raw: Vec<RawVtep>,
    ports: &[PortConfig],
    defaults: &PortDefaults,
    cx: &Ctx,
) -> Result<Vec<PortConfig>, ConfigError> {
    let mut out: Vec<PortConfig> = Vec::new();
    let mut names = BTreeSet::new();
    let mut underlays = BTreeSet::new();
    for v in raw {
        let name = v.name.get_ref();
        if name.is_empty() || name.len() > 15 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_".contains(c)) {
            return Err(cx.err(Some(v.name.span()), "name: expected 1-15 characters of A-Z a-z 0-9 _"));
        }
        if !names.insert(name.clone()) {
            return Err(cx.err(Some(v.name.span()), format!("name: a second vtep named \"{name}\"")));
        }
        let under = v.underlay.get_ref();
        match ports.iter().find(|p| &p.name == under) {
            Some(p) if p.dpdk().is_some() => {}
            Some(_) => return Err(cx.err(Some(v.underlay.span()), format!("underlay: \"{under}\" is not a dpdk port"))),
            None => return Err(cx.err(Some(v.underlay.span()), format!("underlay: no port named \"{under}\""))),
        }
        if !underlays.insert(under.clone()) {
            return Err(cx.err(Some(v.underlay.span()), format!("underlay: \"{under}\" is a second vtep's underlay")));
        }
        let (local, prefix_len) = local_ip(&v.local_ip, cx)?;
        let gateway = v.gateway.as_ref().map(|g| ip(g, "gateway", cx)).transpose()?;
        let udp_port = match &v.udp_port {
            None => vxlan::DEFAULT_PORT,
            Some(p) if (1..=65535).contains(p.get_ref()) => *p.get_ref() as u16,
            Some(p) => return Err(cx.err(Some(p.span()), "udp_port: expected a port from 1 to 65535")),
        };
        let mtu = cx.range(&v.mtu, "mtu", 68, 9216 - vxlan::OUTER_LEN as u32, DEFAULT_MTU)?;
        let mut vnis = Vec::new();
        let mut remotes: BTreeMap<Ipv4Addr, Vec<u16>> = BTreeMap::new();
        for n in &v.vni {
            let vni = *n.vni.get_ref();
            if !(1..=vxlan::MAX_VNI as i64).contains(&vni) {
                return Err(cx.err(Some(n.vni.span()), format!("vni: expected a VNI from 1 to {}", vxlan::MAX_VNI)));
            }
            let vlan = *n.vlan.get_ref();
            if !(1..=MAX_VID as i64).contains(&vlan) {
                return Err(cx.err(Some(n.vlan.span()), format!("vlan: expected a VLAN id from 1 to {MAX_VID}")));
            }
            if vnis.iter().any(|&(x, _)| x as i64 == vni) {
                return Err(cx.err(Some(n.vni.span()), format!("vni: {vni} is mapped twice")));
            }
            if vnis.iter().any(|&(_, y)| y as i64 == vlan) {
                return Err(cx.err(Some(n.vlan.span()), format!("vlan: VLAN {vlan} has a VNI already")));
            }
            vnis.push((vni as u32, vlan as u16));
            for r in &n.remotes {
                let a = ip(r, "remotes", cx)?;
                if a == local || a.is_multicast() || a.is_broadcast() || a.is_unspecified() {
                    return Err(cx.err(Some(r.span()), format!("remotes: {a} is not a remote tunnel endpoint")));
                }
                remotes.entry(a).or_default().push(vlan as u16);
            }
        }
        for (remote, vlans) in remotes {
            let port_name = format!("{name}-{remote}");
            if ports.iter().chain(&out).any(|p| p.name == port_name) {
                return Err(
                    cx.err(Some(v.name.span()), format!("a port is named \"{port_name}\", as a tunnel would be"))
                );
            }
            let cfg = VxlanConfig {
                vtep: name.clone(),
                underlay: under.clone(),
                local,
                prefix_len,
                gateway,
                udp_port,
                remote,
                vnis: vnis.clone(),
            };
            out.push(tunnel_port(port_name, cfg, mtu, &vlans, defaults));
        }
    }
    Ok(out)
}

/// The port of one remote endpoint, carrying `vlans`.
fn tunnel_port(name: String, cfg: VxlanConfig, mtu: u32, vlans: &[u16], d: &PortDefaults) -> PortConfig {
    PortConfig {
        name,
        endpoint: Endpoint::Vxlan(cfg),
        mtu,
        weight_packets: d.weight_packets,
        weight_bytes: d.weight_bytes,
        allowed_macs: Vec::new(),
        mac_limit: d.mac_limit,
        mem_limits: MemLimits { max_bytes: 0, max_regions: 0 },
        queue_cfg: Vec::new(),
        vlan: PortVlan::tunnel(vlans),
        rates: RateCaps::default(),
        origin: None,
    }
}

fn ip(s: &Spanned<String>, key: &str, cx: &Ctx) -> Result<Ipv4Addr, ConfigError> {
    s.get_ref().parse().map_err(|_| {
        cx.err(
            Some(s.span()),
            format!("{key}: expected an IPv4 address such as \"10.0.0.1\", found \"{}\"", s.get_ref()),
        )
    })
}

/// `local_ip`: an address with its prefix length, "10.0.0.1/24" (/32 without one).
fn local_ip(s: &Spanned<String>, cx: &Ctx) -> Result<(Ipv4Addr, u8), ConfigError> {
    let bad = || {
        cx.err(
            Some(s.span()),
            format!("local_ip: expected an address such as \"10.0.0.1/24\", found \"{}\"", s.get_ref()),
        )
    };
    let (a, len) = match s.get_ref().split_once('/') {
        Some((a, l)) => (a, l.parse::<u8>().ok().filter(|&l| l <= 32).ok_or_else(bad)?),
        None => (s.get_ref().as_str(), 32),
    };
    let a: Ipv4Addr = a.parse().map_err(|_| bad())?;
    if a.is_unspecified() || a.is_multicast() || a.is_broadcast() {
        return Err(bad());
    }
    Ok((a, len))
}
