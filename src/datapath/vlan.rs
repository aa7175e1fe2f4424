//! VLANs in the data path, on a switch where some port has a VLAN config: a frame's VLAN as it
//! enters (classify, for NORMAL) and how it leaves each port (delivery): tagged or not, by the
//! port's mode. Both read the switch's copy of the frame's front, never the sender's buffer.
#![forbid(unsafe_code)]

use super::counters::DropReason;
use super::frame::{Frame, Shape};
use crate::config::vlan::{PortVlan, VlanRefusal};
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

/// The VLAN of a frame arriving at a port with VLAN config `port` (its outer tag's, or the
/// port's for an untagged frame), and the outer tag's TCI as it came (None: untagged), which
/// [`egress_tagging`] compares against each destination's; dropped (with its reason) if the
/// port may not use it. An untagged frame, the usual case, reads one ethertype.
#[inline(always)]
pub(super) fn ingress_vlan(port: &PortVlan, f: &Frame) -> Result<(u16, Option<u16>), DropReason> {
    // The front holds at least the 14-byte header: shorter frames were dropped as runts.
    let Some(ty) = f.front_at::<2>(12) else { return Err(DropReason::Runt) };
    let tci = if is_tag(u16::from_be_bytes(ty)) { outer_tci(f.front())? } else { None };
    match port.ingress(tci.map(|t| t & VlanTag::VID_MASK)) {
        Ok(vid) => Ok((vid, tci)),
        Err(r) => Err(refused(r)),
    }
}

fn refused(r: VlanRefusal) -> DropReason {
    match r {
        VlanRefusal::TaggedOnAccess => DropReason::VlanTagged,
        VlanRefusal::NotAllowed => DropReason::VlanNotAllowed,
        VlanRefusal::Stacked => DropReason::VlanStacked,
    }
}

/// How frame `f`, switched in VLAN `f.vlan`, leaves a port that sends that VLAN `tagged` (or
/// not): None if as it came (the usual case, decided on the tag classify recorded, without
/// reading the frame again), else with its tag pushed, rewritten or popped, the shape's
/// prefix (the addresses and the new tag) written into `buf` by [`retag`].
#[inline(always)]
pub(super) fn egress_tagging(f: &Frame, tagged: bool) -> Option<Retag> {
    let vid = f.vlan;
    match (f.tag, tagged) {
        (None, false) => None,
        (Some(t), true) if t & VlanTag::VID_MASK == vid => None,
        (None, true) => Some(Retag { skip: 12, tci: Some(vid) }),
        (Some(t), true) => Some(Retag { skip: 16, tci: Some((t & VlanTag::PCP_MASK) | vid) }),
        (Some(_), false) => Some(Retag { skip: 16, tci: None }),
    }
}

/// A frame's tag pushed, rewritten or popped as it leaves a port: the bytes of the frame the
/// new header replaces (its addresses, and its tag if it had one), and the new tag's TCI.
#[derive(Clone, Copy)]
pub(super) struct Retag {
    skip: u32,
    tci: Option<u16>,
}

/// The shape of frame `f` under `r`: the new addresses and tag in `buf`, then the frame after
/// what they replace.
#[inline]
pub(super) fn retag<'b>(f: &Frame, r: Retag, buf: &'b mut [u8; 16]) -> Shape<'b> {
    // Checked at ingress: the front holds the addresses, and the tag if there is one.
    buf[..12].copy_from_slice(&f.front()[..12]);
    let len = match r.tci {
        Some(tci) => {
            buf[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
            buf[14..16].copy_from_slice(&tci.to_be_bytes());
            16
        }
        None => 12,
    };
    Shape { prefix: &buf[..len], skip: r.skip, take: u32::MAX, patch: None }
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
