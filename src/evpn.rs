//! EVPN for pvswitch's VTEPs through an unmodified FRR: the decisions of `pvs-evpn`, the
//! companion that mirrors a VTEP into the kernel of FRR's network namespace and back (its I/O,
//! netlink and the control socket, is in `src/bin/pvs-evpn.rs`).
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

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use crate::switch::vtep::{RemoteMac, RemoteVnis, VtepInfo, VtepState};
use crate::wire::MacAddr;

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

/// What one tick does: MACs to export (VNI, MAC) and to withdraw, and the sync to send.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tick {
    pub export: Vec<(u32, MacAddr)>,
    pub withdraw: Vec<(u32, MacAddr)>,
    pub sync: Option<VtepState>,
}

/// Decides a tick for VTEP `v` from the kernel's FDB (`fdb`, every bridge entry of the
/// namespace).
pub fn tick(v: &VtepInfo, fdb: &[FdbEntry]) -> Tick {
    let vnis: BTreeSet<u32> = v.vnis.iter().map(|n| n.vni).collect();
    let want: BTreeSet<(u32, MacAddr)> = v
        .local_macs
        .iter()
        .filter_map(|m| Some((m.vni, m.mac.parse().ok()?)))
        .filter(|(vni, _)| vnis.contains(vni))
        .collect();
    let mut have = BTreeSet::new();
    let mut remotes: BTreeMap<Ipv4Addr, BTreeSet<u32>> = BTreeMap::new();
    let mut macs = BTreeSet::new();
    for e in fdb {
        if let Some(vni) = vni_of(&e.dev, "pvsl").filter(|v| vnis.contains(v)) {
            if e.is_static && !e.own {
                have.insert((vni, e.mac));
            }
        } else if let (Some(vni), Some(dst), true) = (vni_of(&e.dev, "pvsx").filter(|v| vnis.contains(v)), e.dst, e.own)
        {
            if e.mac == MacAddr::ZERO {
                remotes.entry(dst).or_default().insert(vni);
            } else if e.ext_learned && !want.contains(&(vni, e.mac)) {
                macs.insert(RemoteMac { vni, mac: e.mac.to_string(), remote: dst.to_string() });
            }
        }
    }
    let state = VtepState {
        remotes: remotes
            .into_iter()
            .map(|(r, vnis)| RemoteVnis { remote: r.to_string(), vnis: vnis.into_iter().collect() })
            .collect(),
        macs: macs.into_iter().collect(),
    };
    Tick {
        export: want.difference(&have).copied().collect(),
        withdraw: have.difference(&want).copied().collect(),
        sync: (normalized(&state) != normalized(&v.learned)).then_some(state),
    }
}

/// A state in one order: remotes by address (their VNIs sorted), MACs by (VNI, MAC, remote).
type Normal = (Vec<(Ipv4Addr, Vec<u32>)>, BTreeSet<(u32, String, String)>);

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
    (r, m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::vtep::{LocalMac, VniInfo};

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
            local_macs: local.iter().map(|(v, m)| LocalMac { vni: *v, mac: m.to_string() }).collect(),
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
        let t = tick(&v, &fdb);
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
        let t = tick(&v, &fdb);
        let s = t.sync.expect("pvswitchd knows none of it yet");
        assert_eq!(s.remotes, vec![RemoteVnis { remote: "10.0.0.2".into(), vnis: vec![100, 200] }]);
        assert_eq!(s.macs, vec![RemoteMac { vni: 100, mac: "02:00:00:00:00:07".into(), remote: "10.0.0.2".into() }]);
        let synced = VtepInfo { learned: s, ..v };
        assert_eq!(tick(&synced, &fdb).sync, None, "in step: nothing to send");
        assert_eq!(tick(&synced, &fdb[..1]).sync.map(|s| s.macs.len()), Some(0), "a withdrawn MAC is synced away");
    }
}
