//! The flow key: the packet header fields a flow matches on, and their extraction from a frame.
//!
//! A [`FlowKey`] is four `u64` words, so applying a mask is four ANDs, comparing two keys is
//! four compares and hashing is four multiply rounds. The same type serves as a key (field
//! values) and as a mask (1 bits are the bits that must match). Every bit of the four words
//! belongs to exactly one field:
//!
//! | word | bits 0..            | bits ..64                                            |
//! |------|---------------------|------------------------------------------------------|
//! | 0    | dl_dst (48)         | in_port (16)                                         |
//! | 1    | dl_src (48)         | dl_type (16)                                         |
//! | 2    | nw_src (32)         | nw_dst (32)                                          |
//! | 3    | vlan_tci (16)       | nw_proto (8), nw_tos (8), tp_src (16), tp_dst (16)   |
//!
//! MAC addresses are stored as 48-bit big-endian numbers (first octet most significant).

use std::fmt;

#[cfg(test)]
use crate::wire::Ipv4Packet;
#[cfg(test)]
use crate::wire::arp::ArpPacket;
#[cfg(test)]
use crate::wire::tcp::TcpPacket;
use crate::wire::{MacAddr, VlanTag, ethernet, ethertype, protocol};

/// Number of `u64` words in a [`FlowKey`].
pub const WORDS: usize = 4;

/// What OVS puts in `dl_type` for 802.3 frames whose type/length field is a length (< 0x600).
pub const ETH_TYPE_NONE: u16 = 0x05ff;
/// The "tag present" bit of `vlan_tci` (the DEI position, as OVS uses it).
pub const VLAN_PRESENT: u16 = VlanTag::DEI;

/// One field of a [`FlowKey`], with its OVS name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    InPort,
    DlDst,
    DlSrc,
    DlType,
    VlanTci,
    NwSrc,
    NwDst,
    NwProto,
    NwTos,
    TpSrc,
    TpDst,
}

impl Field {
    /// All fields, in declaration order (`Field::X as usize` indexes this array).
    pub const ALL: [Field; 11] = [
        Field::InPort,
        Field::DlDst,
        Field::DlSrc,
        Field::DlType,
        Field::VlanTci,
        Field::NwSrc,
        Field::NwDst,
        Field::NwProto,
        Field::NwTos,
        Field::TpSrc,
        Field::TpDst,
    ];

    /// (word, shift, width in bits).
    const fn layout(self) -> (usize, u32, u32) {
        match self {
            Field::DlDst => (0, 0, 48),
            Field::InPort => (0, 48, 16),
            Field::DlSrc => (1, 0, 48),
            Field::DlType => (1, 48, 16),
            Field::NwSrc => (2, 0, 32),
            Field::NwDst => (2, 32, 32),
            Field::VlanTci => (3, 0, 16),
            Field::NwProto => (3, 16, 8),
            Field::NwTos => (3, 24, 8),
            Field::TpSrc => (3, 32, 16),
            Field::TpDst => (3, 48, 16),
        }
    }

    /// Width of the field in bits.
    pub const fn bits(self) -> u32 {
        self.layout().2
    }

    /// The all-ones value of the field (its exact-match mask).
    pub const fn max(self) -> u64 {
        (1u64 << self.bits()) - 1
    }

    /// The field's name in ovs-ofctl syntax.
    pub const fn name(self) -> &'static str {
        match self {
            Field::InPort => "in_port",
            Field::DlDst => "dl_dst",
            Field::DlSrc => "dl_src",
            Field::DlType => "dl_type",
            Field::VlanTci => "vlan_tci",
            Field::NwSrc => "nw_src",
            Field::NwDst => "nw_dst",
            Field::NwProto => "nw_proto",
            Field::NwTos => "nw_tos",
            Field::TpSrc => "tp_src",
            Field::TpDst => "tp_dst",
        }
    }
}

