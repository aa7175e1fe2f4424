//! Extracting a [`FlowKey`] from a frame's first bytes, to a [`Depth`], over any
//! [`FrameBytes`]: a byte slice, or the data path's view of a guest buffer.

#[cfg(test)]
use crate::wire::Ipv4Packet;
#[cfg(test)]
use crate::wire::arp::ArpPacket;
#[cfg(test)]
use crate::wire::tcp::TcpPacket;
use crate::wire::{MacAddr, ethernet, ethertype, protocol};

use super::key::{Depth, ETH_TYPE_NONE, Field, Key, VLAN_PRESENT};

impl<const N: usize> Key<N> {
    /// Extracts the key of a frame received on `in_port` from its first bytes (any length;
    /// never panics). Fields the frame does not have, or that are cut off, stay 0.
    ///
    /// - One VLAN tag (TPID 0x8100 or 0x88a8) is parsed into `vlan_tci` (with
    ///   [`VLAN_PRESENT`] set) and `dl_type` is the ethertype after it. A tag cut off before
    ///   the inner ethertype is not parsed: `dl_type` is then the TPID.
    /// - A type/length field below 0x600 (802.3 length) gives `dl_type` [`ETH_TYPE_NONE`], as
    ///   OVS (LLC/SNAP is not decoded).
    /// - IPv4 needs version 4, IHL >= 5 and total length >= IHL*4, else no `nw_*` field is set.
    ///   Options are skipped. Non-first fragments keep `nw_*` but get `tp_*` 0.
    /// - TCP/UDP/SCTP ports need only the 4 port bytes to be present; ICMP type/code the first 2.
    /// - ARP (Ethernet/IPv4 only) sets `nw_src`/`nw_dst` to SPA/TPA and `nw_proto` to the opcode
    ///   if it is <= 0xff (as OVS).
    pub fn extract(in_port: u16, frame: &[u8]) -> Key<N> {
        Self::extract_to(in_port, frame, Depth::L4)
    }

    /// As [`FlowKey::extract`], but reading no header deeper than `depth`: the fields of
    /// deeper headers stay 0. For a mask `m`, `extract_to(p, f, m.depth()).and(&m)` equals
    /// `extract(p, f).and(&m)`. Reads each field once, where it lies ([`FrameBytes`]).
    #[inline]
    pub fn extract_to<B: FrameBytes + ?Sized>(in_port: u16, frame: &B, depth: Depth) -> Key<N> {
        Self::extract_fields(in_port, frame, depth, true)
    }

    /// The key of a frame under `scope` (a mask, such as a flow table's union of masks), whose
    /// [`FlowKey::depth`] is `depth`: `extract(p, f).and(scope)`, reading no header deeper than
    /// `depth`, and not the two MAC addresses when `scope` has none of their bits.
    #[inline]
    pub fn extract_under<B: FrameBytes + ?Sized>(in_port: u16, frame: &B, scope: &Key<N>, depth: Depth) -> Key<N> {
        let macs = scope.get(Field::DlDst) != 0 || scope.get(Field::DlSrc) != 0;
        Self::extract_fields(in_port, frame, depth, macs).and(scope)
    }

