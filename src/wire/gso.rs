//! Offloads done in software, for a destination that did not negotiate what the sender used
//! (virtio 1.2 section 5.1.6.2): completing a partial checksum (NEEDS_CSUM), and cutting a TCP
//! segmentation offload frame (gso_type TCPV4/TCPV6) into MSS-sized segments with correct
//! IPv4/IPv6 and TCP headers. Pure functions over the headers' bytes: the payload stays where it
//! is (in guest memory) and is summed and copied by the caller, piece by piece.

use super::checksum::{self, Sum};
use super::ethernet;
use super::ipv4::{self, Ipv4Packet};
use super::ipv6::{self, Ipv6Packet};
use super::tcp::{self, TcpPacket};
use super::virtio_net::{Negotiated, VirtioNetHdr, flags, gso};
use super::{ethertype, set_be16};

/// Most bytes of headers a segmented frame may have: Ethernet with two VLAN tags, IPv4 with
/// options or IPv6, TCP with options.
pub const MAX_HDR: usize = 14 + 8 + 60 + 60;

/// Smallest gso_size accepted: TCP's smallest MSS (Linux's TCP_MIN_MSS). A smaller one would
/// make up to 65535 segments of one frame, each a copy, a checksum and a receive buffer or mbuf
/// the sender does not pay for; 88 bounds a 64 KiB frame at 745 segments, about the work of the
/// same bytes sent as small frames.
pub const MIN_MSS: u16 = 88;

/// Largest TSO frame accepted: an IP packet of 64 KiB behind Ethernet and two VLAN tags.
pub const MAX_FRAME: u32 = 65535 + 14 + 8;

/// Why a frame's offload request cannot be honoured (the frame is dropped and counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadError {
    /// NEEDS_CSUM with `csum_start + csum_offset + 2` past the frame's end.
    CsumOutOfFrame,
    /// A gso_type other than TCPV4/TCPV6 (with or without ECN).
    GsoType,
    /// An offload the sender did not negotiate (NEEDS_CSUM without CSUM, TSO without
    /// HOST_TSO4/6, ECN without HOST_ECN).
    NotNegotiated,
    /// gso_size below [`MIN_MSS`] (0 included).
    GsoSizeTooSmall,
    /// The headers are not Ethernet + IPv4/IPv6 + TCP as the gso_type says, or `hdr_len` lies
    /// beyond the frame.
    GsoHeaders,
}

impl OffloadError {
    pub fn as_str(self) -> &'static str {
        match self {
            OffloadError::CsumOutOfFrame => "csum_start/csum_offset past the frame",
            OffloadError::GsoType => "gso_type not TCPv4/TCPv6",
            OffloadError::NotNegotiated => "offload the port did not negotiate",
            OffloadError::GsoSizeTooSmall => "gso_size below 88 (TCP's smallest MSS)",
            OffloadError::GsoHeaders => "TSO frame without Ethernet/IP/TCP headers, or hdr_len past the frame",
        }
    }
}

/// What the sender asked of the device for one frame, checked against the frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offload {
    /// NEEDS_CSUM: the checksum starting at `csum_start` (frame offset) is partial; its field
    /// is at `csum_start + csum_offset`.
    pub csum: Option<(u16, u16)>,
    /// TSO: payload bytes per segment, with the headers' layout.
    pub tso: Option<Tso>,
}

/// Layout of a TSO frame's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tso {
    pub mss: u16,
    pub v6: bool,
    /// The ECN bit: CWR on the first segment only, as without it (the receiver must have
    /// negotiated GUEST_ECN to take the frame whole).
    pub ecn: bool,
    /// Offsets of the IP and TCP headers, and of the payload (the headers' total length).
    pub l3: u16,
    pub l4: u16,
    pub hdr_len: u16,
}

impl Offload {
    pub const NONE: Offload = Offload { csum: None, tso: None };

    pub fn is_none(&self) -> bool {
        self.csum.is_none() && self.tso.is_none()
    }