/// How deep into a frame a key has to be read: the last header holding a field of a mask.
/// Fields of deeper headers stay 0 in a key extracted to a shallower depth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Depth {
    /// Only `in_port`: the frame's bytes are not read.
    #[default]
    Port,
    /// The Ethernet header and VLAN tag: `dl_dst`, `dl_src`, `dl_type`, `vlan_tci`.
    L2,
    /// Also the IPv4 (or ARP) header: `nw_src`, `nw_dst`, `nw_proto`, `nw_tos`.
    L3,
    /// Also the transport ports: `tp_src`, `tp_dst`.
    L4,
}

impl Field {
    /// The header this field is read from.
    pub const fn depth(self) -> Depth {
        match self {
            Field::InPort => Depth::Port,
            Field::DlDst | Field::DlSrc | Field::DlType | Field::VlanTci => Depth::L2,
            Field::NwSrc | Field::NwDst | Field::NwProto | Field::NwTos => Depth::L3,
            Field::TpSrc | Field::TpDst => Depth::L4,
        }
    }
}

/// Packet header fields, or a mask over them. See the module docs for the layout.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    w: [u64; WORDS],
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xD6E8_FEB8_6659_FD93;

impl FlowKey {
    /// The mask that matches every bit of every field.
    pub const EXACT: FlowKey = FlowKey { w: [u64::MAX; WORDS] };

    /// A key from its raw words (see the module docs for the layout).
    pub const fn from_words(w: [u64; WORDS]) -> FlowKey {
        FlowKey { w }
    }

    /// The raw words.
    pub const fn words(&self) -> &[u64; WORDS] {
        &self.w
    }

    /// The value of `f` (right-aligned).
    #[inline]
    pub const fn get(&self, f: Field) -> u64 {
        let (w, s, _) = f.layout();
        (self.w[w] >> s) & f.max()
    }

    /// Sets `f` to `v`, truncated to the field's width.
    #[inline]
    pub fn set(&mut self, f: Field, v: u64) {
        let (w, s, _) = f.layout();
        self.w[w] = (self.w[w] & !(f.max() << s)) | ((v & f.max()) << s);
    }

    /// Builder form of [`FlowKey::set`].
    #[inline]
    pub fn with(mut self, f: Field, v: u64) -> FlowKey {
        self.set(f, v);
        self
    }

    /// Word-wise AND: this key with `mask` applied.
    #[inline]
    pub fn and(&self, mask: &FlowKey) -> FlowKey {
        FlowKey { w: std::array::from_fn(|i| self.w[i] & mask.w[i]) }
    }

    /// Word-wise OR: as masks, the fields either one matches.
    #[inline]
    pub fn or(&self, other: &FlowKey) -> FlowKey {
        FlowKey { w: std::array::from_fn(|i| self.w[i] | other.w[i]) }
    }

    /// True if every bit is 0 (as a mask: matches everything).
    #[inline]
    pub fn is_zero(&self) -> bool {
        self.w.iter().all(|&w| w == 0)
    }

    /// Hash of the key with `mask` applied; equal to `self.and(mask).hash()`.
    #[inline]
    pub fn hash_masked(&self, mask: &FlowKey) -> u64 {
        let mut h = 0x243F_6A88_85A3_08D3u64;
        for i in 0..WORDS {
            h = (h ^ (self.w[i] & mask.w[i])).wrapping_mul(K1).rotate_left(29);
        }
        h ^= h >> 32;
        h = h.wrapping_mul(K2);
        h ^ (h >> 29)
    }

    /// Hash of the whole key (multiply-rotate per word, xorshift-multiply finish).
    #[inline]
    pub fn hash(&self) -> u64 {
        self.hash_masked(&FlowKey::EXACT)
    }

