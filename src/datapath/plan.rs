//! What a poll thread works from.
//!
//! A `Plan` is immutable once published: the port table, each port's policy (port security,
//! weights), the flow table and the thread's receive queues. The control thread builds a new
//! plan for every change (a reload, a port added or removed, a queue moved) and posts it to
//! each thread's `Mailbox` (`mailbox.rs`, how it is handed over).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::datapath::counters::RxqStats;
use crate::datapath::mac_table::Mac;

use crate::capture::Tap;
use crate::config::ips::IpPrefix;
use crate::config::vlan::PortVlan;
use crate::flow::table::FlowTable;
use crate::port::Port;

/// Per-port settings the data path applies, replaced as a whole on reload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// Port security: frames whose source MAC is not listed are dropped. Empty allows any.
    pub allowed_macs: Vec<Mac>,
    /// Port security: frames whose source address is in none of these are dropped
    /// (`datapath::spoof`). Empty allows any.
    pub allowed_ips: Vec<IpPrefix>,
    /// Security groups: the rules its connections meet (`datapath::firewall`). None: none.
    pub rules: Option<Arc<crate::secgroup::PortRules>>,
    /// Which VLANs the port carries, tagged or not.
    pub vlan: PortVlan,
    /// What NORMAL learns from the port's frames.
    pub learning: Learning,
    /// The captures that watch it (`pvswitchctl capture`; set by `PortTable::with_taps`):
    /// here, beside what delivery reads of the port anyway, so a port nobody captures costs
    /// the test of an empty slice on a line already loaded.
    pub taps: Taps,
    /// The mirrors that copy its frames, and whether it is a mirror's output (set by
    /// `PortTable::with_mirrors`).
    pub mirrors: Mirrors,
    /// Some capture or mirror watches what it sends (`taps` or `mirrors.as_src`): a visit
    /// reads one flag for both.
    pub watched_src: bool,
    /// Some capture or mirror watches what it is given (`taps` or `mirrors.as_dst`): its
    /// writes take delivery's slow path.
    pub watched_dst: bool,
    /// A live trace watches what it sends: delivery notes where each of its frames could not
    /// be written (`Delivery::missed`).
    pub traced: bool,
}

/// A port's mirrors (`[[mirror]]`, `config::mirror`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mirrors {
    /// Where copies of the frames it sends go (`select_src_port`, `select_all`).
    pub as_src: Box<[MirrorTo]>,
    /// Where copies of the frames it is given go (`select_dst_port`).
    pub as_dst: Box<[MirrorTo]>,
    /// The mirrors that select it as a source (bit `MirrorTo::bit`): a frame from it to a
    /// port one of them selects as a destination is copied once, as it was sent.
    pub src_of: u64,
    /// It is a mirror's output: it receives the copies only, and what it sends is dropped.
    pub output: bool,
}

/// One mirror as a port it selects sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorTo {
    /// The mirror's index (its bit in `Mirrors::src_of`).
    pub bit: u8,
    /// Its output port.
    pub port: u16,
    /// Only frames in these VLANs (None: any frame).
    pub vlans: Option<Arc<VlanSet>>,
    /// Copies cut to this many bytes (`u32::MAX`: whole).
    pub snaplen: u32,
}

/// A set of VLAN ids, one bit each.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet(pub [u64; 64]);

impl VlanSet {
    pub fn of(vids: &[u16]) -> VlanSet {
        let mut s = VlanSet([0; 64]);
        for &v in vids.iter().filter(|&&v| v < 4096) {
            s.0[v as usize / 64] |= 1 << (v % 64);
        }
        s
    }

    #[inline]
    pub fn contains(&self, vid: u16) -> bool {
        vid < 4096 && self.0[vid as usize / 64] & (1 << (vid % 64)) != 0
    }
}

impl std::fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let n: u32 = self.0.iter().map(|w| w.count_ones()).sum();
        write!(f, "{n} VLANs")
    }
}

