//! `[[vtep]]`: a VXLAN tunnel endpoint on a dpdk port (its underlay), and the tenant networks
//! it carries, each a VNI across hosts mapped to a VLAN on this one (`[[vtep.vni]]`, with the
//! remote endpoints its broadcasts go to). Each remote endpoint becomes a port of its own, of
//! type "vxlan", named `VTEP-REMOTE_IP`: a trunk of the VLANs whose VNIs list it, with its own
//! counters, learned MACs and flood membership, as a VM is.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use toml::Spanned;

use super::endpoint::{Endpoint, VxlanConfig};
use super::error::{ConfigError, Ctx};
use super::port::PortConfig;
use super::raw::RawVtep;
use super::switch::PortDefaults;
use super::tenant::RateCaps;
use crate::config::vlan::{MAX_VID, PortVlan};
use crate::mem::MemLimits;
use crate::wire::MacAddr;
use crate::wire::vxlan;

/// The overlay MTU when `[[vtep]]` does not say: 1500 on the underlay, less the 50 bytes of
/// outer headers.
pub const DEFAULT_MTU: u32 = 1450;

/// A `[[vtep]]` as validated: what it makes tunnel ports of, with the remotes learned at run
/// time (EVPN's flood lists, `Remotes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VtepConfig {
    pub name: String,
    pub underlay: String,
    pub local: Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: Option<Ipv4Addr>,
    pub next_hop_mac: Option<MacAddr>,
    pub udp_port: u16,
    /// The overlay MTU (of its tunnel ports).
    pub mtu: u32,
    /// Its tunnels learn MACs from the frames they bring (default); false: remote MACs come
    /// only from the control plane (`vtep-sync`), as a Linux VXLAN device with `nolearning`.
    pub learning: bool,
    pub vnis: Vec<VniConfig>,
}

/// One tenant network of a VTEP: its VNI, its VLAN here, the remotes the file names for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VniConfig {
    pub vni: u32,
    pub vlan: u16,
    pub remotes: Vec<Ipv4Addr>,
}

/// Remote endpoints learned at run time, per VTEP name: each remote's VNIs (EVPN's type-3
/// routes, `vtep-sync`). They join the file's remotes.
pub type Remotes = BTreeMap<String, BTreeMap<Ipv4Addr, BTreeSet<u32>>>;

impl VtepConfig {
    /// The VLAN of VNI `vni` here.
    pub fn vlan_of(&self, vni: u32) -> Option<u16> {
        self.vnis.iter().find(|v| v.vni == vni).map(|v| v.vlan)
    }

    /// The tunnel ports of this VTEP: one per remote, of the file or `learned`, carrying the
    /// VLANs of the VNIs that list it. Names of `taken` ports are skipped (the file's names
    /// were checked when it was read; a learned remote cannot take a port's name).
    pub fn tunnel_ports(
        &self,
        learned: Option<&BTreeMap<Ipv4Addr, BTreeSet<u32>>>,
        defaults: &PortDefaults,
        taken: &dyn Fn(&str) -> bool,
    ) -> Vec<PortConfig> {
        let mut remotes: BTreeMap<Ipv4Addr, BTreeSet<u16>> = BTreeMap::new();
        for n in &self.vnis {
            for r in &n.remotes {
                remotes.entry(*r).or_default().insert(n.vlan);
            }
        }
        for (r, vnis) in learned.into_iter().flatten() {
            if *r == self.local {
                continue;
            }
            for vni in vnis {
                if let Some(vlan) = self.vlan_of(*vni) {
                    remotes.entry(*r).or_default().insert(vlan);
                }
            }
        }
        let vnis: Vec<(u32, u16)> = self.vnis.iter().map(|v| (v.vni, v.vlan)).collect();
        let mut out = Vec::new();
        for (remote, vlans) in remotes {
            let name = format!("{}-{remote}", self.name);
            if taken(&name) {
                continue;
            }
            let cfg = VxlanConfig {
                vtep: self.name.clone(),
                underlay: self.underlay.clone(),
                local: self.local,
                prefix_len: self.prefix_len,
                gateway: self.gateway,
                next_hop_mac: self.next_hop_mac,
                udp_port: self.udp_port,
                remote,
                vnis: vnis.clone(),
                learning: self.learning,
            };
            let vlans: Vec<u16> = vlans.into_iter().collect();
            out.push(tunnel_port(name, cfg, self.mtu, &vlans, defaults));
        }
        out
    }
}

