//! The tracker through its one entry point, `track`, as the data path calls it.

use super::packet::build::*;
use super::state::*;
use super::*;
use crate::wire::tcp::flags::{ACK, FIN, RST, SYN};
use crate::wire::{ethertype, protocol};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const COMMIT: Option<Commit> = Some(Commit { mark: None });

fn ct(total: u32, per_zone: u32) -> Conntrack {
    Conntrack::new(Limits { total, per_zone }, Timeouts::default())
}

fn v4(p: Vec<u8>) -> CtPacket {
    CtPacket::parse(ethertype::IPV4, &p, p.len())
}

/// A TCP segment from A:40000 to B:80 (`reply`: B to A).
fn seg(reply: bool, flags: u16, seq: u32, ack: u32, len: usize) -> CtPacket {
    let (s, d, sp, dp) = if reply { (B, A, 80, 40000) } else { (A, B, 40000, 80) };
    v4(ipv4(TCP, s, d, &tcp(sp, dp, flags, seq, ack, 1000, None, len)))
}

fn udp_pkt(reply: bool) -> CtPacket {
    if reply { v4(ipv4(UDP, B, A, &udp(53, 5000, 4))) } else { v4(ipv4(UDP, A, B, &udp(5000, 53, 4))) }
}

#[test]
fn a_tcp_connection_from_handshake_to_close() {
    let t = ct(100, 100);
    let now = 5;
    assert_eq!(t.track(&seg(false, SYN, 1000, 0, 0), 0, COMMIT, now).state, TRK | NEW);
    assert_eq!(t.track(&seg(false, SYN, 1000, 0, 0), 0, None, now).state, TRK | NEW, "a retransmitted SYN");
    assert_eq!(t.track(&seg(true, SYN | ACK, 5000, 1001, 0), 0, None, now).state, TRK | EST | RPL);
    assert_eq!(t.track(&seg(false, ACK, 1001, 5001, 0), 0, None, now).state, TRK | EST);
    assert_eq!(t.track(&seg(false, ACK, 1001, 5001, 500), 0, None, now).state, TRK | EST);
    assert_eq!(t.track(&seg(true, ACK, 5001, 1501, 0), 0, None, now).state, TRK | EST | RPL);
    // Outside the window: far ahead, or acknowledging what was never sent.
    assert_eq!(t.track(&seg(false, ACK, 900_000, 5001, 10), 0, None, now).state, TRK | INV);
    assert_eq!(t.track(&seg(true, ACK, 5001, 99_999, 0), 0, None, now).state, TRK | INV, "an ACK of unsent data");
    assert_eq!(t.entries(None, 10)[0].state, "ESTABLISHED");
    assert_eq!(t.track(&seg(false, ACK | FIN, 1501, 5001, 0), 0, None, now).state, TRK | EST);
    assert_eq!(t.track(&seg(true, ACK | FIN, 5001, 1502, 0), 0, None, now).state, TRK | EST | RPL);
    assert_eq!(t.entries(None, 10)[0].state, "TIME_WAIT");
    // The port reused by a new SYN: a new connection.
    assert_eq!(t.track(&seg(false, SYN, 77, 0, 0), 0, COMMIT, now).state, TRK | NEW);
    assert_eq!(t.entries(None, 10)[0].state, "SYN_SENT");
    assert_eq!(t.len(), 1);
    assert_eq!(t.track(&seg(false, RST, 78, 0, 0), 0, None, now).state, TRK | NEW);
    assert_eq!(t.entries(None, 10)[0].state, "CLOSED");
}

#[test]
fn until_committed_every_frame_is_new_and_a_reply_is_nothing_known() {
    let t = ct(100, 100);
    assert_eq!(t.track(&udp_pkt(false), 0, None, 1).state, TRK | NEW);
    assert_eq!(t.track(&udp_pkt(true), 0, None, 1).state, TRK | NEW);
    assert_eq!(t.len(), 0);
    // A TCP segment that can neither open nor be picked up.
    assert_eq!(t.track(&seg(false, RST, 1, 0, 0), 0, COMMIT, 1).state, TRK | INV);
    assert_eq!(t.track(&seg(false, SYN | ACK, 1, 0, 0), 0, COMMIT, 1).state, TRK | INV);
    assert_eq!(t.len(), 0);
}

