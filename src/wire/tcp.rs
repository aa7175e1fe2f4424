//! TCP headers (RFC 9293): the fields a switch reads for flows and rewrites when it segments.

use super::checksum::Sum;
use super::{Error, be16, set_be16};

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    pub const FLAGS: usize = 12;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
}

pub const MIN_HEADER_LEN: usize = 20;
/// Offset of the checksum field in the header (what virtio's `csum_offset` names).
pub const CHECKSUM_OFFSET: usize = field::CHECKSUM;

/// Flag bits (the low 9 bits of the data-offset/flags word).
pub mod flags {
    pub const FIN: u16 = 0x001;
    pub const SYN: u16 = 0x002;
    pub const RST: u16 = 0x004;
    pub const PSH: u16 = 0x008;
    pub const ACK: u16 = 0x010;
    pub const URG: u16 = 0x020;
    pub const ECE: u16 = 0x040;
    pub const CWR: u16 = 0x080;
    pub const ALL: u16 = 0x1ff;
}

#[derive(Debug, Clone, Copy)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    pub const fn new_unchecked(buffer: T) -> TcpPacket<T> {
        TcpPacket { buffer }
    }

    /// A view of a buffer holding at least the ports (what flow keys need).
    pub fn new_ports(buffer: T) -> Result<TcpPacket<T>, Error> {
        if buffer.as_ref().len() < 4 {
            return Err(Error::Truncated);
        }
        Ok(TcpPacket { buffer })
    }

    /// A view of a buffer holding the whole header, options included.
    pub fn new_checked(buffer: T) -> Result<TcpPacket<T>, Error> {
        if buffer.as_ref().len() < MIN_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let p = TcpPacket { buffer };
        if p.header_len() < MIN_HEADER_LEN {
            return Err(Error::Malformed);
        }
        if p.header_len() > p.buffer.as_ref().len() {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn src_port(&self) -> u16 {
        be16(self.b(), field::SRC_PORT).unwrap()
    }

    pub fn dst_port(&self) -> u16 {
        be16(self.b(), field::DST_PORT).unwrap()
    }

    pub fn seq_number(&self) -> u32 {
        u32::from_be_bytes(self.b()[field::SEQ..field::SEQ + 4].try_into().unwrap())
    }

    pub fn ack_number(&self) -> u32 {
        u32::from_be_bytes(self.b()[field::ACK..field::ACK + 4].try_into().unwrap())
    }

    pub fn header_len(&self) -> usize {
        (self.b()[field::FLAGS] >> 4) as usize * 4
    }

    pub fn flags(&self) -> u16 {
        be16(self.b(), field::FLAGS).unwrap() & flags::ALL
    }

    pub fn window(&self) -> u16 {
        be16(self.b(), field::WINDOW).unwrap()
    }

    pub fn checksum(&self) -> u16 {
        be16(self.b(), field::CHECKSUM).unwrap()
    }

    pub fn urgent(&self) -> u16 {
        be16(self.b(), field::URGENT).unwrap()
    }

    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }

    /// Whether the checksum is right, given the pseudo header for this segment's length.
    pub fn verify_checksum(&self, pseudo: Sum) -> bool {
        let mut s = pseudo;
        s.add_bytes(self.b());
        s.fold() == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    pub fn set_seq_number(&mut self, v: u32) {
        self.buffer.as_mut()[field::SEQ..field::SEQ + 4].copy_from_slice(&v.to_be_bytes());
    }

    /// Replaces the flag bits, keeping the data offset.
    pub fn set_flags(&mut self, f: u16) {
        let b = self.buffer.as_mut();
        let w = (be16(b, field::FLAGS).unwrap() & !flags::ALL) | (f & flags::ALL);
        set_be16(b, field::FLAGS, w);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), field::CHECKSUM, v);
    }

    /// Computes the checksum over the whole buffer (header and payload) and `pseudo`.
    pub fn fill_checksum(&mut self, pseudo: Sum) {
        self.set_checksum(0);
        let mut s = pseudo;
        s.add_bytes(self.buffer.as_ref());
        let c = s.finish();
        self.set_checksum(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum::pseudo_header_v4;
    use std::net::Ipv4Addr;

    #[test]
    fn view_and_checksum() {
        let mut b = [0u8; 24];
        b[0..2].copy_from_slice(&1234u16.to_be_bytes());
        b[2..4].copy_from_slice(&80u16.to_be_bytes());
        b[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        b[12] = 5 << 4;
        b[13] = (flags::SYN | flags::ACK) as u8;
        b[20..24].copy_from_slice(b"data");
        let mut t = TcpPacket::new_checked(&mut b[..]).unwrap();
        assert_eq!((t.src_port(), t.dst_port(), t.seq_number(), t.header_len()), (1234, 80, 0x0102_0304, 20));
        assert_eq!(t.flags(), flags::SYN | flags::ACK);
        assert_eq!(t.payload(), b"data");
        let pseudo = pseudo_header_v4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 6, 24);
        t.fill_checksum(pseudo);
        assert!(t.verify_checksum(pseudo));
        t.set_flags(flags::FIN);
        assert_eq!((t.flags(), t.header_len()), (flags::FIN, 20));
        assert!(!t.verify_checksum(pseudo));
        b[12] = 4 << 4;
        assert_eq!(TcpPacket::new_checked(&b[..]).unwrap_err(), Error::Malformed);
        assert!(TcpPacket::new_ports(&b[..3]).is_err());
    }
}