/// Checks `[[vtep]]` tables against the ports (`ports`: the file's and the drop-ins').
/// Long because it is one check per key, in the table's order, each with its error at the key.
pub(super) fn validate(raw: Vec<RawVtep>, ports: &[PortConfig], cx: &Ctx) -> Result<Vec<VtepConfig>, ConfigError> {
    let mut out: Vec<VtepConfig> = Vec::new();
    let mut underlays = BTreeSet::new();
    for v in raw {
        let name = v.name.get_ref();
        if name.is_empty() || name.len() > 15 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_".contains(c)) {
            return Err(cx.err(Some(v.name.span()), "name: expected 1-15 characters of A-Z a-z 0-9 _"));
        }
        if out.iter().any(|o| &o.name == name) {
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
        let next_hop_mac = match &v.next_hop_mac {
            None => None,
            Some(m) => match m.get_ref().parse::<MacAddr>() {
                Ok(mac) if mac.is_unicast() => Some(mac),
                _ => {
                    let found = m.get_ref();
                    return Err(
                        cx.err(Some(m.span()), format!("next_hop_mac: expected a unicast MAC, found \"{found}\""))
                    );
                }
            },
        };
        let udp_port = match &v.udp_port {
            None => vxlan::DEFAULT_PORT,
            Some(p) if (1..=65535).contains(p.get_ref()) => *p.get_ref() as u16,
            Some(p) => return Err(cx.err(Some(p.span()), "udp_port: expected a port from 1 to 65535")),
        };
        let mtu = cx.range(&v.mtu, "mtu", 68, 9216 - vxlan::OUTER_LEN as u32, DEFAULT_MTU)?;
        let mut vnis: Vec<VniConfig> = Vec::new();
        for n in &v.vni {
            let vni = *n.vni.get_ref();
            if !(1..=vxlan::MAX_VNI as i64).contains(&vni) {
                return Err(cx.err(Some(n.vni.span()), format!("vni: expected a VNI from 1 to {}", vxlan::MAX_VNI)));
            }
            let vlan = *n.vlan.get_ref();
            if !(1..=MAX_VID as i64).contains(&vlan) {
                return Err(cx.err(Some(n.vlan.span()), format!("vlan: expected a VLAN id from 1 to {MAX_VID}")));
            }
            if vnis.iter().any(|x| x.vni as i64 == vni) {
                return Err(cx.err(Some(n.vni.span()), format!("vni: {vni} is mapped twice")));
            }
            if vnis.iter().any(|x| x.vlan as i64 == vlan) {
                return Err(cx.err(Some(n.vlan.span()), format!("vlan: VLAN {vlan} has a VNI already")));
            }
            let mut remotes = Vec::new();
            for r in &n.remotes {
                let a = ip(r, "remotes", cx)?;
                if a == local || a.is_multicast() || a.is_broadcast() || a.is_unspecified() {
                    return Err(cx.err(Some(r.span()), format!("remotes: {a} is not a remote tunnel endpoint")));
                }
                remotes.push(a);
            }
            vnis.push(VniConfig { vni: vni as u32, vlan: vlan as u16, remotes });
        }
        let vtep = VtepConfig {
            name: name.clone(),
            underlay: under.clone(),
            local,
            prefix_len,
            gateway,
            next_hop_mac,
            udp_port,
            mtu,
            learning: v.learning.as_ref().is_none_or(|l| *l.get_ref()),
            vnis,
        };
        for p in vtep.tunnel_ports(None, &PortDefaults::default(), &|_| false) {
            if ports.iter().any(|o| o.name == p.name) {
                return Err(
                    cx.err(Some(v.name.span()), format!("a port is named \"{}\", as a tunnel would be", p.name))
                );
            }
        }
        out.push(vtep);
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
        allowed_ips: Vec::new(),
        security_groups: Vec::new(),
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
