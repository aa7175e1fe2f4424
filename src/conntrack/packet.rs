//! What connection tracking reads of a frame: its addresses, protocol and ports (or ICMP
//! identifier), and for TCP the sequence space; for an ICMP error, the connection it quotes.
//! Parsed from the IP header on, over `wire`'s checked views; nothing here allocates.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::ipv4::Ipv4Packet;
use crate::wire::ipv6::Ipv6Packet;
use crate::wire::tcp::{TcpPacket, flags};
use crate::wire::{ethertype, protocol};

/// ICMP (v4) message types conntrack knows.
mod icmp4 {
    pub const ECHO_REPLY: u8 = 0;
    pub const UNREACHABLE: u8 = 3;
    pub const REDIRECT: u8 = 5;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAMETER_PROBLEM: u8 = 12;
}

/// ICMPv6 message types conntrack knows (errors are those below 128).
mod icmp6 {
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
}

/// One direction of a connection: what a frame's headers say, before any zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tuple {
    /// IPv4 addresses sit in the first 4 bytes, the rest zero.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// TCP/UDP ports; for ICMP echo both are the identifier.
    pub sport: u16,
    pub dport: u16,
    /// IP protocol (TCP, UDP, ICMP, ICMPv6, or another, tracked by addresses alone).
    pub proto: u8,
    pub v6: bool,
}

impl Tuple {
    /// The other direction's tuple.
    pub fn reversed(&self) -> Tuple {
        Tuple { src: self.dst, dst: self.src, sport: self.dport, dport: self.sport, ..*self }
    }

    pub fn src_ip(&self) -> std::net::IpAddr {
        ip(&self.src, self.v6)
    }

    pub fn dst_ip(&self) -> std::net::IpAddr {
        ip(&self.dst, self.v6)
    }
}

fn ip(a: &[u8; 16], v6: bool) -> std::net::IpAddr {
    if v6 { Ipv6Addr::from(*a).into() } else { Ipv4Addr::new(a[0], a[1], a[2], a[3]).into() }
}

/// What a TCP segment says, for the state machine and the window check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    pub flags: u16,
    pub seq: u32,
    pub ack: u32,
    /// The window field as sent (unscaled).
    pub window: u16,
    /// Its payload length.
    pub len: u32,
    /// The window scale option of a SYN (None: not offered).
    pub wscale: Option<u8>,
}

/// A first fragment's place among its datagram's fragments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frag {
    /// The datagram's identification (IPv4's 16 bits, IPv6's 32).
    pub id: u32,
    /// Where the fragment's data ends in the datagram (bytes after the IP header).
    pub end: u32,
}

/// What a frame is to connection tracking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtPacket {
    /// A packet of a connection: its tuple, for TCP its segment, and if it is the first
    /// fragment of a datagram, where its data ends.
    Conn { tuple: Tuple, tcp: Option<Segment>, kind: Kind, first: Option<Frag> },
    /// An ICMP error quoting a packet of the connection `quoted` (as the quoted packet went:
    /// from this error's destination, usually).
    Error { tuple: Tuple, quoted: Tuple },
    /// A fragment after the first (no L4 header): it follows its first fragment's verdict.
    /// `group` is the datagram's addresses and protocol, its identification in the ports
    /// (`Frag::group`); its data spans `offset..end` of the datagram.
    Fragment { group: Tuple, offset: u32, end: u32 },
    /// Not trackable: malformed, truncated (a first fragment too short for its L4 header
    /// among them), an ICMP message that is neither an echo nor an error.
    Invalid,
    /// Not IP: conntrack leaves it alone (`+trk` only, as OVS).
    NotIp,
}

impl Frag {
    /// The tuple that names a datagram's fragments: `t`'s addresses and protocol, the
    /// identification `id` in the ports.
    pub fn group(t: &Tuple, id: u32) -> Tuple {
        Tuple { sport: (id >> 16) as u16, dport: id as u16, ..*t }
    }
}

/// Whether a packet may open a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TCP, UDP, an echo request, another protocol.
    Opens,
    /// An echo reply: belongs to an echo request's connection, never opens one.
    ReplyOnly,
}

