//! Ethernet II frames and 802.1Q / 802.1ad VLAN tags.
//!
//! [`EthernetFrame`] is a checked view over a frame's bytes (addresses, ethertype, payload);
//! [`EthernetRepr`] is the parsed, rewritable part of the header: both addresses and up to
//! [`MAX_TAGS`] VLAN tags, outer first. The data path never rewrites a frame in place: flow
//! actions change a copy of the `EthernetRepr`, and delivery writes it with [`EthernetRepr::emit`]
//! in front of the rest of the sender's frame.

use super::{Error, MacAddr, be16, set_be16};

/// Ethertypes pvswitch knows by name.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    /// Reverse ARP (RFC 903): what a hypervisor announces a migrated VM's MAC with.
    pub const RARP: u16 = 0x8035;
    /// 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service VLAN tag (QinQ outer).
    pub const QINQ: u16 = 0x88a8;
    pub const IPV6: u16 = 0x86dd;
    /// Values below this are 802.3 length fields, not ethertypes.
    pub const MIN: u16 = 0x0600;
}

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
}

/// Destination, source and ethertype.
pub const HEADER_LEN: usize = 14;
/// The highest VLAN id a frame may carry (4095 is reserved, 0 is a priority tag).
pub const MAX_VID: u16 = 4094;
/// Bytes of a VLAN tag (TPID and TCI).
pub const TAG_LEN: usize = 4;
/// The most VLAN tags an [`EthernetRepr`] holds.
pub const MAX_TAGS: usize = 2;
/// The longest header [`EthernetRepr::emit`] writes: addresses and two tags (no ethertype).
pub const MAX_EMIT_LEN: usize = 12 + MAX_TAGS * TAG_LEN;

/// A checked view of an Ethernet II frame.
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// A view without checks; accessors panic on a buffer shorter than [`HEADER_LEN`].
    pub const fn new_unchecked(buffer: T) -> EthernetFrame<T> {
        EthernetFrame { buffer }
    }

    /// A view of a buffer that holds at least the 14-byte header.
    pub fn new_checked(buffer: T) -> Result<EthernetFrame<T>, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(EthernetFrame { buffer })
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::DST])
    }

    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SRC])
    }

    /// The outer ethertype (a TPID if the frame is tagged).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ETHERTYPE).unwrap()
    }

    /// Everything after the 14-byte header (a tagged frame's payload starts with its TCI).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.0);
    }

    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.0);
    }

    pub fn set_ethertype(&mut self, t: u16) {
        set_be16(self.buffer.as_mut(), field::ETHERTYPE, t);
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// Whether `tpid` introduces a VLAN tag (802.1Q or 802.1ad).
#[inline]
pub const fn is_vlan_tpid(tpid: u16) -> bool {
    tpid == ethertype::VLAN || tpid == ethertype::QINQ
}

/// One VLAN tag: its TPID and its TCI as on the wire (PCP 3 bits, DEI 1, VID 12).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VlanTag {
    pub tpid: u16,
    pub tci: u16,
}

impl VlanTag {
    /// The VID bits of a TCI.
    pub const VID_MASK: u16 = 0x0fff;
    /// The PCP bits of a TCI.
    pub const PCP_MASK: u16 = 0xe000;
    pub const PCP_SHIFT: u32 = 13;
    /// The DEI (formerly CFI) bit, which OVS reuses as "tag present" in flow keys.
    pub const DEI: u16 = 0x1000;

    pub const fn new(tpid: u16, tci: u16) -> VlanTag {
        VlanTag { tpid, tci }
    }

    pub const fn vid(&self) -> u16 {
        self.tci & VlanTag::VID_MASK
    }

    pub const fn pcp(&self) -> u8 {
        (self.tci >> VlanTag::PCP_SHIFT) as u8
    }
}

/// The rewritable part of an Ethernet header: addresses and up to two VLAN tags, outer first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// Only `..ntags` are meaningful; `tags[0]` is the outer tag.
    pub tags: [VlanTag; MAX_TAGS],
    pub ntags: u8,
}

impl EthernetRepr {
    /// Parses the header of `frame`: both addresses and up to two tags with TPID 0x8100 or
    /// 0x88a8. Returns the header and the number of bytes of `frame` it covers
    /// (12 + 4 * ntags); the frame continues there with the innermost ethertype. A tag is only
    /// taken if the 2 bytes after it (the next ethertype) are present.
    pub fn parse(frame: &[u8]) -> Result<(EthernetRepr, usize), Error> {
        let f = EthernetFrame::new_checked(frame)?;
        let mut h = EthernetRepr { dst: f.dst_addr(), src: f.src_addr(), ..EthernetRepr::default() };
        let mut off = field::ETHERTYPE;
        while (h.ntags as usize) < MAX_TAGS && frame.len() >= off + TAG_LEN + 2 {
            let tpid = be16(frame, off).unwrap();
            if !is_vlan_tpid(tpid) {
                break;
            }
            h.tags[h.ntags as usize] = VlanTag::new(tpid, be16(frame, off + 2).unwrap());
            h.ntags += 1;
            off += TAG_LEN;
        }
        Ok((h, off))
    }