    /// Checks the virtio-net header `h` of a frame of `len` bytes whose first bytes are `head`
    /// (at least the headers, when there are any: up to [`MAX_HDR`]). `tso4`/`tso6`/`ecn` say
    /// what the sender negotiated (HOST_TSO4, HOST_TSO6, HOST_ECN).
    pub fn parse(h: &VirtioNetHdr, head: &[u8], len: u32, sender: &Negotiated) -> Result<Offload, OffloadError> {
        let Negotiated { csum, tso4, tso6, ecn } = *sender;
        let mut o = Offload::NONE;
        if h.flags & flags::NEEDS_CSUM != 0 {
            if !csum {
                return Err(OffloadError::NotNegotiated);
            }
            if h.csum_start as u32 + h.csum_offset as u32 + 2 > len {
                return Err(OffloadError::CsumOutOfFrame);
            }
            o.csum = Some((h.csum_start, h.csum_offset));
        }
        let kind = h.gso_type & !gso::ECN;
        if kind == gso::NONE {
            return if h.gso_type & gso::ECN != 0 { Err(OffloadError::GsoType) } else { Ok(o) };
        }
        let v6 = match kind {
            gso::TCPV4 if tso4 => false,
            gso::TCPV6 if tso6 => true,
            gso::TCPV4 | gso::TCPV6 => return Err(OffloadError::NotNegotiated),
            _ => return Err(OffloadError::GsoType),
        };
        let with_ecn = h.gso_type & gso::ECN != 0;
        if with_ecn && !ecn {
            return Err(OffloadError::NotNegotiated);
        }
        if h.gso_size < MIN_MSS {
            return Err(OffloadError::GsoSizeTooSmall);
        }
        if h.hdr_len as u32 > len {
            return Err(OffloadError::GsoHeaders);
        }
        let t = tcp_layout(head, v6).ok_or(OffloadError::GsoHeaders)?;
        if t.hdr_len as u32 > len {
            return Err(OffloadError::GsoHeaders);
        }
        // A TSO frame's checksum is the TCP one, whatever csum_start said (Linux always sets
        // NEEDS_CSUM with it; a header without it still gets correct segments).
        o.csum = Some((t.l4, tcp::CHECKSUM_OFFSET as u16));
        o.tso = Some(Tso { mss: h.gso_size, v6, ecn: with_ecn, ..t });
        Ok(o)
    }

    /// Whether a receiver that negotiated `rx` takes a frame with this offload as it is.
    pub fn taken_by(&self, rx: &Negotiated) -> bool {
        match self.tso {
            Some(t) => rx.csum && if t.v6 { rx.tso6 } else { rx.tso4 } && (!t.ecn || rx.ecn),
            None => self.csum.is_none() || rx.csum,
        }
    }

    /// The offsets moved by `delta` bytes (an Ethernet header rewritten to another length).
    pub fn shifted(mut self, delta: i32) -> Offload {
        let mv = |v: u16| (v as i32 + delta) as u16;
        if let Some((s, off)) = self.csum {
            self.csum = Some((mv(s), off));
        }
        if let Some(t) = self.tso.as_mut() {
            t.l3 = mv(t.l3);
            t.l4 = mv(t.l4);
            t.hdr_len = mv(t.hdr_len);
        }
        self
    }

    /// The virtio-net header that hands this frame on whole to a receiver that negotiated the
    /// offloads (num_buffers left 1).
    pub fn to_hdr(&self) -> VirtioNetHdr {
        let mut h = VirtioNetHdr::PLAIN;
        if let Some((start, off)) = self.csum {
            h.flags = flags::NEEDS_CSUM;
            h.csum_start = start;
            h.csum_offset = off;
        }
        if let Some(t) = self.tso {
            h.gso_type = if t.v6 { gso::TCPV6 } else { gso::TCPV4 } | if t.ecn { gso::ECN } else { 0 };
            h.gso_size = t.mss;
            h.hdr_len = t.hdr_len;
        }
        h
    }

    /// Number of segments a TSO frame of `len` bytes makes (1 without TSO).
    pub fn segments(&self, len: u32) -> u32 {
        match self.tso {
            Some(t) => (len.saturating_sub(t.hdr_len as u32)).div_ceil(t.mss as u32).max(1),
            None => 1,
        }
    }
}

/// Where the IP and transport headers of `head` are: Ethernet (up to two tags), then IPv4 (not
/// a fragment) or IPv6 (no extension headers). Returns (l3, l4, v6, protocol).
fn ip_layout(head: &[u8]) -> Option<(usize, usize, bool, u8)> {
    let (_, mut l3) = ethernet::EthernetRepr::parse(head).ok()?;
    let ty = super::be16(head, l3)?;
    l3 += 2;
    match ty {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(head.get(l3..)?).ok()?;
            (!ip.is_fragment()).then_some((l3, l3 + ip.header_len(), false, ip.protocol()))
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(head.get(l3..)?).ok()?;
            Some((l3, l3 + ipv6::HEADER_LEN, true, ip.next_header()))
        }
        _ => None,
    }
}

