//! Target: the segmenter (`wire::gso`): `Offload::parse` on an arbitrary virtio-net header and
//! frame, then, for what it accepts and classify lets through (the MTU check), the segments
//! both ways the code makes them: `segment_headers` over the flat frame, and the data path's
//! `offload::Segments` over the frame cut into buffer segments, sent as it is or with its
//! Ethernet header rewritten (a VLAN tag pushed or popped, as flow actions do). Every segment's
//! headers lie within bounds, the payloads put back together are the frame's, and every
//! segment's IPv4 header checksum and TCP checksum verify.
//!
//! An input: byte 0 the sender's offloads (bits 0-3: CSUM, TSO4, TSO6, ECN), the header
//! rewrite (bits 4-5: none, push a tag, pop a tag, rewrite the addresses) and whether the TCP
//! checksum is completed (bit 6, else left partial); bytes 1-3 where the frame is cut into
//! buffer segments; bytes 4-5 the port's MTU; 6-7 unused; 8-19 the virtio-net header; the
//! frame after it.

use super::{Rng, Target, bit, fuzz, regressions};
use crate::mem::Segs;
use crate::wire::checksum::Sum;
use crate::wire::gso::{self, DeviceJob, MAX_FRAME, MAX_HDR, MIN_MSS, Offload};
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::virtio_net::Negotiated;
use crate::wire::virtio_net::{VirtioNetHdr, flags, gso as gso_type};

pub const HDR: usize = 20;