    /// Bytes [`EthernetRepr::emit`] writes: 12 + 4 * ntags.
    pub fn wire_len(&self) -> usize {
        12 + TAG_LEN * self.ntags as usize
    }

    /// Writes dst, src and the tags (not the ethertype) to `out`; returns the byte count.
    pub fn emit(&self, out: &mut [u8; MAX_EMIT_LEN]) -> usize {
        out[field::DST].copy_from_slice(&self.dst.0);
        out[field::SRC].copy_from_slice(&self.src.0);
        let mut off = field::ETHERTYPE;
        for t in &self.tags[..self.ntags as usize] {
            set_be16(out, off, t.tpid);
            set_be16(out, off + 2, t.tci);
            off += TAG_LEN;
        }
        off
    }

    /// The outer tag, if tagged.
    pub fn outer(&self) -> Option<VlanTag> {
        (self.ntags > 0).then_some(self.tags[0])
    }

    /// Pushes a new outer tag. Ignored (returns false) if there are already [`MAX_TAGS`].
    pub fn push_tag(&mut self, tag: VlanTag) -> bool {
        if self.ntags as usize >= MAX_TAGS {
            return false;
        }
        self.tags[1] = self.tags[0];
        self.tags[0] = tag;
        self.ntags += 1;
        true
    }

    /// Pops the outer tag (no-op if untagged).
    pub fn pop_tag(&mut self) {
        if self.ntags > 0 {
            self.tags[0] = self.tags[1];
            self.tags[1] = VlanTag::default();
            self.ntags -= 1;
        }
    }
}

/// Where a frame's network-layer header starts: the ethertype after at most one VLAN tag
/// (what flow keys look through) and its offset. None for a frame shorter than its header.
pub fn l3_start(frame: &[u8]) -> Option<(u16, usize, Option<VlanTag>)> {
    let f = EthernetFrame::new_checked(frame).ok()?;
    let ty = f.ethertype();
    if is_vlan_tpid(ty)
        && let (Some(tci), Some(inner)) = (be16(frame, HEADER_LEN), be16(frame, HEADER_LEN + 2))
    {
        return Some((inner, HEADER_LEN + TAG_LEN, Some(VlanTag::new(ty, tci))));
    }
    Some((ty, HEADER_LEN, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);

    fn frame(tags: &[(u16, u16)], ty: u16) -> Vec<u8> {
        let mut f = [A.0, B.0].concat();
        for &(p, t) in tags {
            f.extend(p.to_be_bytes());
            f.extend(t.to_be_bytes());
        }
        f.extend(ty.to_be_bytes());
        f.extend([0xaa; 30]);
        f
    }

    #[test]
    fn frame_view() {
        let mut f = frame(&[], ethertype::IPV4);
        assert!(EthernetFrame::new_checked(&f[..13]).is_err());
        let mut v = EthernetFrame::new_checked(&mut f[..]).unwrap();
        assert_eq!((v.dst_addr(), v.src_addr(), v.ethertype()), (A, B, ethertype::IPV4));
        v.set_dst_addr(B);
        v.set_ethertype(ethertype::ARP);
        assert_eq!((v.dst_addr(), v.ethertype(), v.payload().len()), (B, ethertype::ARP, 30));
        assert_eq!(&f[12..14], &[0x08, 0x06]);
    }

    #[test]
    fn repr_round_trip() {
        for tags in [&[][..], &[(0x8100, 0x2005)], &[(0x88a8, 7), (0x8100, 9)]] {
            let f = frame(tags, ethertype::IPV4);
            let (h, covered) = EthernetRepr::parse(&f).unwrap();
            assert_eq!((h.ntags as usize, covered, h.wire_len()), (tags.len(), 12 + 4 * tags.len(), covered));
            let mut out = [0u8; MAX_EMIT_LEN];
            assert_eq!(h.emit(&mut out), covered);
            assert_eq!(&out[..covered], &f[..covered]);
        }
        // Only two tags are taken; the third stays in the frame.
        let f = frame(&[(0x8100, 1), (0x8100, 2), (0x8100, 3)], ethertype::IPV4);
        assert_eq!(EthernetRepr::parse(&f).unwrap().1, 20);
        assert!(EthernetRepr::parse(&f[..13]).is_err());
        // A tag whose inner ethertype is cut off is not taken.
        let f = frame(&[(0x8100, 5)], ethertype::IPV4);
        assert_eq!(EthernetRepr::parse(&f[..17]).unwrap().0.ntags, 0);
        assert_eq!(EthernetRepr::parse(&f[..18]).unwrap().0.ntags, 1);
    }

    #[test]
    fn l3_offsets() {
        assert_eq!(l3_start(&frame(&[], ethertype::IPV6)), Some((ethertype::IPV6, 14, None)));
        let (ty, off, tag) = l3_start(&frame(&[(0x8100, 0x2005)], ethertype::IPV4)).unwrap();
        assert_eq!((ty, off, tag.unwrap().vid(), tag.unwrap().pcp()), (ethertype::IPV4, 18, 5, 1));
        assert_eq!(l3_start(&[0; 10]), None);
    }
}