/// Where the IP and TCP headers of `head` are, if it is Ethernet (up to two tags) + IPv4
/// (`v6` false, not a fragment) or IPv6 (`v6` true, no extension headers) + TCP.
fn tcp_layout(head: &[u8], v6: bool) -> Option<Tso> {
    let (l3, l4, is_v6, proto) = ip_layout(head)?;
    if is_v6 != v6 || proto != ipv4::protocol::TCP {
        return None;
    }
    let t = TcpPacket::new_checked(head.get(l4..)?).ok()?;
    let hdr_len = l4 + t.header_len();
    (hdr_len <= MAX_HDR).then_some(Tso {
        mss: 0,
        v6,
        ecn: false,
        l3: l3 as u16,
        l4: l4 as u16,
        hdr_len: hdr_len as u16,
    })
}

/// How a device with TX offloads (a NIC) is asked to finish a frame it takes whole: the
/// lengths of the frame's headers, and the values two fields must hold before it does, by
/// DPDK's convention (IPv4 header checksum 0 when the device computes it; the TCP/UDP checksum
/// field the pseudo header's sum, without the length for TSO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceJob {
    /// TSO with this MSS, else a checksum only.
    pub tso: Option<u16>,
    pub v6: bool,
    pub udp: bool,
    /// Lengths of the L2, L3 and L4 headers (L4: TCP's with options, UDP's 8).
    pub l2: u16,
    pub l3: u16,
    pub l4: u16,
    /// Fields to store before the frame goes: (frame offset, big-endian value).
    pub fields: [(u16, u16); 2],
}

impl DeviceJob {
    /// The job for frame `o` whose first bytes (its headers) are `head`; None if a device
    /// cannot do it (a checksum not where TCP's or UDP's is, ECN TSO, headers it cannot read),
    /// and the switch does the work in software.
    pub fn new(head: &[u8], o: &Offload) -> Option<DeviceJob> {
        if let Some(t) = o.tso {
            if t.ecn || head.len() < t.hdr_len as usize {
                return None;
            }
            let (l3, l4, hl) = (t.l3 as usize, t.l4 as usize, t.hdr_len as usize);
            let (pseudo, ip_field) = if t.v6 {
                (Ipv6Packet::new_checked(&head[l3..l4]).ok()?.pseudo_header(0), (l4 + tcp::CHECKSUM_OFFSET, 0))
            } else {
                (Ipv4Packet::new_checked(&head[l3..l4]).ok()?.pseudo_header(0), (l3 + 10, 0))
            };
            let tcp_field = (l4 + tcp::CHECKSUM_OFFSET, pseudo.fold());
            // IPv6 has no header checksum: its slot repeats the TCP field's store.
            let ip_field = if t.v6 { tcp_field } else { ip_field };
            return Some(DeviceJob {
                tso: Some(t.mss),
                v6: t.v6,
                udp: false,
                l2: l3 as u16,
                l3: (l4 - l3) as u16,
                l4: (hl - l4) as u16,
                fields: [(ip_field.0 as u16, ip_field.1), (tcp_field.0 as u16, tcp_field.1)],
            });
        }
        let (start, field) = o.csum?;
        let (l3, l4, v6, proto) = ip_layout(head)?;
        let udp = match (proto, field as usize) {
            (ipv4::protocol::TCP, tcp::CHECKSUM_OFFSET) => false,
            (ipv4::protocol::UDP, 6) => true,
            _ => return None,
        };
        if start as usize != l4 {
            return None;
        }
        let pseudo = if v6 {
            let ip = Ipv6Packet::new_checked(&head[l3..]).ok()?;
            ip.pseudo_header(ip.payload_len() as u32)
        } else {
            let ip = Ipv4Packet::new_checked(&head[l3..]).ok()?;
            ip.pseudo_header((ip.total_len() as u32).saturating_sub(ip.header_len() as u32))
        };
        let f = (start + field, pseudo.fold());
        Some(DeviceJob {
            tso: None,
            v6,
            udp,
            l2: l3 as u16,
            l3: (l4 - l3) as u16,
            l4: if udp { 8 } else { 0 },
            fields: [f, f],
        })
    }
}

