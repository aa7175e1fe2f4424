//! Switching between test VMs, stepped: what arrives where, in which order, and what the
//! senders' rings say afterwards.

use pvsgen::frontend::{Desc, F_INDIRECT, F_NEXT, HDR_LEN};

use super::*;
use crate::datapath::counters::DropReason;
use crate::wire::virtio_net::feature;

#[test]
fn unicast_goes_only_to_its_learned_port_intact() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(1);
    let sent: Vec<Vec<u8>> = (0..40).map(|i| frame(mac(1), mac(0), 60 + i * 37, i as u32)).collect();
    for f in &sent {
        b.vms[0].guest.send(f);
    }
    b.settle(20);
    assert_eq!(b.vms[1].recv(), sent);
    assert!(b.vms[2].recv().is_empty(), "known unicast reached a third port");
    assert_eq!(b.vms[0].guest.tx_pending(), 0, "the sender's chains were not all completed");
    let t = b.totals(0);
    assert_eq!((t.rx_packets, t.rx_bytes), (40, sent.iter().map(|f| f.len() as u64).sum()));
    assert_eq!(b.totals(1).tx_packets, 40);
}

#[test]
fn broadcast_and_unknown_unicast_flood_to_every_other_port() {
    let mut b = Bench::new(BenchCfg { vms: 4, ..BenchCfg::default() });
    let bcast = frame([0xff; 6], mac(0), 100, 1);
    let unknown = frame([0x02, 9, 9, 9, 9, 9], mac(0), 100, 2);
    b.vms[0].guest.send(&bcast);
    b.vms[0].guest.send(&unknown);
    b.settle(10);
    for i in 1..4 {
        assert_eq!(b.vms[i].recv(), vec![bcast.clone(), unknown.clone()], "vm{i}");
    }
    assert!(b.vms[0].recv().is_empty(), "a flood went back to its sender");
}

#[test]
fn descriptor_chains_and_indirect_tables_are_walked() {
    let mut b = Bench::new(BenchCfg::default());
    b.announce(1);
    let l = *b.vms[0].guest.layout();
    let f = frame(mac(1), mac(0), 1000, 7);
    // One chain: a header descriptor and the frame in three pieces (descriptors 0..4).
    let mem = &b.vms[0].guest.mem;
    let at = |d: u16| l.tx_buf(d);
    mem.write(at(0), &[0u8; HDR_LEN]);
    let pieces = [&f[..13], &f[13..500], &f[500..]];
    for (k, p) in pieces.iter().enumerate() {
        mem.write(at(k as u16 + 1), p);
    }
    {
        let mut tx = b.vms[0].guest.raw_tx();
        tx.desc(0, Desc { addr: at(0), len: HDR_LEN as u32, flags: F_NEXT, next: 1 });
        for (k, p) in pieces.iter().enumerate() {
            let last = k == pieces.len() - 1;
            let d = k as u16 + 1;
            tx.desc(d, Desc { addr: at(d), len: p.len() as u32, flags: if last { 0 } else { F_NEXT }, next: d + 1 });
        }
        tx.push(0);
    }
    // The same frame again through an indirect table of four descriptors at buffer slot 10.
    let table = at(10);
    let descs: Vec<Desc> = (0..4u16)
        .map(|k| {
            let (addr, len) =
                if k == 0 { (at(0), HDR_LEN as u32) } else { (at(k), pieces[k as usize - 1].len() as u32) };
            Desc { addr, len, flags: if k < 3 { F_NEXT } else { 0 }, next: k + 1 }
        })
        .collect();
    pvsgen::frontend::write_descs(&b.vms[0].guest.mem, table, &descs);
    {
        let mut tx = b.vms[0].guest.raw_tx();
        tx.desc(5, Desc { addr: table, len: 64, flags: F_INDIRECT, next: 0 });
        tx.push(5);
    }
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f.clone(), f]);
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
}

