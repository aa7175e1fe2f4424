//! One guest against the poll thread it shares with others: each way a guest could make a
//! frame or a visit unbounded work, or steal another guest's traffic through the MAC table.
//! In every test the offender's queue is stopped or held to its share, and two bystanders on
//! the same thread keep forwarding with nothing lost.

use pvsgen::frontend::{Desc, F_INDIRECT, F_NEXT, F_WRITE, HDR_LEN, Layout, write_descs};

use super::*;
use crate::datapath::counters::DropReason;
use crate::datapath::tx::guest::MAX_FRAME_BUFS;
use crate::vring::{MAX_CHAIN_DESCS, RingError};
use crate::wire::virtio_net::feature;

/// VM `from` sends `n` frames of assorted sizes to VM `to`, 100 at a time: all arrive, intact
/// and in order, and the sender's ring is fully completed.
fn forwards(b: &mut Bench, from: usize, to: usize, n: u32) {
    let sent: Vec<Vec<u8>> = (0..n).map(|i| frame(mac(to), mac(from), 60 + (i as usize * 97) % 1400, i)).collect();
    let mut got = Vec::new();
    for chunk in sent.chunks(100) {
        for f in chunk {
            b.vms[from].guest.send(f);
        }
        b.settle(20);
        got.extend(b.vms[to].recv());
    }
    assert_eq!(got.len(), sent.len(), "vm{from} -> vm{to}: frames lost");
    assert!(got == sent, "vm{from} -> vm{to}: frames corrupted or reordered");
    assert_eq!(b.vms[from].guest.tx_pending(), 0, "vm{from}'s chains were not all completed");
}

/// Why VM `i`'s virtqueue `vq` (0: its RX queue, 1: its TX queue) was stopped, if it was.
fn broken(b: &Bench, i: usize, vq: usize) -> Option<RingError> {
    b.vms[i].port.queues().unwrap().all()[vq].lock().broken
}

/// Rewrites every descriptor of VM `i`'s RX ring to a buffer of `len` bytes (those already
/// posted included: the switch reads a descriptor when it takes the buffer).
fn rx_buffers_of(b: &mut Bench, i: usize, len: u32) {
    let l = *b.vms[i].guest.layout();
    b.vms[i].rx_buf = len;
    let mut rx = b.vms[i].guest.raw_rx();
    for d in 0..l.qsize {
        rx.desc(d, Desc { addr: l.rx_buf(d), len, flags: F_WRITE, next: 0 });
    }
}

/// Zero-length receive buffers (which, with MRG_RXBUF, used to make every frame pop the whole
/// ring and give it back) stop the receiver's RX queue at the first one; the sender's frames
/// to everyone else go on.
#[test]
fn zero_length_receive_buffers_stop_only_that_queue() {
    let d = DRIVER_FEATURES;
    let mut b = Bench::with_features(BenchCfg { vms: 3, ..BenchCfg::default() }, &[d, d | feature::MRG_RXBUF, d]);
    b.announce(1);
    b.announce(2);
    rx_buffers_of(&mut b, 1, 0);
    let mut to_vm2 = Vec::new();
    for i in 0..50 {
        b.vms[0].guest.send(&frame(mac(1), mac(0), 1000, i));
        let f = frame(mac(2), mac(0), 1000, 100 + i);
        b.vms[0].guest.send(&f);
        to_vm2.push(f);
    }
    assert!(b.settle(20) < 20, "the switch never finished vm0's 100 frames");
    assert_eq!(broken(&b, 1, 0), Some(RingError::EmptyBuffer));
    assert_eq!(b.vms[2].recv(), to_vm2, "vm2 lost frames to vm1's attack");
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
    assert_eq!(b.drops(1, DropReason::Malformed), 1);
    assert_eq!(b.drops(1, DropReason::PortDown), 49, "frames after the queue stopped are counted port_down");
    // vm1's own TX queue still works, and the bystanders forward.
    forwards(&mut b, 1, 2, 50);
    forwards(&mut b, 2, 0, 200);
}