#[test]
fn udp_is_new_until_a_reply_and_echo_replies_need_their_request() {
    let t = ct(100, 100);
    assert_eq!(t.track(&udp_pkt(false), 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&udp_pkt(false), 0, None, 1).state, TRK | NEW, "no reply yet");
    assert_eq!(t.track(&udp_pkt(true), 0, None, 1).state, TRK | EST | RPL);
    assert_eq!(t.track(&udp_pkt(false), 0, None, 1).state, TRK | EST);
    let echo = |ty: u8, s, d| v4(ipv4(protocol::ICMP, s, d, &icmp(ty, 0, [0, 7, 0, 1], &[])));
    assert_eq!(t.track(&echo(0, B, A), 0, COMMIT, 1).state, TRK | INV, "a reply to no request");
    assert_eq!(t.track(&echo(8, A, B), 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&echo(0, B, A), 0, None, 1).state, TRK | EST | RPL);
    assert_eq!(t.track(&CtPacket::NotIp, 0, None, 1).state, TRK);
    // B's own echo request to A with the same identifier is no reply to A's: a connection of
    // its own (as Linux's tracker, whose ICMP tuple holds the type). Found with real guests,
    // whose ping processes' identifiers (their pids) met.
    assert_eq!(t.track(&echo(8, B, A), 0, None, 1).state, TRK | NEW);
    assert_eq!(t.track(&echo(8, B, A), 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&echo(0, A, B), 0, None, 1).state, TRK | EST | RPL, "its reply");
    assert_eq!(t.len(), 3, "UDP, A's echo, B's echo");
}

#[test]
fn icmp_errors_are_related_to_the_connection_they_quote() {
    let t = ct(100, 100);
    t.track(&udp_pkt(false), 0, COMMIT, 1);
    let sent = ipv4(UDP, A, B, &udp(5000, 53, 4));
    let err = v4(ipv4(protocol::ICMP, [10, 0, 0, 254], A, &icmp(3, 3, [0; 4], &sent)));
    assert_eq!(t.track(&err, 0, None, 1).state, TRK | REL | RPL);
    let other = ipv4(UDP, A, B, &udp(5001, 53, 4));
    let made_up = v4(ipv4(protocol::ICMP, [10, 0, 0, 254], A, &icmp(3, 3, [0; 4], &other)));
    assert_eq!(t.track(&made_up, 0, None, 1).state, TRK | INV, "an error about no connection");
    assert_eq!(t.track(&err, 1, None, 1).state, TRK | INV, "another zone's connection");
}

#[test]
fn zones_keep_the_same_addresses_apart_and_each_zone_has_its_limit() {
    let t = ct(1000, 3);
    assert_eq!(t.track(&udp_pkt(false), 1, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&udp_pkt(true), 2, None, 1).state, TRK | NEW, "zone 2 knows nothing of zone 1");
    assert_eq!(t.track(&udp_pkt(true), 1, None, 1).state, TRK | EST | RPL);
    // Zone 1 fills its quota; zone 2 still opens.
    for port in 1..=2u16 {
        let p = v4(ipv4(UDP, A, B, &udp(6000 + port, 53, 0)));
        assert!(t.track(&p, 1, COMMIT, 1).refused.is_none());
    }
    let p = v4(ipv4(UDP, A, B, &udp(7000, 53, 0)));
    assert_eq!(t.track(&p, 1, COMMIT, 1).refused, Some(Refused::ZoneLimit));
    assert!(t.track(&p, 2, COMMIT, 1).refused.is_none());
    assert_eq!((t.zone_len(1), t.zone_len(2), t.len()), (3, 1, 4));
    assert_eq!(t.refused[Refused::ZoneLimit as usize].load(Relaxed), 1);
    assert_eq!(t.flush(Some(1)), 3);
    assert_eq!((t.zone_len(1), t.len()), (0, 1));
}

#[test]
fn the_table_limit_holds_across_zones() {
    let t = ct(10, 1000);
    let mut refused = 0;
    for port in 0..20u16 {
        let p = v4(ipv4(UDP, A, B, &udp(port, 53, 0)));
        refused += t.track(&p, port % 3, COMMIT, 1).refused.is_some() as u32;
    }
    assert_eq!((t.len(), refused), (10, 10));
    assert!(t.bytes_per_connection() <= 256, "{} bytes a connection", t.bytes_per_connection());
}