#[test]
fn mergeable_receive_buffers_carry_a_frame_larger_than_one() {
    // The receiver's buffers are 256 bytes: a 1500-byte frame takes 6 of them (12 + 1500 bytes).
    let cfg = BenchCfg { rx_buf: 256, ..BenchCfg::default() };
    let mut b = Bench::with_features(cfg, &[DRIVER_FEATURES, DRIVER_FEATURES | feature::MRG_RXBUF]);
    b.announce(1);
    let sent: Vec<Vec<u8>> = (0..5).map(|i| frame(mac(1), mac(0), 1500 - i * 100, i as u32)).collect();
    for f in &sent {
        b.vms[0].guest.send(f);
    }
    b.settle(10);
    assert_eq!(b.vms[1].recv(), sent);
    assert_eq!(b.totals(1).tx_packets, 5);
    // Without MRG_RXBUF the same frames do not fit one 256-byte buffer: dropped, counted.
    let mut b = Bench::new(cfg);
    b.announce(1);
    b.vms[0].guest.send(&sent[0]);
    b.settle(10);
    assert!(b.vms[1].recv().is_empty());
    assert_eq!(b.drops(1, DropReason::RxBufferTooSmall), 1);
}

/// VM 0 sends VM 1 `n` frames, at most 100 in flight, stepping the switch in between.
fn send_steps(b: &mut Bench, n: u32) -> Vec<Vec<u8>> {
    let sent: Vec<Vec<u8>> = (0..n).map(|i| frame(mac(1), mac(0), 64, i)).collect();
    for chunk in sent.chunks(100) {
        for f in chunk {
            b.vms[0].guest.send(f);
        }
        for _ in 0..10 {
            b.step();
        }
    }
    sent
}

#[test]
fn a_full_receiver_holds_frames_in_the_sender_until_it_has_room() {
    let mut b = Bench::new(BenchCfg::default());
    b.announce(1);
    // vm1 has 256 receive buffers: 20 of 276 frames must wait in vm0's ring.
    let sent = send_steps(&mut b, 276);
    assert_eq!(b.vms[0].guest.tx_pending(), 20, "frames for a full receiver left the sender's ring");
    assert_eq!(b.drops(1, DropReason::RxRingFull), 0);
    let mut got = b.vms[1].recv();
    b.settle(10);
    got.extend(b.vms[1].recv());
    assert_eq!(got, sent, "frames lost or reordered across backpressure");
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
}

#[test]
fn a_receiver_that_stays_full_is_dropped_toward_after_the_retry_time() {
    let mut b = Bench::new(BenchCfg { retry_cycles: 0, ..BenchCfg::default() });
    b.announce(1);
    send_steps(&mut b, 266);
    assert_eq!(b.vms[0].guest.tx_pending(), 0, "the sender was held back past the retry time");
    assert_eq!(b.drops(1, DropReason::RxRingFull), 10);
    assert_eq!(b.vms[1].recv().len(), 256);
}

#[test]
fn a_moved_queue_keeps_its_frames_in_order() {
    let mut b = Bench::new(BenchCfg { threads: 2, ..BenchCfg::default() });
    b.announce(1);
    let mut seq = 0;
    let mut sent = Vec::new();
    let mut got = Vec::new();
    for round in 0..10 {
        for _ in 0..50 {
            let f = frame(mac(1), mac(0), 64 + (seq as usize % 200), seq);
            b.vms[0].guest.send(&f);
            sent.push(f);
            seq += 1;
        }
        b.step();
        // Move vm0's queue to the other thread: leave one plan, which the thread adopts, then
        // join the other's.
        let (from, to) = (round % 2, 1 - round % 2);
        b.queues[from].retain(|&q| q != 0);
        b.post(from);
        b.step();
        b.queues[to].push(0);
        b.post(to);
        b.settle(10);
        got.extend(b.vms[1].recv());
    }
    assert_eq!(got.len(), sent.len(), "frames lost across queue moves");
    assert_eq!(got, sent, "frames reordered across queue moves");
}

#[test]
fn a_port_left_out_of_the_plan_gets_nothing() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.leave(2);
    b.step();
    b.vms[0].guest.send(&frame([0xff; 6], mac(0), 60, 1));
    b.settle(10);
    assert_eq!(b.vms[1].recv().len(), 1);
    assert!(b.vms[2].recv().is_empty(), "a port no longer in the plan got a flood");
}

#[test]
fn a_broken_ring_stops_only_its_queue() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(2);
    // vm0 posts a chain pointing outside its memory.
    {
        let mut tx = b.vms[0].guest.raw_tx();
        tx.desc(0, Desc { addr: 1 << 40, len: 64, flags: 0, next: 0 });
        tx.push(0);
    }
    b.settle(10);
    let q = b.vms[0].port.queues().unwrap().guest_tx(0);
    assert_eq!(q.lock().broken, Some(crate::vring::RingError::BadAddress));
    assert_eq!(b.drops(0, DropReason::Malformed), 1);
    // vm1 still reaches vm2.
    let f = frame(mac(2), mac(1), 200, 3);
    b.vms[1].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[2].recv(), vec![f]);
}

