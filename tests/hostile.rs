//! pvswitchd against a hostile guest. Three test VMs (tests/frontend) on one switch: "good1"
//! and "good2" behave, "evil" breaks its rings or its vhost-user socket in one way per test.
//! Each test checks that pvswitchd survives, stops only the queue that was broken (reporting
//! why in `ports`, counting a `malformed` drop), and keeps forwarding between the good VMs.
//! Needs no hugepages and no DPDK.

use crate::common;
use crate::frontend;

use common::vms::*;
use common::*;
use frontend::*;

/// The evil VM connects, works (one broadcast), then does `attack` to queue `broken`
/// (GUEST_RX or GUEST_TX). The queue must stop with an error containing `expect`, the evil
/// port's other queue and the good ports must keep working.
fn hostile(name: &str, broken: usize, expect: &str, attack: impl FnOnce(&mut Vm, &mut Bench)) {
    let _g = serial();
    let mut b = Bench::start(name);
    let mut evil = b.connect_evil();
    if broken == GUEST_TX {
        evil.post_rx_buffers(8, RX_BUF);
    }
    b.evil_broadcasts(&mut evil);

    attack(&mut evil, &mut b);

    let err = b.wait_queue_error("evil", broken);
    assert!(err.contains(expect), "evil queue {broken}: error {err:?}, expected it to mention {expect:?}");
    b.assert_alive();
    wait_for("a malformed drop on port evil", || {
        (b.sw.counters("evil").drops.get(DropReason::Malformed) >= 1).then_some(())
    });
    let evil_port = b.sw.port_info("evil");
    let other = 1 - broken;
    assert!(queue_error(&evil_port, other).is_none(), "only queue {broken} should have stopped: {}", evil_port.json());
    b.assert_good_ports_clean();

    // The good VMs still forward to each other, many frames, intact.
    b.check_forwarding(100);

    // The evil port's other queue still works.
    if broken == GUEST_TX {
        let f = b.good1_broadcasts();
        assert_eq!(recv_n(&mut evil, 1), vec![f], "evil's RX queue should still receive");
    } else {
        b.seq += 1;
        let f = frame(MAC_A, MAC_C, 300, 0xee, b.seq);
        evil.send(&f);
        assert_eq!(recv_n(&mut b.good1, 1), vec![f], "evil's TX queue should still send");
    }

    // The broken queue stays stopped until the guest resets it.
    assert!(queue_error(&b.sw.port_info("evil"), broken).is_some());
    b.check_forwarding(20);
    b.assert_alive();
}

/// A valid 64-byte TX buffer in the evil VM's memory (header + frame bytes; contents don't matter).
const GOOD_BUF: u64 = TX_BUFS + 100 * BUF_SLOT;

// ---- guest TX ring: what the switch reads ----

#[test]
fn tx_address_outside_memory() {
    hostile("h-tx-addr", GUEST_TX, "outside guest memory", |evil, _| {
        tx_chain(evil, &[Desc { addr: MEM_SIZE + 0x1000, len: 76, flags: 0, next: 0 }]);
    });
}

#[test]
fn tx_address_straddles_end_of_memory() {
    hostile("h-tx-straddle", GUEST_TX, "outside guest memory", |evil, _| {
        tx_chain(evil, &[Desc { addr: MEM_SIZE - 32, len: 76, flags: 0, next: 0 }]);
    });
}

#[test]
fn tx_address_wraps_address_space() {
    hostile("h-tx-wrap", GUEST_TX, "outside guest memory", |evil, _| {
        tx_chain(evil, &[Desc { addr: u64::MAX - 15, len: 76, flags: 0, next: 0 }]);
    });
}

#[test]
fn tx_descriptor_loop() {
    // 0 -> 1 -> 0 -> ...; zero-length descriptors so only the loop check can stop it.
    hostile("h-tx-loop", GUEST_TX, "loop", |evil, _| {
        tx_chain(
            evil,
            &[
                Desc { addr: GOOD_BUF, len: 0, flags: F_NEXT, next: 1 },
                Desc { addr: GOOD_BUF, len: 0, flags: F_NEXT, next: 0 },
            ],
        );
    });
}

#[test]
fn tx_chain_longer_than_ring() {
    // Every descriptor of the table chained to the next, the last back to the first: a chain
    // of more than QSIZE descriptors.
    hostile("h-tx-long", GUEST_TX, "loop", |evil, _| {
        let descs: Vec<Desc> =
            (0..QSIZE).map(|i| Desc { addr: GOOD_BUF, len: 0, flags: F_NEXT, next: (i + 1) % QSIZE }).collect();
        tx_chain(evil, &descs);
    });
}

