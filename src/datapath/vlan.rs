//! VLANs in the data path, on a switch where some port has a VLAN config: a frame's VLAN as it
//! enters (classify, for NORMAL) and how it leaves each port (delivery): tagged or not, by the
//! port's mode. Both read the switch's copy of the frame's front, never the sender's buffer.
#![forbid(unsafe_code)]

use super::counters::DropReason;
use super::frame::{AS_IS, Frame, Shape};
use crate::wire::vlan::{PortVlan, VlanRefusal};
use crate::wire::{EthernetRepr, VlanTag, ethertype};

/// An ethertype that is a VLAN tag's TPID: 802.1Q, 802.1ad, and the older 0x9100 QinQ.
#[inline]
fn is_tag(ty: u16) -> bool {
    ty == ethertype::VLAN || ty == ethertype::QINQ || ty == 0x9100
}

/// The outer 802.1Q tag's TCI of a header's bytes (`head`, from its addresses on), None if
/// untagged. An 802.1ad outer tag, or a second tag, is refused: a frame that could hop VLANs
/// where its outer tag is stripped.
#[inline]
fn outer_tci(head: &[u8]) -> Result<Option<u16>, DropReason> {
    let Some(t) = head.get(12..16) else { return Err(DropReason::Runt) };
    match u16::from_be_bytes([t[0], t[1]]) {
        ethertype::VLAN => {
            let Some(inner) = head.get(16..18) else { return Err(DropReason::Runt) };
            if is_tag(u16::from_be_bytes([inner[0], inner[1]])) {
                return Err(DropReason::VlanStacked);
            }
            Ok(Some(u16::from_be_bytes([t[2], t[3]])))
        }
        ty if is_tag(ty) => Err(DropReason::VlanStacked),
        _ => Ok(None),
    }
}

/// The VLAN of a frame arriving at a port with VLAN config `port`: its outer tag's, or the
/// port's for an untagged frame; dropped (with its reason) if the port may not use it.
#[inline]
pub(super) fn ingress_vlan(port: &PortVlan, f: &Frame) -> Result<u16, DropReason> {
    let tag = outer_tci(f.front())?.map(|tci| tci & VlanTag::VID_MASK);
    port.ingress(tag).map_err(refused)
}

fn refused(r: VlanRefusal) -> DropReason {
    match r {
        VlanRefusal::TaggedOnAccess => DropReason::VlanTagged,
        VlanRefusal::NotAllowed => DropReason::VlanNotAllowed,
        VlanRefusal::Stacked => DropReason::VlanStacked,
    }
}

/// How frame `f`, switched in VLAN `f.vlan`, leaves a port with VLAN config `port`: as it
/// came, or with its tag pushed, rewritten or popped (`buf` holds the new addresses and tag,
/// the shape's prefix). None if the port does not carry the VLAN.
#[inline]
pub(super) fn egress_shape<'b>(f: &Frame, port: &PortVlan, buf: &'b mut [u8; 16]) -> Option<Shape<'b>> {
    let vid = f.vlan;
    let tagged = port.egress(vid)?;
    let front = f.front();
    // Checked at ingress: the front holds the addresses, and the tag if there is one.
    let tci = outer_tci(front).ok()?;
    let (skip, keep_pcp) = match (tci, tagged) {
        (None, false) => return Some(AS_IS),
        (Some(t), true) if t & VlanTag::VID_MASK == vid => return Some(AS_IS),
        (None, true) => (12, 0),
        (Some(t), true) => (16, t & VlanTag::PCP_MASK),
        (Some(_), false) => (16, 0),
    };
    buf[..12].copy_from_slice(&front[..12]);
    let len = if tagged {
        buf[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        buf[14..16].copy_from_slice(&(keep_pcp | vid).to_be_bytes());
        16
    } else {
        12
    };
    Some(Shape { prefix: &buf[..len], skip, take: u32::MAX, patch: None })
}

/// A header rewritten by a flow's actions (`h`), for its NORMAL action: its VLAN at `port`.
pub fn header_vlan(port: &PortVlan, h: &EthernetRepr) -> Result<u16, DropReason> {
    let tag = match h.tags[..h.ntags as usize] {
        [] => None,
        [t] if t.tpid == ethertype::VLAN => Some(t.vid()),
        _ => return Err(DropReason::VlanStacked),
    };
    port.ingress(tag).map_err(refused)
}

/// `h` as a port with VLAN config `port` sends VLAN `vid`: its tag set or removed. None if
/// the port does not carry it.
pub fn header_for(port: &PortVlan, vid: u16, h: &EthernetRepr) -> Option<EthernetRepr> {
    let tagged = port.egress(vid)?;
    let mut out = *h;
    match (out.ntags, tagged) {
        (0, false) => {}
        (0, true) => {
            out.push_tag(VlanTag::new(ethertype::VLAN, vid));
        }
        (_, true) => out.tags[0].tci = (out.tags[0].tci & VlanTag::PCP_MASK) | vid,
        (_, false) => out.pop_tag(),
    }
    Some(out)
}