    #[inline]
    fn extract_fields<B: FrameBytes + ?Sized>(in_port: u16, frame: &B, depth: Depth, macs: bool) -> Key<N> {
        let mut k = Key::<N>::default();
        k.set(Field::InPort, in_port as u64);
        if depth == Depth::Port {
            return k;
        }
        // Untagged IPv4 without options, the common case: both headers in one read, and no
        // check of where each field lies.
        if depth >= Depth::L3
            && let Some(h) = frame.at::<{ ethernet::HEADER_LEN + 20 }>(0)
            && h[12..14] == ethertype::IPV4.to_be_bytes()
            && h[14] == 0x45
        {
            if macs {
                k.set(Field::DlDst, MacAddr::from_bytes(&h[0..6]).to_u64());
                k.set(Field::DlSrc, MacAddr::from_bytes(&h[6..12]).to_u64());
            }
            k.set(Field::DlType, ethertype::IPV4 as u64);
            if let Some((_, ip)) = h.split_last_chunk::<20>() {
                k.ipv4_fields(frame, ethernet::HEADER_LEN, ip, depth);
            }
            return k;
        }
        if macs {
            if let Some(d) = frame.at::<6>(0) {
                k.set(Field::DlDst, MacAddr(d).to_u64());
            }
            if let Some(s) = frame.at::<6>(6) {
                k.set(Field::DlSrc, MacAddr(s).to_u64());
            }
        }
        let Some(mut ty) = be16(frame, 12) else { return k };
        let mut off = ethernet::HEADER_LEN;
        if ethernet::is_vlan_tpid(ty)
            && let (Some(tci), Some(inner)) = (be16(frame, 14), be16(frame, 16))
        {
            k.set(Field::VlanTci, (tci | VLAN_PRESENT) as u64);
            ty = inner;
            off += ethernet::TAG_LEN;
        }
        if ty < ethertype::MIN {
            ty = ETH_TYPE_NONE;
        }
        k.set(Field::DlType, ty as u64);
        if depth == Depth::L2 {
            return k;
        }
        match ty {
            ethertype::IPV4 => k.extract_ipv4(frame, off, depth),
            ethertype::ARP => k.extract_arp(frame, off),
            _ => {}
        }
        k
    }

    /// The IPv4 header at `ip`, if the frame holds its first 20 bytes (`ipv4_fields`).
    #[inline]
    fn extract_ipv4<B: FrameBytes + ?Sized>(&mut self, frame: &B, ip: usize, depth: Depth) {
        if let Some(h) = frame.at::<20>(ip) {
            self.ipv4_fields(frame, ip, &h, depth);
        }
    }

    /// The fields of the IPv4 header whose first 20 bytes are `h`, read at `ip` of `frame`:
    /// version 4, IHL >= 5 and total length >= IHL*4 (options are skipped); transport fields
    /// from the payload (what the total length and the frame both hold), unless a non-first
    /// fragment.
    #[inline(always)]
    fn ipv4_fields<B: FrameBytes + ?Sized>(&mut self, frame: &B, ip: usize, h: &[u8; 20], depth: Depth) {
        let hl = (h[0] & 0x0f) as usize * 4;
        let total = u16::from_be_bytes([h[2], h[3]]) as usize;
        if h[0] >> 4 != 4 || hl < 20 || total < hl {
            return;
        }
        let proto = h[9];
        self.set(Field::NwTos, (h[1] & 0xfc) as u64);
        self.set(Field::NwProto, proto as u64);
        self.set(Field::NwSrc, u32::from_be_bytes([h[12], h[13], h[14], h[15]]) as u64);
        self.set(Field::NwDst, u32::from_be_bytes([h[16], h[17], h[18], h[19]]) as u64);
        let frag = u16::from_be_bytes([h[6], h[7]]) & crate::wire::ipv4::OFFSET_MASK;
        if frag != 0 || depth < Depth::L4 {
            return;
        }
        // The payload is what both the total length and the frame hold.
        let l4 = ip + hl;
        let end = (ip + total).min(frame.size());
        let room = end.saturating_sub(l4);
        match proto {
            // The three share the position of their ports.
            protocol::TCP | protocol::UDP | protocol::SCTP if room >= 4 => {
                if let Some(p) = frame.at::<4>(l4) {
                    self.set(Field::TpSrc, u16::from_be_bytes([p[0], p[1]]) as u64);
                    self.set(Field::TpDst, u16::from_be_bytes([p[2], p[3]]) as u64);
                }
            }
            protocol::ICMP if room >= 2 => {
                if let Some(p) = frame.at::<2>(l4) {
                    self.set(Field::TpSrc, p[0] as u64);
                    self.set(Field::TpDst, p[1] as u64);
                }
            }
            _ => {}
        }
    }