/// Long because it is one oracle: the input decoded into a frame and a header, then every
/// property checked against it in turn (parse, segmentation, checksums, device jobs).
fn run(input: &[u8]) -> u64 {
    if input.len() < HDR {
        return 0;
    }
    let (c, frame) = input.split_at(HDR);
    let neg = Negotiated { csum: c[0] & 1 != 0, tso4: c[0] & 2 != 0, tso6: c[0] & 4 != 0, ecn: c[0] & 8 != 0 };
    let h = VirtioNetHdr::parse(&c[8..20]).unwrap();
    let len = frame.len() as u32;
    let head = &frame[..frame.len().min(MAX_HDR)];
    let o = match Offload::parse(&h, head, len, &neg) {
        Ok(o) => o,
        Err(e) => return bit(&[1, e as u64]),
    };
    if let Some((start, off)) = o.csum {
        assert!(start as u32 + off as u32 + 2 <= len, "checksum field past the frame");
    }
    let max_frame = u16::from_le_bytes([c[4], c[5]]).max(68) as u32 + 14;
    if let Some(t) = o.tso {
        assert!(t.l3 >= 14 && t.l3 < t.l4 && t.l4 < t.hdr_len, "layout {t:?}");
        assert!(t.hdr_len as usize <= MAX_HDR && t.hdr_len as u32 <= len, "headers past the frame: {t:?}");
        assert!(t.mss >= MIN_MSS);
        // classify: the MTU applies to the segments, and a frame is at most 64 KiB of IP.
        if len > MAX_FRAME || t.hdr_len as u32 + t.mss as u32 > max_frame {
            return bit(&[2]);
        }
    }
    if let Some(j) = DeviceJob::new(head, &o) {
        for (at, _) in j.fields {
            assert!(at as u32 + 2 <= len, "device job field {at} past the frame");
        }
        assert!((j.l2 + j.l3 + j.l4) as u32 <= len);
    }
    // The frame in guest buffers: a 12-byte virtio-net header, then the frame, cut in up to
    // three more places.
    let mut buf = vec![0u8; 12];
    buf.extend_from_slice(frame);
    let total = buf.len();
    let mut cuts: Vec<usize> = c[1..4].iter().filter(|&&b| b != 0).map(|&b| b as usize * total / 256).collect();
    cuts.sort();
    cuts.dedup();
    let mut segs = Segs::default();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&total)) {
        // SAFETY: inside `buf`, which lives until the end of this function, after `segs`.
        unsafe { segs.push(buf[at..].as_mut_ptr(), (cut - at) as u32) }.unwrap();
        at = cut;
    }
    let (prefix, skip) = match (c[0] >> 4) & 3 {
        1 if len >= 14 => ([&frame[..12], &[0x81, 0, 0, 5][..]].concat(), 12),
        2 if len >= 18 && frame[12..14] == [0x81, 0] => (frame[..12].to_vec(), 16),
        3 if len >= 12 => (vec![2, 0, 0, 0, 0, 9, 2, 0, 0, 0, 0, 8], 12),
        _ => (Vec::new(), 0),
    };
    let full = c[0] & 0x40 != 0;
    // The same frame through the data path, sent as it is and as rewritten.
    let (sum, as_is) = crate::datapath::offload_for_fuzzing(clone(&segs), 12, len, o, &[], 0, full);
    let (_, rewritten) = crate::datapath::offload_for_fuzzing(clone(&segs), 12, len, o, &prefix, skip, full);
    if let Some((start, off)) = o.csum.filter(|_| o.tso.is_none()) {
        // A partial checksum completed from the buffers is the one completed over the flat frame.
        let mut flat = frame.to_vec();
        gso::complete_checksum(&mut flat, start as usize, off as usize);
        let at = (start + off) as usize;
        assert_eq!(sum, Some((at as u32, u16::from_be_bytes([flat[at], flat[at + 1]]))));
        return bit(&[3]);
    }
    let Some(t) = o.tso else { return bit(&[4]) };
    let segments = as_is.expect("the data path segments what classify accepted");
    let hl = t.hdr_len as usize;
    let count = o.segments(len);
    assert_eq!(segments.len() as u32, count);
    assert!(count as usize <= (frame.len() - hl) / t.mss as usize + 1);
    let mut payload = Vec::new();
    let mut out = [0u8; MAX_HDR];
    let mut seq = None;
    for (i, (hdrs, skip, plen, l4)) in segments.iter().enumerate() {
        let (skip, plen) = (*skip as usize, *plen as usize);
        assert!(plen <= t.mss as usize && skip + plen <= frame.len(), "segment {i}: payload {skip}+{plen}");
        assert_eq!((hdrs.len(), *l4), (hl, t.l4));
        assert_eq!(skip, hl + payload.len(), "segment {i} does not follow the previous one");
        let body = &frame[skip..skip + plen];
        payload.extend_from_slice(body);
        // The flat-frame segmenter writes the same headers.
        gso::segment_headers(head, &t, i as u32, count, (skip - hl) as u32, plen as u32, &mut out[..]);
        if full {
            let mut s = Sum::new();
            s.add_bytes(body);
            gso::finish_tcp_checksum(&mut out, &t, s);
        }
        assert_eq!(&out[..hl], &hdrs[..], "segment {i}: the two segmenters disagree");
        let seg = [&hdrs[..], body].concat();
        if !t.v6 {
            let ip = Ipv4Packet::new_checked(&seg[t.l3 as usize..]).expect("segment's IPv4 header");
            assert!(ip.verify_checksum(), "segment {i}: IPv4 header checksum");
            assert_eq!(ip.total_len() as usize, seg.len() - t.l3 as usize, "segment {i}: IPv4 total length");
        }
        if full {
            assert_eq!(gso::l4_checksum_ok(&seg), Some(true), "segment {i}: TCP checksum");
        }
        let s = u32::from_be_bytes(seg[t.l4 as usize + 4..t.l4 as usize + 8].try_into().unwrap());
        if let Some(prev) = seq {
            assert_eq!(s, prev, "segment {i}: sequence number");
        }
        seq = Some(s.wrapping_add(plen as u32));
    }
    assert_eq!(payload, frame[hl..], "the segments' payloads are not the frame's");
    if let Some(rw) = rewritten {
        let delta = prefix.len() as i32 - skip as i32;
        for (i, (hdrs, sk, plen, _)) in rw.iter().enumerate() {
            assert_eq!(hdrs.len() as i32, hl as i32 + delta, "rewritten segment {i}: header length");
            assert!((*sk + *plen) as usize <= frame.len());
            if full {
                let seg = [&hdrs[..], &frame[*sk as usize..(*sk + *plen) as usize]].concat();
                assert_ne!(gso::l4_checksum_ok(&seg), Some(false), "rewritten segment {i}: TCP checksum");
            }
        }
    }
    bit(&[5, t.v6 as u64, count.min(4) as u64, (c[0] >> 4) as u64 & 7])
}

fn clone<'m>(s: &Segs<'m>) -> Segs<'m> {
    let mut c = Segs::default();
    for &(p, n) in s.pieces() {
        // SAFETY: the pieces of `s`, valid for 'm as they are in `s`.
        unsafe { c.push(p, n) }.unwrap();
    }
    c
}

