//! Checksum and segmentation offloads through the data path: a TSO frame of up to 64 KiB and a
//! partial checksum reach a receiver that negotiated the offloads as they are (header fields
//! carried through), and one that did not as MSS-sized segments with complete headers and
//! checksums, or with the checksum completed; malformed offload headers are dropped per reason
//! while a bystander's frames go on.

use pvsgen::frontend::{Desc, F_NEXT, Layout, SCRATCH};

use super::*;
use crate::datapath::counters::DropReason;
use crate::wire::checksum::Sum;
use crate::wire::gso::l4_checksum_ok;
use crate::wire::virtio_net::{feature, flags, gso};
use crate::wire::{Ipv4Packet, VirtioNetHdr};

const OFFLOADS: u64 = feature::CSUM
    | feature::GUEST_CSUM
    | feature::HOST_TSO4
    | feature::HOST_TSO6
    | feature::GUEST_TSO4
    | feature::GUEST_TSO6
    | feature::HOST_ECN
    | feature::GUEST_ECN;

/// A TCP/IPv4 frame from VM `from` to VM `to` with `payload` bytes, its TCP checksum field
/// holding the pseudo header's sum (as a guest with CSUM hands it over).
fn tcp_frame(to: usize, from: usize, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&mac(to));
    f.extend_from_slice(&mac(from));
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((40 + payload.len()).min(65535) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&100u16.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[10, 0, 0, from as u8 + 1]);
    ip[16..20].copy_from_slice(&[10, 0, 0, to as u8 + 1]);
    f.extend_from_slice(&ip);
    Ipv4Packet::new_unchecked(&mut f[14..]).fill_checksum();
    let mut th = [0u8; 20];
    th[0..2].copy_from_slice(&40000u16.to_be_bytes());
    th[2..4].copy_from_slice(&5201u16.to_be_bytes());
    th[4..8].copy_from_slice(&1000u32.to_be_bytes());
    th[12..14].copy_from_slice(&(5u16 << 12 | 0x018).to_be_bytes()); // ACK PSH
    th[14..16].copy_from_slice(&65535u16.to_be_bytes());
    f.extend_from_slice(&th);
    f.extend_from_slice(payload);
    let l4_len = 20 + payload.len() as u32;
    let pseudo = Ipv4Packet::new_unchecked(&f[14..]).pseudo_header(l4_len);
    f[50..52].copy_from_slice(&pseudo.fold().to_be_bytes());
    f
}