#[test]
fn tx_too_many_segments() {
    // A linear chain of 65 one-byte segments (the limit is 64).
    hostile("h-tx-segs", GUEST_TX, "too many segments", |evil, _| {
        let descs: Vec<Desc> = (0..65u16)
            .map(|i| Desc { addr: GOOD_BUF + i as u64, len: 1, flags: if i < 64 { F_NEXT } else { 0 }, next: i + 1 })
            .collect();
        tx_chain(evil, &descs);
    });
}

#[test]
fn tx_next_out_of_range() {
    hostile("h-tx-next", GUEST_TX, "next index out of range", |evil, _| {
        tx_chain(evil, &[Desc { addr: GOOD_BUF, len: 12, flags: F_NEXT, next: QSIZE }]);
    });
}

#[test]
fn tx_head_out_of_range() {
    hostile("h-tx-head", GUEST_TX, "head index out of range", |evil, _| {
        evil.raw_tx().push(QSIZE);
    });
}

#[test]
fn tx_avail_idx_jumps_past_ring_size() {
    hostile("h-tx-jump", GUEST_TX, "avail index", |evil, _| {
        let mut tx = evil.raw_tx();
        let idx = tx.avail_idx();
        tx.set_avail_idx(idx.wrapping_add(QSIZE + 1));
    });
}

/// A well-formed two-entry indirect table (header, then frame) at SCRATCH.
fn good_indirect_table(evil: &Vm) {
    write_descs(
        &evil.mem,
        SCRATCH,
        &[
            Desc { addr: GOOD_BUF, len: 12, flags: F_NEXT, next: 1 },
            Desc { addr: GOOD_BUF + 12, len: 64, flags: 0, next: 0 },
        ],
    );
}

#[test]
fn tx_indirect_bad_length() {
    hostile("h-tx-ind-len", GUEST_TX, "indirect", |evil, _| {
        good_indirect_table(evil);
        tx_chain(evil, &[Desc { addr: SCRATCH, len: 17, flags: F_INDIRECT, next: 0 }]);
    });
}

#[test]
fn tx_indirect_table_outside_memory() {
    hostile("h-tx-ind-out", GUEST_TX, "indirect", |evil, _| {
        tx_chain(evil, &[Desc { addr: MEM_SIZE + 0x1000, len: 32, flags: F_INDIRECT, next: 0 }]);
    });
}

#[test]
fn tx_indirect_table_straddles_end_of_memory() {
    // The table's first entry is inside guest memory, the second is not.
    hostile("h-tx-ind-straddle", GUEST_TX, "indirect", |evil, _| {
        write_descs(&evil.mem, MEM_SIZE - 16, &[Desc { addr: GOOD_BUF, len: 76, flags: F_NEXT, next: 1 }]);
        tx_chain(evil, &[Desc { addr: MEM_SIZE - 16, len: 32, flags: F_INDIRECT, next: 0 }]);
    });
}

#[test]
fn tx_nested_indirect() {
    hostile("h-tx-ind-nested", GUEST_TX, "indirect", |evil, _| {
        good_indirect_table(evil);
        write_descs(&evil.mem, SCRATCH + 0x100, &[Desc { addr: SCRATCH, len: 32, flags: F_INDIRECT, next: 0 }]);
        tx_chain(evil, &[Desc { addr: SCRATCH + 0x100, len: 16, flags: F_INDIRECT, next: 0 }]);
    });
}

#[test]
fn tx_indirect_with_next() {
    hostile("h-tx-ind-next", GUEST_TX, "indirect", |evil, _| {
        good_indirect_table(evil);
        tx_chain(
            evil,
            &[
                Desc { addr: SCRATCH, len: 32, flags: F_INDIRECT | F_NEXT, next: 1 },
                Desc { addr: GOOD_BUF, len: 64, flags: 0, next: 0 },
            ],
        );
    });
}

#[test]
fn tx_write_only_descriptor() {
    hostile("h-tx-wo", GUEST_TX, "direction", |evil, _| {
        tx_chain(
            evil,
            &[
                Desc { addr: GOOD_BUF, len: 12, flags: F_NEXT, next: 1 },
                Desc { addr: GOOD_BUF + 12, len: 64, flags: F_WRITE, next: 0 },
            ],
        );
    });
}

// ---- guest RX ring: what the switch writes into ----