/// A port's captures.
#[derive(Clone, Default)]
pub struct Taps(pub Box<[Tap]>);

impl std::fmt::Debug for Taps {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{} captures", self.0.len())
    }
}

impl PartialEq for Taps {
    fn eq(&self, o: &Taps) -> bool {
        self.0.len() == o.0.len()
            && self.0.iter().zip(o.0.iter()).all(|(a, b)| Arc::ptr_eq(&a.capture, &b.capture) && a.iface == b.iface)
    }
}

impl Eq for Taps {}

/// What NORMAL learns from a port's frames' source MACs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Learning {
    /// Every unicast source (a VM, a NIC).
    #[default]
    Any,
    /// A remote tunnel endpoint's: any but a MAC a local port owns (`PortTable::owned`), so a
    /// frame from the underlay cannot move a local VM's address behind a tunnel.
    NotOwned,
    /// Nothing: a tunnel of a VTEP whose remote MACs come from its control plane only.
    Off,
}

impl PortPolicy {
    #[inline]
    pub fn allows(&self, src: &Mac) -> bool {
        self.allowed_macs.is_empty() || self.allowed_macs.contains(src)
    }

    /// Sets `watched_src` and `watched_dst` from its captures and mirrors.
    fn watch(&mut self) {
        self.watched_src = !self.taps.0.is_empty() || !self.mirrors.as_src.is_empty();
        self.watched_dst = !self.taps.0.is_empty() || !self.mirrors.as_dst.is_empty();
        self.traced = self.taps.0.iter().any(|t| t.capture.trace);
    }

    /// Whether every source is allowed (no port security): the frame need not be read.
    #[inline]
    pub fn allows_any(&self) -> bool {
        self.allowed_macs.is_empty() && self.allowed_ips.is_empty()
    }
}

/// Every port by id (ids are reused only after every thread has let go of the old port).
#[derive(Default)]
pub struct PortTable {
    pub by_id: Vec<Option<Arc<Port>>>,
    pub policy: Vec<PortPolicy>,
    /// The ids of the ports in `by_id` (but mirrors' outputs), densely, for flooding: a flood
    /// reads ids, not ports, until it opens one (a port it skips costs no line of the port's
    /// own).
    pub live: Vec<u16>,
    /// Some port has a VLAN config: NORMAL learns and floods per VLAN, and every frame it
    /// switches leaves each port tagged or not as that port sends its VLAN. Without, no VLAN
    /// work is done at all.
    pub vlans: bool,
    /// With VLANs, per VLAN id: which list of `floods` holds the ports that carry it.
    flood_of: Vec<u16>,
    /// Distinct flood lists (VLANs with the same members share one), as port ids.
    floods: Vec<Vec<u16>>,
    /// With tunnels, per VLAN id: the list of `floods` without tunnel ports, for frames that
    /// came from one (split horizon: every VTEP replicates its own floods to every other).
    local_flood_of: Vec<u16>,
    /// By port id: whether it is a tunnel port.
    tunnel: Vec<bool>,
    /// Some port is a tunnel (NORMAL then asks each sender's `PortPolicy::learning`).
    pub tunnels: bool,
    /// By port id: whether it is a VTEP's underlay (open or not), which no flood reaches.
    underlay_port: Vec<bool>,
    /// Every VTEP's underlay, as decapsulation needs it.
    pub underlays: Vec<Underlay>,
    /// By port id: a tunnel port's underlay port (`NO_UNDERLAY` if none is open).
    underlay_of: Vec<u16>,
    /// With tunnels: the MACs local ports own (their `allowed_macs`), sorted; a tunnel never
    /// learns them.
    owned: Vec<Mac>,
    /// Connection tracking, if some port has security groups (`with_conntrack`): the data
    /// path's firewall stage runs only then.
    pub conntrack: Option<Arc<crate::conntrack::Conntrack>>,
    /// The flows' connection tracking (`ct` actions, `pipeline.rs`), if some flow has one: a
    /// table of its own, so a flow's zones never meet security groups'.
    pub flow_conntrack: Option<Arc<crate::conntrack::Conntrack>>,
    /// Flow export (`[ipfix]`), if configured: every burst's frames are offered to it.
    pub export: Option<Arc<crate::export::FlowExport>>,
    /// Routing (`[[vrf]]`, `route/`), if some VRF is configured: NORMAL asks it first for a
    /// frame in one of its VLANs.
    pub routes: Option<Arc<crate::datapath::route::Routes>>,
}

