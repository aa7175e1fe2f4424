//! VTEPs and their control plane. pvswitchd runs no routing protocol: a control plane outside it
//! (EVPN through FRR and `pvs-evpn`, or an orchestrator) reads what a VTEP has here (`vteps`:
//! its VNIs and the MACs local to this host on each) and tells it what lives elsewhere
//! (`vtep-sync`: the remote endpoints of each VNI, its flood list, and the MACs behind each).
//! A sync is the whole state, not a change: a control plane that restarts, or a pvswitchd
//! that restarts, is back in step with the first sync.
//!
//! Remote endpoints become tunnel ports (with the file's, `Config::set_remotes`); remote MACs
//! are entries of the MAC table pointing at them, as learned ones are (a MAC that moves, a
//! migrated VM's RARP, is learned where it is now, and the control plane's next sync agrees).
//! Remote MACs' addresses (EVPN's MAC+IP routes) are the VRFs' neighbours behind the tunnel
//! port of their MAC's remote (`remote_neighbours`), as a local port's `allowed_ips` are its:
//! ARP for them is answered here, and frames routed to them go through the tunnel in the
//! destination network's VNI. An address a local port has stays the local port's.

use crate::proto::{LocalMac, RemoteMac, RemoteNeighbour, RemoteVnis, VniInfo, VtepInfo, VtepState};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use super::portcmd::PortCmdError::{self, Failed, Invalid, NotFound};
use super::{Endpoints, Switch};
use crate::config::Remotes;
use crate::config::vlan::VlanMode;
use crate::datapath::route::Remote;
use crate::wire::MacAddr;

/// What the VTEPs' control plane told them.
#[derive(Debug, Default)]
pub struct Learned {
    pub remotes: Remotes,
    /// Per VTEP: (VNI, MAC, remote endpoint).
    pub macs: BTreeMap<String, BTreeSet<(u32, MacAddr, Ipv4Addr)>>,
    /// Per VTEP: (VNI, address, MAC) of remote MACs.
    pub neighbours: BTreeMap<String, BTreeSet<(u32, IpAddr, MacAddr)>>,
}

/// Most remote MACs one sync may install (the MAC table's room is shared with every port).
pub const MAX_REMOTE_MACS: usize = 65536;
/// Most remote addresses one sync may give (the VRFs' neighbours are at most 32,767 a plan).
pub const MAX_REMOTE_NEIGHBOURS: usize = 16384;

impl Switch {
    /// `vteps`: every VTEP, its local MACs and what it learned.
    pub fn vteps(&self) -> Vec<VtepInfo> {
        let entries = self.mac.entries();
        self.cfg
            .vteps
            .iter()
            .map(|v| {
                let vni_of = |vlan: u16| v.vnis.iter().find(|n| n.vlan == vlan).map(|n| n.vni);
                let mut local: BTreeMap<(u32, String), bool> = BTreeMap::new();
                // Learned on a port of this host: not a tunnel, and not a VTEP's underlay (which
                // takes no tenant frame; nothing there is a tenant's to export).
                let underlay = |name: &str| self.cfg.vteps.iter().any(|v| v.underlay == name);
                for (mac, vlan, port) in &entries {
                    let local_port =
                        self.port(*port as usize).is_some_and(|ps| ps.port.tunnel().is_none() && !underlay(ps.name()));
                    if let (true, Some(vni)) = (local_port, vni_of(*vlan)) {
                        local.insert((vni, mac.to_string()), false);
                    }
                }
                // A configured MAC is here while its VM is: a port whose frontend left (a VM
                // stopped, or migrated away) no longer claims it.
                let mut ips: BTreeMap<(u32, String), Vec<String>> = BTreeMap::new();
                for ps in self.ports.iter().flatten() {
                    let here = ps.link.is_some() || ps.port.nic().is_some();
                    if ps.cfg.vlan.mode == VlanMode::Access
                        && here
                        && let Some(vni) = vni_of(ps.cfg.vlan.tag)
                    {
                        local.extend(ps.cfg.allowed_macs.iter().map(|m| ((vni, m.to_string()), true)));
                        if let [mac] = ps.cfg.allowed_macs[..] {
                            ips.insert((vni, mac.to_string()), self.routed_hosts(ps.cfg.vlan.tag, &ps.cfg.allowed_ips));
                        }
                    }
                }
                let local: Vec<LocalMac> = local
                    .into_iter()
                    .map(|(k, configured)| {
                        let ips = if configured { ips.remove(&k).unwrap_or_default() } else { Vec::new() };
                        LocalMac { vni: k.0, mac: k.1, configured, ips }
                    })
                    .collect();
                VtepInfo {
                    name: v.name.clone(),
                    underlay: v.underlay.clone(),
                    local: v.local.to_string(),
                    udp_port: v.udp_port,
                    vnis: v.vnis.iter().map(|n| VniInfo { vni: n.vni, vlan: n.vlan }).collect(),
                    local_macs: local,
                    learned: self.learned_state(&v.name),
                }
            })
            .collect()
    }