    /// How many of a frame's first bytes its L4 fields need: the end of the transport ports
    /// (or ICMP's type and code) behind an IPv4 header of any length (options included) and
    /// at most one VLAN tag; 0 for a frame whose key has no L4 field. `frame` holds the first
    /// bytes (at least the IP header's first byte for an answer).
    #[inline]
    pub fn l4_end(frame: &[u8]) -> usize {
        let (Some(mut ty), mut ip) = (be16(frame, 12), ethernet::HEADER_LEN) else { return 0 };
        if ethernet::is_vlan_tpid(ty) {
            let Some(inner) = be16(frame, 16) else { return 0 };
            (ty, ip) = (inner, ip + ethernet::TAG_LEN);
        }
        match frame.get(ip) {
            Some(&v) if ty == ethertype::IPV4 && v >> 4 == 4 && v & 0x0f >= 5 => ip + (v & 0x0f) as usize * 4 + 4,
            _ => 0,
        }
    }

    /// An Ethernet/IPv4 ARP packet at `arp`: SPA and TPA, and the opcode if it is <= 0xff.
    #[inline]
    fn extract_arp<B: FrameBytes + ?Sized>(&mut self, frame: &B, arp: usize) {
        let Some(a) = frame.at::<{ crate::wire::arp::PACKET_LEN }>(arp) else { return };
        if a[0..2] != [0, 1] || a[2..4] != ethertype::IPV4.to_be_bytes() || a[4] != 6 || a[5] != 4 {
            return;
        }
        let op = u16::from_be_bytes([a[6], a[7]]);
        if op <= 0xff {
            self.set(Field::NwProto, op as u64);
        }
        self.set(Field::NwSrc, u32::from_be_bytes([a[14], a[15], a[16], a[17]]) as u64);
        self.set(Field::NwDst, u32::from_be_bytes([a[24], a[25], a[26], a[27]]) as u64);
    }
}

/// A big-endian u16 at `off`.
#[inline]
fn be16<B: FrameBytes + ?Sized>(b: &B, off: usize) -> Option<u16> {
    b.at::<2>(off).map(u16::from_be_bytes)
}

/// A frame's first bytes as key extraction reads them: a field at a time, straight from where
/// they lie (a byte slice: in the data path, the switch's copy of the frame's front).
pub trait FrameBytes {
    /// How many bytes there are.
    fn size(&self) -> usize;
    /// The `N` bytes at `off`, if they lie below `size()`.
    fn at<const N: usize>(&self, off: usize) -> Option<[u8; N]>;
}

impl FrameBytes for [u8] {
    #[inline]
    fn size(&self) -> usize {
        self.len()
    }
    #[inline]
    fn at<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        self.get(off..off.checked_add(N)?)?.try_into().ok()
    }
}

/// The slice-view parser `extract_to` replaced, kept as its reference in tests.
#[cfg(test)]
pub(crate) fn extract_reference(in_port: u16, frame: &[u8]) -> super::FlowKey {
    let mut k = super::FlowKey::default();
    k.set(Field::InPort, in_port as u64);
    if let Some(d) = frame.get(0..6) {
        k.set(Field::DlDst, MacAddr::from_bytes(d).to_u64());
    }
    if let Some(s) = frame.get(6..12) {
        k.set(Field::DlSrc, MacAddr::from_bytes(s).to_u64());
    }
    let Some((mut ty, off, tag)) = ethernet::l3_start(frame) else { return k };
    if let Some(t) = tag {
        k.set(Field::VlanTci, (t.tci | VLAN_PRESENT) as u64);
    }
    if ty < ethertype::MIN {
        ty = ETH_TYPE_NONE;
    }
    k.set(Field::DlType, ty as u64);
    let l3 = &frame[off..];
    match ty {
        ethertype::IPV4 => {
            let Ok(ip) = Ipv4Packet::new_checked(l3) else { return k };
            k.set(Field::NwTos, (ip.tos() & 0xfc) as u64);
            k.set(Field::NwProto, ip.protocol() as u64);
            k.set(Field::NwSrc, u32::from(ip.src_addr()) as u64);
            k.set(Field::NwDst, u32::from(ip.dst_addr()) as u64);
            if ip.frag_offset() != 0 {
                return k;
            }
            let l4 = ip.payload();
            match ip.protocol() {
                protocol::TCP | protocol::UDP | protocol::SCTP => {
                    if let Ok(t) = TcpPacket::new_ports(l4) {
                        k.set(Field::TpSrc, t.src_port() as u64);
                        k.set(Field::TpDst, t.dst_port() as u64);
                    }
                }
                protocol::ICMP if l4.len() >= 2 => {
                    k.set(Field::TpSrc, l4[0] as u64);
                    k.set(Field::TpDst, l4[1] as u64);
                }
                _ => {}
            }
        }
        ethertype::ARP => {
            let Ok(arp) = ArpPacket::new_checked(l3) else { return k };
            let op = arp.operation();
            if op <= 0xff {
                k.set(Field::NwProto, op as u64);
            }
            k.set(Field::NwSrc, u32::from(arp.sender_ip()) as u64);
            k.set(Field::NwDst, u32::from(arp.target_ip()) as u64);
        }
        _ => {}
    }
    k
}

