//! VXLAN (RFC 7348) over IPv4: the outer Ethernet, IPv4 and UDP headers and the VXLAN header
//! in front of an inner Ethernet frame, 50 bytes in all. [`VxlanPacket`] is a checked view of
//! the VXLAN header and [`VxlanRepr`] its parsed form (the VNI), as the rest of `wire/`;
//! [`Outer`] is one tunnel's headers as a template, filled in per frame (lengths, the IP
//! identification and checksum, the UDP source port that spreads flows over the underlay's
//! paths). Whether a received frame is for this host's VTEP is the receiver's question
//! (`datapath::rx::vxlan`), asked over these views and `ipv4`'s and `udp`'s.

use std::net::Ipv4Addr;

use super::checksum::Sum;
use super::mac::MacAddr;
use super::{Error, ethertype, protocol};

/// The IANA port for VXLAN.
pub const DEFAULT_PORT: u16 = 4789;
/// The VXLAN header.
pub const HEADER_LEN: usize = 8;
/// Outer Ethernet (14), IPv4 without options (20), UDP (8) and VXLAN (8): what a frame grows by.
pub const OUTER_LEN: usize = 14 + 20 + 8 + HEADER_LEN;
/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// The VXLAN flags byte with its I bit: the VNI is valid.
pub const FLAG_VNI: u8 = 0x08;
/// Offsets in the outer headers.
const IP: usize = 14;
const UDP: usize = IP + 20;
/// Where the VXLAN header starts in an encapsulated frame.
pub const VXLAN_AT: usize = UDP + 8;

/// A checked view of a VXLAN header (8 bytes: flags, reserved, the VNI, reserved) and the
/// inner frame behind it.
#[derive(Debug, Clone, Copy)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
    /// A view of a buffer holding at least the VXLAN header.
    pub fn new_checked(buffer: T) -> Result<VxlanPacket<T>, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(VxlanPacket { buffer })
    }

    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    /// The 24-bit VNI (meaningful when the I flag is set).
    pub fn vni(&self) -> u32 {
        let b = self.buffer.as_ref();
        u32::from_be_bytes([0, b[4], b[5], b[6]])
    }

    /// The inner frame (as much of it as the buffer holds).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VxlanPacket<T> {
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[0] = v;
    }

    pub fn set_vni(&mut self, vni: u32) {
        self.buffer.as_mut()[4..7].copy_from_slice(&vni.to_be_bytes()[1..]);
    }
}

/// A VXLAN header as parsed: its VNI. A header without the I flag is malformed (RFC 7348: the
/// VNI is not valid); the reserved bits are ignored on receipt and written zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanRepr {
    pub vni: u32,
}

impl VxlanRepr {
    pub fn parse<T: AsRef<[u8]>>(p: &VxlanPacket<T>) -> Result<VxlanRepr, Error> {
        if p.flags() & FLAG_VNI == 0 {
            return Err(Error::Malformed);
        }
        Ok(VxlanRepr { vni: p.vni() })
    }

    /// Writes the header (all 8 bytes) into `p`.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut VxlanPacket<T>) {
        p.buffer.as_mut()[..HEADER_LEN].fill(0);
        p.set_flags(FLAG_VNI);
        p.set_vni(self.vni);
    }
}

/// One tunnel's outer headers, to a remote endpoint in one VNI: everything but what depends on
/// the frame, which `fill` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outer {
    bytes: [u8; OUTER_LEN],
    /// The IPv4 header's sum with its length and identification fields zero.
    ip_sum: Sum,
}

impl Outer {
    /// Headers from `src_mac`/`local` to `dst_mac` (the next hop's) / `remote`, UDP port `port`,
    /// VNI `vni`, with time to live `ttl`. The don't-fragment bit is set: a frame too large
    /// for the underlay is dropped here rather than fragmented.
    pub fn new(
        src_mac: MacAddr,
        dst_mac: MacAddr,
        local: Ipv4Addr,
        remote: Ipv4Addr,
        port: u16,
        vni: u32,
        ttl: u8,
    ) -> Outer {
        let mut b = [0u8; OUTER_LEN];
        b[0..6].copy_from_slice(&dst_mac.0);
        b[6..12].copy_from_slice(&src_mac.0);
        b[12..14].copy_from_slice(&ethertype::IPV4.to_be_bytes());
        let ip = &mut b[IP..UDP];
        ip[0] = 0x45;
        ip[6] = 0x40; // don't fragment
        ip[8] = ttl;
        ip[9] = protocol::UDP;
        ip[12..16].copy_from_slice(&local.octets());
        ip[16..20].copy_from_slice(&remote.octets());
        let mut s = Sum::new();
        s.add_bytes(ip);
        b[UDP + 2..UDP + 4].copy_from_slice(&port.to_be_bytes());
        VxlanRepr { vni }.emit(&mut VxlanPacket { buffer: &mut b[VXLAN_AT..] });
        Outer { bytes: b, ip_sum: s }
    }