fn payload(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

/// A TSO header for `tcp_frame`'s frames.
fn tso(mss: u16) -> VirtioNetHdr {
    VirtioNetHdr {
        flags: flags::NEEDS_CSUM,
        gso_type: gso::TCPV4,
        hdr_len: 54,
        gso_size: mss,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    }
}

/// A partial checksum header for `tcp_frame`'s frames.
const CSUM: VirtioNetHdr = VirtioNetHdr {
    flags: flags::NEEDS_CSUM,
    gso_type: 0,
    hdr_len: 0,
    gso_size: 0,
    csum_start: 34,
    csum_offset: 16,
    num_buffers: 0,
};

/// Sends one frame from VM `i` with virtio-net header `h`: the header, then the frame in
/// 4 KiB descriptors, one chain from descriptor 0 (the previous one must be completed).
fn send_with(b: &mut Bench, i: usize, h: &VirtioNetHdr, frame: &[u8]) {
    assert_eq!(b.vms[i].guest.tx_pending(), 0, "the previous raw frame is not completed");
    b.vms[i].guest.mem.write(SCRATCH, &h.to_bytes());
    b.vms[i].guest.mem.write(SCRATCH + 4096, frame);
    let mut tx = b.vms[i].guest.raw_tx();
    let pieces: Vec<&[u8]> = frame.chunks(4096).collect();
    tx.desc(0, Desc { addr: SCRATCH, len: 12, flags: F_NEXT, next: 1 });
    for (k, p) in pieces.iter().enumerate() {
        let last = k + 1 == pieces.len();
        let d = Desc {
            addr: SCRATCH + 4096 + 4096 * k as u64,
            len: p.len() as u32,
            flags: if last { 0 } else { F_NEXT },
            next: k as u16 + 2,
        };
        tx.desc(k as u16 + 1, d);
    }
    tx.stage(0);
    tx.publish();
}

/// A bench of three VMs: 0 sends with offloads, 1 receives with `rx_features`, 2 is a
/// bystander. Receive buffers of 4 KiB; MRG_RXBUF for everyone.
fn bench(rx_features: u64) -> Bench {
    let d = DRIVER_FEATURES | feature::MRG_RXBUF;
    let mut b = Bench::with_features(
        BenchCfg { vms: 3, layout: Layout::TEST, ..BenchCfg::default() },
        &[d | OFFLOADS, d | rx_features, d],
    );
    for i in 0..3 {
        b.announce(i);
    }
    b
}

/// The segments a receiver without offloads got for a TSO frame: each a complete TCP/IPv4
/// frame within the MSS, checksums good, sequence numbers contiguous; their payloads put
/// together are the original's.
fn check_segments(got: &[Vec<u8>], original: &[u8], mss: usize) {
    let n = (original.len() - 54).div_ceil(mss);
    assert_eq!(got.len(), n, "segments");
    let mut back = Vec::new();
    for (i, s) in got.iter().enumerate() {
        assert!(s.len() - 54 <= mss, "segment {i} is {} bytes", s.len());
        assert_eq!(s[..12], original[..12], "segment {i}'s addresses");
        let ip = Ipv4Packet::new_checked(&s[14..]).unwrap();
        assert!(ip.verify_checksum(), "segment {i}: IP checksum");
        assert_eq!(ip.total_len() as usize, s.len() - 14, "segment {i}: IP length");
        assert_eq!(ip.ident(), 100 + i as u16, "segment {i}: IP id");
        assert_eq!(l4_checksum_ok(s), Some(true), "segment {i}: TCP checksum");
        let seq = u32::from_be_bytes(s[38..42].try_into().unwrap());
        assert_eq!(seq, 1000 + (i * mss) as u32, "segment {i}: sequence number");
        let psh = s[47] & 0x08 != 0;
        assert_eq!(psh, i + 1 == n, "segment {i}: PSH only on the last");
        back.extend_from_slice(&s[54..]);
    }
    assert!(back == original[54..], "payload differs after segmentation");
}

#[test]
fn a_64k_tso_frame_reaches_a_receiver_with_offloads_whole() {
    let mut b = bench(OFFLOADS);
    let f = tcp_frame(1, 0, &payload(65000, 1));
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(50);
    let got = b.vms[1].recv();
    assert_eq!(got.len(), 1, "one frame, not segments");
    assert!(got[0] == f, "the frame changed on the way");
    let h = b.vms[1].hdrs[0];
    assert_eq!((h.flags, h.gso_type, h.gso_size, h.hdr_len, h.csum_start, h.csum_offset), (1, 1, 1448, 54, 34, 16));
    assert!(h.num_buffers >= 16, "64 KiB in 4 KiB buffers: {}", h.num_buffers);
    assert_eq!(b.totals(1).sw_segmented, 0);
}

/// A tag pushed on the way (an access port's frame to a trunk) keeps a TSO frame's offload:
/// whole to a trunk that negotiated it, its header's offsets 4 bytes further on; and popped
/// again, segments for an access port that did not negotiate it.
#[test]
fn tso_frames_keep_their_offload_through_a_tag() {
    use crate::config::vlan::PortVlan;
    let mut b = bench(OFFLOADS);
    b.policies[0].vlan = PortVlan::access(10);
    b.policies[1].vlan = PortVlan::trunk(&[10]);
    b.policies[2].vlan = PortVlan::access(10);
    b.post(0);
    let f = tcp_frame(1, 0, &payload(20000, 3));
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(50);
    let got = b.vms[1].recv();
    assert_eq!(got.len(), 1, "one frame, not segments");
    assert!(got[0] == tagged(&f, 0x8100, 10), "the trunk's frame is not the frame tagged");
    let h = b.vms[1].hdrs[0];
    assert_eq!((h.gso_type, h.gso_size, h.hdr_len, h.csum_start, h.csum_offset), (1, 1448, 58, 38, 16));
    check_segments(&b.vms[2].recv(), &f, 1448);
}

#[test]
fn a_tso_frame_to_a_receiver_without_offloads_is_segmented_for_it_alone() {
    let mut b = bench(0);
    let before = b.totals(1).tx_packets;
    let f = tcp_frame(1, 0, &payload(60000, 2));
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(50);
    let got = b.vms[1].recv();
    check_segments(&got, &f, 1448);
    assert!(b.vms[1].hdrs.iter().all(|h| *h == VirtioNetHdr { num_buffers: 1, ..VirtioNetHdr::PLAIN }));
    assert_eq!(b.totals(1).sw_segmented, 1);
    assert_eq!(b.totals(1).tx_packets - before, got.len() as u64, "each segment counts as a frame sent");
}

#[test]
fn a_receiver_with_guest_csum_but_no_tso_gets_segments_with_partial_checksums() {
    let mut b = bench(feature::GUEST_CSUM);
    let f = tcp_frame(1, 0, &payload(10000, 3));
    send_with(&mut b, 0, &tso(1000), &f);
    b.settle(50);
    let mut got = b.vms[1].recv();
    assert_eq!(got.len(), 10);
    for (s, h) in got.iter_mut().zip(b.vms[1].hdrs.clone()) {
        assert_eq!((h.flags, h.gso_type, h.csum_start, h.csum_offset), (flags::NEEDS_CSUM, 0, 34, 16));
        // Complete it as the guest would: the field holds the pseudo header's sum.
        let v = crate::wire::gso::final_value(Sum::new().add_bytes(&s[34..]).fold());
        s[50..52].copy_from_slice(&v.to_be_bytes());
    }
    check_segments(&got, &f, 1000);
}

#[test]
fn a_partial_checksum_is_completed_for_a_receiver_without_guest_csum() {
    let mut b = bench(0);
    for len in [0usize, 1, 99, 1400] {
        let f = tcp_frame(1, 0, &payload(len, 4));
        send_with(&mut b, 0, &CSUM, &f);
        b.settle(20);
        let got = b.vms[1].recv();
        assert_eq!(got.len(), 1);
        assert_eq!(l4_checksum_ok(&got[0]), Some(true), "payload {len}: checksum not completed");
        assert_eq!(got[0][..50], f[..50]);
        assert_eq!(got[0][52..], f[52..]);
    }
    assert_eq!(b.totals(1).sw_checksums, 4);
    // A receiver with GUEST_CSUM gets the frame as it was, NEEDS_CSUM kept.
    let mut b = bench(feature::GUEST_CSUM);
    let f = tcp_frame(1, 0, &payload(500, 5));
    send_with(&mut b, 0, &CSUM, &f);
    b.settle(20);
    assert!(b.vms[1].recv() == [f.clone()]);
    assert_eq!(b.vms[1].hdrs[0].flags, flags::NEEDS_CSUM);
}

#[test]
fn a_flood_gives_each_port_what_it_negotiated() {
    // Unknown destination: vm1 (offloads) gets it whole, vm2 (none) as segments.
    let mut b = bench(OFFLOADS);
    let mut f = tcp_frame(1, 0, &payload(20000, 6));
    f[..6].copy_from_slice(&[2, 0xee, 0, 0, 0, 9]);
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(50);
    assert!(b.vms[1].recv() == [f.clone()]);
    let got = b.vms[2].recv();
    check_segments(&got, &f, 1448);
}

/// Each malformed offload header is dropped and counted for its reason; the sender's next good
/// frame, and a bystander's, go through.
#[test]
fn malformed_offload_headers_are_dropped_per_reason() {
    let mut b = bench(OFFLOADS);
    let f = tcp_frame(1, 0, &payload(3000, 7));
    let len = f.len() as u16;
    let cases = [
        (VirtioNetHdr { csum_start: len - 10, ..CSUM }, DropReason::OffloadCsum),
        (VirtioNetHdr { gso_size: 0, ..tso(1448) }, DropReason::OffloadGsoSize),
        (VirtioNetHdr { hdr_len: len + 1, ..tso(1448) }, DropReason::OffloadHeaders),
        (VirtioNetHdr { gso_type: gso::UDP, ..tso(1448) }, DropReason::OffloadGsoType),
        (VirtioNetHdr { gso_type: gso::TCPV6, ..tso(1448) }, DropReason::OffloadHeaders),
        // MSS past the MTU (9000 here): the segments would not fit.
        (tso(9500), DropReason::Mtu),
    ];
    for (h, why) in cases {
        let before = b.drops(0, why);
        send_with(&mut b, 0, &h, &f);
        b.vms[2].guest.send(&frame(mac(1), mac(2), 100, 1));
        b.settle(20);
        assert_eq!(b.drops(0, why), before + 1, "{why:?} not counted for {h:?}");
        assert_eq!(b.vms[1].recv().len(), 1, "the bystander's frame ({why:?})");
    }
    // The sender itself goes on.
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(20);
    assert!(b.vms[1].recv() == [f]);
}

/// A port that negotiated no offloads has a header that means nothing: it is not read, so a
/// TSO or NEEDS_CSUM header from it is ignored and the frame goes as it is (a 64 KiB one is
/// over the MTU). A port that negotiated some offloads may not use the others: a TSO header
/// from a port with CSUM alone is dropped (offload_not_negotiated).
#[test]
fn offload_headers_a_port_did_not_negotiate() {
    let d = DRIVER_FEATURES | feature::MRG_RXBUF;
    let cfg = BenchCfg { vms: 3, layout: Layout::TEST, ..BenchCfg::default() };
    let mut b = Bench::with_features(cfg, &[d, d | OFFLOADS, d | feature::CSUM]);
    for i in 0..3 {
        b.announce(i);
    }
    for vm in &mut b.vms {
        vm.recv();
    }
    let f = tcp_frame(1, 0, &payload(20000, 8));
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(20);
    assert_eq!(b.drops(0, DropReason::Mtu), 1, "the TSO header ignored: a plain 20000-byte frame");
    send_with(&mut b, 0, &CSUM, &f[..1000]);
    b.settle(20);
    assert!(b.vms[1].recv() == [&f[..1000]], "the NEEDS_CSUM header ignored: the frame as sent");
    send_with(&mut b, 0, &VirtioNetHdr::PLAIN, &f);
    b.settle(20);
    assert_eq!(b.drops(0, DropReason::Mtu), 2);
    assert_eq!(b.drops(0, DropReason::OffloadNotNegotiated), 0);
    // CSUM alone: it may not use TSO, so its TSO header is refused.
    send_with(&mut b, 2, &tso(1448), &f);
    b.settle(20);
    assert_eq!(b.drops(2, DropReason::OffloadNotNegotiated), 1);
    assert!(b.vms[1].recv().is_empty());
    // Both senders' queues go on: their next plain frames arrive.
    let (from0, from2) = (tcp_frame(1, 0, &payload(100, 3)), tcp_frame(1, 2, &payload(100, 4)));
    send_with(&mut b, 0, &VirtioNetHdr::PLAIN, &from0);
    send_with(&mut b, 2, &VirtioNetHdr::PLAIN, &from2);
    b.settle(20);
    assert!(b.vms[1].recv() == [from0, from2]);
}

/// More segments than the receiver's ring has entries can never be placed: such a frame is
/// dropped at once (counted), not written in part and retried. Before, the first 256
/// segments reached the receiver at every retry.
#[test]
fn a_tso_frame_with_more_segments_than_the_ring_is_dropped_whole() {
    let mut b = bench(0);
    let f = tcp_frame(1, 0, &payload(60000, 7));
    send_with(&mut b, 0, &tso(88), &f); // 682 segments, for a ring of 256
    b.settle(50);
    assert_eq!(b.vms[1].recv().len(), 0, "segments of a frame that cannot fit were delivered");
    assert_eq!(b.drops(1, DropReason::RxBufferTooSmall), 1);
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
    // The receiver and the sender go on.
    let g = tcp_frame(1, 0, &payload(3000, 8));
    send_with(&mut b, 0, &tso(1448), &g);
    b.settle(50);
    check_segments(&b.vms[1].recv(), &g, 1448);
}

/// A receiver whose free buffers run out in the middle of a TSO frame's segments (room for
/// the segment count, not for their bytes): the segments written are taken back, so the
/// frame arrives whole or not at all, never in part and never twice.
#[test]
fn a_tso_frame_that_runs_out_of_room_midway_arrives_whole_or_not_at_all() {
    let d = DRIVER_FEATURES | feature::MRG_RXBUF;
    let mut b = Bench::with_features(
        BenchCfg { vms: 3, layout: Layout::TEST, retry_cycles: 0, ..BenchCfg::default() },
        &[d | OFFLOADS, d, d],
    );
    for i in 0..3 {
        b.announce(i);
    }
    // vm1's buffers shrink to 256 bytes: a 1514-byte segment takes 6 of them.
    let l = *b.vms[1].guest.layout();
    b.vms[1].rx_buf = 256;
    {
        let mut rx = b.vms[1].guest.raw_rx();
        for k in 0..l.qsize {
            rx.desc(k, Desc { addr: l.rx_buf(k), len: 256, flags: pvsgen::frontend::F_WRITE, next: 0 });
        }
    }
    let f = tcp_frame(1, 0, &payload(65000, 9)); // 45 segments, 270 buffers: more than 256
    send_with(&mut b, 0, &tso(1448), &f);
    b.settle(50);
    let got = b.vms[1].recv();
    assert_eq!(got.len(), 0, "{} segments of a frame that did not fit were delivered", got.len());
    assert_eq!(b.drops(1, DropReason::RxRingFull), 1);
    // One that fits (20 segments, 120 buffers) arrives whole, once.
    let g = tcp_frame(1, 0, &payload(20 * 1448, 10));
    send_with(&mut b, 0, &tso(1448), &g);
    b.settle(50);
    check_segments(&b.vms[1].recv(), &g, 1448);
}

/// Software segmentation is charged per segment: a burst of two broadcast TSO frames that
/// each become 240 segments for each of two receivers sends the first, and the second waits
/// in the sender's ring for a later visit; every segment arrives once.
#[test]
fn software_segments_are_charged_to_the_sender_and_bounded_per_visit() {
    let mut b = bench(0);
    let mut frames = Vec::new();
    for k in 0..2u16 {
        let mut f = tcp_frame(1, 0, &payload(240 * 250, 11 + k as u32));
        f[..6].copy_from_slice(&[0xff; 6]);
        frames.push(f);
    }
    // Two chains: header and frame each, from descriptors 0 and 40.
    let h = tso(250).to_bytes();
    {
        let mem = &b.vms[0].guest.mem;
        for (k, f) in frames.iter().enumerate() {
            let at = SCRATCH + k as u64 * 0x10_0000;
            mem.write(at, &h);
            mem.write(at + 4096, f);
        }
    }
    let mut tx = b.vms[0].guest.raw_tx();
    for (k, f) in frames.iter().enumerate() {
        let (d, at) = (40 * k as u16, SCRATCH + k as u64 * 0x10_0000);
        tx.desc(d, Desc { addr: at, len: 12, flags: F_NEXT, next: d + 1 });
        tx.desc(d + 1, Desc { addr: at + 4096, len: f.len() as u32, flags: 0, next: 0 });
        tx.stage(d);
    }
    tx.publish();
    b.step();
    assert_eq!(b.vms[0].guest.tx_pending(), 1, "the second frame should wait for a later visit");
    assert_eq!(b.vms[1].recv().len(), 240);
    assert_eq!(b.vms[2].recv().len(), 240);
    // Its overdraft (479 frames' work against a quantum of 256) is repaid first: the next
    // visit passes the queue by, the one after takes the second frame.
    b.step();
    assert_eq!(b.vms[0].guest.tx_pending(), 1, "the overdraft was not charged");
    b.step();
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
    assert_eq!(b.vms[1].recv().len(), 240);
    assert_eq!(b.vms[2].recv().len(), 240);
}
