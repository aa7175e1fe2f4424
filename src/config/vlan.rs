//! 802.1Q port membership, a port's policy: which VLANs a port carries, and whether each
//! leaves it tagged, in Open vSwitch's four `vlan_mode`s. Configured here (`[[port]]`'s
//! `vlan_mode`, `tag`, `trunks`; a tunnel's VNIs); the data path decides with it
//! ([`PortVlan::ingress`], [`PortVlan::egress`]) and writes the tags itself
//! (`datapath::vlan`, over `wire::ethernet`'s tag format).
//!
//! VLAN 0 stands for "untagged": the one bridge domain of a switch with no VLAN config, and
//! what a trunk's untagged frames belong to (as in OVS). A frame with a priority tag (VID 0)
//! counts as untagged.

use std::fmt;

pub use crate::wire::ethernet::MAX_VID;

/// How a port takes and sends VLANs (OVS's `vlan_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VlanMode {
    /// Tagged frames of its `trunks` (all VLANs if none are listed; untagged frames are VLAN 0).
    #[default]
    Trunk,
    /// One VLAN (`tag`): untagged frames join it, leave untagged; tagged frames are dropped.
    Access,
    /// A trunk whose untagged frames are VLAN `tag`, which leaves untagged.
    NativeUntagged,
    /// A trunk whose untagged frames are VLAN `tag`, which leaves tagged.
    NativeTagged,
    /// A VXLAN tunnel's port (never configured by name): frames arrive tagged with the VLAN
    /// their VNI maps to (decapsulation writes the tag) and leave untagged (the VNI says
    /// their VLAN), for the VLANs of its `trunks`.
    Tunnel,
}

impl VlanMode {
    /// The name the configuration file uses.
    pub fn name(&self) -> &'static str {
        match self {
            VlanMode::Trunk => "trunk",
            VlanMode::Access => "access",
            VlanMode::NativeUntagged => "native-untagged",
            VlanMode::NativeTagged => "native-tagged",
            VlanMode::Tunnel => "tunnel",
        }
    }

    pub fn from_name(s: &str) -> Option<VlanMode> {
        [VlanMode::Trunk, VlanMode::Access, VlanMode::NativeUntagged, VlanMode::NativeTagged]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// A set of VLAN ids, 0..=4095, as a bitmap.
#[derive(Clone, PartialEq, Eq)]
pub struct VlanSet([u64; 64]);

impl VlanSet {
    pub const fn empty() -> VlanSet {
        VlanSet([0; 64])
    }

    /// Every VLAN a port may use, and untagged (0).
    pub fn all() -> VlanSet {
        let mut s = VlanSet([u64::MAX; 64]);
        s.0[63] &= !(1 << 63); // 4095
        s
    }

    pub fn insert(&mut self, vid: u16) {
        self.0[(vid as usize >> 6) & 63] |= 1 << (vid & 63);
    }

    #[inline]
    pub fn contains(&self, vid: u16) -> bool {
        self.0[(vid as usize >> 6) & 63] & (1 << (vid & 63)) != 0
    }

    pub fn is_all(&self) -> bool {
        *self == VlanSet::all()
    }

    /// The set as inclusive ranges, ascending. A word of 64 VLANs all in or all out is taken
    /// whole (`ports` shows every port's set: a trunk of all VLANs is one range, not 4,095
    /// bits looked at).
    pub fn ranges(&self) -> Vec<(u16, u16)> {
        let mut out: Vec<(u16, u16)> = Vec::new();
        let mut add = |lo: u16, hi: u16| match out.last_mut() {
            Some((_, h)) if *h + 1 == lo => *h = hi,
            _ => out.push((lo, hi)),
        };
        for (w, &bits) in self.0.iter().enumerate() {
            let base = (w * 64) as u16;
            match bits {
                0 => {}
                u64::MAX => add(base, base + 63),
                _ => (0..64u16).filter(|b| bits & (1 << b) != 0).for_each(|b| add(base + b, base + b)),
            }
        }
        out
    }
}

impl fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// `10,20-29` (or `all`).
impl fmt::Display for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_all() {
            return f.write_str("all");
        }
        let parts: Vec<String> =
            self.ranges().iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
        f.write_str(&parts.join(","))
    }
}

/// Why a frame may not enter a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VlanRefusal {
    /// A tagged frame on an access port.
    TaggedOnAccess,
    /// A VLAN (or untagged frames) the port does not carry.
    NotAllowed,
    /// An 802.1ad (QinQ) outer tag, or a second tag.
    Stacked,
}

/// A port's VLAN config. The default (a trunk of every VLAN, untagged frames in VLAN 0) is a
/// port without one: on a switch where no port has one, the data path does no VLAN work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortVlan {
    pub mode: VlanMode,
    /// The access or native VLAN (0 for a trunk).
    pub tag: u16,
    /// The tagged VLANs a trunk or native port carries (for a trunk, 0 stands for untagged).
    pub trunks: VlanSet,
}

impl Default for PortVlan {
    fn default() -> PortVlan {
        PortVlan { mode: VlanMode::Trunk, tag: 0, trunks: VlanSet::all() }
    }
}

impl PortVlan {
    pub fn access(tag: u16) -> PortVlan {
        PortVlan { mode: VlanMode::Access, tag, trunks: VlanSet::empty() }
    }

    pub fn trunk(vids: &[u16]) -> PortVlan {
        let mut trunks = VlanSet::empty();
        vids.iter().for_each(|&v| trunks.insert(v));
        PortVlan { mode: VlanMode::Trunk, tag: 0, trunks }
    }

    /// A VXLAN tunnel's port, carrying `vids` (the VLANs of the VNIs it is in).
    pub fn tunnel(vids: &[u16]) -> PortVlan {
        PortVlan { mode: VlanMode::Tunnel, ..PortVlan::trunk(vids) }
    }

