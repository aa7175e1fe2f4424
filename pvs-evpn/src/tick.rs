//! EVPN for pvswitch's VTEPs through an unmodified FRR: the decisions of `pvs-evpn`, the
//! companion that mirrors a VTEP into the kernel of FRR's network namespace and back (its I/O is
//! beside it: `netlink` (the FDB), `shadow` (the kernel objects), `main` (the loop, the
//! control socket)).
//!
//! FRR's zebra learns local MACs and VNIs from kernel bridges and VXLAN devices and installs
//! what BGP EVPN learned from other hosts as FDB entries on those VXLAN devices. So per VNI of a
//! VTEP, the companion keeps *shadow* kernel objects that carry no traffic: a bridge
//! `pvsb<VNI>`, a VXLAN device `pvsx<VNI>` (the VNI, the VTEP's address and UDP port, no
//! learning) and a veth `pvsl<VNI>` standing for every port of pvswitch. Each tick:
//! - **out**: every MAC local to this host on the VNI (`vteps`) is a static FDB entry on
//!   `pvsl<VNI>` (zebra advertises it as a type-2 route), and an entry no longer local is
//!   deleted (withdrawn); the VNI itself is advertised (type 3) because its VXLAN device is up;
//! - **in**: what zebra installed on `pvsx<VNI>` (entries with a remote VTEP address: the
//!   all-zero MAC is the VNI's flood list, any other MAC, marked extern_learn, a remote host's)
//!   is the VTEP's learned state, sent with one `vtep-sync` when it differs from what
//!   pvswitchd holds (so a restarted pvswitchd, or FRR, is back in step on the next tick).
//!
//! **Addresses (MAC+IP routes).** A configured MAC's addresses in a VRF's network (`ips` of
//! `vteps`, IPv4 and IPv6) are static neighbours of the bridge `pvsb<VNI>` (zebra advertises
//! each as a type-2 MAC+IP route); the neighbours zebra installs there (extern_learn) for
//! remote MACs are synced as `neighbours`, which pvswitchd's VRFs answer ARP and neighbour
//! solicitations for and route to. Learned MACs have no address: pvswitchd learns none from
//! guests (no ARP learning, so none to poison). The bridge is the one shadow object with IPv6
//! on (for its IPv6 neighbours), and it has no IPv6 address, so it sends nothing.
//!
//! **A MAC that moved away.** Tunnels of an EVPN VTEP learn nothing from the data plane, so a
//! VM that moves to another host while its old port stays connected (a live migration's
//! source, silent) stays learned on that port here until told otherwise. EVPN's MAC mobility
//! tells: the other host advertises it with a higher sequence number, and zebra replaces our
//! static entry with its remote one. A learned MAC we had exported whose static entry is gone
//! while zebra has it remote has moved: it is synced as remote (pvswitchd moves it behind the
//! tunnel) and not exported again. If the VM then speaks here again, pvswitchd learns it on its
//! local port although the last sync said remote: it came back, and is exported (zebra raises
//! the sequence number). A configured MAC (`allowed_macs` of a connected port) is always this
//! host's.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use pvswitch::proto::{RemoteMac, RemoteNeighbour, RemoteVnis, VtepInfo, VtepState};
use pvswitch::wire::MacAddr;

/// The shadow objects of VNI `vni`: (bridge, VXLAN device, local port, its veth peer).
pub fn shadow_names(vni: u32) -> [String; 4] {
    [format!("pvsb{vni}"), format!("pvsx{vni}"), format!("pvsl{vni}"), format!("pvsp{vni}")]
}

/// The VNI a shadow object of `name` (and `prefix`) belongs to.
pub fn vni_of(name: &str, prefix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?.parse().ok()
}

/// One bridge FDB entry as the kernel reports it, on an interface named `dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FdbEntry {
    pub dev: String,
    pub mac: MacAddr,
    /// NDA_DST: the remote VTEP of an entry on a VXLAN device.
    pub dst: Option<Ipv4Addr>,
    /// NTF_EXT_LEARNED: installed by a control plane (zebra).
    pub ext_learned: bool,
    /// NTF_SELF: the device's own table (a VXLAN device's remote entries).
    pub own: bool,
    /// A static entry (NUD_NOARP), what the companion exports.
    pub is_static: bool,
}