/// A VTEP's underlay dpdk port as decapsulation sees it: its address and UDP port, which VLAN
/// each VNI is on this host, and which tunnel port each remote endpoint is.
#[derive(Debug)]
pub struct Underlay {
    pub port: u16,
    pub local: std::net::Ipv4Addr,
    pub udp_port: u16,
    /// (VNI, VLAN), sorted by VNI.
    pub vlan_of: Vec<(u32, u16)>,
    /// (remote address, its tunnel port), sorted by address.
    pub remotes: Vec<(u32, u16)>,
    /// When a poll thread last looked for tunnels whose next hop is unresolved (TSC).
    pub swept: std::sync::atomic::AtomicU64,
}

impl Underlay {
    /// The VLAN of VNI `vni` here.
    #[inline]
    pub fn vlan(&self, vni: u32) -> Option<u16> {
        self.vlan_of.binary_search_by_key(&vni, |v| v.0).ok().map(|i| self.vlan_of[i].1)
    }

    /// The tunnel port of the remote endpoint at `ip`.
    #[inline]
    pub fn tunnel(&self, ip: std::net::Ipv4Addr) -> Option<u16> {
        let ip = u32::from(ip);
        self.remotes.binary_search_by_key(&ip, |r| r.0).ok().map(|i| self.remotes[i].1)
    }
}

pub const NO_UNDERLAY: u16 = u16::MAX;

impl PortTable {
    /// The table of `ports`, with the VTEPs `vteps` (their underlays are no member of any
    /// VLAN or flood, and carry nothing but VXLAN and ARP, whether or not any remote is
    /// known yet).
    pub fn new(ports: &[(Arc<Port>, PortPolicy)], vteps: &[crate::config::VtepConfig]) -> PortTable {
        let n = ports.iter().map(|(p, _)| p.id as usize + 1).max().unwrap_or(0);
        let mut t = PortTable { by_id: vec![None; n], policy: vec![PortPolicy::default(); n], ..Default::default() };
        for (p, pol) in ports {
            t.by_id[p.id as usize] = Some(p.clone());
            t.policy[p.id as usize] = pol.clone();
            t.live.push(p.id);
        }
        t.vlans = ports.iter().any(|(_, pol)| !pol.vlan.is_default());
        t.tunnel = t.by_id.iter().map(|p| p.as_ref().is_some_and(|p| p.tunnel().is_some())).collect();
        let tunnels = t.tunnel.contains(&true);
        t.tunnels = tunnels;
        // A VTEP's underlay is no member of any VLAN, nor of any flood: its frames are the VTEP's.
        let underlays: std::collections::HashSet<&str> = vteps.iter().map(|v| v.underlay.as_str()).collect();
        t.underlay_port = t.by_id.iter().map(|p| p.as_ref().is_some_and(|p| underlays.contains(p.name()))).collect();
        if tunnels {
            t.owned = ports
                .iter()
                .filter(|(p, pol)| pol.learning == Learning::Any && !t.underlay_port[p.id as usize])
                .flat_map(|(_, pol)| pol.allowed_macs.iter().copied())
                .collect();
            t.owned.sort_unstable();
            t.owned.dedup();
        }
        if t.vlans {
            let mut index = std::collections::HashMap::new();
            let mut list = |members: Vec<u16>, floods: &mut Vec<Vec<u16>>| {
                let next = floods.len() as u16;
                *index.entry(members.clone()).or_insert_with(|| {
                    floods.push(members);
                    next
                })
            };
            let members_of = |vid: u16| -> Vec<u16> {
                ports
                    .iter()
                    .filter(|(p, pol)| pol.vlan.carries(vid) && !t.underlay_port[p.id as usize])
                    .map(|(p, _)| p.id)
                    .collect()
            };
            for vid in 0..4096u16 {
                let members = members_of(vid);
                if tunnels {
                    let local = members.iter().copied().filter(|&id| !t.tunnel[id as usize]).collect();
                    let i = list(local, &mut t.floods);
                    t.local_flood_of.push(i);
                }
                let i = list(members, &mut t.floods);
                t.flood_of.push(i);
            }
        }
        t.underlay_of = vec![NO_UNDERLAY; n];
        for v in vteps {
            let Some((u, _)) = ports.iter().find(|(u, _)| u.name() == v.underlay && u.nic().is_some()) else {
                continue;
            };
            let mut vlan_of: Vec<(u32, u16)> = v.vnis.iter().map(|n| (n.vni, n.vlan)).collect();
            vlan_of.sort();
            let mut remotes = Vec::new();
            for (p, _) in ports {
                if let Some(tun) = p.tunnel().filter(|tun| tun.cfg.vtep == v.name) {
                    t.underlay_of[p.id as usize] = u.id;
                    remotes.push((u32::from(tun.cfg.remote), p.id));
                }
            }
            remotes.sort();
            t.underlays.push(Underlay {
                port: u.id,
                local: v.local,
                udp_port: v.udp_port,
                vlan_of,
                remotes,
                swept: Default::default(),
            });
        }
        t
    }

