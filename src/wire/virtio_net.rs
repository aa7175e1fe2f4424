//! The virtio-net device's wire format (virtio 1.2, section 5.1): its feature bits (with the
//! transport bits a net device negotiates) and the header in front of every frame.

use super::{Error, le16};

/// Feature bits, as masks of the 64-bit feature word.
pub mod feature {
    pub const CSUM: u64 = 1 << 0;
    pub const GUEST_CSUM: u64 = 1 << 1;
    pub const CTRL_GUEST_OFFLOADS: u64 = 1 << 2;
    pub const MTU: u64 = 1 << 3;
    pub const MAC: u64 = 1 << 5;
    pub const GUEST_TSO4: u64 = 1 << 7;
    pub const GUEST_TSO6: u64 = 1 << 8;
    pub const GUEST_ECN: u64 = 1 << 9;
    pub const GUEST_UFO: u64 = 1 << 10;
    pub const HOST_TSO4: u64 = 1 << 11;
    pub const HOST_TSO6: u64 = 1 << 12;
    pub const HOST_ECN: u64 = 1 << 13;
    pub const HOST_UFO: u64 = 1 << 14;
    pub const MRG_RXBUF: u64 = 1 << 15;
    pub const STATUS: u64 = 1 << 16;
    pub const CTRL_VQ: u64 = 1 << 17;
    pub const CTRL_RX: u64 = 1 << 18;
    pub const CTRL_VLAN: u64 = 1 << 19;
    pub const GUEST_ANNOUNCE: u64 = 1 << 21;
    pub const MQ: u64 = 1 << 22;
    pub const CTRL_MAC_ADDR: u64 = 1 << 23;
    /// Transport (ring) features.
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    pub const VERSION_1: u64 = 1 << 32;
    pub const ACCESS_PLATFORM: u64 = 1 << 33;
    pub const RING_PACKED: u64 = 1 << 34;
    /// The device uses buffers in the order they were made available.
    pub const IN_ORDER: u64 = 1 << 35;
    pub const ORDER_PLATFORM: u64 = 1 << 36;
    pub const NOTIFICATION_DATA: u64 = 1 << 38;
    pub const GUEST_USO4: u64 = 1 << 54;
    pub const GUEST_USO6: u64 = 1 << 55;
    pub const HOST_USO: u64 = 1 << 56;
}

const NAMES: [(u64, &str); 31] = [
    (feature::CSUM, "CSUM"),
    (feature::GUEST_CSUM, "GUEST_CSUM"),
    (feature::CTRL_GUEST_OFFLOADS, "CTRL_GUEST_OFFLOADS"),
    (feature::MTU, "MTU"),
    (feature::MAC, "MAC"),
    (feature::GUEST_TSO4, "GUEST_TSO4"),
    (feature::GUEST_TSO6, "GUEST_TSO6"),
    (feature::GUEST_ECN, "GUEST_ECN"),
    (feature::GUEST_UFO, "GUEST_UFO"),
    (feature::HOST_TSO4, "HOST_TSO4"),
    (feature::HOST_TSO6, "HOST_TSO6"),
    (feature::HOST_ECN, "HOST_ECN"),
    (feature::HOST_UFO, "HOST_UFO"),
    (feature::MRG_RXBUF, "MRG_RXBUF"),
    (feature::STATUS, "STATUS"),
    (feature::CTRL_VQ, "CTRL_VQ"),
    (feature::CTRL_RX, "CTRL_RX"),
    (feature::CTRL_VLAN, "CTRL_VLAN"),
    (feature::GUEST_ANNOUNCE, "GUEST_ANNOUNCE"),
    (feature::MQ, "MQ"),
    (feature::CTRL_MAC_ADDR, "CTRL_MAC_ADDR"),
    (feature::RING_INDIRECT_DESC, "INDIRECT_DESC"),
    (feature::RING_EVENT_IDX, "EVENT_IDX"),
    (feature::VERSION_1, "VERSION_1"),
    (feature::ACCESS_PLATFORM, "ACCESS_PLATFORM"),
    (feature::RING_PACKED, "RING_PACKED"),
    (feature::IN_ORDER, "IN_ORDER"),
    (feature::ORDER_PLATFORM, "ORDER_PLATFORM"),
    (feature::NOTIFICATION_DATA, "NOTIFICATION_DATA"),
    (feature::GUEST_USO4, "GUEST_USO4"),
    (feature::HOST_USO, "HOST_USO"),
];

/// The name of one feature bit (`bit N` for bits without one here).
pub fn feature_name(bit: u64) -> String {
    NAMES
        .iter()
        .find(|(b, _)| *b == bit)
        .map_or_else(|| format!("bit {}", bit.trailing_zeros()), |(_, n)| n.to_string())
}

/// Names of the bits set in `features`, lowest first.
pub fn feature_names(features: u64) -> Vec<String> {
    (0..64).map(|i| 1u64 << i).filter(|b| features & b != 0).map(feature_name).collect()
}

/// Length of the header a device with `features` puts before every frame: 12 bytes with
/// VERSION_1 or MRG_RXBUF (`num_buffers` is present), else the legacy 10.
pub const fn hdr_len(features: u64) -> usize {
    if features & (feature::VERSION_1 | feature::MRG_RXBUF) != 0 { HDR_LEN } else { HDR_LEN_LEGACY }
}

/// The header with `num_buffers`.
pub const HDR_LEN: usize = 12;
/// The legacy header without it.
pub const HDR_LEN_LEGACY: usize = 10;

/// `flags` bits.
pub mod flags {
    /// The checksum at `csum_start + csum_offset` is partial: sum from `csum_start` and store.
    pub const NEEDS_CSUM: u8 = 1;
    /// The checksum was verified (receive side).
    pub const DATA_VALID: u8 = 2;
    pub const RSC_INFO: u8 = 4;
}