impl CtPacket {
    /// Parses the IP packet in `l3` (as much of it as the caller copied) of ethertype
    /// `ethertype`, `len` bytes long in the frame (what remains after the Ethernet header).
    pub fn parse(ethertype: u16, l3: &[u8], len: usize) -> CtPacket {
        match ethertype {
            ethertype::IPV4 => parse4(l3, len, false).unwrap_or(CtPacket::Invalid),
            ethertype::IPV6 => parse6(l3, len, false).unwrap_or(CtPacket::Invalid),
            _ => CtPacket::NotIp,
        }
    }
}

/// `quoted`: the packet inside an ICMP error (no nested error is taken, and its length is
/// what the error holds).
fn parse4(l3: &[u8], len: usize, quoted: bool) -> Option<CtPacket> {
    let ip = Ipv4Packet::new_checked(l3).ok()?;
    if !ip.header_complete() || (quoted && ip.frag_offset() != 0) {
        return None;
    }
    let hl = ip.header_len();
    let total = (ip.total_len() as usize).min(if quoted { usize::MAX } else { len });
    if !quoted && (ip.total_len() as usize) > len {
        return None;
    }
    let mut t = Tuple { src: [0; 16], dst: [0; 16], sport: 0, dport: 0, proto: ip.protocol(), v6: false };
    t.src[..4].copy_from_slice(&ip.src_addr().octets());
    t.dst[..4].copy_from_slice(&ip.dst_addr().octets());
    let data = total.checked_sub(hl)? as u32;
    let first = match (quoted, ip.is_fragment(), ip.frag_offset() as u32 * 8) {
        (false, true, 0) => Some(Frag { id: ip.ident() as u32, end: data }),
        (false, true, offset) => {
            let group = Frag::group(&t, ip.ident() as u32);
            return Some(CtPacket::Fragment { group, offset, end: offset + data });
        }
        _ => None,
    };
    // A first fragment carries the L4 header (all of it, or it is invalid: the bytes past the
    // datagram's end are never read as its header); its payload length is not the
    // datagram's, which only the TCP window check would need (a fragmented TCP segment is
    // rare and left whole).
    let b = &l3[hl..l3.len().min(hl + data as usize).max(hl)];
    let p = l4(t, b, data as usize, quoted, false);
    if first.is_some() { with_first(p?, first) } else { p }
}

/// `p` (a first fragment's connection packet) marked as such.
#[cold]
fn with_first(p: CtPacket, frag: Option<Frag>) -> Option<CtPacket> {
    Some(match p {
        CtPacket::Conn { tuple, tcp, kind, .. } => CtPacket::Conn { tuple, tcp, kind, first: frag },
        p => p,
    })
}

fn parse6(l3: &[u8], len: usize, quoted: bool) -> Option<CtPacket> {
    let ip = Ipv6Packet::new_checked(l3).ok()?;
    let total = 40 + ip.payload_len() as usize;
    if !quoted && total > len {
        return None;
    }
    let mut t =
        Tuple { src: ip.src_addr().octets(), dst: ip.dst_addr().octets(), sport: 0, dport: 0, proto: 0, v6: true };
    // Extension headers: hop-by-hop, routing, destination options are skipped; a fragment
    // header is followed only in a first fragment.
    let (mut nh, mut at) = (ip.next_header(), 40usize);
    let mut first = None;
    for _ in 0..8 {
        match nh {
            0 | 43 | 60 => {
                let h = l3.get(at..at + 2)?;
                nh = h[0];
                at += (h[1] as usize + 1) * 8;
            }
            44 => {
                let h = l3.get(at..at + 8)?;
                let (offset, more) = (u16::from_be_bytes([h[2], h[3]]) & 0xfff8, h[3] & 1 != 0);
                let id = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
                nh = h[0];
                at += 8;
                let data = total.checked_sub(at)? as u32;
                if quoted && offset != 0 {
                    return None;
                }
                if !quoted && offset != 0 {
                    let group = Frag::group(&Tuple { proto: nh, ..t }, id);
                    return Some(CtPacket::Fragment { group, offset: offset as u32, end: offset as u32 + data });
                }
                if !quoted && more {
                    first = Some(Frag { id, end: data });
                }
            }
            _ => break,
        }
    }
    t.proto = nh;
    let b = l3.get(at..)?;
    if first.is_none() {
        return l4(t, b, total.saturating_sub(at), quoted, true);
    }
    let b = &b[..b.len().min(total.saturating_sub(at))];
    with_first(l4(t, b, total.saturating_sub(at), quoted, true)?, first)
}

