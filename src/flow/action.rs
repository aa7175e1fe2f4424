//! Flow actions and their execution on an Ethernet header.
//!
//! The data path does not rewrite frames in place. It parses the Ethernet header (addresses and
//! up to two VLAN tags) into an [`EthHeader`], [`execute`] runs the action list on a copy of it
//! and hands every output, together with the header as it is at that point, to a callback. The
//! callback writes the header with [`EthHeader::write`] and appends the original frame from the
//! offset [`EthHeader::parse`] returned (which starts with the innermost ethertype).

use super::key::{ETH_TYPE_VLAN, ETH_TYPE_VLAN_8021AD, VLAN_PCP_MASK, VLAN_VID_MASK};

/// One action of a flow, in ovs-ofctl terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `output:PORT`.
    Output(u16),
    /// `in_port`: send back out of the port the frame came from.
    InPort,
    /// `flood`: all ports except the input port (and, in OVS, ports with flooding disabled).
    Flood,
    /// `all`: all ports except the input port.
    All,
    /// `normal`: the switch's MAC-learning forwarding.
    Normal,
    /// `drop`. The parser never produces it (a dropping flow has an empty action list); if it
    /// appears, execution stops there.
    Drop,
    /// `mod_vlan_vid:VID`: rewrite the outer VID, or push a 0x8100 tag (PCP 0) if untagged.
    SetVlanVid(u16),
    /// `mod_vlan_pcp:PCP`: rewrite the outer PCP, or push a 0x8100 tag (VID 0) if untagged.
    SetVlanPcp(u8),
    /// `strip_vlan`: pop the outer tag (no-op if untagged).
    StripVlan,
    /// `push_vlan:TPID`: push a new outer tag with this TPID, copying the current outer TCI
    /// (0 if untagged).
    PushVlan(u16),
    /// `mod_dl_src:MAC`.
    SetDlSrc([u8; 6]),
    /// `mod_dl_dst:MAC`.
    SetDlDst([u8; 6]),
}

/// Where [`execute`] sends a copy of the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Emit {
    Port(u16),
    InPort,
    Flood,
    All,
    Normal,
}

/// Maximum number of VLAN tags an [`EthHeader`] holds.
pub const MAX_TAGS: usize = 2;

/// The rewritable part of an Ethernet header: addresses and up to two VLAN tags, outer first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EthHeader {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    /// (TPID, TCI as on the wire), `tags[0]` is the outer tag. Only `..ntags` are meaningful.
    pub tags: [(u16, u16); MAX_TAGS],
    pub ntags: u8,
}

impl EthHeader {
    /// Parses the header of `frame`: both addresses and up to two tags with TPID 0x8100 or
    /// 0x88a8. Returns the header and the number of bytes of `frame` it covers
    /// (12 + 4 * ntags); the frame continues there with the innermost ethertype. A tag is only
    /// taken if the 2 bytes after it (the next ethertype) are present. `None` if the frame is
    /// shorter than 14 bytes.
    pub fn parse(frame: &[u8]) -> Option<(EthHeader, usize)> {
        if frame.len() < 14 {
            return None;
        }
        let mut h = EthHeader {
            dst: frame[0..6].try_into().unwrap(),
            src: frame[6..12].try_into().unwrap(),
            ..EthHeader::default()
        };
        let mut off = 12;
        while (h.ntags as usize) < MAX_TAGS && frame.len() >= off + 6 {
            let tpid = u16::from_be_bytes([frame[off], frame[off + 1]]);
            if tpid != ETH_TYPE_VLAN && tpid != ETH_TYPE_VLAN_8021AD {
                break;
            }
            h.tags[h.ntags as usize] = (tpid, u16::from_be_bytes([frame[off + 2], frame[off + 3]]));
            h.ntags += 1;
            off += 4;
        }
        Some((h, off))
    }

    /// Bytes [`EthHeader::write`] produces: 12 + 4 * ntags.
    pub fn wire_len(&self) -> usize {
        12 + 4 * self.ntags as usize
    }

    /// Writes dst, src and the tags (not the ethertype) to `out`; returns the byte count.
    pub fn write(&self, out: &mut [u8; 20]) -> usize {
        out[0..6].copy_from_slice(&self.dst);
        out[6..12].copy_from_slice(&self.src);
        let mut off = 12;
        for &(tpid, tci) in &self.tags[..self.ntags as usize] {
            out[off..off + 2].copy_from_slice(&tpid.to_be_bytes());
            out[off + 2..off + 4].copy_from_slice(&tci.to_be_bytes());
            off += 4;
        }
        off
    }