/// One IPv4 or IPv6 neighbour as the kernel reports it, on an interface named `dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeighEntry {
    pub dev: String,
    pub ip: IpAddr,
    pub mac: MacAddr,
    /// NTF_EXT_LEARNED: installed by zebra (a remote MAC+IP route).
    pub ext_learned: bool,
    /// NUD_NOARP: what the companion exports, and what zebra installs.
    pub is_static: bool,
}

/// What one tick does: MACs to export (VNI, MAC) and to withdraw, addresses to export (VNI,
/// address, MAC) and to withdraw, and the sync to send.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tick {
    pub export: Vec<(u32, MacAddr)>,
    pub withdraw: Vec<(u32, MacAddr)>,
    pub export_neigh: Vec<(u32, IpAddr, MacAddr)>,
    pub withdraw_neigh: Vec<(u32, IpAddr, MacAddr)>,
    pub sync: Option<VtepState>,
    /// The MACs exported once this tick is done (the next tick's `exported`).
    pub exported: BTreeSet<(u32, MacAddr)>,
}

/// Decides a tick for VTEP `v` from the kernel's FDB (`fdb`, every bridge entry of the
/// namespace), its IPv4 and IPv6 neighbours (`neigh`) and what the last tick left exported (`exported`).
pub fn tick(v: &VtepInfo, fdb: &[FdbEntry], neigh: &[NeighEntry], exported: &BTreeSet<(u32, MacAddr)>) -> Tick {
    let vnis: BTreeSet<u32> = v.vnis.iter().map(|n| n.vni).collect();
    let local = |configured: bool| -> BTreeSet<(u32, MacAddr)> {
        v.local_macs
            .iter()
            .filter(|m| m.configured == configured)
            .filter_map(|m| Some((m.vni, m.mac.parse().ok()?)))
            .filter(|(vni, _)| vnis.contains(vni))
            .collect()
    };
    let (configured, learned) = (local(true), local(false));
    let mut have = BTreeSet::new();
    let mut remotes: BTreeMap<Ipv4Addr, BTreeSet<u32>> = BTreeMap::new();
    let mut zebra_remote: BTreeMap<(u32, MacAddr), Ipv4Addr> = BTreeMap::new();
    for e in fdb {
        if let Some(vni) = vni_of(&e.dev, "pvsl").filter(|v| vnis.contains(v)) {
            if e.is_static && !e.own {
                have.insert((vni, e.mac));
            }
        } else if let (Some(vni), Some(dst), true) = (vni_of(&e.dev, "pvsx").filter(|v| vnis.contains(v)), e.dst, e.own)
        {
            if e.mac == MacAddr::ZERO {
                remotes.entry(dst).or_default().insert(vni);
            } else if e.ext_learned {
                zebra_remote.insert((vni, e.mac), dst);
            }
        }
    }
    let synced_remote: BTreeSet<(u32, String)> = v.learned.macs.iter().map(|m| (m.vni, m.mac.to_lowercase())).collect();
    // A learned MAC zebra has remote: still ours while our entry stands; moved away if zebra
    // took our entry over; back here if pvswitchd learned it again after we said remote; else
    // (never exported, never synced) ours.
    let moved_away = |k: &(u32, MacAddr)| {
        zebra_remote.contains_key(k)
            && !have.contains(k)
            && exported.contains(k)
            && !synced_remote.contains(&(k.0, k.1.to_string()))
    };
    let want: BTreeSet<(u32, MacAddr)> =
        configured.iter().chain(learned.iter().filter(|k| !moved_away(k))).copied().collect();
    let macs: BTreeSet<RemoteMac> = zebra_remote
        .iter()
        .filter(|(k, _)| !want.contains(k))
        .map(|((vni, mac), dst)| RemoteMac { vni: *vni, mac: mac.to_string(), remote: dst.to_string() })
        .collect();
    let (want_neigh, have_neigh, remote_neigh) = addresses(v, &vnis, neigh, &macs);
    let state = VtepState {
        remotes: remotes
            .into_iter()
            .map(|(r, vnis)| RemoteVnis { remote: r.to_string(), vnis: vnis.into_iter().collect() })
            .collect(),
        macs: macs.into_iter().collect(),
        neighbours: remote_neigh,
    };
    // A kernel neighbour is one a device and address: one whose MAC changed is replaced, not
    // withdrawn (deleting it would delete the new one).
    let wanted_ip: BTreeSet<(u32, IpAddr)> = want_neigh.iter().map(|&(vni, ip, _)| (vni, ip)).collect();
    Tick {
        export: want.difference(&have).copied().collect(),
        withdraw: have.difference(&want).copied().collect(),
        export_neigh: want_neigh.difference(&have_neigh).copied().collect(),
        withdraw_neigh: have_neigh.iter().filter(|&&(vni, ip, _)| !wanted_ip.contains(&(vni, ip))).copied().collect(),
        sync: (normalized(&state) != normalized(&v.learned)).then_some(state),
        exported: want,
    }
}

