//! UDP headers (RFC 768).

use super::{Error, be16, set_be16};

pub const HEADER_LEN: usize = 8;
/// Offset of the checksum field in the header (what virtio's `csum_offset` names).
pub const CHECKSUM_OFFSET: usize = 6;

#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub fn new_checked(buffer: T) -> Result<UdpPacket<T>, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(UdpPacket { buffer })
    }

    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 0).unwrap()
    }

    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), 2).unwrap()
    }

    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), 4).unwrap()
    }

    pub fn is_empty(&self) -> bool {
        self.len() as usize <= HEADER_LEN
    }

    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), CHECKSUM_OFFSET).unwrap()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    pub fn set_len(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), 4, v);
    }

    pub fn set_checksum(&mut self, v: u16) {
        set_be16(self.buffer.as_mut(), CHECKSUM_OFFSET, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view() {
        let mut b = [0, 53, 0x30, 0x39, 0, 12, 0, 0, 1, 2, 3, 4];
        let mut u = UdpPacket::new_checked(&mut b[..]).unwrap();
        assert_eq!((u.src_port(), u.dst_port(), u.len()), (53, 12345, 12));
        u.set_checksum(0xbeef);
        assert_eq!(u.checksum(), 0xbeef);
        assert!(UdpPacket::new_checked(&b[..7]).is_err());
    }
}
