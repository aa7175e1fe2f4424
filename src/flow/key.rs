//! The flow key: the packet header fields a flow matches on, packed (extraction from a frame
//! is in extract.rs).
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
//! | 4    | ct_state (8)        | ct_zone (16), ct_mark (32), 8 bits unused            |
//!
//! Word 4 is the connection tracker's metadata, not a header: 0 in every key extracted from a
//! frame, set by a `ct` action for the tables after it (`datapath/pipeline.rs`).
//! MAC addresses are stored as 48-bit big-endian numbers (first octet most significant).

use std::fmt;

use crate::wire::{MacAddr, VlanTag};

/// Number of `u64` words in a [`FlowKey`].
pub const WORDS: usize = 5;

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
    CtState,
    CtZone,
    CtMark,
}

impl Field {
    /// All fields, in declaration order (`Field::X as usize` indexes this array).
    pub const ALL: [Field; 14] = [
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
        Field::CtState,
        Field::CtZone,
        Field::CtMark,
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
            Field::CtState => (4, 0, 8),
            Field::CtZone => (4, 8, 16),
            Field::CtMark => (4, 24, 32),
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
            Field::CtState => "ct_state",
            Field::CtZone => "ct_zone",
            Field::CtMark => "ct_mark",
        }
    }
}

/// How deep into a frame a key has to be read: the last header holding a field of a mask.
/// Fields of deeper headers stay 0 in a key extracted to a shallower depth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Depth {
    /// Only `in_port` (and the tracker's metadata): the frame's bytes are not read.
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
            Field::InPort | Field::CtState | Field::CtZone | Field::CtMark => Depth::Port,
            Field::DlDst | Field::DlSrc | Field::DlType | Field::VlanTci => Depth::L2,
            Field::NwSrc | Field::NwDst | Field::NwProto | Field::NwTos => Depth::L3,
            Field::TpSrc | Field::TpDst => Depth::L4,
        }
    }
}

/// Packet header fields and the tracker's metadata, or a mask over them: the key flows match
/// on. See the module docs for the layout.
pub type FlowKey = Key<WORDS>;

/// The first four words alone: a frame's header fields as table 0 sees them (the tracker's word
/// is 0 there, for every frame). The exact-match cache, classify's keys and table 0's classifier
/// work on these, so a table without `ct` pays nothing for the fifth word.
pub type PacketKey = Key<PACKET_WORDS>;

/// Words of a [`PacketKey`].
pub const PACKET_WORDS: usize = 4;

/// `N` words of a key (see [`FlowKey`], [`PacketKey`]): a field in a word past `N` reads 0
/// and is not stored.
#[derive(Clone, Copy, Eq)]
pub struct Key<const N: usize> {
    w: [u64; N],
}

impl<const N: usize> Default for Key<N> {
    fn default() -> Key<N> {
        Key { w: [0; N] }
    }
}

impl<const N: usize> std::hash::Hash for Key<N> {
    /// The words, as `eq` compares them (for the classifier's grouping by mask; the data
    /// path hashes with [`Key::hash`]).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.w.hash(state)
    }
}

impl<const N: usize> PartialEq for Key<N> {
    /// Every word XORed and the differences ORed: no branch, and no call to `bcmp` for an
    /// odd number of words (a derived comparison of five words made one).
    #[inline(always)]
    fn eq(&self, other: &Key<N>) -> bool {
        (0..N).fold(0, |d, i| d | (self.w[i] ^ other.w[i])) == 0
    }
}

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xD6E8_FEB8_6659_FD93;
const K3: u64 = 0xA076_1D64_78BD_642F;
const K4: u64 = 0xE703_7ED1_A0B4_28DB;

/// The 128-bit product of `a` and `b`, its halves XORed: every output bit depends on every
/// input bit of both.
#[inline(always)]
fn fold(a: u64, b: u64) -> u64 {
    let p = a as u128 * b as u128;
    (p as u64) ^ ((p >> 64) as u64)
}

impl<const N: usize> Key<N> {
    /// The mask that matches every bit of every field.
    pub const EXACT: Key<N> = Key { w: [u64::MAX; N] };

    /// A key from its raw words (see the module docs for the layout).
    pub const fn from_words(w: [u64; N]) -> Key<N> {
        Key { w }
    }

    /// The raw words.
    pub const fn words(&self) -> &[u64; N] {
        &self.w
    }

    /// The value of `f` (right-aligned).
    #[inline]
    pub const fn get(&self, f: Field) -> u64 {
        let (w, s, _) = f.layout();
        if w >= N {
            return 0;
        }
        (self.w[w] >> s) & f.max()
    }

