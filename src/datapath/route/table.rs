//! What routing reads: each VRF's networks (by VLAN, and per VRF the longest prefix first, for
//! IPv4 and IPv6) and the neighbours the ports give it (and EVPN's, behind tunnels), in an
//! open-addressed index by VRF and address. Made with each plan; read-only on the poll threads.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::VrfConfig;
use crate::config::ips::IpPrefix;
use crate::config::vlan::PortVlan;
use crate::wire::MacAddr;

/// No network: the VLAN is in no VRF.
const NONE: u16 = u16::MAX;

/// An IPv4 address as a neighbour key's address: IPv4-mapped (`::ffff:a.b.c.d`), so that one
/// index holds both families and no IPv4 key equals an IPv6 one a port may have.
#[inline(always)]
pub(super) fn mapped(a: u32) -> u128 {
    0xffff_0000_0000 | a as u128
}

/// One network of a VRF, as the data path reads it.
#[derive(Debug, Clone, Copy)]
pub struct Net {
    pub vrf: u16,
    pub vlan: u16,
    pub gateway: Ipv4Addr,
    mask: u32,
    pub gateway_mac: MacAddr,
    /// The IPv6 gateway's address and the network's mask (a dual-stack network).
    pub gateway6: Option<(u128, u128)>,
}

impl Net {
    pub(super) fn contains(&self, a: u32) -> bool {
        (a ^ u32::from(self.gateway)) & self.mask == 0
    }

    pub(super) fn contains6(&self, a: u128) -> bool {
        self.gateway6.is_some_and(|(g, m)| (a ^ g) & m == 0)
    }

    /// The gateway's IPv6 link-local address (fe80:: and the modified EUI-64 of its MAC, RFC
    /// 4291 2.5.1): the same on every network of the VRF and on every host.
    pub fn link_local(&self) -> u128 {
        let m = self.gateway_mac.0;
        let iid = [m[0] ^ 2, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]];
        0xfe80 << 112 | u64::from_be_bytes(iid) as u128
    }
}

/// A routed address: the port it is on and its MAC, in network `net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Neighbour {
    /// IPv4's index key: the VRF (high 32 bits) and the address (an IPv6 neighbour's is never
    /// looked up: it is in `slots6`).
    key4: u64,
    vrf: u16,
    /// IPv6, or IPv4-mapped.
    addr: u128,
    pub mac: MacAddr,
    pub port: u16,
    pub net: u16,
}

impl Neighbour {
    /// Its address.
    pub fn address(&self) -> IpAddr {
        match Ipv6Addr::from(self.addr).to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(self.addr)),
        }
    }
}

/// A neighbour a port's configuration does not give: a remote MAC's address from EVPN, behind
/// the tunnel port `port`, on VLAN `vlan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub port: u16,
    pub mac: MacAddr,
    pub addr: IpAddr,
    pub vlan: u16,
}

/// Every VRF's networks and neighbours, made with each plan (`PortTable::with_routes`).
#[derive(Debug)]
pub struct Routes {
    /// By VLAN id: its network in `nets` (`NONE`: in no VRF).
    by_vlan: Box<[u16]>,
    pub nets: Vec<Net>,
    /// Per VRF: its networks, the longest IPv4 prefix first; and those with an IPv6 gateway,
    /// the longest IPv6 prefix first.
    by_vrf: Vec<Vec<u16>>,
    by_vrf6: Vec<Vec<u16>>,
    /// Sorted by VRF and address.
    neighbours: Vec<Neighbour>,
    /// Open-addressed indexes of `neighbours` (1 + the index; 0 empty), IPv4's by `key4` and
    /// IPv6's by VRF and address, each at most half full: a lookup is a multiply and, mostly,
    /// one probe. Their keys are the configuration's, so no guest chooses where they fall.
    slots4: Index,
    slots6: Index,
}

/// An open-addressed index: its slots, and 64 - log2 of their number.
#[derive(Debug)]
struct Index {
    slots: Box<[u16]>,
    shift: u32,
}

