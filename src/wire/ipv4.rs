//! IPv4 headers (RFC 791).

use std::net::Ipv4Addr;

use super::checksum::{self, Sum};
use super::{Error, be16, set_be16};

/// IP protocol numbers pvswitch knows by name (also IPv6 next-header values).
pub mod protocol {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
    pub const SCTP: u8 = 132;
}

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLG_OFF: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// The header without options.
pub const MIN_HEADER_LEN: usize = 20;
const DONT_FRAG: u16 = 0x4000;
const MORE_FRAGS: u16 = 0x2000;
pub const OFFSET_MASK: u16 = 0x1fff;

/// A checked view of an IPv4 packet. `new_checked` checks the fixed header only: flow keys
/// are extracted from the first bytes of a frame, so options and payload may be cut short.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Ipv4Packet<T> {
        Ipv4Packet { buffer }
    }

    /// A view of a buffer holding the fixed 20-byte header of a well-formed IPv4 header:
    /// version 4, header length at least 20, total length at least the header length. The
    /// options may extend past the buffer (see [`Ipv4Packet::header_complete`]).
    pub fn new_checked(buffer: T) -> Result<Ipv4Packet<T>, Error> {
        let b = buffer.as_ref();
        if b.len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = Ipv4Packet { buffer };
        if p.version() != 4 || p.header_len() < MIN_HEADER_LEN || (p.total_len() as usize) < p.header_len() {
            return Err(Error::Malformed);
        }
        Ok(p)
    }

    /// Whether the buffer holds the whole header, options included.
    pub fn header_complete(&self) -> bool {
        self.header_len() <= self.buffer.as_ref().len()
    }

    /// Whether the buffer holds the whole packet (`total_len` bytes).
    pub fn is_complete(&self) -> bool {
        self.total_len() as usize <= self.buffer.as_ref().len()
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[field::VER_IHL] >> 4
    }

    pub fn header_len(&self) -> usize {
        (self.b()[field::VER_IHL] & 0x0f) as usize * 4
    }

    /// The TOS byte: DSCP (6 bits) and ECN (2 bits).
    pub fn tos(&self) -> u8 {
        self.b()[field::TOS]
    }

    pub fn dscp(&self) -> u8 {
        self.tos() >> 2
    }

    pub fn ecn(&self) -> u8 {
        self.tos() & 3
    }

    pub fn total_len(&self) -> u16 {
        be16(self.b(), field::LENGTH).unwrap()
    }

    pub fn ident(&self) -> u16 {
        be16(self.b(), field::IDENT).unwrap()
    }

    pub fn dont_frag(&self) -> bool {
        be16(self.b(), field::FLG_OFF).unwrap() & DONT_FRAG != 0
    }

    pub fn more_frags(&self) -> bool {
        be16(self.b(), field::FLG_OFF).unwrap() & MORE_FRAGS != 0
    }

    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be16(self.b(), field::FLG_OFF).unwrap() & OFFSET_MASK
    }

    /// Whether this is a fragment (any but a whole datagram).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    pub fn ttl(&self) -> u8 {
        self.b()[field::TTL]
    }

    pub fn protocol(&self) -> u8 {
        self.b()[field::PROTOCOL]
    }

    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM).unwrap()
    }

    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from_be_bytes(self.b()[field::SRC..field::SRC + 4].try_into().unwrap()))
    }

    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from_be_bytes(self.b()[field::DST..field::DST + 4].try_into().unwrap()))
    }

    /// Whether the header checksum is right (false if the header is cut off).
    pub fn verify_checksum(&self) -> bool {
        self.header_complete() && checksum::checksum(&self.b()[..self.header_len()]) == 0
    }

    /// The payload as far as the buffer holds it (it ends at `total_len`).
    pub fn payload(&self) -> &[u8] {
        let b = self.b();
        let end = (self.total_len() as usize).min(b.len());
        b.get(self.header_len()..end).unwrap_or(&[])
    }

    /// The TCP/UDP pseudo header for this packet's payload of `l4_len` bytes.
    pub fn pseudo_header(&self, l4_len: u32) -> Sum {
        checksum::pseudo_header_v4(self.src_addr(), self.dst_addr(), self.protocol(), l4_len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn set_total_len(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), field::LENGTH, v);
    }

    pub fn set_ident(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), field::IDENT, v);
    }

    /// Sets the fragment flags and offset word as a whole (DF kept as given).
    pub fn set_frag(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let v = (dont_frag as u16 * DONT_FRAG) | (more_frags as u16 * MORE_FRAGS) | (offset & OFFSET_MASK);
        set_be16(self.buffer.as_mut(), field::FLG_OFF, v);
    }

    pub fn set_tos(&mut self, v: u8) {
        self.buffer.as_mut()[field::TOS] = v;
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(c);
    }
}