/// A well-formed TSO (or checksum-only) TCP frame and the header a Linux guest would send it
/// with: IPv4 or IPv6, 0-2 VLAN tags, TCP options, a payload of 0-3000 bytes (or up to 64 KiB).
fn generate(rng: &mut Rng) -> Vec<u8> {
    let v6 = rng.one_in(2);
    let vlans = rng.below(3);
    let opts = 4 * rng.below(11);
    let plen = if rng.one_in(8) { rng.below(65000) } else { rng.below(3000) };
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    for _ in 0..vlans {
        f.extend_from_slice(&[0x81, 0, 0, 10]);
    }
    let l3 = f.len() + 2;
    let tcp_len = 20 + opts + plen;
    if v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&[0xfd; 16]);
        f.extend_from_slice(&[0xfe; 16]);
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        f.extend_from_slice(&[0xff, 0xf0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        Ipv4Packet::new_unchecked(&mut f[l3..]).fill_checksum();
    }
    let l4 = f.len();
    f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
    f.extend_from_slice(&(rng.next() as u32).to_be_bytes());
    f.extend_from_slice(&7u32.to_be_bytes());
    let fl = [0x10u8, 0x18, 0x19, 0x98, 0x11][rng.below(5)];
    f.extend_from_slice(&[(((20 + opts) / 4) << 4) as u8, fl, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend((0..opts).map(|i| if i + 1 == opts { 0 } else { 1 }));
    f.extend(rng.bytes(plen));
    let tso = rng.below(4) != 0;
    let mss = *rng.pick(&[MIN_MSS, 89, 536, 1448, 1460, 8948, 9000, 65000]);
    let mtu = *rng.pick(&[1500u16, 9000, 65535, mss.saturating_add(120), 68]);
    let hdr = VirtioNetHdr {
        flags: flags::NEEDS_CSUM,
        gso_type: if !tso {
            0
        } else if v6 {
            gso_type::TCPV6
        } else {
            gso_type::TCPV4
        } | if tso && rng.one_in(4) { gso_type::ECN } else { 0 },
        hdr_len: (l4 + 20 + opts) as u16,
        gso_size: if tso { mss } else { 0 },
        csum_start: l4 as u16,
        csum_offset: 16,
        num_buffers: 0,
    };
    let mut c = vec![0x0f | (rng.below(4) as u8) << 4 | (rng.below(2) as u8) << 6];
    c.extend(rng.bytes(3));
    c.extend_from_slice(&mtu.to_le_bytes());
    c.extend_from_slice(&[0, 0]);
    c.extend_from_slice(&hdr.to_bytes());
    c.extend_from_slice(&f);
    c
}

/// Sets a header field (or a frame byte near the headers) to an edge value.
fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    if v.len() < HDR {
        v.resize(HDR, 0);
    }
    match rng.below(3) {
        0 => {
            // A u16 of the virtio-net header: hdr_len, gso_size, csum_start, csum_offset.
            let at = 8 + 2 * (1 + rng.below(4));
            let len = (v.len() - HDR) as u16;
            let x =
                *rng.pick(&[0u16, 1, 14, 16, 54, 87, 88, 89, 0xffff, len, len.wrapping_sub(1), len.wrapping_sub(2)]);
            v[at..at + 2].copy_from_slice(&x.to_le_bytes());
        }
        1 => v[9] = *rng.pick(&[0u8, 1, 3, 4, 5, 0x80, 0x81, 0x84]),
        _ => {
            // One byte of the frame's first 80 (its headers).
            if v.len() > HDR {
                let at = HDR + rng.below((v.len() - HDR).min(80));
                v[at] = *rng.pick(&[0u8, 0x45, 0x4f, 0x46, 0x60, 0x81, 0x86, 0xdd, 0x08, 6, 17, 0xff, 0x50, 0xf0]);
            }
        }
    }
}

pub const TARGET: Target =
    Target { name: "gso", max_len: HDR + 70_000, run, generate: Some(generate), mutate: Some(mutate), dict: &[] };

#[test]
fn gso() {
    fuzz(&TARGET);
}

#[test]
fn gso_regressions() {
    regressions(&TARGET);
}