impl Index {
    /// An index of the `n` keys `keys` yields, by hash.
    fn new(n: usize, keys: impl Iterator<Item = (u16, u64)>) -> Index {
        let size = (2 * n).next_power_of_two().max(16);
        let mut x = Index { slots: vec![0; size].into_boxed_slice(), shift: 64 - size.trailing_zeros() };
        for (i, k) in keys {
            let mut h = x.start(k);
            while x.slots[h] != 0 {
                h = (h + 1) & (size - 1);
            }
            x.slots[h] = i + 1;
        }
        x
    }

    /// Where the probe for hash `k` starts.
    #[inline(always)]
    fn start(&self, k: u64) -> usize {
        (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// The first index from `k`'s start for which `hit` holds, if one does before an empty slot.
    #[inline(always)]
    fn find(&self, k: u64, hit: impl Fn(usize) -> Option<bool>) -> Option<u16> {
        let mask = self.slots.len() - 1;
        let mut h = self.start(k);
        loop {
            let i = (*self.slots.get(h)? as usize).checked_sub(1)?;
            if hit(i)? {
                return Some(i as u16);
            }
            h = (h + 1) & mask;
        }
    }
}

fn key4(vrf: u16, a: u32) -> u64 {
    (vrf as u64) << 32 | a as u64
}

fn hash6(vrf: u16, a: u128) -> u64 {
    (a as u64) ^ ((a >> 64) as u64).rotate_left(29) ^ (vrf as u64) << 48
}

impl Routes {
    /// The VRFs of the configuration, with the neighbours the ports give (each port's id, its
    /// `allowed_macs`, `allowed_ips` and VLANs): each port with one allowed MAC, for each host
    /// address of its `allowed_ips` (IPv4 or IPv6) that is in a network of a VLAN the port
    /// carries (the first such port, for an address two name); then each of `remote` whose
    /// address is in the network of its VLAN, unless a port named it. None without VRFs.
    pub fn new<'p>(
        vrfs: &[VrfConfig],
        ports: impl Iterator<Item = (u16, &'p [MacAddr], &'p [IpPrefix], &'p PortVlan)>,
        remote: &[Remote],
    ) -> Option<Routes> {
        if vrfs.is_empty() {
            return None;
        }
        let mut r = Routes {
            by_vlan: vec![NONE; 4096].into_boxed_slice(),
            nets: Vec::new(),
            by_vrf: Vec::new(),
            by_vrf6: Vec::new(),
            neighbours: Vec::new(),
            slots4: Index::new(0, std::iter::empty()),
            slots6: Index::new(0, std::iter::empty()),
        };
        for (vi, v) in vrfs.iter().enumerate() {
            let mut mine = Vec::new();
            for n in &v.networks {
                r.by_vlan[n.vlan as usize] = r.nets.len() as u16;
                mine.push(r.nets.len() as u16);
                r.nets.push(Net {
                    vrf: vi as u16,
                    vlan: n.vlan,
                    gateway: n.gateway,
                    mask: n.mask(),
                    gateway_mac: v.gateway_mac,
                    gateway6: n.gateway6.map(|g| (u128::from(g.addr), g.mask())),
                });
            }
            let mut mine6: Vec<u16> = mine.iter().copied().filter(|&i| r.nets[i as usize].gateway6.is_some()).collect();
            mine.sort_by_key(|&i| std::cmp::Reverse(r.nets[i as usize].mask.count_ones()));
            mine6.sort_by_key(|&i| std::cmp::Reverse(r.nets[i as usize].gateway6.map_or(0, |g| g.1.count_ones())));
            r.by_vrf.push(mine);
            r.by_vrf6.push(mine6);
        }
        for (id, macs, ips, vlan) in ports {
            let [mac] = macs[..] else { continue };
            for p in ips {
                let (addr, found) = if let Some(a) = p.host4() {
                    let a = u32::from(a);
                    (mapped(a), r.nets.iter().position(|n| n.contains(a) && vlan.carries(n.vlan)))
                } else if let Some(a) = p.host6() {
                    let a = u128::from(a);
                    (a, r.nets.iter().position(|n| n.contains6(a) && vlan.carries(n.vlan)))
                } else {
                    continue;
                };
                if let Some(net) = found {
                    let vrf = r.nets[net].vrf;
                    let n = Neighbour { key4: key4(vrf, addr as u32), vrf, addr, mac, port: id, net: net as u16 };
                    r.neighbours.push(n);
                }
            }
        }
        for n in remote {
            let (addr, net) = match n.addr {
                IpAddr::V4(a) => (mapped(u32::from(a)), r.net_of(n.vlan).filter(|net| net.contains(u32::from(a)))),
                IpAddr::V6(a) => (u128::from(a), r.net_of(n.vlan).filter(|net| net.contains6(u128::from(a)))),
            };
            if let Some(net) = net {
                let (vrf, net) = (net.vrf, r.by_vlan[n.vlan as usize]);
                let key4 = key4(vrf, addr as u32);
                r.neighbours.push(Neighbour { key4, vrf, addr, mac: n.mac, port: n.port, net });
            }
        }
        // The first port to name an address keeps it (a stable sort: the ports' before EVPN's).
        r.neighbours.sort_by_key(|n| (n.vrf, n.addr));
        r.neighbours.dedup_by_key(|n| (n.vrf, n.addr));
        r.neighbours.truncate(u16::MAX as usize / 2);
        let is4 = |n: &Neighbour| n.addr >> 32 == 0xffff;
        let (n4, n6) =
            (r.neighbours.iter().filter(|n| is4(n)).count(), r.neighbours.iter().filter(|n| !is4(n)).count());
        let all = || r.neighbours.iter().enumerate().map(|(i, n)| (i as u16, n));
        r.slots4 = Index::new(n4, all().filter(|(_, n)| is4(n)).map(|(i, n)| (i, n.key4)));
        r.slots6 = Index::new(n6, all().filter(|(_, n)| !is4(n)).map(|(i, n)| (i, hash6(n.vrf, n.addr))));
        Some(r)
    }

    /// The network of VLAN `vid`, if it is a VRF's.
    #[inline]
    pub fn net_of(&self, vid: u16) -> Option<&Net> {
        match self.by_vlan.get(vid as usize) {
            Some(&i) if i != NONE => self.nets.get(i as usize),
            _ => None,
        }
    }

    /// Neighbour `i` (`Out::Routed`'s).
    pub fn neighbour(&self, i: u16) -> Option<&Neighbour> {
        self.neighbours.get(i as usize)
    }

    /// The neighbour at IPv4 address `a` in VRF `vrf`, by index.
    #[inline]
    pub(super) fn find4(&self, vrf: u16, a: u32) -> Option<u16> {
        let k = key4(vrf, a);
        self.slots4.find(k, |i| Some(self.neighbours.get(i)?.key4 == k))
    }

    /// The neighbour at IPv6 address `a` in VRF `vrf`, by index.
    pub(super) fn find6(&self, vrf: u16, a: u128) -> Option<u16> {
        self.slots6.find(hash6(vrf, a), |i| self.neighbours.get(i).map(|n| n.addr == a && n.vrf == vrf))
    }

    /// The network of VRF `vrf` that holds IPv4 address `a` (the longest prefix).
    pub(super) fn network_of(&self, vrf: u16, a: u32) -> Option<&Net> {
        self.by_vrf.get(vrf as usize)?.iter().map(|&i| &self.nets[i as usize]).find(|n| n.contains(a))
    }

    /// The network of VRF `vrf` that holds IPv6 address `a` (the longest prefix).
    pub(super) fn network_of6(&self, vrf: u16, a: u128) -> Option<&Net> {
        self.by_vrf6.get(vrf as usize)?.iter().map(|&i| &self.nets[i as usize]).find(|n| n.contains6(a))
    }

    /// The neighbour at `addr` (IPv6, or IPv4-mapped) in network `net` (an address of another
    /// network, or another VRF's, is none).
    pub fn answer_for(&self, net: &Net, addr: u128) -> Option<&Neighbour> {
        let i = match Ipv6Addr::from(addr).to_ipv4_mapped() {
            Some(a) => self.find4(net.vrf, a.into())?,
            None => self.find6(net.vrf, addr)?,
        };
        let n = &self.neighbours[i as usize];
        (self.nets[n.net as usize].vlan == net.vlan).then_some(n)
    }

    /// Every neighbour, for `pvswitchctl`.
    pub fn neighbours(&self) -> &[Neighbour] {
        &self.neighbours
    }
}