#[test]
fn expiry_is_swept_a_bounded_number_of_slots_at_a_time() {
    let t = ct(100, 100);
    for port in 0..50u16 {
        t.track(&v4(ipv4(UDP, A, B, &udp(port, 53, 0))), 0, COMMIT, 1);
    }
    t.track(&seg(false, SYN, 1, 0, 0), 0, COMMIT, 1);
    let mut cursor = 0;
    // Not yet: UDP lives 30 s.
    assert_eq!(t.sweep(&mut cursor, t.slots(), 30), 0);
    // A budget of 16 slots removes at most 16; a whole pass removes the rest.
    let first = t.sweep(&mut cursor, 16, 32);
    assert!(first <= 16);
    let mut total = first;
    for _ in 0..t.slots() / 16 + 1 {
        total += t.sweep(&mut cursor, 16, 32);
    }
    assert_eq!(total, 51, "UDP after 30 s, a SYN_SENT after 30 s");
    assert!(t.is_empty());
    assert_eq!(t.track(&udp_pkt(true), 0, None, 32).state, TRK | NEW);
}

#[test]
fn a_connection_is_picked_up_mid_stream_after_a_restart() {
    // A fresh table (as after a restart) sees an established connection's next segments.
    let t = ct(100, 100);
    assert_eq!(t.track(&seg(false, ACK, 70_000, 90_000, 100), 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&seg(true, ACK, 90_000, 70_100, 0), 0, None, 1).state, TRK | EST | RPL);
    assert_eq!(t.track(&seg(false, ACK, 70_100, 90_000, 100), 0, None, 1).state, TRK | EST);
}

#[test]
fn marks_are_set_by_commit_and_read_by_every_frame() {
    let t = ct(100, 100);
    let r = t.track(&udp_pkt(false), 0, Some(Commit { mark: Some((0x10, 0xff)) }), 1);
    assert_eq!(r.mark, 0x10);
    assert_eq!(t.track(&udp_pkt(true), 0, None, 1).mark, 0x10);
    t.track(&udp_pkt(false), 0, Some(Commit { mark: Some((0x200, 0xf00)) }), 1);
    assert_eq!(t.track(&udp_pkt(true), 0, None, 1).mark, 0x210);
}

#[test]
fn ipv6_connections_are_tracked_like_ipv4() {
    let t = ct(100, 100);
    let (a, b) = ([0xfd; 16], [0xfe; 16]);
    let p = |s, d, sp, dp| {
        let p = ipv6(protocol::UDP, s, d, &udp(sp, dp, 0));
        CtPacket::parse(ethertype::IPV6, &p, p.len())
    };
    assert_eq!(t.track(&p(a, b, 1, 2), 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&p(b, a, 2, 1), 0, None, 1).state, TRK | EST | RPL);
    let e = &t.entries(None, 1)[0];
    assert_eq!((e.orig.src_ip().to_string(), e.orig.sport), ("fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd:fdfd".into(), 1));
}

/// Both directions of connections on two threads at once, as two poll threads polling the
/// two VMs' queues: every frame gets a verdict, no connection is stored twice, and the one
/// thread's inserts never make the other's hits fail.
#[test]
fn two_threads_track_the_two_directions_at_once() {
    use std::sync::Arc;
    let t = Arc::new(ct(10_000, 10_000));
    const CONNS: u16 = 500;
    for port in 0..CONNS {
        t.track(&v4(ipv4(UDP, A, B, &udp(port, 53, 0))), 0, COMMIT, 1);
    }
    let run = |reply: bool| {
        let t = t.clone();
        std::thread::spawn(move || {
            let mut est = 0;
            for round in 0..200 {
                for port in 0..CONNS {
                    let p = if reply { ipv4(UDP, B, A, &udp(53, port, 0)) } else { ipv4(UDP, A, B, &udp(port, 53, 0)) };
                    let r = t.track(&v4(p), 0, None, 1);
                    assert!(r.state & TRK != 0 && r.state & INV == 0, "{r:?}");
                    est += (r.state & EST != 0) as u32;
                }
                // New connections meanwhile, from the orig side only.
                if !reply {
                    let p = ipv4(UDP, A, B, &udp(10_000 + round, 53, 0));
                    assert!(t.track(&v4(p), 0, COMMIT, 1).refused.is_none());
                }
            }
            est
        })
    };
    let (orig, rep) = (run(false), run(true));
    let (_, replies_est) = (orig.join().unwrap(), rep.join().unwrap());
    assert_eq!(replies_est, 200 * CONNS as u32, "every reply found its connection");
    assert_eq!(t.len(), CONNS as u32 + 200);
    assert_eq!(t.entries(None, 100_000).len(), CONNS as usize + 200);
}