/// The evil VM posts one receive buffer `d`; good1 broadcasts, so the switch tries to write
/// into it (and good2 must get the frame all the same).
fn rx_attack(evil: &mut Vm, b: &mut Bench, d: Desc) {
    let mut rx = evil.raw_rx();
    rx.desc(0, d);
    rx.push(0);
    b.good1_broadcasts();
}

#[test]
fn rx_read_only_buffer() {
    hostile("h-rx-ro", GUEST_RX, "direction", |evil, b| {
        rx_attack(evil, b, Desc { addr: RX_BUFS, len: RX_BUF, flags: 0, next: 0 });
        b.wait_queue_error("evil", GUEST_RX);
        assert!(
            evil.mem.read(RX_BUFS, RX_BUF as usize).iter().all(|&x| x == 0),
            "the switch wrote into a read-only buffer"
        );
    });
}

#[test]
fn rx_buffer_outside_memory() {
    hostile("h-rx-addr", GUEST_RX, "outside guest memory", |evil, b| {
        rx_attack(evil, b, Desc { addr: MEM_SIZE - 100, len: RX_BUF, flags: F_WRITE, next: 0 });
    });
}

#[test]
fn rx_avail_idx_jumps_past_ring_size() {
    hostile("h-rx-jump", GUEST_RX, "avail index", |evil, b| {
        let mut rx = evil.raw_rx();
        let idx = rx.avail_idx();
        rx.set_avail_idx(idx.wrapping_add(QSIZE + 1));
        b.good1_broadcasts();
    });
}

// ---- the vhost-user socket ----

#[test]
fn garbage_on_vhost_user_socket() {
    let mut x = 0x9e3779b9u32;
    let garbage: Vec<u8> = (0..100)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    socket_attack("h-garbage", "100 garbage bytes", &garbage);
}

#[test]
fn truncated_vhost_user_message() {
    // SET_FEATURES (2), version 1, announcing an 8-byte body, of which only 4 bytes come.
    let mut m = Vec::new();
    for w in [2u32, 1, 8, 0] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    socket_attack("h-truncated", "a truncated message", &m);
}