#[cfg(test)]
mod tests {
    use super::super::FlowKey;
    use super::super::key::testutil::*;
    use super::*;

    #[test]
    fn tcp_over_vlan() {
        let mut f = eth(Some(0x6000 | 100), ethertype::IPV4);
        f.extend(ipv4(0xb9, 6, [10, 0, 0, 1], [10, 0, 0, 2], 0x4000, &[], &ports(1234, 80)));
        let k = FlowKey::extract(7, &f);
        assert_eq!(k.in_port(), 7);
        assert_eq!(k.dl_dst(), DST);
        assert_eq!(k.dl_src(), SRC);
        assert_eq!(k.dl_type(), ethertype::IPV4);
        assert_eq!(k.vlan_tci(), 0x7000 | 100);
        assert_eq!((k.vlan_vid(), k.vlan_pcp()), (Some(100), Some(3)));
        assert_eq!(k.nw_src(), 0x0a00_0001);
        assert_eq!(k.nw_dst(), 0x0a00_0002);
        assert_eq!(k.nw_tos(), 0xb8);
        assert_eq!(k.nw_proto(), 6);
        assert_eq!((k.tp_src(), k.tp_dst()), (1234, 80));
    }

    #[test]
    fn udp_with_options_and_8021ad() {
        let mut f = eth(None, ethertype::QINQ);
        f.truncate(12);
        f.extend_from_slice(&[0x88, 0xa8, 0x00, 0x05, 0x08, 0x00]);
        f.extend(ipv4(0, 17, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[1, 1, 1, 0, 1, 1, 1, 0], &ports(53, 5353)));
        let k = FlowKey::extract(0, &f);
        assert_eq!(k.vlan_tci(), VLAN_PRESENT | 5);
        assert_eq!((k.nw_proto(), k.tp_src(), k.tp_dst()), (17, 53, 5353));
        assert_eq!(k.vlan_vid(), Some(5));
    }

    #[test]
    fn icmp_sctp_and_fragments() {
        let mut f = eth(None, ethertype::IPV4);
        f.extend(ipv4(0, 1, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[], &[8, 0, 0, 0]));
        let k = FlowKey::extract(0, &f);
        assert_eq!((k.nw_proto(), k.tp_src(), k.tp_dst()), (1, 8, 0));
        assert_eq!(k.vlan_tci(), 0);
        assert_eq!(k.vlan_vid(), None);

        let mut f = eth(None, ethertype::IPV4);
        f.extend(ipv4(0, 132, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[], &ports(9, 10)));
        assert_eq!(FlowKey::extract(0, &f).tp_dst(), 10);

        // A non-first fragment: nw fields yes, ports no.
        let mut f = eth(None, ethertype::IPV4);
        f.extend(ipv4(0, 6, [1, 1, 1, 1], [2, 2, 2, 2], 0x2000 | 185, &[], &ports(9, 10)));
        let k = FlowKey::extract(0, &f);
        assert_eq!((k.nw_proto(), k.nw_src(), k.tp_src(), k.tp_dst()), (6, 0x0101_0101, 0, 0));
        // The first fragment (MF set, offset 0) has ports.
        let mut f = eth(None, ethertype::IPV4);
        f.extend(ipv4(0, 6, [1, 1, 1, 1], [2, 2, 2, 2], 0x2000, &[], &ports(9, 10)));
        assert_eq!(FlowKey::extract(0, &f).tp_src(), 9);
    }