    /// Sets `f` to `v`, truncated to the field's width.
    #[inline]
    pub fn set(&mut self, f: Field, v: u64) {
        let (w, s, _) = f.layout();
        if w >= N {
            return;
        }
        self.w[w] = (self.w[w] & !(f.max() << s)) | ((v & f.max()) << s);
    }

    /// Builder form of [`FlowKey::set`].
    #[inline]
    pub fn with(mut self, f: Field, v: u64) -> Key<N> {
        self.set(f, v);
        self
    }

    /// Word-wise AND: this key with `mask` applied.
    #[inline]
    pub fn and(&self, mask: &Key<N>) -> Key<N> {
        Key { w: std::array::from_fn(|i| self.w[i] & mask.w[i]) }
    }

    /// Word-wise OR: as masks, the fields either one matches.
    #[inline]
    pub fn or(&self, other: &Key<N>) -> Key<N> {
        Key { w: std::array::from_fn(|i| self.w[i] | other.w[i]) }
    }

    /// True if every bit is 0 (as a mask: matches everything).
    #[inline]
    pub fn is_zero(&self) -> bool {
        self.w.iter().all(|&w| w == 0)
    }

    /// Hash of the key with `mask` applied; equal to `self.and(mask).hash()`. The words are
    /// folded in pairs by two independent 64x64->128 multiplies, then once more: three
    /// multiplies deep where a word-by-word chain was four, so a burst's hashes overlap. The
    /// tracker's word, if the key has it, joins the last fold rotated, which costs no
    /// multiply (a [`PacketKey`]'s hash is a [`FlowKey`]'s whose tracker word is 0).
    #[inline(always)]
    pub fn hash_masked(&self, mask: &Key<N>) -> u64 {
        let w = |i: usize| if i < N { self.w[i] & mask.w[i] } else { 0 };
        let a = fold(w(0) ^ K1, w(1) ^ K2);
        let b = fold(w(2) ^ K3, w(3) ^ K4);
        fold(a ^ K2, b ^ K1 ^ w(4).rotate_left(29))
    }

    /// Hash of the whole key.
    #[inline(always)]
    pub fn hash(&self) -> u64 {
        self.hash_masked(&Key::EXACT)
    }
}

impl FlowKey {
    /// The tracker's word alone.
    #[inline]
    pub fn full_only(&self) -> u64 {
        self.w[4]
    }

    /// The header fields alone (the tracker's word dropped).
    #[inline]
    pub fn packet(&self) -> PacketKey {
        Key { w: [self.w[0], self.w[1], self.w[2], self.w[3]] }
    }
}

impl PacketKey {
    /// The key with the tracker's word 0, as a frame meets table 0.
    #[inline]
    pub fn full(&self) -> FlowKey {
        Key { w: [self.w[0], self.w[1], self.w[2], self.w[3], 0] }
    }
}

impl<const N: usize> Key<N> {
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
    pub fn ct_state(&self) -> u8 {
        self.get(Field::CtState) as u8
    }
    pub fn ct_zone(&self) -> u16 {
        self.get(Field::CtZone) as u16
    }
    pub fn ct_mark(&self) -> u32 {
        self.get(Field::CtMark) as u32
    }
    pub fn tp_dst(&self) -> u16 {
        self.get(Field::TpDst) as u16
    }

    /// The deepest header holding a bit of this mask.
    pub fn depth(&self) -> Depth {
        Field::ALL.iter().filter(|&&f| self.get(f) != 0).map(|f| f.depth()).max().unwrap_or(Depth::Port)
    }
}

impl<const N: usize> fmt::Debug for Key<N> {
    /// All fields, e.g. `FlowKey { in_port=1, dl_dst=.., .., tp_dst=80 }`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = |a: u32| std::net::Ipv4Addr::from(a).to_string();
        write!(
            f,
            "FlowKey {{ in_port={}, dl_dst={}, dl_src={}, dl_type=0x{:04x}, vlan_tci=0x{:04x}, nw_src={}, nw_dst={}, \
             nw_proto={}, nw_tos={}, tp_src={}, tp_dst={}, ct_state=0x{:02x}, ct_zone={}, ct_mark=0x{:x} }}",
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
            self.tp_dst(),
            self.ct_state(),
            self.ct_zone(),
            self.ct_mark()
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
        // Every bit but the tracker word's top byte (unused).
        assert_eq!(seen, [u64::MAX, u64::MAX, u64::MAX, u64::MAX, u64::MAX >> 8]);
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
}
