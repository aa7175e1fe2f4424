//! Wire formats: checked views over bytes plus parsed representations, in the manner of
//! smoltcp (`EthernetFrame<T: AsRef<[u8]>>` and `EthernetRepr`, and so on). No I/O and no
//! `unsafe`: everything here works on byte slices the caller owns (a copy of a frame's first
//! bytes, a header buffer), so the rest of pvswitch never writes a header offset inline.
//!
//! - [`mac`]: [`MacAddr`], the one Ethernet address type (one parser, one printer).
//! - [`ethernet`]: Ethernet II frames, VLAN tags, and [`EthernetRepr`], the rewritable header.
//! - [`ipv4`], [`ipv6`], [`tcp`], [`udp`], [`arp`]: what flows match on and offloads rewrite.
//! - [`checksum`]: the Internet checksum, in pieces.
//! - [`virtio_net`]: the virtio-net header, its length by features, and feature bit names.
//! - [`gso`]: offloads in software: a partial checksum completed, a TSO frame segmented.
//! - [`vxlan`]: VXLAN over IPv4: a tunnel's outer headers, filled per frame, and checked.
#![forbid(unsafe_code)]

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod gso;
pub mod ipv4;
pub mod ipv6;
pub mod mac;
pub mod tcp;
pub mod udp;
pub mod virtio_net;
pub mod vxlan;

pub use ethernet::{EthernetFrame, EthernetRepr, VlanTag, ethertype};
pub use ipv4::{Ipv4Packet, protocol};
pub use mac::MacAddr;
pub use virtio_net::VirtioNetHdr;

/// Why bytes are not the header a view expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the header does.
    Truncated,
    /// A field has a value the format does not allow (wrong version, length too small).
    Malformed,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated header",
            Error::Malformed => "malformed header",
        })
    }
}

impl std::error::Error for Error {}

#[inline]
pub(crate) fn be16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(off..off + 2)?.try_into().unwrap()))
}

#[inline]
pub(crate) fn le16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().unwrap()))
}

#[inline]
pub(crate) fn set_be16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_be_bytes());
}