/// The L4 part: `b` its bytes as copied, `len` its length in the packet.
fn l4(mut t: Tuple, b: &[u8], len: usize, quoted: bool, v6: bool) -> Option<CtPacket> {
    let ports =
        |b: &[u8]| Some((u16::from_be_bytes([*b.first()?, *b.get(1)?]), u16::from_be_bytes([*b.get(2)?, *b.get(3)?])));
    match t.proto {
        protocol::TCP => {
            (t.sport, t.dport) = ports(b)?;
            if quoted {
                return Some(CtPacket::Conn { tuple: t, tcp: None, kind: Kind::Opens, first: None });
            }
            let tcp = TcpPacket::new_checked(b).ok()?;
            let hl = tcp.header_len();
            let seg = Segment {
                flags: tcp.flags(),
                seq: tcp.seq_number(),
                ack: tcp.ack_number(),
                window: tcp.window(),
                len: len.checked_sub(hl)? as u32,
                wscale: if tcp.flags() & flags::SYN != 0 { wscale(&b[20..hl]) } else { None },
            };
            Some(CtPacket::Conn { tuple: t, tcp: Some(seg), kind: Kind::Opens, first: None })
        }
        protocol::UDP | 132 /* SCTP */ | 136 /* UDP-Lite */ => {
            (t.sport, t.dport) = ports(b)?;
            Some(CtPacket::Conn { tuple: t, tcp: None, kind: Kind::Opens, first: None })
        }
        protocol::ICMP if !v6 => icmp_message(t, b, len, quoted, false),
        protocol::ICMPV6 if v6 => icmp_message(t, b, len, quoted, true),
        _ => Some(CtPacket::Conn { tuple: t, tcp: None, kind: Kind::Opens, first: None }),
    }
}

fn icmp_message(mut t: Tuple, b: &[u8], len: usize, quoted: bool, v6: bool) -> Option<CtPacket> {
    let (ty, _code) = (*b.first()?, *b.get(1)?);
    let id = || Some(u16::from_be_bytes([*b.get(4)?, *b.get(5)?]));
    let (request, reply) =
        if v6 { (icmp6::ECHO_REQUEST, icmp6::ECHO_REPLY) } else { (icmp4::ECHO_REQUEST, icmp4::ECHO_REPLY) };
    if ty == request || ty == reply {
        // The identifier on the requester's side, 0 on the other: a reply's tuple is its
        // request's reversed, and a request the other way with the same identifier is another
        // connection (Linux's ICMP tuple holds the type for the same reason).
        (t.sport, t.dport) = if ty == request { (id()?, 0) } else { (0, id()?) };
        let kind = if ty == request { Kind::Opens } else { Kind::ReplyOnly };
        return Some(CtPacket::Conn { tuple: t, tcp: None, kind, first: None });
    }
    let error = if v6 {
        ty < 128
    } else {
        matches!(ty, icmp4::UNREACHABLE | icmp4::REDIRECT | icmp4::TIME_EXCEEDED | icmp4::PARAMETER_PROBLEM | 4)
    };
    if !error || quoted {
        return None;
    }
    let inner = b.get(8..)?;
    let q = if v6 { parse6(inner, len.saturating_sub(8), true)? } else { parse4(inner, len.saturating_sub(8), true)? };
    match q {
        CtPacket::Conn { tuple, .. } => Some(CtPacket::Error { tuple: t, quoted: tuple }),
        _ => None,
    }
}