#[test]
fn dirty_log_without_its_fd() {
    // SET_LOG_BASE (6), version 1, a 16-byte log description (64 KiB at offset 0) but no fd:
    // refused, the connection closed, nobody else touched.
    let mut m = Vec::new();
    for w in [6u32, 1, 16] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(&65536u64.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    socket_attack("h-logbase", "SET_LOG_BASE without its fd", &m);
}

#[test]
fn send_rarp_without_the_feature() {
    // SEND_RARP (19), version 1, a MAC in its u64, on a connection that negotiated no protocol
    // features: refused, the connection closed, nothing announced, nobody else touched.
    let mut m = Vec::new();
    for w in [19u32, 1, 8] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(&[0x52, 0x54, 0, 0xee, 0, 1, 0, 0]);
    socket_attack("h-rarp", "SEND_RARP without the RARP protocol feature", &m);
}

/// The memory table is fine but a ring lies (partly) outside it or is misaligned: pvswitchd
/// must refuse the ring, never run it, and stay alive.
#[test]
fn ring_addresses_outside_memory_table() {
    let _g = serial();
    let mut b = Bench::start("h-ring-addrs");
    let cases = [
        ("TX descriptor table outside memory", [RX_RING, RingAt { desc: MEM_SIZE + 0x10000, ..TX_RING }]),
        ("TX avail ring straddling the end of memory", [RX_RING, RingAt { avail: MEM_SIZE - 64, ..TX_RING }]),
        ("RX used ring straddling the end of memory", [RingAt { used: MEM_SIZE - 1024, ..RX_RING }, TX_RING]),
        ("RX descriptor table below memory", [RingAt { desc: 0u64.wrapping_sub(0x1000), ..RX_RING }, TX_RING]),
        ("TX descriptor table misaligned", [RX_RING, RingAt { desc: TX_RING.desc + 8, ..TX_RING }]),
    ];
    for (i, (what, rings)) in cases.into_iter().enumerate() {
        let r = Vm::try_connect(&b.sw.sock("evil"), rings);
        let p = b.sw.port_info("evil");
        assert!(r.is_err(), "{what}: pvswitchd accepted the rings: {}", p.json());
        drop(r);
        b.assert_alive();
        for q in &p.queues {
            assert!(q.running != Some(true), "{what}: a queue runs: {}", p.json());
        }
        let sw = &b.sw;
        wait_for("port evil back to listening", || (sw.port_info("evil").state == "listening").then_some(()));
        // Count connections, so a refused *second* connection cannot pass for a refused ring.
        assert_eq!(b.sw.port_info("evil").connects, i as u64 + 1, "{what}");
        b.check_forwarding(50);
    }
    b.assert_good_ports_clean();
    let mut evil = b.connect_evil();
    b.evil_broadcasts(&mut evil);
}

// ---- recovery ----

/// After a guest breaks its ring and disconnects, a fresh frontend on the same socket gets a
/// clean port that forwards both ways.
#[test]
fn reconnect_clears_error() {
    let _g = serial();
    let mut b = Bench::start("h-reset");
    let mut evil = b.connect_evil();
    b.evil_broadcasts(&mut evil);
    tx_chain(&mut evil, &[Desc { addr: MEM_SIZE + 0x1000, len: 76, flags: 0, next: 0 }]);
    b.wait_queue_error("evil", GUEST_TX);
    drop(evil);
    let sw = &b.sw;
    wait_for("port evil back to listening", || (sw.port_info("evil").state == "listening").then_some(()));

    let mut vm = b.connect_evil();
    let p = b.sw.port_info("evil");
    for q in &p.queues {
        assert!(q.error.is_none() && q.running == Some(true), "after reconnect: {}", p.json());
    }
    vm.post_rx_buffers(16, RX_BUF);
    b.evil_broadcasts(&mut vm); // also re-learns MAC_C on port evil
    for i in 0..20 {
        b.seq += 1;
        // good1 -> new VM (known unicast) and new VM -> good1.
        let to_vm = frame(MAC_C, MAC_A, 64 + i * 50, 0xc1, b.seq);
        b.good1.send(&to_vm);
        assert_eq!(recv_n(&mut vm, 1), vec![to_vm]);
        let from_vm = frame(MAC_A, MAC_C, 1000 - i * 30, 0xc2, b.seq);
        vm.send(&from_vm);
        assert_eq!(recv_n(&mut b.good1, 1), vec![from_vm]);
    }
    let p = b.sw.port_info("evil");
    assert!(p.queues.iter().all(|q| q.error.is_none()), "{}", p.json());
    b.check_forwarding(50);
    b.assert_alive();
}

// ---- bounded work per frame ----

#[test]
fn rx_zero_length_buffer() {
    hostile("h-rx-zero", GUEST_RX, "length zero", |evil, b| {
        rx_attack(evil, b, Desc { addr: RX_BUFS, len: 0, flags: F_WRITE, next: 0 });
    });
}

#[test]
fn tx_zero_length_descriptors_past_the_chain_cap() {
    // An indirect table of 300 descriptors, all but the last of length zero: 301 to walk.
    hostile("h-tx-zero", GUEST_TX, "longer than 256", |evil, _| {
        let descs: Vec<Desc> = (0..300u16)
            .map(|i| {
                let last = i == 299;
                Desc {
                    addr: GOOD_BUF,
                    len: if last { 76 } else { 0 },
                    flags: if last { 0 } else { F_NEXT },
                    next: i + 1,
                }
            })
            .collect();
        write_descs(&evil.mem, SCRATCH, &descs);
        tx_chain(evil, &[Desc { addr: SCRATCH, len: 16 * 300, flags: F_INDIRECT, next: 0 }]);
    });
}

// ---- interrupts ----

/// The evil VM raises its RX call eventfd's counter to the maximum and clears O_NONBLOCK on
/// it (the flag lives on the open file pvswitchd shares), so the switch's next interrupt to it
/// would block for good. The one poll thread, which serves all three VMs, is interrupted by
/// the control thread's watchdog; evil's RX queue stops ("interrupts blocked"); good1 and
/// good2 keep forwarding, and evil's TX queue still works.
#[test]
fn rx_call_eventfd_that_would_block() {
    use std::os::fd::AsRawFd;
    let _g = serial();
    let mut b = Bench::start("h-call");
    let mut evil = b.connect_evil();
    evil.post_rx_buffers(64, RX_BUF);
    b.evil_broadcasts(&mut evil);
    let fd = evil.call(GUEST_RX).as_raw_fd();
    let max = (u64::MAX - 1).to_ne_bytes();
    // SAFETY: an 8-byte write from a local buffer to our own eventfd, and fcntl on it.
    unsafe {
        assert_eq!(libc::write(fd, max.as_ptr() as *const libc::c_void, 8), 8);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK), 0);
    }
    evil.raw_rx().want_interrupts(true);
    // good1 broadcasts until evil's RX queue reports the error; each broadcast reaches good2.
    let err = wait_for("evil's RX queue to stop", || {
        b.good1_broadcasts();
        queue_error(&b.sw.port_info("evil"), GUEST_RX)
    });
    assert!(err.contains("interrupts blocked"), "evil's RX queue: {err}");
    assert!(b.sw.log().contains("stuck in a guest's call eventfd write"), "no watchdog line in the log");
    b.assert_alive();
    b.assert_good_ports_clean();
    b.check_forwarding(100);
    b.seq += 1;
    let f = frame(MAC_A, MAC_C, 300, 0xee, b.seq);
    evil.send(&f);
    assert_eq!(recv_n(&mut b.good1, 1), vec![f], "evil's TX queue should still send");
    b.check_forwarding(50);
}