/// A TX chain may have `MAX_CHAIN_DESCS` descriptors, counting the indirect one and every
/// entry of its table, zero-length ones too; one more stops the queue.
#[test]
fn zero_length_descriptors_count_toward_the_chain_cap() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(1);
    b.announce(2);
    let l = *b.vms[0].guest.layout();
    let f = frame(mac(1), mac(0), 700, 1);
    // A table: header, `empty` zero-length descriptors, the frame.
    let table = |empty: u32| -> Vec<Desc> {
        let mut t = vec![Desc { addr: l.tx_buf(0), len: HDR_LEN as u32, flags: F_NEXT, next: 1 }];
        for k in 0..empty {
            t.push(Desc { addr: l.tx_buf(1), len: 0, flags: F_NEXT, next: k as u16 + 2 });
        }
        t.push(Desc { addr: l.tx_buf(1), len: f.len() as u32, flags: 0, next: 0 });
        t
    };
    let mem = &b.vms[0].guest.mem;
    mem.write(l.tx_buf(0), &[0u8; HDR_LEN]);
    mem.write(l.tx_buf(1), &f);
    // The indirect descriptor and a table of MAX_CHAIN_DESCS - 1: at the cap, accepted.
    let at_cap = table(MAX_CHAIN_DESCS - 3);
    let over = table(MAX_CHAIN_DESCS - 2);
    write_descs(mem, l.tx_buf(100), &at_cap);
    write_descs(mem, l.tx_buf(110), &over);
    {
        let mut tx = b.vms[0].guest.raw_tx();
        tx.desc(0, Desc { addr: l.tx_buf(100), len: 16 * at_cap.len() as u32, flags: F_INDIRECT, next: 0 });
        tx.desc(1, Desc { addr: l.tx_buf(110), len: 16 * over.len() as u32, flags: F_INDIRECT, next: 0 });
        tx.push(0);
        tx.push(1);
    }
    b.settle(10);
    assert_eq!(b.vms[1].recv(), vec![f], "the chain at the cap did not arrive intact");
    assert_eq!(broken(&b, 0, 1), Some(RingError::ChainTooLong));
    forwards(&mut b, 2, 1, 200);
    forwards(&mut b, 1, 2, 200);
}

/// A queue of chains of 256 descriptors (the most a chain may have) gets its weight's share
/// of the thread's work, counted in descriptors: no more than a bystander of normal frames
/// with the same weight, which keeps forwarding at its full rate.
#[test]
fn long_chains_are_charged_for_their_descriptors() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(2);
    let l = *b.vms[0].guest.layout();
    // vm0: every chain is one indirect descriptor to the same table: header, 253 empty
    // descriptors, a 64-byte frame to vm2 (256 descriptors walked per frame).
    let f = frame(mac(2), mac(0), 64, 0);
    let mut t = vec![Desc { addr: l.tx_buf(0), len: HDR_LEN as u32, flags: F_NEXT, next: 1 }];
    t.extend((0..253u16).map(|k| Desc { addr: l.tx_buf(1), len: 0, flags: F_NEXT, next: k + 2 }));
    t.push(Desc { addr: l.tx_buf(1), len: f.len() as u32, flags: 0, next: 0 });
    let per_frame = t.len() as u64 + 1;
    assert_eq!(per_frame, MAX_CHAIN_DESCS as u64);
    {
        let mem = &b.vms[0].guest.mem;
        mem.write(l.tx_buf(0), &[0u8; HDR_LEN]);
        mem.write(l.tx_buf(1), &f);
        write_descs(mem, l.tx_buf(100), &t);
        let mut tx = b.vms[0].guest.raw_tx();
        for d in 0..128 {
            tx.desc(d, Desc { addr: l.tx_buf(100), len: 16 * t.len() as u32, flags: F_INDIRECT, next: 0 });
        }
    }
    let steps = 40;
    let mut vm1_sent = 0u32;
    for _ in 0..steps {
        // Both queues kept full: vm0 with 128 long chains, vm1 with 128 frames.
        let mut tx = b.vms[0].guest.raw_tx();
        let outstanding = tx.avail_idx().wrapping_sub(tx.used_idx());
        for _ in outstanding..128 {
            let head = tx.avail_idx() % 128;
            tx.stage(head);
        }
        tx.publish();
        let room = 128 - b.vms[1].guest.tx_pending();
        let burst: Vec<Vec<u8>> = (0..room).map(|k| frame(mac(2), mac(1), 64, vm1_sent + k as u32)).collect();
        b.vms[1].guest.send_all(&burst);
        vm1_sent += room as u32;
        b.step();
        b.vms[2].recv();
    }
    let (attacker, bystander) = (b.totals(0).rx_packets, b.totals(1).rx_packets);
    assert!(bystander >= 100 * steps, "the bystander forwarded only {bystander} frames in {steps} visits");
    // Work as the budget counts it: a normal frame is 3 descriptors (2 TX, 1 RX) and costs 1;
    // each visit adds the queue's weight (256) to its credit, and one burst (32 frames) may
    // overdraw it.
    let attacker_work = attacker * (per_frame + 1) / 3;
    let share = steps * 256;
    assert!(
        attacker_work <= share + 32 * (per_frame + 1) / 3,
        "chains of {per_frame} descriptors: {attacker} frames ({attacker_work} units) in {steps} visits of 256"
    );
    assert!(attacker_work >= share / 2, "the attacker got less than its share: {attacker} frames");
    assert_eq!(b.drops(2, DropReason::RxRingFull), 0);
}