/// The headers of segment `index` (of `count`) of a TSO frame whose headers are `orig`
/// (`t.hdr_len` bytes), carrying `payload_len` bytes that start `offset` bytes into the
/// original payload: written to `out[..t.hdr_len]`. IPv4: total length, identification
/// (+index), header checksum; IPv6: payload length; TCP: sequence number (+offset), FIN and PSH
/// on the last segment only, CWR on the first only, and the checksum field set to the pseudo
/// header's sum (the partial form NEEDS_CSUM means; [`finish_tcp_checksum`] completes it).
pub fn segment_headers(orig: &[u8], t: &Tso, index: u32, count: u32, offset: u32, payload_len: u32, out: &mut [u8]) {
    let (l3, l4, hl) = (t.l3 as usize, t.l4 as usize, t.hdr_len as usize);
    out[..hl].copy_from_slice(&orig[..hl]);
    let l4_len = (hl - l4) as u32 + payload_len;
    let pseudo = if t.v6 {
        let mut ip = Ipv6Packet::new_unchecked(&mut out[l3..l4]);
        ip.set_payload_len(l4_len as u16);
        ip.pseudo_header(l4_len)
    } else {
        let mut ip = Ipv4Packet::new_unchecked(&mut out[l3..l4]);
        ip.set_total_len((l4 - l3) as u16 + l4_len as u16);
        let id = ip.ident().wrapping_add(index as u16);
        ip.set_ident(id);
        let pseudo = ip.pseudo_header(l4_len);
        // Over the header's bytes as parsed (l3..l4), not as its IHL now says: the sender's
        // memory may have changed since (then only its own segments are wrong).
        set_be16(out, l3 + 10, 0);
        let c = checksum::checksum(&out[l3..l4]);
        set_be16(out, l3 + 10, c);
        pseudo
    };
    let mut tcp = TcpPacket::new_unchecked(&mut out[l4..hl]);
    let seq = tcp.seq_number().wrapping_add(offset);
    tcp.set_seq_number(seq);
    let mut fl = tcp.flags();
    if index + 1 < count {
        fl &= !(tcp::flags::FIN | tcp::flags::PSH);
    }
    if index > 0 {
        fl &= !tcp::flags::CWR;
    }
    tcp.set_flags(fl);
    set_be16(out, l4 + tcp::CHECKSUM_OFFSET, pseudo.fold());
}

/// Completes the TCP checksum of a segment whose headers `segment_headers` wrote to `hdrs`,
/// given the sum of its payload bytes.
pub fn finish_tcp_checksum(hdrs: &mut [u8], t: &Tso, payload: Sum) {
    let (l4, hl) = (t.l4 as usize, t.hdr_len as usize);
    let mut s = Sum::new();
    s.add_bytes(&hdrs[l4..hl]);
    let v = checksum::combine(s.fold(), payload.fold());
    set_be16(hdrs, l4 + tcp::CHECKSUM_OFFSET, final_value(v));
}

/// The checksum field's value from the folded sum of everything it covers (the partial value
/// already in the field included): its complement, with 0 sent as 0xffff (equal in ones'
/// complement, and what UDP requires).
pub fn final_value(folded: u16) -> u16 {
    match !folded {
        0 => 0xffff,
        v => v,
    }
}

/// Completes a NEEDS_CSUM checksum in place in a frame held whole in `frame` (tests: the data
/// path computes it from the sender's buffers, `datapath::tx::offload::checksum`).
#[cfg(test)]
pub fn complete_checksum(frame: &mut [u8], csum_start: usize, csum_offset: usize) {
    let v = final_value(Sum::new().add_bytes(&frame[csum_start..]).fold());
    set_be16(frame, csum_start + csum_offset, v);
}

