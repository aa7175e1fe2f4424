//! Frames the tests build by hand, and what the switch makes of them: an IPv4/UDP frame, and
//! the same frame as a router leaves it.

use pvswitch::wire::MacAddr;
use pvswitch::wire::checksum::checksum;

fn mac(m: &str) -> [u8; 6] {
    m.parse::<MacAddr>().unwrap_or_else(|_| panic!("{m} is not a MAC")).0
}

/// A 74-byte IPv4/UDP frame from `src` (MAC) at `from` to `dst` (MAC) for address `to`, with
/// TTL `ttl`, its header checksum right.
pub fn udp4(dst: &str, src: &str, from: [u8; 4], to: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut f = mac(dst).to_vec();
    f.extend(mac(src));
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 60, 0, 1, 0, 0, ttl, 17, 0, 0]);
    f.extend_from_slice(&from);
    f.extend_from_slice(&to);
    let sum = checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&[0x30, 0x39, 0x30, 0x39, 0, 40, 0, 0]);
    f.resize(74, 0x5a);
    f
}

/// IPv4 frame `f` as a router whose MAC is `gateway` leaves it for the neighbour at `to`: the
/// neighbour's MAC from the gateway's, its TTL one less and the header checksum again.
pub fn routed(f: &[u8], to: &str, gateway: &str) -> Vec<u8> {
    let mut want = f.to_vec();
    want[0..6].copy_from_slice(&mac(to));
    want[6..12].copy_from_slice(&mac(gateway));
    want[22] -= 1;
    want[24..26].copy_from_slice(&[0, 0]);
    let sum = checksum(&want[14..34]);
    want[24..26].copy_from_slice(&sum.to_be_bytes());
    want
}