/// With MRG_RXBUF a frame may take at most `MAX_FRAME_BUFS` receive buffers: a guest posting
/// tiny ones gets the frames that would need more dropped (counted, its buffers given back
/// untouched), smaller frames still arrive whole, and the bystanders lose nothing.
#[test]
fn a_frame_takes_a_bounded_number_of_receive_buffers() {
    let d = DRIVER_FEATURES;
    let cfg = BenchCfg { vms: 3, layout: Layout::packed(1024, 16384), ..BenchCfg::default() };
    let mut b = Bench::with_features(cfg, &[d, d | feature::MRG_RXBUF, d]);
    b.announce(1);
    b.announce(2);
    rx_buffers_of(&mut b, 1, 32);
    // 12 + 9000 bytes in 32-byte buffers: 282 of them.
    let big = frame(mac(1), mac(0), 9000, 1);
    assert!((HDR_LEN + big.len()).div_ceil(32) > MAX_FRAME_BUFS);
    // 12 + 4000 bytes: 126 buffers.
    let fits = frame(mac(1), mac(0), 4000, 2);
    let bystander = frame(mac(2), mac(0), 9000, 3);
    for f in [&big, &bystander, &fits] {
        b.vms[0].guest.send(f);
    }
    b.settle(10);
    assert_eq!(b.drops(1, DropReason::RxBufferTooSmall), 1);
    assert_eq!(b.vms[1].recv(), vec![fits], "vm1 should get the frame that fits in 256 buffers");
    assert_eq!(b.vms[2].recv(), vec![bystander]);
    assert_eq!(broken(&b, 1, 0), None, "small buffers are no ring error");
    forwards(&mut b, 2, 0, 200);
    forwards(&mut b, 1, 2, 50);
}