type Addresses = BTreeSet<(u32, IpAddr, MacAddr)>;

/// The addresses of a tick: those to export (configured MACs' `ips`), those exported
/// (static, not zebra's, on a shadow bridge of one of the VTEP's VNIs), and zebra's for the
/// remote MACs `macs` (what the sync says).
fn addresses(
    v: &VtepInfo,
    vnis: &BTreeSet<u32>,
    neigh: &[NeighEntry],
    macs: &BTreeSet<RemoteMac>,
) -> (Addresses, Addresses, Vec<RemoteNeighbour>) {
    let want: Addresses = v
        .local_macs
        .iter()
        .filter(|m| m.configured && vnis.contains(&m.vni))
        .filter_map(|m| Some((m.vni, m.mac.parse::<MacAddr>().ok()?, &m.ips)))
        .flat_map(|(vni, mac, ips)| ips.iter().filter_map(move |ip| Some((vni, ip.parse().ok()?, mac))))
        .collect();
    let remote_macs: BTreeSet<(u32, MacAddr)> =
        macs.iter().filter_map(|m| Some((m.vni, m.mac.parse().ok()?))).collect();
    let (mut have, mut remote) = (Addresses::new(), BTreeSet::new());
    for n in neigh {
        let Some(vni) = vni_of(&n.dev, "pvsb").filter(|v| vnis.contains(v)) else { continue };
        if n.ext_learned {
            if remote_macs.contains(&(vni, n.mac)) {
                remote.insert(RemoteNeighbour { vni, ip: n.ip.to_string(), mac: n.mac.to_string() });
            }
        } else if n.is_static {
            have.insert((vni, n.ip, n.mac));
        }
    }
    (want, have, remote.into_iter().collect())
}

/// A state in one order: remotes by address (their VNIs sorted), MACs by (VNI, MAC, remote),
/// addresses by (VNI, address, MAC).
type Normal = (Vec<(Ipv4Addr, Vec<u32>)>, BTreeSet<(u32, String, String)>, BTreeSet<(u32, String, String)>);