    /// The host addresses of `ips` in the network of a VRF on VLAN `vlan` (what the VRFs
    /// route to a port with them).
    fn routed_hosts(&self, vlan: u16, ips: &[crate::config::ips::IpPrefix]) -> Vec<String> {
        let nets: Vec<_> = self.cfg.vrfs.iter().flat_map(|v| &v.networks).filter(|n| n.vlan == vlan).collect();
        let routed = |p: &crate::config::ips::IpPrefix| match (p.host4(), p.host6()) {
            (Some(a), _) => nets.iter().any(|n| n.contains(a)).then(|| a.to_string()),
            (_, Some(a)) => nets.iter().any(|n| n.gateway6.is_some_and(|g| g.contains(a))).then(|| a.to_string()),
            _ => None,
        };
        ips.iter().filter_map(routed).collect()
    }

    /// Every VTEP's remote addresses as the plans route to them: behind the tunnel port of the
    /// remote their MAC is at, in the VLAN of their VNI.
    pub(super) fn remote_neighbours(&self) -> Vec<Remote> {
        let mut out = Vec::new();
        for v in &self.cfg.vteps {
            let (Some(macs), Some(neighbours)) = (self.learned.macs.get(&v.name), self.learned.neighbours.get(&v.name))
            else {
                continue;
            };
            // Each remote's tunnel port, looked up once (not once an address).
            let mut tunnels: BTreeMap<Ipv4Addr, Option<u16>> = BTreeMap::new();
            for (vni, ip, mac) in neighbours {
                let Some(remote) = remote_of(macs, *vni, *mac) else { continue };
                let port = *tunnels
                    .entry(remote)
                    .or_insert_with(|| self.port_by_name(&format!("{}-{remote}", v.name)).map(|ps| ps.id()));
                if let (Some(port), Some(vlan)) = (port, v.vlan_of(*vni)) {
                    out.push(Remote { port, mac: *mac, addr: *ip, vlan });
                }
            }
        }
        out
    }

    /// What VTEP `name` learned, as a sync says it (sorted).
    fn learned_state(&self, name: &str) -> VtepState {
        let remotes = self.learned.remotes.get(name).into_iter().flatten();
        let macs = self.learned.macs.get(name).into_iter().flatten();
        let neighbours = self.learned.neighbours.get(name).into_iter().flatten();
        VtepState {
            remotes: remotes
                .map(|(r, vnis)| RemoteVnis { remote: r.to_string(), vnis: vnis.iter().copied().collect() })
                .collect(),
            macs: macs
                .map(|(vni, mac, r)| RemoteMac { vni: *vni, mac: mac.to_string(), remote: r.to_string() })
                .collect(),
            neighbours: neighbours
                .map(|(vni, ip, mac)| RemoteNeighbour { vni: *vni, ip: ip.to_string(), mac: mac.to_string() })
                .collect(),
        }
    }