/// What a frame of an established connection costs the tracker (its parse and its `track`),
/// with 10k and 1M connections stored: nanoseconds a frame, 5 runs (the machine's speed
/// swings: read the spread). Ignored: `cargo test --release --lib conntrack::tests::cost --
/// --ignored --nocapture` prints it for BENCHMARKS.md.
#[test]
#[ignore]
fn cost() {
    for conns in [10_000u32, 1_000_000] {
        let t = ct(conns + conns / 4, conns + conns / 4);
        let frame = |i: u32| {
            let (s, d) = ([10, 1, (i >> 16) as u8, (i >> 8) as u8], [10, 2, 0, i as u8]);
            ipv4(UDP, s, d, &udp(1000 + (i % 50_000) as u16, 53, 18))
        };
        let frames: Vec<Vec<u8>> = (0..conns).map(frame).collect();
        for f in &frames {
            assert!(t.track(&v4(f.clone()), 0, COMMIT, 1).refused.is_none());
        }
        // Each run: the parse alone, then parse and track, over the same frames (alternated,
        // as the machine's speed swings); the tracker's cost is the difference.
        let pass = |track: bool| {
            let start = std::time::Instant::now();
            let mut n = 0u32;
            for i in 0..1_000_000usize {
                // A stride through the connections, as frames of many flows interleave.
                let f = &frames[(i * 7919) % frames.len()];
                let p = std::hint::black_box(CtPacket::parse(ethertype::IPV4, f, f.len()));
                if track {
                    n += (t.track(&p, 0, None, 1).state & EST == 0) as u32;
                }
            }
            std::hint::black_box(n);
            start.elapsed().as_nanos() as f64 / 1e6
        };
        // The same frames in bursts of 32 through `track_burst`.
        let burst = || {
            let start = std::time::Instant::now();
            let mut n = 0u32;
            let mut pkts = [CtPacket::NotIp; BURST];
            let mut out = [CtResult::default(); BURST];
            for b in 0..1_000_000 / BURST {
                for (j, p) in pkts.iter_mut().enumerate() {
                    let f = &frames[((b * BURST + j) * 7919) % frames.len()];
                    *p = CtPacket::parse(ethertype::IPV4, f, f.len());
                }
                t.track_burst(&pkts, 0, None, 1, &mut out);
                n += out.iter().filter(|r| r.state & EST == 0).count() as u32;
            }
            std::hint::black_box(n);
            start.elapsed().as_nanos() as f64 / 1e6
        };
        let mut bursts: Vec<f64> = Vec::new();
        let mut runs: Vec<(f64, f64)> = (0..7)
            .map(|_| {
                let r = (pass(false), pass(true));
                bursts.push(burst() - r.0);
                r
            })
            .collect();
        bursts.sort_by(f64::total_cmp);
        runs.sort_by(|a, b| (a.1 - a.0).total_cmp(&(b.1 - b.0)));
        let d = |r: &(f64, f64)| r.1 - r.0;
        println!(
            "{conns} connections: track {:.1} ns a frame over a parse of {:.1} (min {:.1}, max {:.1}, 7 runs); \
             in bursts of 32: {:.1} (min {:.1}, max {:.1}); {} bytes a connection",
            d(&runs[3]),
            runs[3].0,
            d(&runs[0]),
            d(&runs[6]),
            bursts[3],
            bursts[0],
            bursts[6],
            t.bytes_per_connection()
        );
    }
}

#[test]
fn a_burst_is_tracked_as_its_frames_one_by_one() {
    let (one, burst) = (ct(100, 100), ct(100, 100));
    let pkts: Vec<CtPacket> = (0..40u16)
        .map(|i| match i % 4 {
            0 => v4(ipv4(UDP, A, B, &udp(i, 53, 0))),
            1 => v4(ipv4(UDP, B, A, &udp(53, i - 1, 0))),
            2 => CtPacket::Invalid,
            _ => seg(false, SYN, i as u32, 0, 0),
        })
        .collect();
    let want: Vec<CtResult> = pkts.iter().map(|p| one.track(p, 3, COMMIT, 1)).collect();
    let mut got = [CtResult::default(); BURST];
    burst.track_burst(&pkts, 3, COMMIT, 1, &mut got);
    assert_eq!(&got[..], &want[..BURST], "the first 32");
    assert_eq!(burst.len(), one.len() - 2, "the 8 past the burst were left alone");
}

