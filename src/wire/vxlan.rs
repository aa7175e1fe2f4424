//! VXLAN (RFC 7348) over IPv4: the outer Ethernet, IPv4 and UDP headers and the VXLAN header
//! in front of an inner Ethernet frame, 50 bytes in all. `Outer` is one tunnel's headers as a
//! template, filled in per frame (lengths, the IP identification and checksum, the UDP source
//! port that spreads flows over the underlay's paths); `parse` checks a received frame's outer
//! headers and finds its VNI and inner frame.

use std::net::Ipv4Addr;

use super::checksum::Sum;
use super::mac::MacAddr;
use super::{ethertype, protocol};

/// The IANA port for VXLAN.
pub const DEFAULT_PORT: u16 = 4789;
/// The VXLAN header.
pub const HEADER_LEN: usize = 8;
/// Outer Ethernet (14), IPv4 without options (20), UDP (8) and VXLAN (8): what a frame grows by.
pub const OUTER_LEN: usize = 14 + 20 + 8 + HEADER_LEN;
/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// The VXLAN flags byte with its I bit: the VNI is valid.
const FLAG_VNI: u8 = 0x08;
/// Offsets in the outer headers.
const IP: usize = 14;
const UDP: usize = IP + 20;
const VXLAN: usize = UDP + 8;

/// Why a frame from the underlay is not a VXLAN frame for this tunnel endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not IPv4/UDP to our address and port at all: other traffic on the underlay.
    NotOurs,
    /// Addressed to us, but its outer headers are short or inconsistent (lengths, IP options,
    /// a fragment, the VXLAN flags).
    BadOuter,
    /// Its inner frame is shorter than an Ethernet header.
    BadInner,
}

/// What the outer headers of a received VXLAN frame said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The sending tunnel endpoint (outer IPv4 source).
    pub remote: Ipv4Addr,
    pub vni: u32,
    /// The inner frame's length (it starts at `OUTER_LEN`).
    pub inner_len: usize,
}

/// Checks a frame from the underlay (`head`: at least its first `OUTER_LEN + 14` bytes, `len`:
/// its whole length): IPv4 without options or fragmentation, UDP to `local`:`port`, lengths that
/// agree with the frame, the VXLAN I flag. A frame not addressed to us is `NotOurs`.
pub fn parse(head: &[u8], len: usize, local: Ipv4Addr, port: u16) -> Result<Received, Refusal> {
    let be16 = |o: usize| head.get(o..o + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    if be16(12) != Some(ethertype::IPV4) {
        return Err(Refusal::NotOurs);
    }
    let Some(ip) = head.get(IP..UDP) else { return Err(Refusal::NotOurs) };
    if ip[9] != protocol::UDP || ip[16..20] != local.octets() {
        return Err(Refusal::NotOurs);
    }
    if head.len() < VXLAN + HEADER_LEN || be16(UDP + 2) != Some(port) {
        return Err(if head.len() < VXLAN + HEADER_LEN { Refusal::BadOuter } else { Refusal::NotOurs });
    }
    // Version 4 without options; neither a fragment nor one to come.
    let frag = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff;
    let ip_len = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    let udp_len = be16(UDP + 4).unwrap_or(0) as usize;
    if ip[0] != 0x45 || frag != 0 || ip_len + IP > len || ip_len < 20 + udp_len || udp_len < 8 + HEADER_LEN {
        return Err(Refusal::BadOuter);
    }
    let v = &head[VXLAN..VXLAN + HEADER_LEN];
    if v[0] & FLAG_VNI == 0 {
        return Err(Refusal::BadOuter);
    }
    let inner_len = udp_len - 8 - HEADER_LEN;
    if inner_len < 14 {
        return Err(Refusal::BadInner);
    }
    Ok(Received {
        remote: Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        vni: u32::from_be_bytes([0, v[4], v[5], v[6]]),
        inner_len,
    })
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
        b[VXLAN] = FLAG_VNI;
        b[VXLAN + 4..VXLAN + 7].copy_from_slice(&vni.to_be_bytes()[1..]);
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
        u32::from_be_bytes([0, self.bytes[VXLAN + 4], self.bytes[VXLAN + 5], self.bytes[VXLAN + 6]])
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
        // What the other end makes of it, receiving as REMOTE... here as LOCAL's peer: swap.
        let mut back = f.clone();
        back[IP + 16..IP + 20].copy_from_slice(&LOCAL.octets());
        back[IP + 12..IP + 16].copy_from_slice(&REMOTE.octets());
        let r = parse(&back, back.len(), LOCAL, DEFAULT_PORT).unwrap();
        assert_eq!(r, Received { remote: REMOTE, vni: 100, inner_len: 60 });
    }

    #[test]
    fn frames_not_for_us_and_bad_headers_are_told_apart() {
        let mut f = encapsulated(60);
        f[IP + 16..IP + 20].copy_from_slice(&LOCAL.octets());
        let ok = |f: &[u8]| parse(f, f.len(), LOCAL, DEFAULT_PORT);
        assert!(ok(&f).is_ok());
        let with = |at: usize, v: u8| {
            let mut g = f.clone();
            g[at] = v;
            g
        };
        assert_eq!(ok(&with(12, 0x86)), Err(Refusal::NotOurs), "not IPv4");
        assert_eq!(ok(&with(IP + 9, 6)), Err(Refusal::NotOurs), "TCP");
        assert_eq!(ok(&with(IP + 19, 99)), Err(Refusal::NotOurs), "another address");
        assert_eq!(ok(&with(UDP + 3, 0)), Err(Refusal::NotOurs), "another port");
        assert_eq!(ok(&with(IP, 0x46)), Err(Refusal::BadOuter), "IP options");
        assert_eq!(ok(&with(IP + 6, 0x20)), Err(Refusal::BadOuter), "more fragments");
        assert_eq!(ok(&with(VXLAN, 0)), Err(Refusal::BadOuter), "no I flag");
        assert_eq!(ok(&with(IP + 2, 0xff)), Err(Refusal::BadOuter), "IP length past the frame");
        assert_eq!(ok(&with(UDP + 5, 17)), Err(Refusal::BadInner), "an inner frame of 1 byte");
        assert_eq!(ok(&f[..VXLAN + 4]), Err(Refusal::BadOuter), "cut inside the VXLAN header");
        assert_eq!(parse(&f, f.len() - 10, LOCAL, DEFAULT_PORT), Err(Refusal::BadOuter), "frame shorter than IP says");
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