    /// Whether this is a port without VLAN config.
    pub fn is_default(&self) -> bool {
        *self == PortVlan::default()
    }

    /// The VLAN of a frame arriving with outer 802.1Q tag VID `tag` (None: untagged).
    #[inline]
    pub fn ingress(&self, tag: Option<u16>) -> Result<u16, VlanRefusal> {
        let tag = tag.filter(|&v| v != 0);
        match (self.mode, tag) {
            (VlanMode::Access, Some(_)) => Err(VlanRefusal::TaggedOnAccess),
            (VlanMode::Access, None) => Ok(self.tag),
            (VlanMode::Trunk | VlanMode::Tunnel, t) => {
                let v = t.unwrap_or(0);
                if self.trunks.contains(v) { Ok(v) } else { Err(VlanRefusal::NotAllowed) }
            }
            (VlanMode::NativeUntagged | VlanMode::NativeTagged, None) => Ok(self.tag),
            (VlanMode::NativeUntagged | VlanMode::NativeTagged, Some(v)) => {
                if v == self.tag || self.trunks.contains(v) { Ok(v) } else { Err(VlanRefusal::NotAllowed) }
            }
        }
    }

    /// How a frame of VLAN `vid` leaves this port: None if the port does not carry it, else
    /// whether it is tagged.
    #[inline]
    pub fn egress(&self, vid: u16) -> Option<bool> {
        match self.mode {
            VlanMode::Access => (vid == self.tag).then_some(false),
            VlanMode::Trunk => self.trunks.contains(vid).then_some(vid != 0),
            VlanMode::Tunnel => self.trunks.contains(vid).then_some(false),
            VlanMode::NativeUntagged if vid == self.tag => Some(false),
            VlanMode::NativeTagged if vid == self.tag => Some(true),
            VlanMode::NativeUntagged | VlanMode::NativeTagged => {
                (vid != 0 && self.trunks.contains(vid)).then_some(true)
            }
        }
    }

    /// Whether frames of VLAN `vid` may leave this port.
    #[inline]
    pub fn carries(&self, vid: u16) -> bool {
        self.egress(vid).is_some()
    }
}

/// `access 10`, `trunk 10,20-29`, `native-untagged 10 trunks 20`.
impl fmt::Display for PortVlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            VlanMode::Access => write!(f, "access {}", self.tag),
            VlanMode::Trunk => write!(f, "trunk {}", self.trunks),
            VlanMode::Tunnel => write!(f, "tunnel {}", self.trunks),
            m => write!(f, "{} {} trunks {}", m.name(), self.tag, self.trunks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_modes_take_and_send_as_ovs_does() {
        let access = PortVlan::access(10);
        assert_eq!(access.ingress(None), Ok(10));
        assert_eq!(access.ingress(Some(0)), Ok(10), "a priority tag is no tag");
        assert_eq!(access.ingress(Some(10)), Err(VlanRefusal::TaggedOnAccess));
        assert_eq!((access.egress(10), access.egress(20), access.egress(0)), (Some(false), None, None));

        let trunk = PortVlan::trunk(&[10, 20]);
        assert_eq!((trunk.ingress(Some(10)), trunk.ingress(Some(30))), (Ok(10), Err(VlanRefusal::NotAllowed)));
        assert_eq!(trunk.ingress(None), Err(VlanRefusal::NotAllowed), "untagged is VLAN 0, not listed");
        assert_eq!((trunk.egress(20), trunk.egress(30)), (Some(true), None));

        let any = PortVlan::default();
        assert_eq!(
            (any.ingress(None), any.ingress(Some(7)), any.ingress(Some(4095))),
            (Ok(0), Ok(7), Err(VlanRefusal::NotAllowed))
        );
        assert_eq!((any.egress(0), any.egress(7)), (Some(false), Some(true)));

        let mut nu = PortVlan::trunk(&[20]);
        (nu.mode, nu.tag) = (VlanMode::NativeUntagged, 10);
        assert_eq!((nu.ingress(None), nu.ingress(Some(10)), nu.ingress(Some(20))), (Ok(10), Ok(10), Ok(20)));
        assert_eq!(nu.ingress(Some(30)), Err(VlanRefusal::NotAllowed));
        assert_eq!((nu.egress(10), nu.egress(20), nu.egress(0), nu.egress(30)), (Some(false), Some(true), None, None));
        let nt = PortVlan { mode: VlanMode::NativeTagged, ..nu };
        assert_eq!((nt.egress(10), nt.egress(20)), (Some(true), Some(true)));
    }

    #[test]
    fn ranges_agree_with_membership() {
        let mut s = VlanSet::empty();
        for v in [0, 1, 2, 63, 64, 65, 127, 128, 200, 4094] {
            s.insert(v);
        }
        (300..=1000).for_each(|v| s.insert(v));
        let from_ranges: Vec<u16> = s.ranges().iter().flat_map(|&(a, b)| a..=b).collect();
        let members: Vec<u16> = (0..=4095).filter(|&v| s.contains(v)).collect();
        assert_eq!(from_ranges, members);
        assert_eq!(s.ranges()[..3], [(0, 2), (63, 65), (127, 128)]);
        assert_eq!(VlanSet::all().ranges(), vec![(0, 4094)]);
    }

    #[test]
    fn sets_print_as_ranges() {
        let p = PortVlan::trunk(&[10, 20, 21, 22, 4094]);
        assert_eq!(p.to_string(), "trunk 10,20-22,4094");
        assert_eq!(PortVlan::default().to_string(), "trunk all");
        assert!(!VlanSet::all().contains(4095));
        assert_eq!(VlanMode::from_name("native-tagged"), Some(VlanMode::NativeTagged));
    }
}