// ---- offload headers: per-frame drops, the queue keeps running ----

/// A TCP/IPv4 frame from the evil VM to good1 with `payload` bytes.
fn tcp_to_good1(payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&MAC_A);
    f.extend_from_slice(&MAC_C);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 3, 10, 0, 0, 1]);
    let total = (40 + payload) as u16;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend((0..payload).map(|i| i as u8));
    f
}

/// A guest that negotiated offloads sends malformed offload headers (csum_start past the frame,
/// gso_size 0 and 1 (below TCP's smallest MSS), hdr_len past the frame, an unknown gso_type,
/// TSO6 it did not negotiate, an MSS over the MTU): each frame is dropped and counted for its reason, its queue keeps running,
/// its next good TSO frame arrives (segmented for good1, which negotiated no offloads), and the
/// good VMs forward as before.
#[test]
fn malformed_offload_headers_drop_only_their_frames() {
    use pvsgen::frontend::Layout;
    let _g = serial();
    let mut b = Bench::start("h-offload");
    let features = FEATURES | 1 | (1 << 11); // CSUM, HOST_TSO4
    let mut evil = Vm::connect_features(&b.sw.sock("evil"), Layout::TEST, features).unwrap();
    b.sw.wait_running("evil", 1);
    b.evil_broadcasts(&mut evil);
    let f = tcp_to_good1(3000);
    let len = f.len() as u16;
    // flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
    let cases: [([u16; 6], DropReason); 7] = [
        ([1, 0, 0, 0, len - 10, 16], DropReason::OffloadCsum),
        ([1, 1, 54, 0, 34, 16], DropReason::OffloadGsoSize),
        ([1, 1, 54, 1, 34, 16], DropReason::OffloadGsoSize),
        ([1, 1, len + 1, 1448, 34, 16], DropReason::OffloadHeaders),
        ([1, 3, 54, 1448, 34, 16], DropReason::OffloadGsoType),
        ([1, 4, 54, 1448, 34, 16], DropReason::OffloadNotNegotiated),
        ([1, 1, 54, 9000, 34, 16], DropReason::Mtu),
    ];
    let send = |evil: &mut Vm, h: [u16; 6]| {
        let mut hdr = [0u8; 12];
        hdr[0] = h[0] as u8;
        hdr[1] = h[1] as u8;
        for (k, v) in h[2..].iter().enumerate() {
            hdr[2 + 2 * k..4 + 2 * k].copy_from_slice(&v.to_le_bytes());
        }
        evil.mem.write(GOOD_BUF, &hdr);
        evil.mem.write(GOOD_BUF + 12, &f);
        tx_chain(evil, &[Desc { addr: GOOD_BUF, len: 12 + f.len() as u32, flags: 0, next: 0 }]);
    };
    for (h, reason) in cases {
        let before = b.sw.counters("evil").drops.get(reason);
        send(&mut evil, h);
        wait_for(&format!("a {} drop", drop_name(reason)), || {
            (b.sw.counters("evil").drops.get(reason) > before).then_some(())
        });
        b.check_forwarding(20);
    }
    let evil_port = b.sw.port_info("evil");
    assert!(
        queue_error(&evil_port, GUEST_TX).is_none(),
        "a bad offload header stopped the queue: {}",
        evil_port.json()
    );
    // A good TSO frame after all that: good1 (no offloads) gets it as three segments.
    send(&mut evil, [1, 1, 54, 1448, 34, 16]);
    let got = recv_n(&mut b.good1, 3);
    assert_eq!(got.iter().map(|s| s.len()).collect::<Vec<_>>(), [1502, 1502, 158]);
    assert!(got.iter().flat_map(|s| s[54..].to_vec()).eq(f[54..].iter().copied()), "payload changed");
    b.check_forwarding(100);
    b.assert_alive();
}