/// The fields of an IPv4 header pvswitch builds or rewrites (no options).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub payload_len: u16,
    pub ttl: u8,
    pub tos: u8,
    pub ident: u16,
    pub dont_frag: bool,
}

impl Ipv4Repr {
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Ipv4Repr {
        Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: p.total_len() - p.header_len() as u16,
            ttl: p.ttl(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
        }
    }

    /// Writes a 20-byte header with a correct checksum into `out[..20]`.
    pub fn emit(&self, out: &mut [u8]) {
        out[field::VER_IHL] = 0x45;
        out[field::TOS] = self.tos;
        set_be16(out, field::LENGTH, self.payload_len + MIN_HEADER_LEN as u16);
        set_be16(out, field::IDENT, self.ident);
        set_be16(out, field::FLG_OFF, if self.dont_frag { DONT_FRAG } else { 0 });
        out[field::TTL] = self.ttl;
        out[field::PROTOCOL] = self.protocol;
        out[field::SRC..field::SRC + 4].copy_from_slice(&self.src.octets());
        out[field::DST..field::DST + 4].copy_from_slice(&self.dst.octets());
        let mut p = Ipv4Packet::new_unchecked(&mut out[..MIN_HEADER_LEN]);
        p.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP packet from Wireshark's sample captures (header checksum 0xb861).
    const PACKET: [u8; 24] = [
        0x45, 0x00, 0x00, 0x18, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
        0x00, 0xc7, 1, 2, 3, 4,
    ];

    #[test]
    fn view() {
        let mut b = PACKET;
        b[3] = 0x18;
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.header_len(), p.total_len(), p.protocol()), (4, 20, 24, protocol::UDP));
        assert_eq!((p.src_addr(), p.dst_addr()), (Ipv4Addr::new(192, 168, 0, 1), Ipv4Addr::new(192, 168, 0, 199)));
        assert!(p.dont_frag() && !p.is_fragment() && p.is_complete());
        assert_eq!(p.payload(), &[1, 2, 3, 4]);
        assert!(Ipv4Packet::new_checked(&b[..19]).is_err());
        let mut v6 = b;
        v6[0] = 0x65;
        assert_eq!(Ipv4Packet::new_checked(&v6[..]).unwrap_err(), Error::Malformed);
        // Options cut off by the buffer: the fixed header is still readable.
        let mut long_ihl = b;
        long_ihl[0] = 0x46;
        let p = Ipv4Packet::new_checked(&long_ihl[..21]).unwrap();
        assert!(!p.header_complete() && p.payload().is_empty() && !p.verify_checksum());
    }

    #[test]
    fn checksum_fill_and_repr() {
        let mut b = PACKET;
        let mut p = Ipv4Packet::new_checked(&mut b[..]).unwrap();
        p.set_checksum(0);
        assert!(!p.verify_checksum());
        p.fill_checksum();
        assert_eq!(p.checksum(), 0xb861 + (0x73 - 0x18)); // the capture had total length 0x73
        assert!(p.verify_checksum());
        let r = Ipv4Repr::parse(&p);
        let mut out = [0u8; 20];
        r.emit(&mut out);
        assert_eq!(out, b[..20]);
    }
}
