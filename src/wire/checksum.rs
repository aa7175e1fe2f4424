//! The Internet checksum (RFC 1071): a ones' complement sum of 16-bit big-endian words.
//!
//! Sums are accumulated in a `u64` and folded at the end, so pieces of a packet (a pseudo
//! header, a TCP header, payload segments) can be summed separately and combined with
//! [`combine`]; a piece of odd length shifts every later piece by a byte, which
//! [`Sum::add_bytes`] tracks.

use std::net::{Ipv4Addr, Ipv6Addr};

/// A running ones' complement sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sum {
    acc: u64,
    /// Whether an odd number of bytes was added so far (the next byte is a low byte).
    odd: bool,
}

impl Sum {
    pub const fn new() -> Sum {
        Sum { acc: 0, odd: false }
    }

    /// Adds `data` as if it followed everything added before.
    pub fn add_bytes(&mut self, mut data: &[u8]) -> &mut Sum {
        if self.odd && !data.is_empty() {
            self.acc += data[0] as u64;
            data = &data[1..];
            self.odd = false;
        }
        let mut acc = self.acc;
        // Long runs: 32-bit words in the machine's byte order into four independent 64-bit
        // sums (no carry can leave them for 2^32 words), which the compiler turns into vector
        // adds. Ones' complement addition does not care about byte order (RFC 1071 section
        // 2(B)): the folded result only needs its two bytes swapped back.
        if data.len() >= 64 {
            let mut lanes = [0u64; 4];
            let mut blocks = data.chunks_exact(16);
            for b in &mut blocks {
                for (lane, w) in lanes.iter_mut().zip(b.chunks_exact(4)) {
                    *lane += u32::from_ne_bytes(w.try_into().unwrap()) as u64;
                }
            }
            let mut native = 0u64;
            for l in lanes {
                let (s, carry) = native.overflowing_add(l);
                native = s + carry as u64;
            }
            let folded = fold64(native);
            let be = if cfg!(target_endian = "little") { folded.swap_bytes() } else { folded };
            let (s, carry) = acc.overflowing_add(be as u64);
            acc = s + carry as u64;
            data = blocks.remainder();
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            // Four big-endian words at once: the sum of 16-bit words is kept modulo 2^16 - 1,
            // which a 64-bit add with end-around carry preserves.
            let w = u64::from_be_bytes(c.try_into().unwrap());
            let (s, carry) = acc.overflowing_add(w);
            acc = s + carry as u64;
        }
        let rest = chunks.remainder();
        let mut pairs = rest.chunks_exact(2);
        for p in &mut pairs {
            let (s, carry) = acc.overflowing_add(u16::from_be_bytes([p[0], p[1]]) as u64);
            acc = s + carry as u64;
        }
        if let [b] = pairs.remainder() {
            let (s, carry) = acc.overflowing_add((*b as u64) << 8);
            acc = s + carry as u64;
            self.odd = true;
        }
        self.acc = acc;
        self
    }

    /// Adds one 16-bit word (at an even offset).
    pub fn add_u16(&mut self, w: u16) -> &mut Sum {
        let (s, carry) = self.acc.overflowing_add(w as u64);
        self.acc = s + carry as u64;
        self
    }

    pub fn add_u32(&mut self, w: u32) -> &mut Sum {
        self.add_u16((w >> 16) as u16).add_u16(w as u16)
    }

    /// The sum folded to 16 bits (not complemented).
    pub fn fold(&self) -> u16 {
        fold64(self.acc)
    }

    /// The checksum field value: the complement of the folded sum.
    pub fn finish(&self) -> u16 {
        !self.fold()
    }
}

/// A 64-bit ones' complement sum folded to 16 bits.
fn fold64(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The checksum of `data` alone.
pub fn checksum(data: &[u8]) -> u16 {
    Sum::new().add_bytes(data).finish()
}

/// Combines two folded partial sums (ones' complement addition).
pub fn combine(a: u16, b: u16) -> u16 {
    let s = a as u32 + b as u32;
    ((s & 0xffff) + (s >> 16)) as u16
}

/// The TCP/UDP pseudo header over IPv4: addresses, protocol and the L4 length.
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4_len: u32) -> Sum {
    let mut s = Sum::new();
    s.add_bytes(&src.octets()).add_bytes(&dst.octets()).add_u16(protocol as u16).add_u32(l4_len);
    s
}

/// The TCP/UDP pseudo header over IPv6 (RFC 8200 section 8.1).
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4_len: u32) -> Sum {
    let mut s = Sum::new();
    s.add_bytes(&src.octets()).add_bytes(&dst.octets()).add_u32(l4_len).add_u16(next_header as u16);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The straightforward definition, word by word.
    fn reference(data: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { (c[0] as u16) << 8 };
            s += w as u32;
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    #[test]
    fn known_answer() {
        // RFC 1071 section 3's example words 0001 f203 f4f5 f6f7: sum ddf2, checksum 220d.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(Sum::new().add_bytes(&d).fold(), 0xddf2);
        assert_eq!(checksum(&d), 0x220d);
        // A real IPv4 header (checksum field 0xb861 included): sums to 0xffff, checksum 0.
        let ip = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8,
            0x00, 0xc7,
        ];
        assert_eq!(checksum(&ip), 0);
    }

    #[test]
    fn long_runs_equal_the_definition() {
        // Every length around the vector path's edges, all-ones bytes (the most carries),
        // pseudo-random bytes, and pieces starting at odd offsets.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let random: Vec<u8> = (0..70_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let ones = vec![0xffu8; 70_000];
        for data in [&random, &ones] {
            for len in (0..200).chain([1447, 1448, 1449, 4096, 65_535, 70_000]) {
                assert_eq!(checksum(&data[..len]), reference(&data[..len]), "len {len}");
                let (a, b) = ((len / 3) | 1, 2 * len / 3);
                if b > a {
                    let mut s = Sum::new();
                    s.add_bytes(&data[..a]).add_bytes(&data[a..b]).add_bytes(&data[b..len]);
                    assert_eq!(s.finish(), reference(&data[..len]), "len {len} in three");
                }
            }
        }
    }

    #[test]
    fn pieces_equal_whole() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 999, 1000] {
            assert_eq!(checksum(&data[..len]), reference(&data[..len]), "len {len}");
            for split in [0, 1, 2, 3, 5, 8, len / 2] {
                let split = split.min(len);
                let mut s = Sum::new();
                s.add_bytes(&data[..split]).add_bytes(&data[split..len]);
                assert_eq!(s.finish(), reference(&data[..len]), "len {len} split {split}");
            }
        }
    }
}