/// A state sorted as pvswitchd reports it.
fn normalized(s: &VtepState) -> Normal {
    let mut r: Vec<(Ipv4Addr, Vec<u32>)> = s
        .remotes
        .iter()
        .filter_map(|r| {
            let mut v = r.vnis.clone();
            v.sort();
            Some((r.remote.parse().ok()?, v))
        })
        .collect();
    r.sort();
    let m = s.macs.iter().map(|m| (m.vni, m.mac.to_lowercase(), m.remote.clone())).collect();
    let n = s.neighbours.iter().map(|n| (n.vni, n.ip.clone(), n.mac.to_lowercase())).collect();
    (r, m, n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pvswitch::proto::{LocalMac, VniInfo};

    fn entry(dev: &str, mac: &str, dst: Option<&str>, ext: bool, own: bool, st: bool) -> FdbEntry {
        FdbEntry {
            dev: dev.into(),
            mac: mac.parse().unwrap(),
            dst: dst.map(|d| d.parse().unwrap()),
            ext_learned: ext,
            own,
            is_static: st,
        }
    }

    fn vtep(local: &[(u32, &str)]) -> VtepInfo {
        VtepInfo {
            name: "vt".into(),
            vnis: vec![VniInfo { vni: 100, vlan: 10 }, VniInfo { vni: 200, vlan: 20 }],
            local_macs: local
                .iter()
                .map(|(v, m)| LocalMac { vni: *v, mac: m.to_string(), configured: false, ips: vec![] })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn exports_what_is_local_and_withdraws_what_is_not() {
        let v = vtep(&[(100, "02:00:00:00:00:01"), (200, "02:00:00:00:00:02")]);
        let fdb = [
            entry("pvsl100", "02:00:00:00:00:01", None, false, false, true),
            entry("pvsl100", "02:00:00:00:00:09", None, false, false, true),
            entry("pvsl100", "aa:bb:cc:00:00:01", None, false, true, false), // the veth's own address
        ];
        let t = tick(&v, &fdb, &[], &BTreeSet::new());
        assert_eq!(t.export, vec![(200, "02:00:00:00:00:02".parse().unwrap())]);
        assert_eq!(t.withdraw, vec![(100, "02:00:00:00:00:09".parse().unwrap())]);
        assert_eq!(t.sync, None, "nothing remote, and pvswitchd knows nothing remote");
    }

    #[test]
    fn imports_flood_lists_and_remote_macs_and_syncs_only_on_change() {
        let v = vtep(&[(100, "02:00:00:00:00:01")]);
        let fdb = [
            entry("pvsx100", "00:00:00:00:00:00", Some("10.0.0.2"), false, true, false),
            entry("pvsx200", "00:00:00:00:00:00", Some("10.0.0.2"), false, true, false),
            entry("pvsx100", "02:00:00:00:00:07", Some("10.0.0.2"), true, true, false),
            // zebra's copy on the bridge, and a stale remote copy of a MAC now local: not imported.
            entry("pvsx100", "02:00:00:00:00:07", None, true, false, false),
            entry("pvsx100", "02:00:00:00:00:01", Some("10.0.0.3"), true, true, false),
            // a VNI this VTEP does not have
            entry("pvsx300", "00:00:00:00:00:00", Some("10.0.0.4"), false, true, false),
        ];
        let t = tick(&v, &fdb, &[], &BTreeSet::new());
        let s = t.sync.expect("pvswitchd knows none of it yet");
        assert_eq!(s.remotes, vec![RemoteVnis { remote: "10.0.0.2".into(), vnis: vec![100, 200] }]);
        assert_eq!(s.macs, vec![RemoteMac { vni: 100, mac: "02:00:00:00:00:07".into(), remote: "10.0.0.2".into() }]);
        let synced = VtepInfo { learned: s, ..v };
        let none = BTreeSet::new();
        assert_eq!(tick(&synced, &fdb, &[], &none).sync, None, "in step: nothing to send");
        assert_eq!(
            tick(&synced, &fdb[..1], &[], &none).sync.map(|s| s.macs.len()),
            Some(0),
            "a withdrawn MAC is synced away"
        );
    }

    /// MAC mobility with tunnels that learn nothing: a learned MAC we exported whose static
    /// entry zebra replaced with a remote one moved away (synced remote, not exported again);
    /// learned here again after that sync, it came back (exported); a configured one is ours.
    #[test]
    fn a_learned_mac_zebra_took_over_moved_and_comes_back_when_learned_again() {
        let m: MacAddr = "02:00:00:00:00:05".parse().unwrap();
        let v = vtep(&[(100, "02:00:00:00:00:05")]);
        let ours = [entry("pvsl100", "02:00:00:00:00:05", None, false, false, true)];
        let t = tick(&v, &ours, &[], &BTreeSet::new());
        assert!(t.export.is_empty() && t.withdraw.is_empty());
        assert!(t.exported.contains(&(100, m)));
        // Host 2 advertised it with a higher sequence number: zebra replaced our entry.
        let taken = [entry("pvsx100", "02:00:00:00:00:05", Some("10.0.0.2"), true, true, false)];
        let t = tick(&v, &taken, &[], &t.exported);
        assert!(t.export.is_empty(), "not exported again: it moved");
        let s = t.sync.expect("synced as remote");
        assert_eq!(s.macs, vec![RemoteMac { vni: 100, mac: m.to_string(), remote: "10.0.0.2".into() }]);
        // pvswitchd moved it behind the tunnel: no longer local, in step.
        let moved = VtepInfo { learned: s.clone(), ..vtep(&[]) };
        let t = tick(&moved, &taken, &[], &t.exported);
        assert_eq!((t.sync, t.export.len()), (None, 0));
        // The VM speaks here again: learned on its port although the last sync said remote.
        let back = VtepInfo { learned: s, ..v.clone() };
        let t = tick(&back, &taken, &[], &t.exported);
        assert_eq!(t.export, vec![(100, m)], "it came back: exported");
        // Never exported, never synced (a companion that just started): ours.
        assert_eq!(tick(&v, &taken, &[], &BTreeSet::new()).export, vec![(100, m)]);
        // A configured MAC is this host's whatever zebra says.
        let mut conf = v.clone();
        conf.local_macs[0].configured = true;
        let exported = BTreeSet::from([(100, m)]);
        assert_eq!(tick(&conf, &taken, &[], &exported).export, vec![(100, m)]);
    }

    fn neigh(dev: &str, ip: &str, mac: &str, ext: bool) -> NeighEntry {
        NeighEntry {
            dev: dev.into(),
            ip: ip.parse().unwrap(),
            mac: mac.parse().unwrap(),
            ext_learned: ext,
            is_static: true,
        }
    }

    /// A configured MAC's addresses (IPv4 and IPv6) are exported as static neighbours of its
    /// VNI's bridge (replaced when the MAC changes, withdrawn when gone); zebra's neighbours of
    /// remote MACs are synced, those of a MAC not remote are not.
    #[test]
    fn addresses_of_configured_macs_go_out_and_zebras_for_remote_macs_come_in() {
        let mut v = vtep(&[(100, "02:00:00:00:00:01")]);
        v.local_macs[0].configured = true;
        v.local_macs[0].ips = vec!["10.1.0.1".into(), "fd00::1".into()];
        let fdb = [
            entry("pvsl100", "02:00:00:00:00:01", None, false, false, true),
            entry("pvsx100", "02:00:00:00:00:07", Some("10.0.0.2"), true, true, false),
        ];
        let kernel = [
            neigh("pvsb100", "10.1.0.9", "02:00:00:00:00:01", false), // ours, no longer its
            neigh("pvsb100", "10.1.0.7", "02:00:00:00:00:07", true),  // zebra's, a remote MAC
            neigh("pvsb100", "fd00::7", "02:00:00:00:00:07", true),   // and its IPv6 address
            neigh("pvsb100", "10.1.0.8", "02:00:00:00:00:08", true),  // zebra's, MAC not remote
            neigh("pvsb300", "10.3.0.7", "02:00:00:00:00:07", true),  // a VNI not ours
            neigh("eth0", "192.168.0.1", "02:00:00:00:00:77", false), // the host's own
        ];
        let m1: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let t = tick(&v, &fdb, &kernel, &BTreeSet::new());
        let ip = |a: &str| a.parse::<IpAddr>().unwrap();
        assert_eq!(t.export_neigh, vec![(100, ip("10.1.0.1"), m1), (100, ip("fd00::1"), m1)]);
        assert_eq!(t.withdraw_neigh, vec![(100, ip("10.1.0.9"), m1)]);
        let s = t.sync.expect("the remote MAC and its address");
        let remote = |ip: &str| RemoteNeighbour { vni: 100, ip: ip.into(), mac: "02:00:00:00:00:07".into() };
        assert_eq!(s.neighbours, vec![remote("10.1.0.7"), remote("fd00::7")]);
        // In step: the address exported, pvswitchd told.
        let ours = [
            neigh("pvsb100", "10.1.0.1", "02:00:00:00:00:01", false),
            neigh("pvsb100", "fd00::1", "02:00:00:00:00:01", false),
            kernel[1].clone(),
            kernel[2].clone(),
        ];
        let synced = VtepInfo { learned: s, ..v.clone() };
        let t = tick(&synced, &fdb, &ours, &BTreeSet::new());
        assert_eq!((t.export_neigh.len(), t.withdraw_neigh.len(), t.sync), (0, 0, None));
        // The same address at another MAC (a port's MAC changed): replaced, not deleted.
        let old = [neigh("pvsb100", "10.1.0.1", "02:00:00:00:00:02", false), ours[1].clone()];
        let t = tick(&synced, &fdb, &old, &BTreeSet::new());
        assert_eq!((t.export_neigh.len(), t.withdraw_neigh.len()), (1, 0));
    }
}
