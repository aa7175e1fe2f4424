//! ARP over Ethernet for IPv4 (RFC 826): the only kind flow keys look into.

use std::net::Ipv4Addr;

use super::ethernet::ethertype;
use super::{Error, MacAddr, be16};

pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;

#[derive(Debug, Clone, Copy)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// A view of an Ethernet/IPv4 ARP packet (hardware type 1, protocol 0x0800, lengths 6
    /// and 4); anything else is `Malformed` for our purposes.
    pub fn new_checked(buffer: T) -> Result<ArpPacket<T>, Error> {
        let b = buffer.as_ref();
        if b.len() < PACKET_LEN {
            return Err(Error::Truncated);
        }
        if be16(b, 0) != Some(1) || be16(b, 2) != Some(ethertype::IPV4) || b[4] != 6 || b[5] != 4 {
            return Err(Error::Malformed);
        }
        Ok(ArpPacket { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn operation(&self) -> u16 {
        be16(self.b(), 6).unwrap()
    }

    pub fn sender_hw(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b()[8..14])
    }

    pub fn sender_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[14..18]).unwrap())
    }

    pub fn target_hw(&self) -> MacAddr {
        MacAddr::from_bytes(&self.b()[18..24])
    }

    pub fn target_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(<[u8; 4]>::try_from(&self.b()[24..28]).unwrap())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request() {
        let mut b = vec![0, 1, 8, 0, 6, 4, 0, 1];
        b.extend([2, 0, 0, 0, 0, 1, 10, 0, 0, 1]);
        b.extend([0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
        let a = ArpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            (a.operation(), a.sender_hw(), a.sender_ip()),
            (OP_REQUEST, MacAddr([2, 0, 0, 0, 0, 1]), Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!((a.target_hw(), a.target_ip()), (MacAddr::ZERO, Ipv4Addr::new(10, 0, 0, 2)));
        assert!(ArpPacket::new_checked(&b[..27]).is_err());
        b[5] = 16;
        assert_eq!(ArpPacket::new_checked(&b[..]).unwrap_err(), Error::Malformed);
    }
}