/// `gso_type` values.
pub mod gso {
    pub const NONE: u8 = 0;
    pub const TCPV4: u8 = 1;
    pub const UDP: u8 = 3;
    pub const TCPV6: u8 = 4;
    pub const UDP_L4: u8 = 5;
    /// Or-ed into the type: the segments carry ECN's CWR flag as the first one does.
    pub const ECN: u8 = 0x80;
}

/// A virtio-net header, parsed (all fields little-endian on the wire, as VERSION_1 requires).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtioNetHdr {
    pub flags: u8,
    pub gso_type: u8,
    /// Length of the headers to copy in front of each segment.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    /// Receive side, with MRG_RXBUF or VERSION_1: buffers the frame spans.
    pub num_buffers: u16,
}

impl VirtioNetHdr {
    /// The header of a plain frame in one buffer.
    pub const PLAIN: VirtioNetHdr =
        VirtioNetHdr { flags: 0, gso_type: 0, hdr_len: 0, gso_size: 0, csum_start: 0, csum_offset: 0, num_buffers: 1 };

    /// Parses a header of 10 or 12 bytes (`num_buffers` is 0 in a 10-byte one).
    pub fn parse(b: &[u8]) -> Result<VirtioNetHdr, Error> {
        if b.len() < HDR_LEN_LEGACY {
            return Err(Error::Truncated);
        }
        Ok(VirtioNetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le16(b, 2).unwrap(),
            gso_size: le16(b, 4).unwrap(),
            csum_start: le16(b, 6).unwrap(),
            csum_offset: le16(b, 8).unwrap(),
            num_buffers: le16(b, 10).unwrap_or(0),
        })
    }

    /// Writes the first `out.len()` (10 or 12) bytes of the header.
    pub fn emit(&self, out: &mut [u8]) {
        let mut b = [0u8; HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&self.num_buffers.to_le_bytes());
        let n = out.len().min(HDR_LEN);
        out[..n].copy_from_slice(&b[..n]);
    }

    /// The header's bytes `0..8` and `8..12` as little-endian words, built in registers (what
    /// `Segs::update_words` compares with a receive buffer's header; a legacy 10-byte header
    /// is `lo` and the low half of `hi`).
    #[inline(always)]
    pub fn words(&self) -> (u64, u32) {
        let lo = self.flags as u64
            | (self.gso_type as u64) << 8
            | (self.hdr_len as u64) << 16
            | (self.gso_size as u64) << 32
            | (self.csum_start as u64) << 48;
        (lo, self.csum_offset as u32 | (self.num_buffers as u32) << 16)
    }

    /// The header as bytes (12; a legacy header is the first 10).
    pub fn to_bytes(&self) -> [u8; HDR_LEN] {
        let mut b = [0u8; HDR_LEN];
        self.emit(&mut b);
        b
    }
}

/// The offloads a set of virtio-net feature bits allows in one direction, as the spec defines
/// them (what a frame's header may ask for, what a receiver takes), as the data path asks:
/// for a guest's TX queue what it may send (CSUM, HOST_TSO4/6, HOST_ECN), for its RX queue what
/// it can take (GUEST_CSUM, GUEST_TSO4/6, GUEST_ECN).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Negotiated {
    pub csum: bool,
    pub tso4: bool,
    pub tso6: bool,
    pub ecn: bool,
}

impl Negotiated {
    /// What a driver with `features` may send.
    pub fn host(features: u64) -> Negotiated {
        use feature as f;
        Negotiated {
            csum: features & f::CSUM != 0,
            tso4: features & f::HOST_TSO4 != 0,
            tso6: features & f::HOST_TSO6 != 0,
            ecn: features & f::HOST_ECN != 0,
        }
    }

    /// What a driver with `features` can receive.
    pub fn guest(features: u64) -> Negotiated {
        use feature as f;
        Negotiated {
            csum: features & f::GUEST_CSUM != 0,
            tso4: features & f::GUEST_TSO4 != 0,
            tso6: features & f::GUEST_TSO6 != 0,
            ecn: features & f::GUEST_ECN != 0,
        }
    }

    /// Whether any offload is negotiated (ECN alone means nothing without TSO). With none, a
    /// sender's virtio-net header carries nothing: the driver must leave it zero, and the
    /// device ignores it.
    #[inline]
    pub fn any(&self) -> bool {
        self.csum || self.tso4 || self.tso6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = VirtioNetHdr {
            flags: flags::NEEDS_CSUM,
            gso_type: gso::TCPV4 | gso::ECN,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 3,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 0x81, 54, 0, 0xa8, 5, 34, 0, 16, 0, 3, 0]);
        // The same bytes as two words.
        let (lo, hi) = h.words();
        assert_eq!((&lo.to_le_bytes()[..], &hi.to_le_bytes()[..]), (&b[..8], &b[8..]));
        assert_eq!(VirtioNetHdr::parse(&b).unwrap(), h);
        assert_eq!(VirtioNetHdr::parse(&b[..10]).unwrap(), VirtioNetHdr { num_buffers: 0, ..h });
        assert!(VirtioNetHdr::parse(&b[..9]).is_err());
        assert_eq!(VirtioNetHdr::PLAIN.to_bytes(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn features() {
        assert_eq!(hdr_len(feature::VERSION_1), 12);
        assert_eq!(hdr_len(feature::MRG_RXBUF), 12);
        assert_eq!(hdr_len(0), 10);
        assert_eq!(
            feature_names(feature::VERSION_1 | feature::MRG_RXBUF | 1 << 63),
            ["MRG_RXBUF", "VERSION_1", "bit 63"]
        );
    }
}