#[test]
fn a_later_fragment_follows_its_first_and_nothing_else_passes() {
    let t = ct(100, 100);
    let dgram = udp(5000, 53, 2000);
    let f4 = |s, d, id, off: u16, more, data: &[u8]| v4(fragment4(UDP, s, d, id, off, more, data));
    let (first, second) = (f4(A, B, 7, 0, true, &dgram[..1480]), f4(A, B, 7, 1480, false, &dgram[1480..]));
    assert!(matches!(first, CtPacket::Conn { tuple: Tuple { sport: 5000, dport: 53, .. }, first: Some(_), .. }));
    assert!(matches!(second, CtPacket::Fragment { offset: 1480, end: 2008, .. }), "{second:?}");
    assert_eq!(t.track(&second, 0, None, 1).state, TRK | INV, "no first fragment yet");
    // A first fragment not stored leaves no note.
    assert_eq!(t.track(&first, 0, None, 1).state, TRK | NEW);
    assert_eq!(t.track(&second, 0, None, 1).state, TRK | INV);
    // Committed: its later fragments get what it got.
    let marked = Some(Commit { mark: Some((5, u32::MAX)) });
    assert_eq!(t.track(&first, 0, marked, 1), CtResult { state: TRK | NEW, mark: 5, refused: None, stored: true });
    assert_eq!(t.track(&second, 0, None, 1), CtResult { state: TRK | NEW, mark: 5, refused: None, stored: true });
    assert_eq!(t.track(&second, 0, None, 1).state, TRK | NEW, "the same fragment again (a retried frame)");
    assert_eq!(t.track(&second, 3, None, 1).state, TRK | INV, "another zone");
    assert_eq!(t.track(&f4(A, B, 7, 1000, false, &dgram[1000..1200]), 0, None, 1).state, TRK | INV, "an overlap");
    assert_eq!(t.track(&f4(A, B, 7, 65528, false, &[0; 16]), 0, None, 1).state, TRK | INV, "past 65,535 bytes");
    assert_eq!(t.track(&f4(B, A, 7, 1480, false, &dgram[1480..]), 0, None, 1).state, TRK | INV, "the other way");
    assert_eq!(t.track(&f4(A, B, 8, 1480, false, &dgram[1480..]), 0, None, 1).state, TRK | INV, "another id");
    // The reply's datagram, fragmented, follows its own first fragment (an established reply).
    let back = udp(53, 5000, 1600);
    let (r1, r2) = (f4(B, A, 7, 0, true, &back[..1480]), f4(B, A, 7, 1480, false, &back[1480..]));
    assert_eq!(t.track(&r1, 0, None, 1).state, TRK | EST | RPL);
    assert_eq!(t.track(&r2, 0, None, 1).state, TRK | EST | RPL);
    assert_eq!(t.bad_fragments.load(Relaxed), 7);
    assert_eq!(t.entries(None, 10).len(), 1, "notes are no connections");
    // A first fragment too short for its TCP header is invalid, whatever follows it.
    let syn = tcp(40000, 80, SYN, 1, 0, 1000, None, 0);
    assert_eq!(v4(fragment4(TCP, A, B, 9, 0, true, &syn[..8])), CtPacket::Invalid);
    // IPv6: the fragment header's identification and offset.
    let (a, b) = ([0xfd; 16], [0xfe; 16]);
    let v6 = |p: Vec<u8>| CtPacket::parse(ethertype::IPV6, &p, p.len());
    let p1 = v6(fragment6(UDP, a, b, 99, 0, true, &dgram[..1232]));
    let p2 = v6(fragment6(UDP, a, b, 99, 1232, false, &dgram[1232..]));
    assert!(matches!(p2, CtPacket::Fragment { offset: 1232, end: 2008, .. }), "{p2:?}");
    assert_eq!(t.track(&p1, 0, COMMIT, 1).state, TRK | NEW);
    assert_eq!(t.track(&p2, 0, None, 1).state, TRK | NEW);
}
