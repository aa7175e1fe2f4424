//! ARP over Ethernet for IPv4 (RFC 826): the only kind flow keys look into; and the RARP frame
//! (RFC 903, ARP's format) a migrated VM is announced with.

use std::net::Ipv4Addr;

use super::ethernet::ethertype;
use super::{Error, MacAddr, be16};

pub const PACKET_LEN: usize = 28;
pub const OP_REQUEST: u16 = 1;
pub const OP_REPLY: u16 = 2;
/// RARP's "request reverse", what QEMU announces a migrated VM with.
pub const OP_REVERSE_REQUEST: u16 = 3;
/// A RARP announcement's length: the Ethernet minimum (without FCS), zero-padded.
pub const RARP_FRAME_LEN: usize = 60;

/// The broadcast RARP frame that announces `mac` after a migration (as QEMU sends it for a
/// guest that cannot announce itself): from `mac`, asking for `mac`'s address, every IPv4
/// address zero. Switches on the way learn `mac` where the frame comes from.
pub fn rarp_announcement(mac: MacAddr) -> [u8; RARP_FRAME_LEN] {
    let zero = Ipv4Addr::UNSPECIFIED;
    frame(ethertype::RARP, MacAddr::BROADCAST, OP_REVERSE_REQUEST, mac, zero, mac, zero)
}

/// An Ethernet/IPv4 ARP frame, zero-padded to the Ethernet minimum: operation `op` from
/// `sender` (`sha`, `spa`) about `target` (`tha`, `tpa`), Ethernet destination `dst`.
pub fn arp_frame(
    dst: MacAddr,
    op: u16,
    sha: MacAddr,
    spa: Ipv4Addr,
    tha: MacAddr,
    tpa: Ipv4Addr,
) -> [u8; RARP_FRAME_LEN] {
    frame(ethertype::ARP, dst, op, sha, spa, tha, tpa)
}

/// An ARP-format frame (ARP or RARP, by `ty`) from `sha` to Ethernet destination `dst`.
fn frame(
    ty: u16,
    dst: MacAddr,
    op: u16,
    sha: MacAddr,
    spa: Ipv4Addr,
    tha: MacAddr,
    tpa: Ipv4Addr,
) -> [u8; RARP_FRAME_LEN] {
    let mut f = [0u8; RARP_FRAME_LEN];
    f[0..6].copy_from_slice(&dst.0);
    f[6..12].copy_from_slice(&sha.0);
    f[12..14].copy_from_slice(&ty.to_be_bytes());
    let a = &mut f[14..14 + PACKET_LEN];
    a[0..2].copy_from_slice(&1u16.to_be_bytes());
    a[2..4].copy_from_slice(&ethertype::IPV4.to_be_bytes());
    a[4] = 6;
    a[5] = 4;
    a[6..8].copy_from_slice(&op.to_be_bytes());
    a[8..14].copy_from_slice(&sha.0);
    a[14..18].copy_from_slice(&spa.octets());
    a[18..24].copy_from_slice(&tha.0);
    a[24..28].copy_from_slice(&tpa.octets());
    f
}

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

    #[test]
    fn rarp() {
        let mac = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        let f = rarp_announcement(mac);
        assert_eq!(&f[..14], &[255, 255, 255, 255, 255, 255, 0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x80, 0x35]);
        let a = ArpPacket::new_checked(&f[14..]).unwrap();
        assert_eq!((a.operation(), a.sender_hw(), a.target_hw()), (OP_REVERSE_REQUEST, mac, mac));
        assert_eq!((a.sender_ip(), a.target_ip()), (Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED));
        assert!(f[14 + PACKET_LEN..].iter().all(|&b| b == 0));
    }
}