    #[test]
    fn malformed_ipv4_sets_no_nw_fields() {
        for bad in [0x45u8 ^ 0x10, 0x44] {
            let mut f = eth(None, ethertype::IPV4);
            let mut ip = ipv4(0, 6, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[], &ports(9, 10));
            ip[0] = bad;
            f.extend(ip);
            let k = FlowKey::extract(0, &f);
            assert_eq!((k.dl_type(), k.nw_src(), k.nw_proto(), k.tp_src()), (ethertype::IPV4, 0, 0, 0));
        }
        // Ports cut off: nw fields yes, ports no.
        let mut f = eth(None, ethertype::IPV4);
        f.extend(ipv4(0, 6, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[], &ports(9, 10)));
        let k = FlowKey::extract(0, &f[..14 + 20 + 3]);
        assert_eq!((k.nw_proto(), k.tp_src()), (6, 0));
    }

    #[test]
    fn arp() {
        let mut f = eth(Some(3), ethertype::ARP);
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
        f.extend_from_slice(&SRC.0);
        f.extend_from_slice(&[10, 0, 0, 1]);
        f.extend_from_slice(&DST.0);
        f.extend_from_slice(&[10, 0, 0, 2]);
        let k = FlowKey::extract(1, &f);
        assert_eq!((k.dl_type(), k.nw_proto(), k.nw_src(), k.nw_dst()), (ethertype::ARP, 2, 0x0a00_0001, 0x0a00_0002));
        assert_eq!(k.vlan_vid(), Some(3));
        f[18 + 6] = 1; // opcode 0x0102: too big for nw_proto
        assert_eq!(FlowKey::extract(1, &f).nw_proto(), 0);
        f[18 + 4] = 8; // hlen 8: not Ethernet/IPv4 ARP
        assert_eq!(FlowKey::extract(1, &f).nw_src(), 0);
    }

    #[test]
    fn short_frames() {
        let mut f = eth(Some(5), ethertype::IPV4);
        f.extend(ipv4(0, 6, [1, 1, 1, 1], [2, 2, 2, 2], 0, &[], &ports(9, 10)));
        for n in 0..f.len() {
            let k = FlowKey::extract(3, &f[..n]);
            assert_eq!(k.in_port(), 3);
            assert_eq!(k.dl_dst(), if n >= 6 { DST } else { MacAddr::ZERO });
            if n < 18 {
                // The tag is not parsed without its inner ethertype; dl_type is then the TPID.
                assert_eq!(k.vlan_tci(), 0);
                assert_eq!(k.dl_type(), if n >= 14 { ethertype::VLAN } else { 0 });
            }
        }
        // 802.3 length field.
        let f = eth(None, 60);
        assert_eq!(FlowKey::extract(0, &f).dl_type(), ETH_TYPE_NONE);
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut buf = [0u8; 80];
        for i in 0..200_000 {
            let n = rng.below(81) as usize;
            for b in buf.iter_mut() {
                *b = rng.next() as u8;
            }
            // Bias towards interesting headers so the deep paths run too.
            if i % 2 == 0 {
                let tys = [0x8100u16, 0x88a8, 0x0800, 0x0806];
                buf[12..14].copy_from_slice(&rng.pick(&tys).to_be_bytes());
                buf[16..18].copy_from_slice(&rng.pick(&tys).to_be_bytes());
                let ihl = rng.pick(&[0x45u8, 0x46, 0x4f, 0x44]);
                buf[14] = ihl;
                buf[18] = ihl;
                buf[14 + 9] = rng.pick(&[1, 6, 17, 132]);
                buf[18 + 9] = rng.pick(&[1, 6, 17, 132]);
            }
            let k = FlowKey::extract(i as u16, &buf[..n]);
            assert_eq!(k.in_port(), i as u16);
            if k.vlan_tci() != 0 {
                assert!(k.vlan_tci() & VLAN_PRESENT != 0);
            }
        }
    }

