//! `allowed_ips`: the IPv4 and IPv6 prefixes a port may send from (OpenStack's fixed IPs and
//! allowed address pairs), so that a rule's remote address means what it says.
#![forbid(unsafe_code)]

use std::fmt;
use std::net::IpAddr;

/// An IPv4 or IPv6 prefix (`10.0.0.5`, `10.0.0.0/24`, `fd00::5`, `fd00::/64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPrefix {
    /// IPv4 addresses in the first 4 bytes.
    addr: [u8; 16],
    len: u8,
    v6: bool,
}

impl IpPrefix {
    /// A prefix from its text; its host bits must be zero (`10.0.0.1/24` is refused: it names
    /// an address and a network at once).
    pub fn parse(s: &str) -> Option<IpPrefix> {
        let (a, len) = match s.split_once('/') {
            // Digits only, no leading zero ("/08" is refused, as ip(8) refuses it).
            Some((a, l)) => (a, Some(l.parse::<u8>().ok().filter(|n| n.to_string() == l)?)),
            None => (s, None),
        };
        let (addr, v6, max) = match a.parse::<IpAddr>().ok()? {
            IpAddr::V4(v4) => {
                let mut b = [0u8; 16];
                b[..4].copy_from_slice(&v4.octets());
                (b, false, 32)
            }
            IpAddr::V6(v6) => (v6.octets(), true, 128),
        };
        let len = len.unwrap_or(max);
        let p = IpPrefix { addr, len, v6 };
        (len <= max && p.masked(&addr) == addr).then_some(p)
    }

    fn masked(&self, a: &[u8; 16]) -> [u8; 16] {
        let mut m = *a;
        for (i, b) in m.iter_mut().enumerate() {
            let bits = (self.len as usize).saturating_sub(i * 8).min(8);
            *b &= !(0xffu16 >> bits) as u8;
        }
        m
    }

    /// Whether IPv4 address `a` is in the prefix.
    #[inline]
    pub fn contains4(&self, a: [u8; 4]) -> bool {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&a);
        !self.v6 && self.masked(&b) == self.addr
    }

    /// Whether IPv6 address `a` is in the prefix.
    #[inline]
    pub fn contains6(&self, a: &[u8; 16]) -> bool {
        self.v6 && self.masked(a) == self.addr
    }
}

impl IpPrefix {
    /// Whether address `a` (IPv4 in its first 4 bytes if not `v6`, the rest zero) is in the
    /// prefix.
    #[inline]
    pub fn contains(&self, a: &[u8; 16], v6: bool) -> bool {
        self.v6 == v6 && self.masked(a) == self.addr
    }

    pub fn is_v6(&self) -> bool {
        self.v6
    }

    /// The IPv6 address, if the prefix is one IPv6 host (`fd00::5`, `fd00::5/128`).
    pub fn host6(&self) -> Option<std::net::Ipv6Addr> {
        (self.v6 && self.len == 128).then(|| std::net::Ipv6Addr::from(self.addr))
    }

    /// The IPv4 address, if the prefix is one IPv4 host (`10.0.0.5`, `10.0.0.5/32`).
    pub fn host4(&self) -> Option<std::net::Ipv4Addr> {
        (!self.v6 && self.len == 32)
            .then(|| std::net::Ipv4Addr::new(self.addr[0], self.addr[1], self.addr[2], self.addr[3]))
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.v6 {
            write!(f, "{}/{}", std::net::Ipv6Addr::from(self.addr), self.len)
        } else {
            let a = &self.addr;
            write!(f, "{}.{}.{}.{}/{}", a[0], a[1], a[2], a[3], self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_parse_print_and_contain() {
        let p = IpPrefix::parse("10.0.0.0/24").unwrap();
        assert!(p.contains4([10, 0, 0, 9]) && !p.contains4([10, 0, 1, 9]));
        assert!(!p.contains6(&[0; 16]), "a v4 prefix holds no v6 address");
        assert_eq!(p.to_string(), "10.0.0.0/24");
        let h = IpPrefix::parse("10.0.0.5").unwrap();
        assert!(h.contains4([10, 0, 0, 5]) && !h.contains4([10, 0, 0, 4]));
        assert_eq!(h.to_string(), "10.0.0.5/32");
        let v6 = IpPrefix::parse("fd00::/64").unwrap();
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = 7;
        assert!(v6.contains6(&a));
        a[7] = 1;
        assert!(!v6.contains6(&a));
        assert_eq!(IpPrefix::parse("fd00::5").unwrap().to_string(), "fd00::5/128");
        assert!(IpPrefix::parse("0.0.0.0/0").unwrap().contains4([1, 2, 3, 4]));
        for bad in ["10.0.0.1/24", "10.0.0.0/33", "fd00::1/64", "10.0.0", "x", "10.0.0.0/", "10.0.0.0/08", "fd00::/129"]
        {
            assert!(IpPrefix::parse(bad).is_none(), "{bad}");
        }
    }
}