    /// The outer tag's TCI, if tagged.
    pub fn outer_tci(&self) -> Option<u16> {
        (self.ntags > 0).then_some(self.tags[0].1)
    }

    /// Pushes a new outer tag. Ignored (returns false) if there are already [`MAX_TAGS`].
    pub fn push_tag(&mut self, tpid: u16, tci: u16) -> bool {
        if self.ntags as usize >= MAX_TAGS {
            return false;
        }
        self.tags[1] = self.tags[0];
        self.tags[0] = (tpid, tci);
        self.ntags += 1;
        true
    }

    /// Pops the outer tag (no-op if untagged).
    pub fn pop_tag(&mut self) {
        if self.ntags > 0 {
            self.tags[0] = self.tags[1];
            self.tags[1] = (0, 0);
            self.ntags -= 1;
        }
    }
}

/// Runs `actions` in order on a working copy of `hdr`. Header actions change the copy; each
/// output action calls `emit` with the header as it is at that point (OVS semantics: in
/// `mod_vlan_vid:5,output:a,strip_vlan,output:b`, `a` gets the tag and `b` does not).
///
/// A push (by `push_vlan`, or `mod_vlan_vid`/`mod_vlan_pcp` on an untagged header) when two
/// tags are already present is ignored: the header would not fit the 20 bytes
/// [`EthHeader::write`] produces, and stacking a third tag is not a use case. [`Action::Drop`]
/// stops execution. Does not allocate.
pub fn execute(actions: &[Action], hdr: &EthHeader, mut emit: impl FnMut(Emit, &EthHeader)) {
    let mut h = *hdr;
    for a in actions {
        match *a {
            Action::Output(p) => emit(Emit::Port(p), &h),
            Action::InPort => emit(Emit::InPort, &h),
            Action::Flood => emit(Emit::Flood, &h),
            Action::All => emit(Emit::All, &h),
            Action::Normal => emit(Emit::Normal, &h),
            Action::Drop => return,
            Action::SetVlanVid(vid) => {
                let vid = vid & VLAN_VID_MASK;
                if h.ntags == 0 {
                    h.push_tag(ETH_TYPE_VLAN, vid);
                } else {
                    h.tags[0].1 = (h.tags[0].1 & !VLAN_VID_MASK) | vid;
                }
            }
            Action::SetVlanPcp(pcp) => {
                let pcp = ((pcp & 7) as u16) << 13;
                if h.ntags == 0 {
                    h.push_tag(ETH_TYPE_VLAN, pcp);
                } else {
                    h.tags[0].1 = (h.tags[0].1 & !VLAN_PCP_MASK) | pcp;
                }
            }
            Action::StripVlan => h.pop_tag(),
            Action::PushVlan(tpid) => {
                let tci = h.outer_tci().unwrap_or(0);
                h.push_tag(tpid, tci);
            }
            Action::SetDlSrc(mac) => h.src = mac,
            Action::SetDlDst(mac) => h.dst = mac,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const B: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn frame(tags: &[(u16, u16)], ty: u16) -> Vec<u8> {
        let mut f = B.to_vec();
        f.extend_from_slice(&A);
        for &(p, t) in tags {
            f.extend_from_slice(&p.to_be_bytes());
            f.extend_from_slice(&t.to_be_bytes());
        }
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(&[0xde, 0xad]);
        f
    }

    fn run(actions: &[Action], hdr: &EthHeader) -> Vec<(Emit, EthHeader)> {
        let mut v = Vec::new();
        execute(actions, hdr, |e, h| v.push((e, *h)));
        v
    }

    #[test]
    fn parse_and_write_round_trip() {
        for tags in
            [&[][..], &[(0x8100, 0x2005)], &[(0x88a8, 7), (0x8100, 9)], &[(0x8100, 1), (0x8100, 2), (0x8100, 3)]]
        {
            let f = frame(tags, 0x0800);
            let (h, off) = EthHeader::parse(&f).unwrap();
            let n = tags.len().min(2);
            assert_eq!(h.ntags as usize, n);
            assert_eq!(off, 12 + 4 * n);
            assert_eq!(h.wire_len(), off);
            let mut out = [0u8; 20];
            let w = h.write(&mut out);
            let mut again = out[..w].to_vec();
            again.extend_from_slice(&f[off..]);
            assert_eq!(again, f);
        }
        assert!(EthHeader::parse(&[0; 13]).is_none());
        // A tag whose inner ethertype is cut off is not taken.
        let f = frame(&[(0x8100, 5)], 0x0800);
        assert_eq!(EthHeader::parse(&f[..17]).unwrap().0.ntags, 0);
        assert_eq!(EthHeader::parse(&f[..18]).unwrap().0.ntags, 1);
    }

    #[test]
    fn outputs_see_header_at_that_point() {
        let (h, _) = EthHeader::parse(&frame(&[], 0x0800)).unwrap();
        let out = run(
            &[
                Action::Output(1),
                Action::SetVlanVid(5),
                Action::Output(2),
                Action::SetDlSrc(B),
                Action::StripVlan,
                Action::Normal,
                Action::InPort,
                Action::Flood,
                Action::All,
            ],
            &h,
        );
        assert_eq!(out.len(), 6);
        assert_eq!(out[0], (Emit::Port(1), h));
        assert_eq!(out[1].1.ntags, 1);
        assert_eq!(out[1].1.tags[0], (0x8100, 5));
        assert_eq!(out[2].0, Emit::Normal);
        assert_eq!((out[2].1.ntags, out[2].1.src), (0, B));
        assert_eq!([out[3].0, out[4].0, out[5].0], [Emit::InPort, Emit::Flood, Emit::All]);
        // The input header is untouched.
        assert_eq!(h.ntags, 0);
    }

    #[test]
    fn vlan_rewrites() {
        let (tagged, _) = EthHeader::parse(&frame(&[(0x8100, 0xa00c)], 0x0800)).unwrap();
        let (untagged, _) = EthHeader::parse(&frame(&[], 0x0800)).unwrap();
        let last = |a: &[Action], h: &EthHeader| {
            let mut v = a.to_vec();
            v.push(Action::Output(0));
            run(&v, h).pop().unwrap().1
        };
        // mod_vlan_vid keeps the PCP; on untagged pushes 0x8100 with PCP 0.
        assert_eq!(last(&[Action::SetVlanVid(7)], &tagged).tags[0], (0x8100, 0xa007));
        assert_eq!(last(&[Action::SetVlanVid(0x1007)], &untagged).tags[0], (0x8100, 7));
        // mod_vlan_pcp keeps the VID; on untagged pushes VID 0.
        assert_eq!(last(&[Action::SetVlanPcp(1)], &tagged).tags[0], (0x8100, 0x200c));
        assert_eq!(last(&[Action::SetVlanPcp(7)], &untagged).tags[0], (0x8100, 0xe000));
        // push_vlan copies the outer TCI, or 0.
        let h = last(&[Action::PushVlan(0x88a8)], &tagged);
        assert_eq!((h.ntags, h.tags), (2, [(0x88a8, 0xa00c), (0x8100, 0xa00c)]));
        let h = last(&[Action::PushVlan(0x88a8)], &untagged);
        assert_eq!((h.ntags, h.tags[0]), (1, (0x88a8, 0)));
        // A third tag is ignored.
        let h = last(&[Action::PushVlan(0x88a8), Action::PushVlan(0x9100)], &tagged);
        assert_eq!((h.ntags, h.tags[0].0), (2, 0x88a8));
        // strip_vlan pops the outer, no-op when untagged.
        let h = last(&[Action::PushVlan(0x88a8), Action::StripVlan], &tagged);
        assert_eq!(h, tagged);
        assert_eq!(last(&[Action::StripVlan, Action::StripVlan], &tagged), untagged);
        assert_eq!(last(&[Action::SetDlDst(A)], &untagged).dst, A);
    }

    #[test]
    fn drop_and_empty_emit_nothing() {
        let (h, _) = EthHeader::parse(&frame(&[], 0x0800)).unwrap();
        assert!(run(&[], &h).is_empty());
        assert!(run(&[Action::Drop], &h).is_empty());
        assert!(run(&[Action::Drop, Action::Output(1)], &h).is_empty());
    }
}