    /// `vtep-sync NAME STATE`: VTEP `name`'s remote endpoints and MACs are now `state`'s.
    pub fn vtep_sync(&mut self, ep: &mut dyn Endpoints, name: &str, state: &str) -> Result<String, PortCmdError> {
        let Some(v) = self.cfg.vteps.iter().find(|v| v.name == name) else {
            return Err(NotFound(format!("no vtep \"{name}\"")));
        };
        let Checked { remotes, macs, neighbours } = checked_state(v, state)?;
        let (old_remotes, old_macs) = (self.learned.remotes.get(name), self.learned.macs.get(name));
        if old_remotes == Some(&remotes)
            && old_macs == Some(&macs)
            && self.learned.neighbours.get(name).map_or(neighbours.is_empty(), |n| *n == neighbours)
        {
            return Ok(format!("vtep {name}: unchanged"));
        }
        let gone: Vec<_> = old_macs.map(|o| o.difference(&macs).copied().collect()).unwrap_or_default();
        let summary = format!(
            "vtep {name}: {} remotes, {} remote MACs, {} remote addresses",
            remotes.len(),
            macs.len(),
            neighbours.len()
        );
        self.learned.remotes.insert(name.to_string(), remotes);
        self.learned.macs.insert(name.to_string(), macs);
        self.learned.neighbours.insert(name.to_string(), neighbours);
        self.forget_remote_macs(name, &gone);
        let cfg = self.cfg.clone();
        self.apply_config(ep, cfg).map_err(|e| Failed(format!("vtep-sync {name}: {e}")))?;
        Ok(summary)
    }
    /// Puts every remote MAC the control plane gave in the MAC table, behind its tunnel port
    /// (after any change of ports: a port whose VLANs changed was flushed).
    pub(super) fn install_remote_macs(&mut self) {
        for v in &self.cfg.vteps {
            for (vni, mac, remote) in self.learned.macs.get(&v.name).into_iter().flatten() {
                let (Some(vlan), Some(ps)) = (v.vlan_of(*vni), self.port_by_name(&format!("{}-{remote}", v.name)))
                else {
                    continue;
                };
                if self.mac.learn(mac, vlan, ps.id()) == crate::datapath::mac_table::Learned::Refused {
                    log::warn!("vtep {}: no room for remote MAC {mac} (VNI {vni}) behind {remote}", v.name);
                }
            }
        }
    }

    /// Withdrawn remote MACs leave the MAC table (unless they moved meanwhile).
    fn forget_remote_macs(&self, name: &str, gone: &[(u32, MacAddr, Ipv4Addr)]) {
        let Some(v) = self.cfg.vteps.iter().find(|v| v.name == name) else { return };
        for (vni, mac, remote) in gone {
            if let (Some(vlan), Some(ps)) = (v.vlan_of(*vni), self.port_by_name(&format!("{name}-{remote}"))) {
                self.mac.forget(mac, vlan, ps.id());
            }
        }
    }
}