    /// The table with connection tracking `ct`, kept only if some port has security groups.
    pub fn with_conntrack(mut self, ct: Option<Arc<crate::conntrack::Conntrack>>) -> PortTable {
        self.conntrack = ct.filter(|_| self.policy.iter().any(|p| p.rules.is_some()));
        self
    }

    /// The table with the flows' connection tracking `ct`.
    pub fn with_flow_conntrack(mut self, ct: Option<Arc<crate::conntrack::Conntrack>>) -> PortTable {
        self.flow_conntrack = ct;
        self
    }

    /// The table with the VRFs `vrfs` routed (their neighbours from the table's ports, and
    /// `remote`'s, EVPN's).
    pub fn with_routes(
        mut self,
        vrfs: &[crate::config::VrfConfig],
        remote: &[crate::datapath::route::Remote],
    ) -> PortTable {
        let policy = &self.policy;
        let ports = self.live.iter().map(|&id| {
            let p = &policy[id as usize];
            (id, &p.allowed_macs[..], &p.allowed_ips[..], &p.vlan)
        });
        self.routes = crate::datapath::route::Routes::new(vrfs, ports, remote).map(Arc::new);
        self
    }

    /// The table with flow export `x`.
    pub fn with_export(mut self, x: Option<Arc<crate::export::FlowExport>>) -> PortTable {
        self.export = x;
        self
    }

    /// The table with `taps`: (port id, a capture of it), kept in each port's policy.
    pub fn with_taps(mut self, taps: Vec<(u16, Tap)>) -> PortTable {
        let mut by_port: Vec<Vec<Tap>> = vec![Vec::new(); self.by_id.len()];
        for (id, tap) in taps {
            if let Some(v) = by_port.get_mut(id as usize) {
                v.push(tap);
            }
        }
        for (pol, t) in self.policy.iter_mut().zip(by_port) {
            pol.taps = Taps(t.into_boxed_slice());
        }
        self.rewatch();
        self
    }

    /// Sets each port's `watched_src` and `watched_dst` from its captures and mirrors; a
    /// tunnel's writes are watched too while its underlay is captured (`tx::vxlan::encap`
    /// offers them to the underlay's captures, outer headers and all).
    fn rewatch(&mut self) {
        for pol in &mut self.policy {
            pol.watch();
        }
        for id in 0..self.policy.len() {
            if let Some(u) = self.underlay_of(id as u16)
                && self.policy[u as usize].taps.0.iter().any(|t| t.capture.looks_out())
            {
                self.policy[id].watched_dst = true;
            }
        }
    }