    /// The headers for an inner frame of `inner_len` bytes: lengths, the IP identification
    /// `ident` and checksum, and UDP source port `src_port` (RFC 7348 asks for a hash of the
    /// inner frame, so the underlay spreads flows over its paths; UDP checksum zero, as RFC
    /// 7348 allows over IPv4).
    #[inline]
    pub fn fill(&self, out: &mut [u8], inner_len: usize, ident: u16, src_port: u16) {
        out[..OUTER_LEN].copy_from_slice(&self.bytes);
        let ip_len = (20 + 8 + HEADER_LEN + inner_len) as u16;
        out[IP + 2..IP + 4].copy_from_slice(&ip_len.to_be_bytes());
        out[IP + 4..IP + 6].copy_from_slice(&ident.to_be_bytes());
        let mut sum = self.ip_sum;
        sum.add_u16(ip_len).add_u16(ident);
        out[IP + 10..IP + 12].copy_from_slice(&sum.finish().to_be_bytes());
        out[UDP..UDP + 2].copy_from_slice(&src_port.to_be_bytes());
        out[UDP + 4..UDP + 6].copy_from_slice(&(ip_len - 20).to_be_bytes());
    }

    pub fn vni(&self) -> u32 {
        VxlanPacket { buffer: &self.bytes[VXLAN_AT..] }.vni()
    }
}

/// The UDP source port for an inner frame whose first 12 bytes are `addrs` (its destination
/// and source MACs): a hash into the dynamic range 49152-65535 (RFC 7348, section 5), the same
/// for every frame between the same two stations.
#[inline]
pub fn source_port(addrs: &[u8; 12]) -> u16 {
    let a = u64::from_le_bytes(addrs[0..8].try_into().unwrap());
    let b = u32::from_le_bytes(addrs[8..12].try_into().unwrap()) as u64;
    let h = (a ^ b.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    49152 + ((h >> 50) as u16 & 0x3fff)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 11);
    const REMOTE: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 12);

    fn outer() -> Outer {
        Outer::new(MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]), LOCAL, REMOTE, DEFAULT_PORT, 100, 64)
    }

    /// An encapsulated frame: the headers `outer` fills for a 60-byte inner frame.
    fn encapsulated(inner_len: usize) -> Vec<u8> {
        let mut f = vec![0u8; OUTER_LEN + inner_len];
        outer().fill(&mut f, inner_len, 7, 50000);
        f[OUTER_LEN..OUTER_LEN + 12].copy_from_slice(&[0xff; 12]);
        f
    }

    #[test]
    fn filled_headers_are_a_valid_ipv4_udp_vxlan_frame() {
        let f = encapsulated(60);
        let ip = &f[IP..UDP];
        let mut s = Sum::new();
        s.add_bytes(ip);
        assert_eq!(s.finish(), 0, "the IPv4 checksum verifies");
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]) as usize, 20 + 8 + 8 + 60);
        assert_eq!(u16::from_be_bytes([f[UDP + 4], f[UDP + 5]]) as usize, 8 + 8 + 60);
        assert_eq!(u16::from_be_bytes([f[UDP], f[UDP + 1]]), 50000);
        assert_eq!(outer().vni(), 100);
        let v = VxlanPacket::new_checked(&f[VXLAN_AT..]).unwrap();
        assert_eq!(VxlanRepr::parse(&v), Ok(VxlanRepr { vni: 100 }));
        assert_eq!(v.payload().len(), 60);
    }

    #[test]
    fn the_header_view_checks_length_and_the_i_flag_and_emits_what_it_parses() {
        assert_eq!(VxlanPacket::new_checked(&[0x08u8; 7][..]).err(), Some(Error::Truncated));
        let mut b = [0xffu8; 8];
        let r = VxlanRepr { vni: MAX_VNI };
        r.emit(&mut VxlanPacket::new_checked(&mut b[..]).unwrap());
        assert_eq!(b, [0x08, 0, 0, 0, 0xff, 0xff, 0xff, 0], "reserved bits written zero");
        assert_eq!(VxlanRepr::parse(&VxlanPacket::new_checked(&b[..]).unwrap()), Ok(r));
        b[0] = 0;
        assert_eq!(VxlanRepr::parse(&VxlanPacket::new_checked(&b[..]).unwrap()), Err(Error::Malformed), "no I flag");
    }

    #[test]
    fn source_ports_stay_in_the_dynamic_range_and_spread() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000u32 {
            let mut a = [0u8; 12];
            a[8..12].copy_from_slice(&i.to_be_bytes());
            let p = source_port(&a);
            assert!(p >= 49152);
            seen.insert(p);
        }
        assert!(seen.len() > 900, "{} distinct ports for 1000 flows", seen.len());
    }
}