    pub fn in_port(&self) -> u16 {
        self.get(Field::InPort) as u16
    }
    pub fn dl_dst(&self) -> MacAddr {
        MacAddr::from_u64(self.get(Field::DlDst))
    }
    pub fn dl_src(&self) -> MacAddr {
        MacAddr::from_u64(self.get(Field::DlSrc))
    }
    /// The ethertype after the VLAN tag, if any.
    pub fn dl_type(&self) -> u16 {
        self.get(Field::DlType) as u16
    }
    /// 0 for an untagged frame, else VID | PCP << 13 | [`VLAN_PRESENT`].
    pub fn vlan_tci(&self) -> u16 {
        self.get(Field::VlanTci) as u16
    }
    /// The VLAN id, if the frame has a tag.
    pub fn vlan_vid(&self) -> Option<u16> {
        let t = self.vlan_tci();
        (t & VLAN_PRESENT != 0).then_some(t & VlanTag::VID_MASK)
    }
    /// The VLAN priority, if the frame has a tag.
    pub fn vlan_pcp(&self) -> Option<u8> {
        let t = self.vlan_tci();
        (t & VLAN_PRESENT != 0).then_some((t >> VlanTag::PCP_SHIFT) as u8)
    }
    /// IPv4 source, or the ARP sender protocol address.
    pub fn nw_src(&self) -> u32 {
        self.get(Field::NwSrc) as u32
    }
    /// IPv4 destination, or the ARP target protocol address.
    pub fn nw_dst(&self) -> u32 {
        self.get(Field::NwDst) as u32
    }
    /// IP protocol, or the low 8 bits of the ARP opcode.
    pub fn nw_proto(&self) -> u8 {
        self.get(Field::NwProto) as u8
    }
    /// The DSCP bits of the IP TOS byte (TOS & 0xfc).
    pub fn nw_tos(&self) -> u8 {
        self.get(Field::NwTos) as u8
    }
    /// TCP/UDP/SCTP source port, or the ICMP type.
    pub fn tp_src(&self) -> u16 {
        self.get(Field::TpSrc) as u16
    }
    /// TCP/UDP/SCTP destination port, or the ICMP code.
    pub fn tp_dst(&self) -> u16 {
        self.get(Field::TpDst) as u16
    }

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
    pub fn extract(in_port: u16, frame: &[u8]) -> FlowKey {
        FlowKey::extract_to(in_port, frame, Depth::L4)
    }

