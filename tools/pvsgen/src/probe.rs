//! What the generator's frames are, on the wire.
//!
//! A 12-byte virtio-net header (zero) and the Ethernet frame in one descriptor.
//! The frame is dst MAC, src MAC 02:00:00:00:VV:VV (VV:VV = the VM's index), ethertype 0x88b5,
//! then at offset 14: magic "PVSG" (u32 LE), kind (u8: data, hello, ping, pong), pad, source VM
//! index (u16 LE), pad, sequence number (u64 LE, per source VM, from 0), TX timestamp
//! (CLOCK_MONOTONIC ns, u64 LE); zeros up to the frame size.
//!
//! With TSO (`Driver::tso`) a data frame is TCP/IPv4 instead: ethertype 0x0800, a 20-byte IPv4
//! header (10.0.0.1 to 10.0.0.2), a 20-byte TCP header, then the fields above from magic on
//! (at offset 54, not 14); the virtio-net header asks for TSO. Receivers count each TCP/IPv4
//! frame from a generator as a segment; the one carrying the fields counts as the data frame.

use crate::frontend::HDR_LEN;

pub const ETHERTYPE: u16 = 0x88b5;
pub const MAGIC: u32 = u32::from_le_bytes(*b"PVSG");
/// Bytes of the frame the generator writes and reads (Ethernet header and its fields).
pub const PROBE_LEN: usize = 40;
pub const KIND_DATA: u8 = 0;
pub const KIND_HELLO: u8 = 1;
pub const KIND_PING: u8 = 2;
pub const KIND_PONG: u8 = 3;
pub const BCAST: [u8; 6] = [0xff; 6];

/// The payload byte at offset `i` of a frame with sequence number `seq` (verify mode).
#[inline]
pub fn pattern(seq: u64, i: usize) -> u8 {
    (seq as u8).wrapping_mul(31).wrapping_add(i as u8)
}

/// The MAC address of VM `id`.
pub fn mac_of(id: u16) -> [u8; 6] {
    let b = id.to_be_bytes();
    [0x02, 0, 0, 0, b[0], b[1]]
}

/// Bytes of a TSO data frame's Ethernet, IPv4 and TCP headers.
pub const TSO_HDRS: usize = 54;
pub use crate::config::TSO_PROBE_END;

/// The virtio-net header and the Ethernet (type only: the MACs are the caller's), IPv4 and TCP
/// headers of a TSO data frame of `size` bytes with MSS `mss`, as a Linux guest sends it:
/// NEEDS_CSUM from the TCP header, the TCP checksum field holding the pseudo header's sum.
pub fn tso_headers(mss: u16, size: usize) -> ([u8; HDR_LEN], [u8; TSO_HDRS]) {
    let mut vh = [0u8; HDR_LEN];
    vh[0] = 1; // NEEDS_CSUM
    vh[1] = 1; // GSO_TCPV4
    vh[2..4].copy_from_slice(&(TSO_HDRS as u16).to_le_bytes());
    vh[4..6].copy_from_slice(&mss.to_le_bytes());
    vh[6..8].copy_from_slice(&34u16.to_le_bytes()); // csum_start: the TCP header
    vh[8..10].copy_from_slice(&16u16.to_le_bytes()); // csum_offset: TCP's checksum field
    let mut f = [0u8; TSO_HDRS];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (size - 14) as u16;
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 6; // TCP
    ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let sum = |b: &[u8], init: u32| {
        let mut s = init;
        for w in b.chunks(2) {
            s += u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u32;
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    };
    let c = !sum(ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[34..54];
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&5201u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&1u32.to_be_bytes());
    tcp[8..12].copy_from_slice(&1u32.to_be_bytes());
    tcp[12..14].copy_from_slice(&(5u16 << 12 | 0x18).to_be_bytes()); // PSH, ACK
    tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
    // The pseudo header: addresses, protocol, TCP length.
    let tcp_len = ip_len as u32 - 20;
    let pseudo = sum(&f[26..34], 6 + tcp_len);
    f[34 + 16..34 + 18].copy_from_slice(&pseudo.to_be_bytes());
    (vh, f)
}