    /// The table with `mirrors` (the configuration's, in order), each port's part in them
    /// kept in its policy: a mirror whose output is absent (or not a vhost-user or dpdk port)
    /// copies nothing; one that names ports that are absent selects the others. A mirror's
    /// output leaves every flood, and is selected by none (`config::mirror` refuses that;
    /// `select_all` passes over it).
    pub fn with_mirrors(mut self, mirrors: &[crate::config::MirrorConfig]) -> PortTable {
        let id_of = |name: &str| {
            self.live.iter().copied().find(|&id| self.by_id[id as usize].as_ref().is_some_and(|p| p.name() == name))
        };
        let mut outputs = Vec::new();
        let mut as_src: Vec<Vec<MirrorTo>> = vec![Vec::new(); self.by_id.len()];
        let mut as_dst: Vec<Vec<MirrorTo>> = vec![Vec::new(); self.by_id.len()];
        for (bit, m) in mirrors.iter().enumerate().take(64) {
            let Some(out) = id_of(&m.output_port) else { continue };
            if self.is_tunnel(out) || self.underlay_port[out as usize] {
                continue;
            }
            outputs.push(out);
            let to = MirrorTo {
                bit: bit as u8,
                port: out,
                vlans: (!m.select_vlan.is_empty()).then(|| Arc::new(VlanSet::of(&m.select_vlan))),
                snaplen: m.snaplen.unwrap_or(u32::MAX),
            };
            let sources: Vec<u16> = match m.select_all {
                true => self.live.clone(),
                false => m.select_src_port.iter().filter_map(|n| id_of(n)).collect(),
            };
            for id in sources {
                as_src[id as usize].push(to.clone());
            }
            for id in m.select_dst_port.iter().filter_map(|n| id_of(n)) {
                as_dst[id as usize].push(to.clone());
            }
        }
        for &o in &outputs {
            as_src[o as usize].clear();
            as_dst[o as usize].clear();
        }
        for (id, pol) in self.policy.iter_mut().enumerate() {
            let src = std::mem::take(&mut as_src[id]);
            let src_of = src.iter().fold(0u64, |b, m| b | 1 << m.bit);
            pol.mirrors = Mirrors {
                as_src: src.into_boxed_slice(),
                as_dst: std::mem::take(&mut as_dst[id]).into_boxed_slice(),
                src_of,
                output: outputs.contains(&(id as u16)),
            };
        }
        self.rewatch();
        if !outputs.is_empty() {
            // An output is no member of any flood.
            self.live.retain(|id| !outputs.contains(id));
            for list in &mut self.floods {
                list.retain(|id| !outputs.contains(id));
            }
        }
        self
    }