/// The window scale option of a SYN's options (RFC 7323: kind 3, length 3; at most 14).
fn wscale(mut opts: &[u8]) -> Option<u8> {
    while let Some(&kind) = opts.first() {
        match kind {
            0 => return None,
            1 => opts = &opts[1..],
            _ => {
                let l = *opts.get(1)? as usize;
                if l < 2 || l > opts.len() {
                    return None;
                }
                if kind == 3 && l == 3 {
                    return Some(opts[2].min(14));
                }
                opts = &opts[l..];
            }
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod build {
    //! Frames for the tests, from the IP header on.
    use crate::wire::protocol;

    pub fn ipv4(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
        p[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(l4);
        p
    }

    /// A fragment of an IPv4 datagram: `data` at byte `offset` of it (a multiple of 8),
    /// identification `id`, `more` fragments after it.
    pub fn fragment4(proto: u8, src: [u8; 4], dst: [u8; 4], id: u16, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
        let mut p = ipv4(proto, src, dst, data);
        p[4..6].copy_from_slice(&id.to_be_bytes());
        p[6..8].copy_from_slice(&((offset / 8) | if more { 0x2000 } else { 0 }).to_be_bytes());
        p
    }

    /// A fragment of an IPv6 datagram (a fragment header for `next`, then `data`).
    pub fn fragment6(next: u8, src: [u8; 16], dst: [u8; 16], id: u32, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
        let mut h = vec![next, 0];
        h.extend_from_slice(&((offset & 0xfff8) | more as u16).to_be_bytes());
        h.extend_from_slice(&id.to_be_bytes());
        h.extend_from_slice(data);
        ipv6(44, src, dst, &h)
    }

    pub fn ipv6(next: u8, src: [u8; 16], dst: [u8; 16], l4: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0];
        p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        p.extend_from_slice(&[next, 64]);
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(l4);
        p
    }

    /// A TCP header (20 bytes, or 24 with a window scale option on a SYN) and `payload` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn tcp(
        sport: u16,
        dport: u16,
        flags: u16,
        seq: u32,
        ack: u32,
        win: u16,
        wscale: Option<u8>,
        payload: usize,
    ) -> Vec<u8> {
        let hl = if wscale.is_some() { 24 } else { 20 };
        let mut t = vec![0u8; hl + payload];
        t[0..2].copy_from_slice(&sport.to_be_bytes());
        t[2..4].copy_from_slice(&dport.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&ack.to_be_bytes());
        t[12..14].copy_from_slice(&(((hl as u16 / 4) << 12) | flags).to_be_bytes());
        t[14..16].copy_from_slice(&win.to_be_bytes());
        if let Some(s) = wscale {
            t[20..24].copy_from_slice(&[1, 3, 3, s]);
        }
        t
    }

    pub fn udp(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
        let mut u = vec![0u8; 8 + payload];
        u[0..2].copy_from_slice(&sport.to_be_bytes());
        u[2..4].copy_from_slice(&dport.to_be_bytes());
        u[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        u
    }

    pub fn icmp(ty: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
        let mut m = vec![ty, code, 0, 0];
        m.extend_from_slice(&rest);
        m.extend_from_slice(body);
        m
    }

    pub const TCP: u8 = protocol::TCP;
    pub const UDP: u8 = protocol::UDP;
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [10, 0, 0, 2];

    fn parse4(p: &[u8]) -> CtPacket {
        CtPacket::parse(ethertype::IPV4, p, p.len())
    }

    #[test]
    fn tcp_udp_and_echo_give_their_tuples() {
        let syn = ipv4(TCP, A, B, &tcp(40000, 80, flags::SYN, 7, 0, 65535, Some(7), 0));
        let CtPacket::Conn { tuple, tcp: Some(s), kind, .. } = parse4(&syn) else { panic!() };
        assert_eq!((tuple.sport, tuple.dport, tuple.proto, kind), (40000, 80, TCP, Kind::Opens));
        assert_eq!((s.seq, s.len, s.wscale), (7, 0, Some(7)));
        let data = ipv4(TCP, A, B, &tcp(40000, 80, flags::ACK, 8, 1, 100, None, 300));
        let CtPacket::Conn { tcp: Some(s), .. } = parse4(&data) else { panic!() };
        assert_eq!((s.len, s.wscale), (300, None));
        let u = ipv4(UDP, A, B, &udp(5000, 53, 10));
        assert!(matches!(parse4(&u), CtPacket::Conn { tuple: Tuple { sport: 5000, dport: 53, .. }, tcp: None, .. }));
        let echo = ipv4(protocol::ICMP, A, B, &icmp(8, 0, [0x12, 0x34, 0, 1], &[]));
        let reply = ipv4(protocol::ICMP, B, A, &icmp(0, 0, [0x12, 0x34, 0, 1], &[]));
        let (
            CtPacket::Conn { tuple: q, kind: Kind::Opens, .. },
            CtPacket::Conn { tuple: r, kind: Kind::ReplyOnly, .. },
        ) = (parse4(&echo), parse4(&reply))
        else {
            panic!()
        };
        assert_eq!(q.reversed(), r, "an echo reply's tuple is its request's reversed");
    }

    #[test]
    fn an_icmp_error_names_the_connection_it_quotes() {
        let sent = ipv4(UDP, A, B, &udp(5000, 53, 0));
        let err = ipv4(protocol::ICMP, B, A, &icmp(3, 3, [0; 4], &sent));
        let CtPacket::Error { quoted, .. } = parse4(&err) else { panic!("{:?}", parse4(&err)) };
        assert_eq!((quoted.sport, quoted.dport, &quoted.src[..4]), (5000, 53, &A[..]));
        // An error quoting an error, or quoting too little, is not tracked.
        let nested = ipv4(protocol::ICMP, A, B, &icmp(3, 1, [0; 4], &err));
        assert_eq!(parse4(&nested), CtPacket::Invalid);
        let short = ipv4(protocol::ICMP, B, A, &icmp(3, 3, [0; 4], &sent[..22]));
        assert_eq!(parse4(&short), CtPacket::Invalid);
    }

    #[test]
    fn malformed_is_invalid_and_later_fragments_name_their_datagram() {
        let mut p = ipv4(TCP, A, B, &tcp(1, 2, flags::ACK, 0, 0, 0, None, 0));
        assert_eq!(CtPacket::parse(ethertype::IPV4, &p, p.len() - 1), CtPacket::Invalid, "shorter than it says");
        p[4..6].copy_from_slice(&[0x12, 0x34]);
        p[6] = 0x20;
        p[7] = 3;
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        src[..4].copy_from_slice(&A);
        dst[..4].copy_from_slice(&B);
        let group = Tuple { src, dst, sport: 0, dport: 0x1234, proto: TCP, v6: false };
        assert_eq!(parse4(&p), CtPacket::Fragment { group, offset: 24, end: 44 }, "a fragment at offset 24");
        let mut t = ipv4(TCP, A, B, &tcp(1, 2, flags::ACK, 0, 0, 0, None, 0));
        t[20 + 12] = 0x40;
        assert_eq!(parse4(&t), CtPacket::Invalid, "a TCP header length of 16");
        assert_eq!(CtPacket::parse(0x0806, &[0; 28], 28), CtPacket::NotIp);
    }

    #[test]
    fn ipv6_skips_extension_headers_and_tracks_icmpv6() {
        let (a, b) = ([0xfd; 16], [0xfe; 16]);
        // Hop-by-hop options (8 bytes) in front of UDP.
        let mut l4 = vec![protocol::UDP, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&udp(1000, 2000, 4));
        let p = ipv6(0, a, b, &l4);
        let CtPacket::Conn { tuple, .. } = CtPacket::parse(ethertype::IPV6, &p, p.len()) else { panic!() };
        assert_eq!((tuple.proto, tuple.sport, tuple.dport, tuple.v6), (protocol::UDP, 1000, 2000, true));
        let echo = ipv6(protocol::ICMPV6, a, b, &icmp(128, 0, [0, 9, 0, 1], &[]));
        assert!(matches!(
            CtPacket::parse(ethertype::IPV6, &echo, echo.len()),
            CtPacket::Conn { kind: Kind::Opens, .. }
        ));
        let err = ipv6(protocol::ICMPV6, b, a, &icmp(1, 4, [0; 4], &p));
        assert!(matches!(CtPacket::parse(ethertype::IPV6, &err, err.len()), CtPacket::Error { .. }));
        // A later fragment (offset 8, identification 1).
        let mut frag = vec![protocol::UDP, 0, 0, 8, 0, 0, 0, 1];
        frag.extend_from_slice(&[0; 8]);
        let f = ipv6(44, a, b, &frag);
        let group = Tuple { src: a, dst: b, sport: 0, dport: 1, proto: protocol::UDP, v6: true };
        assert_eq!(CtPacket::parse(ethertype::IPV6, &f, f.len()), CtPacket::Fragment { group, offset: 8, end: 16 });
    }
}
