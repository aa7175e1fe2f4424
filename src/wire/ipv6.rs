//! IPv6 fixed headers (RFC 8200). Extension headers are not walked: a frame whose next header
//! is not TCP or UDP is switched as opaque IPv6.

use std::net::Ipv6Addr;

use super::checksum::{self, Sum};
use super::{Error, be16, set_be16};

mod field {
    pub const VER_TC_FLOW: usize = 0;
    pub const LENGTH: usize = 4;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

pub const HEADER_LEN: usize = 40;

#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Ipv6Packet<T> {
        Ipv6Packet { buffer }
    }

    /// A view of a buffer holding the 40-byte fixed header of a version 6 packet.
    pub fn new_checked(buffer: T) -> Result<Ipv6Packet<T>, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = Ipv6Packet { buffer };
        if p.version() != 6 {
            return Err(Error::Malformed);
        }
        Ok(p)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn version(&self) -> u8 {
        self.b()[field::VER_TC_FLOW] >> 4
    }

    pub fn traffic_class(&self) -> u8 {
        let b = self.b();
        (b[0] << 4) | (b[1] >> 4)
    }

    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        u32::from_be_bytes([0, b[1] & 0x0f, b[2], b[3]])
    }

    pub fn payload_len(&self) -> u16 {
        be16(self.b(), field::LENGTH).unwrap()
    }

    pub fn next_header(&self) -> u8 {
        self.b()[field::NXT_HDR]
    }

    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[field::SRC..field::SRC + 16]).unwrap())
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(<[u8; 16]>::try_from(&self.b()[field::DST..field::DST + 16]).unwrap())
    }

    pub fn is_complete(&self) -> bool {
        HEADER_LEN + self.payload_len() as usize <= self.b().len()
    }

    /// The payload as far as the buffer holds it.
    pub fn payload(&self) -> &[u8] {
        let end = (HEADER_LEN + self.payload_len() as usize).min(self.b().len());
        &self.b()[HEADER_LEN..end]
    }

    /// The TCP/UDP pseudo header for an upper-layer packet of `l4_len` bytes.
    pub fn pseudo_header(&self, l4_len: u32) -> Sum {
        checksum::pseudo_header_v6(self.src_addr(), self.dst_addr(), self.next_header(), l4_len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    pub fn set_payload_len(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), field::LENGTH, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view() {
        let mut b = [0u8; 48];
        b[0] = 0x6a;
        b[1] = 0xb1;
        b[2] = 0x23;
        b[3] = 0x45;
        b[4..6].copy_from_slice(&8u16.to_be_bytes());
        b[6] = 17;
        b[7] = 64;
        b[8] = 0xfe;
        b[9] = 0x80;
        b[23] = 1;
        b[24] = 0xff;
        b[25] = 0x02;
        b[39] = 1;
        let mut p = Ipv6Packet::new_checked(&mut b[..]).unwrap();
        assert_eq!((p.traffic_class(), p.flow_label(), p.payload_len()), (0xab, 0x12345, 8));
        assert_eq!((p.next_header(), p.hop_limit()), (17, 64));
        assert_eq!(p.src_addr(), "fe80::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "ff02::1".parse::<Ipv6Addr>().unwrap());
        assert!(p.is_complete());
        p.set_payload_len(9);
        assert!(!p.is_complete());
        assert_eq!(p.payload().len(), 8);
        assert!(Ipv6Packet::new_checked(&b[..39]).is_err());
        b[0] = 0x4a;
        assert_eq!(Ipv6Packet::new_checked(&b[..]).unwrap_err(), Error::Malformed);
    }
}
