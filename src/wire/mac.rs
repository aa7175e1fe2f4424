//! The Ethernet (EUI-48) address: one type, one parser, one printer.

use std::fmt;
use std::str::FromStr;

/// A 48-bit Ethernet address, in wire order.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The address in the first six bytes of `b`. Panics if `b` is shorter.
    #[inline]
    pub fn from_bytes(b: &[u8]) -> MacAddr {
        MacAddr(b[..6].try_into().unwrap())
    }

    #[inline]
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    /// Group addresses (multicast and broadcast): the I/G bit of the first octet.
    #[inline]
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 1 != 0
    }

    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == MacAddr::BROADCAST
    }

    /// An individual address (what a source address must be, and what MAC learning learns).
    #[inline]
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// Locally administered (the U/L bit), as VM MACs such as 52:54:00:.. are.
    #[inline]
    pub const fn is_local(&self) -> bool {
        self.0[0] & 2 != 0
    }

    /// The address as a 48-bit number, first octet most significant.
    #[inline]
    pub const fn to_u64(&self) -> u64 {
        let m = self.0;
        u64::from_be_bytes([0, 0, m[0], m[1], m[2], m[3], m[4], m[5]])
    }

    /// The inverse of [`MacAddr::to_u64`] (bits above 48 are ignored).
    #[inline]
    pub const fn from_u64(v: u64) -> MacAddr {
        let b = v.to_be_bytes();
        MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(b: [u8; 6]) -> MacAddr {
        MacAddr(b)
    }
}

/// Why a MAC address did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseMacError;

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("expected a MAC address such as 52:54:00:12:34:56")
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for MacAddr {
    type Err = ParseMacError;

    /// Six groups of one or two hex digits separated by colons (`52:54:00:12:34:56`,
    /// `2:0:0:0:0:1`); nothing else (no signs, no spaces, no other separators).
    fn from_str(s: &str) -> Result<MacAddr, ParseMacError> {
        let mut mac = [0u8; 6];
        let mut parts = s.split(':');
        for b in mac.iter_mut() {
            let p = parts.next().ok_or(ParseMacError)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(ParseMacError);
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| ParseMacError)?;
        }
        match parts.next() {
            None => Ok(MacAddr(mac)),
            Some(_) => Err(ParseMacError),
        }
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl serde::Serialize for MacAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let m: MacAddr = "52:54:00:Ab:cd:0e".parse().unwrap();
        assert_eq!(m, MacAddr([0x52, 0x54, 0, 0xab, 0xcd, 0x0e]));
        assert_eq!(m.to_string(), "52:54:00:ab:cd:0e");
        assert_eq!("2:0:0:0:0:1".parse::<MacAddr>().unwrap(), MacAddr([2, 0, 0, 0, 0, 1]));
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0e:1",
            "+a:00:00:00:00:01",
            "52:54:00:ab:cd:0g",
            "052:1:2:3:4:5",
            " 52:54:00:ab:cd:0e",
            "52-54-00-ab-cd-0e",
            "52:54:00:ab::0e",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn classes_and_numbers() {
        assert!(MacAddr::BROADCAST.is_multicast() && MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr([0x01, 0, 0x5e, 0, 0, 1]).is_multicast());
        assert!(MacAddr([0x52, 0x54, 0, 0, 0, 1]).is_unicast() && MacAddr([0x52, 0, 0, 0, 0, 1]).is_local());
        let m = MacAddr([1, 2, 3, 4, 5, 6]);
        assert_eq!(m.to_u64(), 0x0102_0304_0506);
        assert_eq!(MacAddr::from_u64(m.to_u64()), m);
        assert_eq!(MacAddr::from_u64(0xffff_0000_0000_00ff), MacAddr([0, 0, 0, 0, 0, 0xff]));
    }
}