    /// The output ports of the table's mirrors.
    pub fn mirror_outputs(&self) -> impl Iterator<Item = u16> + '_ {
        self.policy.iter().enumerate().filter(|(_, p)| p.mirrors.output).map(|(id, _)| id as u16)
    }

    /// Whether a local port owns `mac` (lists it in `allowed_macs`): a tunnel may not learn it.
    #[inline]
    pub fn owned(&self, mac: &Mac) -> bool {
        self.owned.binary_search(mac).is_ok()
    }

    /// The underlay of the dpdk port `id`, if it is a VTEP's.
    #[inline]
    pub fn underlay(&self, id: u16) -> Option<&Underlay> {
        self.underlays.iter().find(|u| u.port == id)
    }

    /// The underlay port of tunnel port `id`.
    #[inline]
    pub fn underlay_of(&self, id: u16) -> Option<u16> {
        self.underlay_of.get(id as usize).copied().filter(|&u| u != NO_UNDERLAY)
    }

    /// Whether port `id` is a tunnel port.
    #[inline]
    pub fn is_tunnel(&self, id: u16) -> bool {
        self.tunnel.get(id as usize) == Some(&true)
    }

    /// The ports a frame of VLAN `vid` from port `from` floods to: every port that carries
    /// the VLAN but, for a frame from a tunnel, the other tunnels (split horizon).
    #[inline]
    pub fn flood_list_from(&self, vid: u16, from: u16) -> &[u16] {
        if self.is_tunnel(from)
            && let Some(&i) = self.local_flood_of.get(vid as usize)
        {
            return &self.floods[i as usize];
        }
        self.flood_list(vid)
    }

    /// The ports a flow's FLOOD or ALL action from port `from` sends to: every port but
    /// `from`, the VTEPs' underlays (a frame goes there only encapsulated, by a tunnel port)
    /// and, from a tunnel, the other tunnels (split horizon, as NORMAL's floods).
    pub fn flood_all_from(&self, from: u16) -> impl Iterator<Item = u16> + '_ {
        let from_tunnel = self.is_tunnel(from);
        self.live
            .iter()
            .copied()
            .filter(move |&id| id != from && !self.underlay_port[id as usize] && !(from_tunnel && self.is_tunnel(id)))
    }

    /// The ports a frame of VLAN `vid` floods to (every port, on a switch without VLANs).
    #[inline]
    pub fn flood_list(&self, vid: u16) -> &[u16] {
        match self.flood_of.get(vid as usize) {
            Some(&i) if self.vlans => &self.floods[i as usize],
            _ => &self.live,
        }
    }

    #[inline]
    pub fn get(&self, id: u16) -> Option<&Arc<Port>> {
        self.by_id.get(id as usize).and_then(|p| p.as_ref())
    }
}

/// A receive queue as the control plane assigns it: queue pair `qpair` of `port`, with the
/// visit budget its weights give it.
#[derive(Clone)]
pub struct RxqSpec {
    pub port: Arc<Port>,
    pub qpair: usize,
    pub weight_packets: u32,
    pub weight_bytes: u32,
    pub stats: Arc<RxqStats>,
}

pub struct Plan {
    pub ports: Arc<PortTable>,
    pub flows: Arc<FlowTable>,
    pub rxqs: Vec<RxqSpec>,
    /// How to poll from this plan on (None: as before).
    pub tuning: Option<Tuning>,
}