/// A `vtep-sync` state for VTEP `v`, parsed and checked: every remote an IPv4 address that is
/// not ours nor multicast or broadcast, every VNI one of the VTEP's, every MAC unicast, at most
/// `MAX_REMOTE_MACS` of them; every neighbour's address a unicast one (IPv4 or IPv6, not
/// link-local) and its MAC one of
/// the state's MACs on its VNI, at most `MAX_REMOTE_NEIGHBOURS`. Returns each remote's VNIs
/// (with those of its MACs), the MACs and the neighbours.
pub fn checked_state(v: &crate::config::VtepConfig, state: &str) -> Result<Checked, PortCmdError> {
    let name = &v.name;
    let st: VtepState =
        serde_json::from_str(state).map_err(|e| Invalid(format!("vtep-sync {name}: malformed state: {e}")))?;
    let ip = |s: &str| -> Result<Ipv4Addr, PortCmdError> {
        let a: Ipv4Addr =
            s.parse().map_err(|_| Invalid(format!("vtep-sync {name}: \"{s}\" is not an IPv4 address")))?;
        if a == v.local || a.is_multicast() || a.is_broadcast() || a.is_unspecified() {
            return Err(Invalid(format!("vtep-sync {name}: {a} is not a remote tunnel endpoint")));
        }
        Ok(a)
    };
    let known =
        |vni: u32| v.vlan_of(vni).ok_or_else(|| Invalid(format!("vtep-sync {name}: VNI {vni} is not on this vtep")));
    let mut remotes: BTreeMap<Ipv4Addr, BTreeSet<u32>> = BTreeMap::new();
    for r in &st.remotes {
        let a = ip(&r.remote)?;
        for &vni in &r.vnis {
            known(vni)?;
        }
        remotes.entry(a).or_default().extend(r.vnis.iter().copied());
    }
    if st.macs.len() > MAX_REMOTE_MACS {
        return Err(Invalid(format!("vtep-sync {name}: {} MACs, at most {MAX_REMOTE_MACS}", st.macs.len())));
    }
    let mut macs = BTreeSet::new();
    for m in &st.macs {
        known(m.vni)?;
        let mac: MacAddr =
            m.mac.parse().map_err(|_| Invalid(format!("vtep-sync {name}: \"{}\" is not a MAC", m.mac)))?;
        if !mac.is_unicast() {
            return Err(Invalid(format!("vtep-sync {name}: {mac} is not a unicast MAC")));
        }
        let a = ip(&m.remote)?;
        // A MAC's remote carries its VNI: unicast to it needs the VLAN on its port.
        remotes.entry(a).or_default().insert(m.vni);
        macs.insert((m.vni, mac, a));
    }
    if st.neighbours.len() > MAX_REMOTE_NEIGHBOURS {
        let n = st.neighbours.len();
        return Err(Invalid(format!("vtep-sync {name}: {n} neighbours, at most {MAX_REMOTE_NEIGHBOURS}")));
    }
    let mut neighbours = BTreeSet::new();
    for n in &st.neighbours {
        let bad = |what: &str| Invalid(format!("vtep-sync {name}: neighbour {} on VNI {}: {what}", n.ip, n.vni));
        let ip: IpAddr = n.ip.parse().map_err(|_| bad("not an IP address"))?;
        let unicast = match ip {
            IpAddr::V4(a) => !(a.is_multicast() || a.is_broadcast() || a.is_unspecified() || a.is_loopback()),
            IpAddr::V6(a) => !(a.is_multicast() || a.is_unspecified() || a.is_loopback() || a.is_unicast_link_local()),
        };
        if !unicast {
            return Err(bad("not a unicast address"));
        }
        let mac: MacAddr = n.mac.parse().map_err(|_| bad("its MAC is not a MAC"))?;
        if remote_of(&macs, n.vni, mac).is_none() {
            return Err(bad(&format!("{mac} is not a remote MAC of the VNI")));
        }
        neighbours.insert((n.vni, ip, mac));
    }
    Ok(Checked { remotes, macs, neighbours })
}

/// The remote MAC `mac` on VNI `vni` is behind, in `macs` (sorted by VNI, MAC, remote: one
/// range lookup, not a scan, since a sync may hold 65,536 MACs and 16,384 addresses).
fn remote_of(macs: &BTreeSet<(u32, MacAddr, Ipv4Addr)>, vni: u32, mac: MacAddr) -> Option<Ipv4Addr> {
    let &(n, m, remote) = macs.range((vni, mac, Ipv4Addr::UNSPECIFIED)..).next()?;
    (n == vni && m == mac).then_some(remote)
}

/// What a checked `vtep-sync` state holds: each remote's VNIs, (VNI, MAC, remote) and (VNI,
/// address, MAC).
pub struct Checked {
    pub remotes: BTreeMap<Ipv4Addr, BTreeSet<u32>>,
    pub macs: BTreeSet<(u32, MacAddr, Ipv4Addr)>,
    pub neighbours: BTreeSet<(u32, IpAddr, MacAddr)>,
}