    #[test]
    fn extract_to_a_masks_depth_agrees_with_extract() {
        let mut rng = Rng(7);
        let l4 = ports(1000, 80);
        let frames = [
            [eth(None, 0x0800), ipv4(0x10, 17, [10, 0, 0, 1], [10, 0, 0, 2], 0, &[], &l4)].concat(),
            [eth(Some(0x2005), 0x0800), ipv4(0, 6, [1, 2, 3, 4], [5, 6, 7, 8], 0, &[0; 4], &l4)].concat(),
            [eth(None, 0x0806), vec![0, 1, 8, 0, 6, 4, 0, 2], vec![7; 20]].concat(),
            eth(None, 0x86dd),
            vec![1, 2, 3],
        ];
        for _ in 0..2000 {
            let mut mask = FlowKey::default();
            for _ in 0..rng.below(4) {
                let f = rng.pick(&Field::ALL);
                mask.set(f, rng.next());
            }
            let f = &frames[rng.below(frames.len() as u64) as usize];
            let f = &f[..rng.below(f.len() as u64 + 1) as usize];
            let d = mask.depth();
            assert_eq!(FlowKey::extract_to(3, f, d).and(&mask), FlowKey::extract(3, f).and(&mask), "{mask:?}");
            assert_eq!(FlowKey::extract_under(3, f, &mask, d), FlowKey::extract(3, f).and(&mask), "{mask:?}");
        }
        assert_eq!(FlowKey::default().depth(), Depth::Port);
        assert_eq!(FlowKey::default().with(Field::InPort, 1).depth(), Depth::Port);
        assert_eq!(FlowKey::default().with(Field::DlType, 0x800).depth(), Depth::L2);
        assert_eq!(FlowKey::default().with(Field::DlType, 1).with(Field::NwDst, 1).depth(), Depth::L3);
        assert_eq!(FlowKey::default().with(Field::TpSrc, 1).depth(), Depth::L4);
        // A shallower extraction leaves the deeper fields 0.
        let k = FlowKey::extract_to(3, &frames[0][..], Depth::L3);
        assert_eq!((k.nw_dst(), k.tp_dst()), (0x0a00_0002, 0));
        assert_eq!(FlowKey::extract_to(3, &frames[0][..], Depth::Port), FlowKey::default().with(Field::InPort, 3));
    }

    #[test]
    fn extract_agrees_with_the_slice_view_parser() {
        let mut rng = Rng(11);
        let l4 = ports(1000, 80);
        let seeds = [
            [eth(None, 0x0800), ipv4(0x10, 17, [10, 0, 0, 1], [10, 0, 0, 2], 0, &[], &l4)].concat(),
            [eth(Some(0x2005), 0x0800), ipv4(0, 6, [1, 2, 3, 4], [5, 6, 7, 8], 0, &[0; 8], &l4)].concat(),
            [eth(None, 0x0800), ipv4(0, 1, [1, 2, 3, 4], [5, 6, 7, 8], 0, &[], &[8, 0, 1, 2])].concat(),
            [eth(None, 0x0800), ipv4(0, 6, [1, 2, 3, 4], [5, 6, 7, 8], 0x20, &[], &l4)].concat(),
            [eth(None, 0x0806), vec![0, 1, 8, 0, 6, 4, 0, 2], vec![7; 20]].concat(),
            [eth(Some(1), 0x0806), vec![0, 1, 8, 0, 6, 4, 1, 2], vec![9; 20]].concat(),
            eth(None, 0x86dd),
            eth(None, 0x0100),
        ];
        for _ in 0..100_000 {
            let mut f = seeds[rng.below(seeds.len() as u64) as usize].clone();
            // Mutate a few bytes where the parsers decide (lengths, IHL, types, flags), and cut.
            for _ in 0..rng.below(4) {
                let at = rng.below(f.len().min(44) as u64) as usize;
                f[at] = if rng.below(2) == 0 {
                    rng.next() as u8
                } else {
                    rng.pick(&[0, 1, 4, 5, 6, 8, 20, 22, 24, 0x45, 0x4f, 0x81, 0xff])
                };
            }
            f.truncate(rng.below(f.len() as u64 + 1) as usize);
            assert_eq!(FlowKey::extract(4, &f), extract_reference(4, &f), "{f:02x?}");
        }
    }
}