/// How a poll thread polls, from `[switch]` (and `[dpdk]`'s NIC poll interval). The switch's
/// plans carry it, so a reload that changes it reaches running threads with their next plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Most frames one visit takes from a queue (at most `config::MAX_BURST`).
    pub burst: u32,
    /// How long a frame may wait for room in a full guest RX ring, in TSC cycles.
    pub retry_cycles: u64,
    /// Adaptive polling: sleep after this long without frames. None: busy polling.
    pub sleep_after_us: Option<u32>,
    /// Adaptive polling: a thread with NIC queues that cannot wake it sleeps this long first,
    /// twice as long after each sleep that found nothing, up to `nic_poll_max_us`.
    pub nic_poll_interval_us: u32,
    pub nic_poll_max_us: u32,
    /// Parking: a guest queue empty this long leaves the polled set (0: never)...
    pub park_after_us: u32,
    /// ... and the parked queues' kicks are looked at this often.
    pub park_check_us: u32,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{PortPolicy, PortTable};
    use crate::config::vlan::PortVlan;
    use crate::port::Port;

    /// A VLAN's flood list is the ports that carry it: a flood's cost grows with its VLAN's
    /// ports, not with the switch's. Without VLAN config, every port.
    #[test]
    fn tunnels_flood_to_local_ports_only_and_underlays_to_none() {
        use crate::config::VxlanConfig;
        use crate::port::tunnel::Tunnel;
        let tunnel = |id: u16, remote: [u8; 4]| {
            let cfg = VxlanConfig {
                vtep: "vt".into(),
                underlay: "up".into(),
                local: [10, 0, 0, 1].into(),
                prefix_len: 24,
                gateway: None,
                next_hop_mac: None,
                udp_port: 4789,
                remote: remote.into(),
                vnis: vec![(100, 10)],
                learning: true,
            };
            Arc::new(Port::vxlan(id, "t", 1450, Tunnel::new(cfg)))
        };
        let vtep = crate::config::VtepConfig {
            name: "vt".into(),
            underlay: "up".into(),
            local: [10, 0, 0, 1].into(),
            prefix_len: 24,
            gateway: None,
            next_hop_mac: None,
            udp_port: 4789,
            mtu: 1450,
            learning: true,
            vnis: vec![crate::config::VniConfig { vni: 100, vlan: 10, remotes: vec![] }],
        };
        let pol = |v: PortVlan| PortPolicy { vlan: v, ..Default::default() };
        let ports = vec![
            (Arc::new(Port::vhost_user(0, "vm", 1500, 1)), pol(PortVlan::access(10))),
            (Arc::new(Port::dpdk(1, "up", 1500, None)), pol(PortVlan::default())),
            (tunnel(2, [10, 0, 0, 2]), pol(PortVlan::tunnel(&[10]))),
            (tunnel(3, [10, 0, 0, 3]), pol(PortVlan::tunnel(&[10]))),
        ];
        let t = PortTable::new(&ports, std::slice::from_ref(&vtep));
        assert_eq!(t.flood_list_from(10, 0), [0, 2, 3], "a VM floods to both remotes, never the underlay");
        assert_eq!(t.flood_list_from(10, 2), [0], "split horizon: a remote's flood stays local");
        assert_eq!(t.flood_list_from(20, 0), [] as [u16; 0], "the underlay carries no VLAN");
        assert_eq!((t.underlay_of(2), t.underlay_of(0)), (None, None), "a failed underlay is none");
        assert_eq!(t.flood_all_from(0).collect::<Vec<_>>(), [2, 3], "a flow's FLOOD: never the underlay");
        assert_eq!(t.flood_all_from(2).collect::<Vec<_>>(), [0], "nor, from a tunnel, another tunnel");
        // Before any remote is known, the underlay is still the VTEP's: no VLAN, no flood, not
        // a port to switch frames to or from unencapsulated.
        let alone = PortTable::new(&ports[..2], std::slice::from_ref(&vtep));
        assert_eq!(alone.flood_list_from(10, 0), [0] as [u16; 1], "no remote: the VM floods to nobody");
        assert_eq!(alone.flood_list(0), [] as [u16; 0], "the underlay is in no flood, untagged included");
        assert_eq!(alone.flood_all_from(0).count(), 0, "a flow's FLOOD: never the underlay");
    }

    #[test]
    fn flood_lists_hold_the_ports_of_their_vlan() {
        let vlans = [PortVlan::access(10), PortVlan::access(20), PortVlan::trunk(&[10, 30]), PortVlan::default()];
        let ports: Vec<(Arc<Port>, PortPolicy)> = vlans
            .iter()
            .enumerate()
            .map(|(i, v)| {
                (
                    Arc::new(Port::vhost_user(i as u16, "p", 1500, 1)),
                    PortPolicy { vlan: v.clone(), ..Default::default() },
                )
            })
            .collect();
        let t = PortTable::new(&ports, &[]);
        let ids = |vid: u16| t.flood_list(vid).to_vec();
        assert_eq!(
            (ids(10), ids(20), ids(30), ids(0), ids(40)),
            (vec![0, 2, 3], vec![1, 3], vec![2, 3], vec![3], vec![3])
        );
        assert_eq!(ids(u16::MAX), vec![0, 1, 2, 3], "a frame NORMAL did not switch floods everywhere");
        let plain = PortTable::new(&[(ports[0].0.clone(), PortPolicy::default())], &[]);
        assert!(!plain.vlans);
        assert_eq!(plain.flood_list(10).len(), 1);
    }
}