/// A receiver that posts one buffer at a time after it stalled: the switch keeps dropping
/// toward it until it has room for a whole burst, instead of letting each single buffer re-arm
/// a wait that holds up the sender's frames to everyone else.
#[test]
fn a_stalled_receiver_posting_one_buffer_at_a_time_holds_up_nobody() {
    let mut b = Bench::new(BenchCfg { vms: 3, retry_cycles: 0, ..BenchCfg::default() });
    b.announce(1);
    b.announce(2);
    // vm1 stops receiving: 256 frames fill its ring, the next ones time out at once and it is
    // marked stalled.
    for chunk in 0..3 {
        let fs: Vec<Vec<u8>> = (0..100).map(|i| frame(mac(1), mac(0), 64, chunk * 100 + i)).collect();
        b.vms[0].guest.send_all(&fs);
        b.settle(10);
    }
    assert_eq!(b.drops(1, DropReason::RxRingFull), 300 - 256);
    // From now on a full receiver that is not stalled holds its senders back for good.
    b.threads[0].cx.retry_cycles = u64::MAX;
    // vm1 takes its frames without posting new buffers, then posts just one.
    {
        let mut rx = b.vms[1].guest.raw_rx();
        let used = rx.used_idx();
        while rx.next_used(used).is_some() {}
    }
    b.vms[1].guest.post_rx_buffers(1, 2048);
    let for_vm2: Vec<Vec<u8>> = (0..10).map(|i| frame(mac(2), mac(0), 64, 1000 + i)).collect();
    let mut burst = vec![frame(mac(1), mac(0), 64, 998), frame(mac(1), mac(0), 64, 999)];
    burst.extend(for_vm2.iter().cloned());
    b.vms[0].guest.send_all(&burst);
    b.settle(10);
    assert_eq!(b.vms[2].recv(), for_vm2, "a receiver posting one buffer held up vm0's frames to vm2");
    assert_eq!(b.vms[0].guest.tx_pending(), 0);
    assert_eq!(b.drops(1, DropReason::RxRingFull), 300 - 256 + 2);
    // With room for a burst, vm1 receives again.
    b.vms[1].guest.post_rx_buffers(63, 2048);
    let f = frame(mac(1), mac(0), 64, 2000);
    b.vms[0].guest.send(&f);
    b.settle(10);
    assert_eq!(b.vms[1].guest.recv(), vec![f]);
    forwards(&mut b, 2, 0, 100);
}

/// A guest sending from thousands of source MACs: it learns at most its limit (the refusals
/// counted), and however many it sends from, the bystanders' entries stay, so their unicast
/// never floods (no copy of it reaches the attacker).
#[test]
fn a_guest_cannot_fill_the_mac_table_or_evict_anothers_entry() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(1);
    b.announce(2);
    let spray = |b: &mut Bench, from: u32, n: u32| {
        for chunk in (from..from + n).collect::<Vec<_>>().chunks(100) {
            let fs: Vec<Vec<u8>> = chunk
                .iter()
                .map(|&i| {
                    frame([0x02, 0xee, 0, 0, 0, 1], [0x06, 0xaa, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0], 60, i)
                })
                .collect();
            b.vms[0].guest.send_all(&fs);
            b.settle(10);
            b.vms[1].recv();
            b.vms[2].recv();
        }
    };
    b.mac.set_limit(0, 8);
    spray(&mut b, 0, 2000);
    assert_eq!(b.mac.learned(0), 8);
    assert!(b.totals(0).learn_refused >= 1900, "refusals not counted: {}", b.totals(0).learn_refused);
    forwards(&mut b, 1, 2, 100);
    assert!(b.vms[0].recv().is_empty(), "vm1's unicast to vm2 flooded");
    // No limit: the attacker fills every bucket it can.
    b.mac.set_limit(0, u32::MAX);
    spray(&mut b, 10_000, 5000);
    assert!(b.mac.learned(0) > 400, "the table should be nearly all the attacker's");
    forwards(&mut b, 1, 2, 100);
    forwards(&mut b, 2, 1, 100);
    assert!(b.vms[0].recv().is_empty(), "an attacker evicted a bystander's MAC: its unicast flooded");
}

