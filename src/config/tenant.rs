//! A port's tenant settings: its VLANs (`vlan_mode`, `tag`, `trunks`, with OVS's meanings) and
//! its rate caps (`ingress_pps`, `ingress_bps`, `egress_pps`, `egress_bps`, `rate_burst_ms`).

use toml::Spanned;

use super::error::{ConfigError, Ctx};
use super::raw::{RawPort, RawVid};
use crate::config::vlan::{MAX_VID, PortVlan, VlanMode, VlanSet};

/// A port's rate caps, per direction, in packets and bits a second (0: no cap). Ingress is
/// what the port sends into the switch, egress what the switch sends to it. Each bucket holds
/// `burst_ms` of its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateCaps {
    pub ingress_pps: u64,
    pub ingress_bps: u64,
    pub egress_pps: u64,
    pub egress_bps: u64,
    pub burst_ms: u32,
}

pub const DEFAULT_RATE_BURST_MS: u32 = 10;

impl Default for RateCaps {
    fn default() -> RateCaps {
        RateCaps { ingress_pps: 0, ingress_bps: 0, egress_pps: 0, egress_bps: 0, burst_ms: DEFAULT_RATE_BURST_MS }
    }
}

/// The port's VLAN config. Without `vlan_mode`: access if `tag` is given, a trunk otherwise.
pub(super) fn vlan(p: &RawPort, cx: &Ctx) -> Result<PortVlan, ConfigError> {
    let mode = match &p.vlan_mode {
        Some(m) => VlanMode::from_name(m.get_ref()).ok_or_else(|| {
            cx.err(
                Some(m.span()),
                format!(
                    "vlan_mode: expected \"access\", \"trunk\", \"native-untagged\" or \"native-tagged\", found \"{}\"",
                    m.get_ref()
                ),
            )
        })?,
        None if p.tag.is_some() && p.trunks.is_some() => {
            let t = p.trunks.as_ref().unwrap();
            return Err(cx.err(
                Some(t.span()),
                "trunks: a port with a tag is an access port unless vlan_mode says \"native-untagged\" or \"native-tagged\"",
            ));
        }
        None if p.tag.is_some() => VlanMode::Access,
        None => VlanMode::Trunk,
    };
    let tag = match (&p.tag, mode) {
        (Some(t), VlanMode::Trunk) => {
            return Err(cx.err(
                Some(t.span()),
                "tag: a trunk port has no tag (its untagged frames are VLAN 0); a native-untagged or native-tagged port has one",
            ));
        }
        (Some(t), _) if (1..=MAX_VID as i64).contains(t.get_ref()) => *t.get_ref() as u16,
        (Some(t), _) => return Err(cx.err(Some(t.span()), format!("tag: expected a VLAN id from 1 to {MAX_VID}"))),
        (None, VlanMode::Trunk) => 0,
        (None, m) => {
            let at = p.vlan_mode.as_ref().map(|m| m.span());
            return Err(cx.err(at, format!("vlan_mode = \"{}\" needs a tag (the port's VLAN)", m.name())));
        }
    };
    let trunks = match (&p.trunks, mode) {
        (Some(t), VlanMode::Access) => {
            return Err(cx.err(Some(t.span()), "trunks: an access port carries only its tag's VLAN"));
        }
        (Some(t), m) => trunk_set(t, m == VlanMode::Trunk, cx)?,
        (None, VlanMode::Access) => VlanSet::empty(),
        (None, _) => VlanSet::all(),
    };
    Ok(PortVlan { mode, tag, trunks })
}

/// `trunks = [10, "20-29"]`: VLAN ids and ranges, none listed twice. 0 (untagged frames) only
/// on a trunk.
fn trunk_set(list: &Spanned<Vec<Spanned<RawVid>>>, trunk: bool, cx: &Ctx) -> Result<VlanSet, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(cx.err(Some(list.span()), "trunks: an empty list carries no VLAN (leave it out to carry all)"));
    }
    let lo = if trunk { 0 } else { 1 };
    let expected = || format!("trunks: expected VLAN ids from {lo} to {MAX_VID}, or ranges such as \"100-199\"");
    let mut set = VlanSet::empty();
    for e in list.get_ref() {
        let bad = || cx.err(Some(e.span()), expected());
        let id = |v: i64| if (lo as i64..=MAX_VID as i64).contains(&v) { Ok(v as u16) } else { Err(bad()) };
        let (a, b) = match e.get_ref() {
            RawVid::One(v) => (id(*v)?, id(*v)?),
            RawVid::Range(s) => {
                let (a, b) = s.split_once('-').ok_or_else(bad)?;
                let num = |x: &str| x.trim().parse::<i64>().map_err(|_| bad()).and_then(id);
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(cx.err(Some(e.span()), format!("trunks: the range \"{s}\" runs backwards")));
                }
                (a, b)
            }
        };
        for v in a..=b {
            if set.contains(v) {
                return Err(cx.err(Some(e.span()), format!("trunks: VLAN {v} is listed twice (ranges overlap)")));
            }
            set.insert(v);
        }
    }
    Ok(set)
}

/// The port's rate caps.
pub(super) fn rates(p: &RawPort, cx: &Ctx) -> Result<RateCaps, ConfigError> {
    const MAX_PPS: i64 = 1_000_000_000;
    const MAX_BPS: i64 = 1_000_000_000_000;
    let num = |v: &Option<Spanned<i64>>, name: &str, max: i64| -> Result<u64, ConfigError> {
        match v {
            None => Ok(0),
            Some(s) if (0..=max).contains(s.get_ref()) => Ok(*s.get_ref() as u64),
            Some(s) => Err(cx.err(Some(s.span()), format!("{name}: expected a rate from 0 (no cap) to {max}"))),
        }
    };
    let burst = match &p.rate_burst_ms {
        None => DEFAULT_RATE_BURST_MS,
        Some(s) if (1..=1000).contains(s.get_ref()) => *s.get_ref() as u32,
        Some(s) => return Err(cx.err(Some(s.span()), "rate_burst_ms: expected a value from 1 to 1000")),
    };
    Ok(RateCaps {
        ingress_pps: num(&p.ingress_pps, "ingress_pps", MAX_PPS)?,
        ingress_bps: num(&p.ingress_bps, "ingress_bps", MAX_BPS)?,
        egress_pps: num(&p.egress_pps, "egress_pps", MAX_PPS)?,
        egress_bps: num(&p.egress_bps, "egress_bps", MAX_BPS)?,
        burst_ms: burst,
    })
}