/// A flood toward a VM whose receive ring is full: the rest of each run is dropped at once and
/// every frame counted, while the VM with room gets them all; floods then skip the full VM for
/// `FLOOD_RETRY_US` (counting what it misses), and once it takes its frames (and posts the
/// buffers again), a flood reaches it again.
#[test]
fn a_flood_counts_every_frame_a_full_ring_misses() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    let qsize = b.vms[2].guest.layout().qsize as u32;
    let mut sent = 0u32;
    let mut flood = |b: &mut Bench, n: u32| {
        for _ in 0..n {
            sent += 1;
            b.vms[0].guest.send(&frame([0xff; 6], mac(0), 60, sent));
            if sent.is_multiple_of(32) {
                b.settle(10);
                assert_eq!(b.vms[1].recv().len(), 32, "vm1 takes every frame (and reposts)");
            }
        }
    };
    // vm2 never drains: its ring fills after `qsize` frames, then misses the next 96.
    flood(&mut b, qsize + 96);
    b.flush_counts();
    assert_eq!(b.drops(2, DropReason::RxRingFull), 96);
    assert_eq!(b.totals(2).tx_packets, qsize as u64);
    assert_eq!(b.vms[2].recv().len(), qsize as usize);
    // Room again: within FLOOD_RETRY_US a flood reaches it again; what it missed meanwhile is
    // counted, so every frame is either delivered or counted.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = 0;
    while got == 0 {
        assert!(std::time::Instant::now() < deadline, "floods never reached vm2 again");
        flood(&mut b, 32);
        got = b.vms[2].recv().len();
    }
    b.flush_counts();
    assert_eq!(got as u64 + b.drops(2, DropReason::RxRingFull), sent as u64 - qsize as u64);
    assert_eq!(b.totals(2).tx_packets, qsize as u64 + got as u64);
}

/// Floods skip a port that cannot take them without opening it: 14 VMs with full receive rings
/// beside a flooding pair are not opened again while skipped (their ring locks are not taken:
/// the skip reads one entry of the thread's own), and what they miss is counted.
#[test]
fn floods_skip_full_ports_without_opening_them() {
    let mut b = Bench::new(BenchCfg { vms: 16, ..BenchCfg::default() });
    // Skips that last (the test's steps take any time): the skip, not its length, is tested.
    b.set_flood_retry(u64::MAX / 4);
    let qsize = b.vms[2].guest.layout().qsize as usize;
    // Fill vm2..vm15 (they never drain); vm1 drains.
    let mut sent = 0u32;
    while sent < qsize as u32 + 32 {
        let burst: Vec<Vec<u8>> = (0..32).map(|k| frame([0xff; 6], mac(0), 60, sent + k)).collect();
        sent += 32;
        b.vms[0].guest.send_all(&burst);
        b.settle(10);
        assert_eq!(b.vms[1].recv().len(), 32);
    }
    // Now every full port is skipped. Another thread holds vm5's RX ring lock (for at most
    // 10 s): a flood that opened vm5 would spin on it until then.
    let port = b.vms[5].port.clone();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let q = port.queues().unwrap().rx_queue_for(0).unwrap().1;
        let _guard = q.lock();
        held_tx.send(()).unwrap();
        let _ = done_rx.recv_timeout(std::time::Duration::from_secs(10));
    });
    held_rx.recv().unwrap();
    let burst: Vec<Vec<u8>> = (0..32).map(|k| frame([0xff; 6], mac(0), 60, sent + k)).collect();
    sent += 32;
    b.vms[0].guest.send_all(&burst);
    let t0 = std::time::Instant::now();
    b.step();
    let took = t0.elapsed();
    done_tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(took < std::time::Duration::from_secs(5), "the flood opened a port it should have skipped ({took:?})");
    b.settle(10);
    assert_eq!(b.vms[1].recv().len(), 32, "the VM with room got the flood");
    b.flush_counts();
    for i in 2..16 {
        assert_eq!(b.drops(i, DropReason::RxRingFull), sent as u64 - qsize as u64, "vm{i}'s misses");
    }
}