/// A receiver whose buffers are too small for what is sent to it (MRG_RXBUF buffers of 32
/// bytes: a 9000-byte frame would take 282 of them, past `MAX_FRAME_BUFS`) costs its senders
/// one walk of its ring, not one a frame, and that walk is not charged to them: a sender with
/// half its frames for it still has every frame switched in one visit, and the other half
/// arrive. Before, each frame walked 256 buffers and the sender paid for all of them.
#[test]
fn a_receiver_with_buffers_too_small_costs_its_senders_one_walk() {
    let d = DRIVER_FEATURES;
    let cfg = BenchCfg { vms: 3, layout: Layout::packed(256, 16384), ..BenchCfg::default() };
    let mut b = Bench::with_features(cfg, &[d, d | feature::MRG_RXBUF, d]);
    b.announce(1);
    b.announce(2);
    rx_buffers_of(&mut b, 1, 32);
    let mut to_vm2 = Vec::new();
    let mut burst = Vec::new();
    for i in 0..64 {
        let to = 1 + i % 2;
        let f = frame(mac(to), mac(0), 9000, i as u32);
        if to == 2 {
            to_vm2.push(f.clone());
        }
        burst.push(f);
    }
    b.vms[0].guest.send_all(&burst);
    b.step();
    assert_eq!(b.vms[0].guest.tx_pending(), 0, "the sender was charged for the receiver's walks");
    assert_eq!(b.drops(1, DropReason::RxBufferTooSmall), 32);
    assert_eq!(b.vms[2].recv(), to_vm2);
    assert!(b.vms[1].recv().is_empty());
    // Shorter frames, which its buffers can hold, are still tried, and arrive; one as long as
    // the first still drops without a walk.
    let short = frame(mac(1), mac(0), 200, 100);
    b.vms[0].guest.send_all(&[short.clone(), frame(mac(1), mac(0), 9000, 101)]);
    b.settle(10);
    assert_eq!(b.drops(1, DropReason::RxBufferTooSmall), 33);
    assert_eq!(b.vms[1].recv(), vec![short]);
    forwards(&mut b, 2, 0, 100);
}

/// A migrating VM's receive buffers that each claim most of its memory (an indirect table of
/// 64 descriptors of 100 MiB each, every buffer the same) cost the switch what it writes into
/// them: the dirty log gets the pages of the frames' bytes and of the used ring, not the
/// 1.6 million pages the descriptors span per frame. Before, every frame marked every page of
/// every descriptor, and a few broadcasts a second held the poll thread (and the control
/// thread, waiting on the ring's lock) for seconds.
#[test]
fn a_logging_receivers_huge_buffers_are_marked_only_where_written() {
    let layout = Layout { mem_size: 128 << 20, ..Layout::packed(256, 2048) };
    let mut b = Bench::new(BenchCfg { vms: 3, layout, ..BenchCfg::default() });
    b.announce(1);
    b.announce(2);
    let log = start_logging(&mut b, 1);
    let (table, buf, len) = (8u64 << 20, 16u64 << 20, 100u32 << 20);
    let descs: Vec<Desc> = (0..64u16)
        .map(|k| Desc { addr: buf, len, flags: F_WRITE | if k < 63 { F_NEXT } else { 0 }, next: k + 1 })
        .collect();
    write_descs(&b.vms[1].guest.mem, table, &descs);
    {
        let mut rx = b.vms[1].guest.raw_rx();
        for d in 0..layout.qsize {
            rx.desc(d, Desc { addr: table, len: 16 * descs.len() as u32, flags: F_INDIRECT, next: 0 });
        }
    }
    take_marked(&log);
    // Broadcasts from vm0 reach the logging vm1, while vm2 and vm0 forward to each other.
    let t0 = std::time::Instant::now();
    for i in 0..8 {
        b.vms[0].guest.send(&frame([0xff; 6], mac(0), 60, i));
    }
    b.settle(10);
    b.vms[2].recv();
    let used: Vec<(u32, u32)> = {
        let mut rx = b.vms[1].guest.raw_rx();
        let idx = rx.used_idx();
        std::iter::from_fn(|| rx.next_used(idx)).collect()
    };
    assert_eq!(used.len(), 8);
    assert!(used.iter().all(|&(_, n)| n as usize == HDR_LEN + 60), "{used:?}");
    let mut want: Vec<u64> = pages(buf, (HDR_LEN + 60) as u64).collect();
    want.extend(pages(layout.rings[0].used, 6 + 8 * layout.qsize as u64));
    want.sort_unstable();
    want.dedup();
    assert_eq!(take_marked(&log), want, "marked: the frames' bytes and the used ring, nothing else");
    eprintln!("8 broadcasts to the logging VM took {:?}", t0.elapsed());
    forwards(&mut b, 0, 2, 200);
    forwards(&mut b, 2, 0, 200);
}