/// Whether `frame` (Ethernet) is IPv4 or IPv6 TCP/UDP whose L4 checksum verifies; None for
/// other frames. For tests.
#[cfg(test)]
pub fn l4_checksum_ok(frame: &[u8]) -> Option<bool> {
    let (_, mut l3) = ethernet::EthernetRepr::parse(frame).ok()?;
    let ty = super::be16(frame, l3)?;
    l3 += 2;
    let (proto, l4, pseudo) = match ty {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(&frame[l3..]).ok()?;
            let l4_len = ip.total_len() as usize - ip.header_len();
            (ip.protocol(), l3 + ip.header_len(), ip.pseudo_header(l4_len as u32))
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(&frame[l3..]).ok()?;
            (ip.next_header(), l3 + ipv6::HEADER_LEN, ip.pseudo_header(ip.payload_len() as u32))
        }
        _ => return None,
    };
    if proto != ipv4::protocol::TCP && proto != ipv4::protocol::UDP {
        return None;
    }
    let mut s = pseudo;
    s.add_bytes(&frame[l4..]);
    Some(s.fold() == 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MacAddr;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// A tiny deterministic generator (xorshift), so the property tests need no crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// An Ethernet + IP + TCP frame (the TCP checksum field holding the pseudo header's sum, as
    /// a guest hands a NEEDS_CSUM frame over), with `opts` bytes of TCP options and `vlan` tags.
    fn tcp_frame(v6: bool, payload: &[u8], opts: usize, vlan: usize, tcp_flags: u16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&MacAddr([2, 0, 0, 0, 0, 2]).0);
        f.extend_from_slice(&MacAddr([2, 0, 0, 0, 0, 1]).0);
        for _ in 0..vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
        }
        let l3 = f.len() + 2;
        let tcp_len = 20 + opts + payload.len();
        if v6 {
            f.extend_from_slice(&ethertype::IPV6.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            ip[6] = 6;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets());
            ip[24..40].copy_from_slice(&Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2).octets());
            f.extend_from_slice(&ip);
        } else {
            f.extend_from_slice(&ethertype::IPV4.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            ip[4..6].copy_from_slice(&0xfff0u16.to_be_bytes());
            ip[6] = 0x40;
            ip[8] = 64;
            ip[9] = 6;
            ip[12..16].copy_from_slice(&Ipv4Addr::new(10, 0, 0, 1).octets());
            ip[16..20].copy_from_slice(&Ipv4Addr::new(10, 0, 0, 2).octets());
            f.extend_from_slice(&ip);
            Ipv4Packet::new_unchecked(&mut f[l3..]).fill_checksum();
        }
        let l4 = f.len();
        let mut th = vec![0u8; 20 + opts];
        th[0..2].copy_from_slice(&40000u16.to_be_bytes());
        th[2..4].copy_from_slice(&5201u16.to_be_bytes());
        th[4..8].copy_from_slice(&0xffff_f000u32.to_be_bytes());
        th[8..12].copy_from_slice(&7u32.to_be_bytes());
        let word = (((20 + opts) / 4) as u16) << 12 | tcp_flags;
        th[12..14].copy_from_slice(&word.to_be_bytes());
        th[14..16].copy_from_slice(&65535u16.to_be_bytes());
        for (i, b) in th[20..].iter_mut().enumerate() {
            *b = if i + 1 == opts { 0 } else { 1 }; // NOPs, then end of options
        }
        f.extend_from_slice(&th);
        f.extend_from_slice(payload);
        let pseudo = if v6 {
            Ipv6Packet::new_unchecked(&f[l3..]).pseudo_header(tcp_len as u32)
        } else {
            Ipv4Packet::new_unchecked(&f[l3..]).pseudo_header(tcp_len as u32)
        };
        set_be16(&mut f, l4 + 16, pseudo.fold());
        f
    }

    const ALL: Negotiated = Negotiated { csum: true, tso4: true, tso6: true, ecn: true };

    fn hdr(v6: bool, mss: u16, f: &[u8]) -> VirtioNetHdr {
        let t = tcp_layout(f, v6).unwrap();
        VirtioNetHdr {
            flags: flags::NEEDS_CSUM,
            gso_type: if v6 { gso::TCPV6 } else { gso::TCPV4 },
            hdr_len: t.hdr_len,
            gso_size: mss,
            csum_start: t.l4,
            csum_offset: 16,
            num_buffers: 0,
        }
    }

    /// Segments `f` the way the data path does: headers from `segment_headers`, payload slices
    /// summed separately, checksum completed.
    fn segment(f: &[u8], o: &Offload) -> Vec<Vec<u8>> {
        let t = o.tso.unwrap();
        let hl = t.hdr_len as usize;
        let n = o.segments(f.len() as u32);
        (0..n)
            .map(|i| {
                let off = i as usize * t.mss as usize;
                let len = (f.len() - hl - off).min(t.mss as usize);
                let mut seg = vec![0u8; hl + len];
                segment_headers(f, &t, i, n, off as u32, len as u32, &mut seg);
                let payload = &f[hl + off..hl + off + len];
                seg[hl..].copy_from_slice(payload);
                let mut s = Sum::new();
                s.add_bytes(payload);
                finish_tcp_checksum(&mut seg, &t, s);
                seg
            })
            .collect()
    }

    #[test]
    fn known_answer_ipv4_segments() {
        let payload: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let f = tcp_frame(false, &payload, 0, 0, tcp::flags::ACK | tcp::flags::PSH | tcp::flags::FIN | tcp::flags::CWR);
        let o = Offload::parse(&hdr(false, 1448, &f), &f, f.len() as u32, &ALL).unwrap();
        let t = o.tso.unwrap();
        assert_eq!((t.l3, t.l4, t.hdr_len), (14, 34, 54));
        let segs = segment(&f, &o);
        assert_eq!(segs.len(), 3);
        assert_eq!(segs.iter().map(|s| s.len()).collect::<Vec<_>>(), [54 + 1448, 54 + 1448, 54 + 104]);
        for (i, s) in segs.iter().enumerate() {
            let ip = Ipv4Packet::new_checked(&s[14..]).unwrap();
            assert!(ip.verify_checksum(), "segment {i} IP checksum");
            assert_eq!(ip.total_len() as usize, s.len() - 14);
            assert_eq!(ip.ident(), 0xfff0u16.wrapping_add(i as u16));
            let tcp = TcpPacket::new_checked(&s[34..]).unwrap();
            assert_eq!(tcp.seq_number(), 0xffff_f000u32.wrapping_add(1448 * i as u32));
            let fl = tcp.flags();
            assert_eq!(fl & tcp::flags::FIN != 0, i == 2, "FIN on the last only");
            assert_eq!(fl & tcp::flags::PSH != 0, i == 2, "PSH on the last only");
            assert_eq!(fl & tcp::flags::CWR != 0, i == 0, "CWR on the first only");
            assert_eq!(l4_checksum_ok(s), Some(true), "segment {i} TCP checksum");
        }
        // A known value: segment 0's IPv4 header checksum, by hand from its fields
        // 4500 05d0 fff0 4000 4006 0000 0a00 0001 0a00 0002 (total length 20 + 20 + 1448).
        let words = [0x4500u32, 0x05d0, 0xfff0, 0x4000, 0x4006, 0x0a00, 0x0001, 0x0a00, 0x0002];
        let mut s: u32 = words.iter().sum();
        s = (s & 0xffff) + (s >> 16);
        assert_eq!(Ipv4Packet::new_checked(&segs[0][14..]).unwrap().checksum(), !(s as u16));
    }

    #[test]
    fn segment_then_reassemble_is_the_original_and_every_checksum_verifies() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..300 {
            let v6 = rng.below(2) == 1;
            let len = 1 + rng.below(65000 - 200) as usize;
            let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let opts = 4 * rng.below(11) as usize;
            let vlan = rng.below(3) as usize;
            let mss = [MIN_MSS, 89, 536, 1400, 1448, 8948, 65000][rng.below(7) as usize];
            let f = tcp_frame(v6, &payload, opts, vlan, tcp::flags::ACK | tcp::flags::PSH);
            let o = Offload::parse(&hdr(v6, mss, &f), &f, f.len() as u32, &ALL)
                .unwrap_or_else(|e| panic!("case {case}: {e:?}"));
            let hl = o.tso.unwrap().hdr_len as usize;
            let segs = segment(&f, &o);
            assert_eq!(segs.len(), len.div_ceil(mss as usize), "case {case}");
            let mut back = Vec::new();
            let mut seq = 0xffff_f000u32;
            for s in &segs {
                assert_eq!(l4_checksum_ok(s), Some(true), "case {case}: checksum");
                let tcp = TcpPacket::new_checked(&s[o.tso.unwrap().l4 as usize..]).unwrap();
                assert_eq!(tcp.seq_number(), seq, "case {case}: sequence");
                seq = seq.wrapping_add((s.len() - hl) as u32);
                assert!(s.len() - hl <= mss as usize);
                back.extend_from_slice(&s[hl..]);
            }
            assert_eq!(back, payload, "case {case}: payload");
        }
    }

    #[test]
    fn a_partial_checksum_is_completed() {
        let mut rng = Rng(7);
        for v6 in [false, true] {
            for len in [0usize, 1, 2, 3, 1000, 1459] {
                let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                let mut f = tcp_frame(v6, &payload, 0, 0, tcp::flags::ACK);
                let l4 = if v6 { 54 } else { 34 };
                complete_checksum(&mut f, l4, 16);
                assert_eq!(l4_checksum_ok(&f), Some(true), "v6 {v6} len {len}");
            }
        }
    }

    #[test]
    fn a_device_job_says_what_a_nic_needs() {
        let (src4, dst4) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let (src6, dst6) = (Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1), Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2));
        // TSO over IPv4 behind a VLAN tag, TCP options: lengths, the IPv4 checksum zeroed, the
        // TCP field the pseudo header's sum without the length (DPDK's convention for TSO).
        let f = tcp_frame(false, &[7u8; 5000], 12, 1, tcp::flags::ACK);
        let o = Offload::parse(&hdr(false, 1400, &f), &f[..MAX_HDR], f.len() as u32, &ALL).unwrap();
        let j = DeviceJob::new(&f[..MAX_HDR], &o).unwrap();
        let pseudo0 = checksum::pseudo_header_v4(src4, dst4, 6, 0).fold();
        assert_eq!((j.tso, j.v6, j.udp, j.l2, j.l3, j.l4), (Some(1400), false, false, 18, 20, 32));
        assert_eq!(j.fields, [(18 + 10, 0), (38 + 16, pseudo0)]);
        // TSO over IPv6: no header checksum.
        let f = tcp_frame(true, &[7u8; 5000], 0, 0, tcp::flags::ACK);
        let o = Offload::parse(&hdr(true, 1400, &f), &f[..MAX_HDR], f.len() as u32, &ALL).unwrap();
        let j = DeviceJob::new(&f[..MAX_HDR], &o).unwrap();
        let tcp_field = (54 + 16, checksum::pseudo_header_v6(src6, dst6, 6, 0).fold());
        assert_eq!((j.tso, j.v6, j.l2, j.l3, j.l4, j.fields), (Some(1400), true, 14, 40, 20, [tcp_field, tcp_field]));
        // ECN TSO stays with the switch (a device may not clear CWR after the first segment).
        let mut h = hdr(true, 1400, &f);
        h.gso_type |= gso::ECN;
        let o = Offload::parse(&h, &f[..MAX_HDR], f.len() as u32, &ALL).unwrap();
        assert_eq!(DeviceJob::new(&f[..MAX_HDR], &o), None);
        // A checksum only, TCP over IPv4: the pseudo header's sum with the TCP length.
        let f = tcp_frame(false, &[1u8; 100], 0, 0, tcp::flags::ACK);
        let csum_only = |start: u16, off: u16| Offload { csum: Some((start, off)), tso: None };
        let j = DeviceJob::new(&f, &csum_only(34, 16)).unwrap();
        let pseudo = checksum::pseudo_header_v4(src4, dst4, 6, 120).fold();
        assert_eq!((j.tso, j.udp, j.l2, j.l3, j.fields), (None, false, 14, 20, [(50, pseudo), (50, pseudo)]));
        // UDP: the field at offset 6.
        let mut u = f.clone();
        u[14 + 9] = 17;
        let j = DeviceJob::new(&u, &csum_only(34, 6)).unwrap();
        let pseudo = checksum::pseudo_header_v4(src4, dst4, 17, 120).fold();
        assert_eq!((j.udp, j.l4, j.fields[0]), (true, 8, (40, pseudo)));
        // Checksums a NIC cannot place: not at the transport header, not at its checksum field,
        // not TCP/UDP, a fragment; and headers cut short. Each stays with the switch.
        assert_eq!(DeviceJob::new(&f, &csum_only(14, 10)), None);
        assert_eq!(DeviceJob::new(&f, &csum_only(34, 6)), None);
        assert_eq!(DeviceJob::new(&u, &csum_only(34, 16)), None);
        let mut icmp = f.clone();
        icmp[14 + 9] = 1;
        assert_eq!(DeviceJob::new(&icmp, &csum_only(34, 2)), None);
        let mut frag = f.clone();
        frag[14 + 6] = 0x20;
        assert_eq!(DeviceJob::new(&frag, &csum_only(34, 16)), None);
        for cut in [0, 13, 20, 33] {
            assert_eq!(DeviceJob::new(&f[..cut], &csum_only(34, 16)), None, "cut at {cut}");
        }
        let f = tcp_frame(false, &[7u8; 5000], 12, 1, tcp::flags::ACK);
        let o = Offload::parse(&hdr(false, 1400, &f), &f[..MAX_HDR], f.len() as u32, &ALL).unwrap();
        assert_eq!(DeviceJob::new(&f[..60], &o), None);
        assert_eq!(DeviceJob::new(&[], &Offload::NONE), None);
    }

    #[test]
    fn malformed_offload_headers_are_refused() {
        let f = tcp_frame(false, &[0u8; 3000], 0, 0, tcp::flags::ACK);
        let len = f.len() as u32;
        let good = hdr(false, 1448, &f);
        let n = |csum, tso4, tso6, ecn| Negotiated { csum, tso4, tso6, ecn };
        let p = |h: VirtioNetHdr, s: Negotiated| Offload::parse(&h, &f, len, &s);
        let all = n(true, true, true, false);
        assert!(p(good, all).is_ok());
        let csum_past = VirtioNetHdr { gso_type: 0, csum_start: len as u16 - 17, ..good };
        assert_eq!(p(csum_past, all), Err(OffloadError::CsumOutOfFrame));
        assert_eq!(
            p(VirtioNetHdr { gso_type: 0, ..good }, n(false, false, false, false)),
            Err(OffloadError::NotNegotiated)
        );
        assert_eq!(p(VirtioNetHdr { gso_size: 0, ..good }, all), Err(OffloadError::GsoSizeTooSmall));
        assert_eq!(p(VirtioNetHdr { gso_size: MIN_MSS - 1, ..good }, all), Err(OffloadError::GsoSizeTooSmall));
        assert!(p(VirtioNetHdr { gso_size: MIN_MSS, ..good }, all).is_ok());
        assert_eq!(p(VirtioNetHdr { hdr_len: len as u16 + 1, ..good }, all), Err(OffloadError::GsoHeaders));
        assert_eq!(p(good, n(true, false, true, false)), Err(OffloadError::NotNegotiated), "TSO4 not negotiated");
        assert_eq!(p(VirtioNetHdr { gso_type: gso::TCPV6, ..good }, all), Err(OffloadError::GsoHeaders));
        assert_eq!(p(VirtioNetHdr { gso_type: gso::UDP, ..good }, all), Err(OffloadError::GsoType));
        assert_eq!(p(VirtioNetHdr { gso_type: gso::TCPV4 | gso::ECN, ..good }, all), Err(OffloadError::NotNegotiated));
        assert!(p(VirtioNetHdr { gso_type: gso::TCPV4 | gso::ECN, ..good }, n(true, true, true, true)).is_ok());
        // Not TCP: an ARP frame with a TSO header.
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&ethertype::ARP.to_be_bytes());
        assert_eq!(Offload::parse(&good, &arp, len, &all), Err(OffloadError::GsoHeaders));
        // What a receiver takes as it is.
        let o = p(good, all).unwrap();
        assert!(
            o.taken_by(&all) && !o.taken_by(&n(true, false, true, true)) && !o.taken_by(&n(false, true, true, true))
        );
        // A plain frame with no offload at all.
        assert_eq!(p(VirtioNetHdr::PLAIN, n(false, false, false, false)), Ok(Offload::NONE));
    }

    /// The sender may rewrite its headers between classification and segmentation: whatever
    /// the bytes then say (an IHL of 60, a TCP data offset of 0), segmenting stays inside the
    /// layout it was given and never panics.
    #[test]
    fn headers_rewritten_after_parsing_never_panic() {
        let f = tcp_frame(false, &[7u8; 5000], 0, 0, tcp::flags::ACK);
        let o = Offload::parse(&hdr(false, 1448, &f), &f, f.len() as u32, &ALL).unwrap();
        let t = o.tso.unwrap();
        let mut evil = f.clone();
        evil[14] = 0x4f; // IHL 15
        evil[46] = 0x00; // TCP data offset 0
        let mut out = vec![0u8; MAX_HDR];
        for i in 0..4 {
            segment_headers(&evil, &t, i, 4, i * 1448, 1448, &mut out);
            finish_tcp_checksum(&mut out, &t, Sum::new());
        }
    }

    #[test]
    fn offsets_follow_a_rewritten_ethernet_header() {
        let f = tcp_frame(false, &[0u8; 100], 0, 0, tcp::flags::ACK);
        let o = Offload::parse(&hdr(false, 1448, &f), &f, f.len() as u32, &ALL).unwrap();
        let pushed = o.shifted(4);
        assert_eq!(pushed.csum, Some((38, 16)));
        assert_eq!(pushed.tso.unwrap().hdr_len, 58);
        let h = pushed.to_hdr();
        assert_eq!((h.flags, h.gso_type, h.gso_size, h.hdr_len, h.csum_start, h.csum_offset), (1, 1, 1448, 58, 38, 16));
    }
}