    /// As [`FlowKey::extract`], but reading no header deeper than `depth`: the fields of
    /// deeper headers stay 0. For a mask `m`, `extract_to(p, f, m.depth()).and(&m)` equals
    /// `extract(p, f).and(&m)`. Reads each field once, where it lies ([`FrameBytes`]).
    #[inline]
    pub fn extract_to<B: FrameBytes + ?Sized>(in_port: u16, frame: &B, depth: Depth) -> FlowKey {
        let mut k = FlowKey::default();
        k.set(Field::InPort, in_port as u64);
        if depth == Depth::Port {
            return k;
        }
        if let Some(d) = frame.at::<6>(0) {
            k.set(Field::DlDst, MacAddr(d).to_u64());
        }
        if let Some(s) = frame.at::<6>(6) {
            k.set(Field::DlSrc, MacAddr(s).to_u64());
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

    /// The deepest header holding a bit of this mask.
    pub fn depth(&self) -> Depth {
        Field::ALL.iter().filter(|&&f| self.get(f) != 0).map(|f| f.depth()).max().unwrap_or(Depth::Port)
    }

    /// An IPv4 header at `ip`: version 4, IHL >= 5 and total length >= IHL*4 (options are
    /// skipped); transport fields from the payload (what the total length and the frame both
    /// hold), unless a non-first fragment.
    #[inline]
    fn extract_ipv4<B: FrameBytes + ?Sized>(&mut self, frame: &B, ip: usize, depth: Depth) {
        let Some(h) = frame.at::<20>(ip) else { return };
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
/// they lie (a byte slice; a guest's buffer, through the data path's view of it). Parsing a
/// copy instead costs more than the copy: on the machines measured, loads from a buffer just
/// filled by a copy waited for its stores (about 13 ns a frame, BENCHMARKS.md).
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
pub(crate) fn extract_reference(in_port: u16, frame: &[u8]) -> FlowKey {
    let mut k = FlowKey::default();
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

impl fmt::Debug for FlowKey {
    /// All fields, e.g. `FlowKey { in_port=1, dl_dst=.., .., tp_dst=80 }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = |a: u32| std::net::Ipv4Addr::from(a).to_string();
        write!(
            f,
            "FlowKey {{ in_port={}, dl_dst={}, dl_src={}, dl_type=0x{:04x}, vlan_tci=0x{:04x}, nw_src={}, nw_dst={}, \
             nw_proto={}, nw_tos={}, tp_src={}, tp_dst={} }}",
            self.in_port(),
            self.dl_dst(),
            self.dl_src(),
            self.dl_type(),
            self.vlan_tci(),
            ip(self.nw_src()),
            ip(self.nw_dst()),
            self.nw_proto(),
            self.nw_tos(),
            self.tp_src(),
            self.tp_dst()
        )
    }
}

/// Frame builders shared by the tests of this module and its siblings.
#[cfg(test)]
pub(crate) mod testutil {
    /// Tiny deterministic PRNG (xorshift64*).
    pub struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        /// Uniform-ish in 0..n.
        pub fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        pub fn pick<T: Copy>(&mut self, v: &[T]) -> T {
            v[self.below(v.len() as u64) as usize]
        }
    }

    use crate::wire::MacAddr;
    pub const DST: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xbb]);
    pub const SRC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xaa]);

    /// Ethernet header with an optional 802.1Q tag and the given ethertype.
    pub fn eth(vlan: Option<u16>, ty: u16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&DST.0);
        f.extend_from_slice(&SRC.0);
        if let Some(tci) = vlan {
            f.extend_from_slice(&0x8100u16.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        f.extend_from_slice(&ty.to_be_bytes());
        f
    }

    /// An IPv4 header (IHL from `options`, which must be a multiple of 4 bytes) plus `l4`.
    pub fn ipv4(tos: u8, proto: u8, src: [u8; 4], dst: [u8; 4], frag: u16, options: &[u8], l4: &[u8]) -> Vec<u8> {
        let hl = 20 + options.len();
        let mut h = vec![0x40 | (hl / 4) as u8, tos];
        h.extend_from_slice(&((hl + l4.len()) as u16).to_be_bytes());
        h.extend_from_slice(&[0, 1]);
        h.extend_from_slice(&frag.to_be_bytes());
        h.extend_from_slice(&[64, proto, 0, 0]);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h.extend_from_slice(options);
        h.extend_from_slice(l4);
        h
    }

    /// A TCP/UDP-style L4 header start: source and destination port plus padding.
    pub fn ports(s: u16, d: u16) -> Vec<u8> {
        let mut v = s.to_be_bytes().to_vec();
        v.extend_from_slice(&d.to_be_bytes());
        v.extend_from_slice(&[0; 16]);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;

    #[test]
    fn layout_covers_every_bit_once() {
        let mut seen = [0u64; WORDS];
        for f in Field::ALL {
            let m = FlowKey::default().with(f, u64::MAX);
            for (s, w) in seen.iter_mut().zip(m.words()) {
                assert_eq!(*s & w, 0, "{f:?} overlaps");
                *s |= w;
            }
            assert_eq!(m.get(f), f.max());
            assert_eq!(Field::ALL[f as usize], f);
        }
        assert_eq!(seen, [u64::MAX; WORDS]);
    }

    #[test]
    fn set_get_truncates() {
        let mut k = FlowKey::default();
        k.set(Field::NwProto, 0x1234);
        assert_eq!(k.nw_proto(), 0x34);
        k.set(Field::TpSrc, 80);
        k.set(Field::TpDst, 443);
        k.set(Field::NwProto, 6);
        assert_eq!((k.tp_src(), k.tp_dst(), k.nw_proto()), (80, 443, 6));
    }

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
    fn hashing() {
        let a = FlowKey::default().with(Field::NwDst, 0x0a00_0001).with(Field::TpDst, 80);
        let b = a.with(Field::TpSrc, 5555);
        let m = FlowKey::default().with(Field::NwDst, u64::MAX).with(Field::TpDst, u64::MAX);
        assert_eq!(a.hash_masked(&m), b.hash_masked(&m));
        assert_eq!(a.hash_masked(&m), b.and(&m).hash());
        assert_ne!(a.hash(), b.hash());
        // Distinct small keys spread over the low bits.
        let mut buckets = [0u32; 64];
        for i in 0..6400u64 {
            buckets[(FlowKey::default().with(Field::TpDst, i).hash() & 63) as usize] += 1;
        }
        assert!(buckets.iter().all(|&n| (50..150).contains(&n)), "{buckets:?}");
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
