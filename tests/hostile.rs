//! pvswitchd against a hostile guest. Three test VMs (tests/frontend) on one switch: "good1"
//! and "good2" behave, "evil" breaks its rings or its vhost-user socket in one way per test.
//! Each test checks that pvswitchd survives, stops only the queue that was broken (reporting
//! why in `ports`, counting a `malformed` drop), and keeps forwarding between the good VMs.
//! Needs no hugepages and no DPDK.

mod common;
mod frontend;

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
        (b.sw.port("evil")["drops"]["malformed"].as_u64() >= Some(1)).then_some(())
    });
    let evil_port = b.sw.port("evil");
    let other = 1 - broken;
    assert!(queue(&evil_port, other)["error"].is_null(), "only queue {broken} should have stopped: {evil_port}");
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
    assert!(queue(&b.sw.port("evil"), broken)["error"].is_string());
    b.check_forwarding(20);
    b.assert_alive();
}

/// A valid 64-byte TX buffer in the evil VM's memory (header + frame bytes; contents don't matter).
const GOOD_BUF: u64 = TX_BUFS + 100 * BUF_SLOT;

fn tx_chain(evil: &mut Vm, descs: &[Desc]) {
    let mut tx = evil.raw_tx();
    for (i, d) in descs.iter().enumerate() {
        tx.desc(i as u16, *d);
    }
    tx.push(0);
}

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
        let p = b.sw.port("evil");
        assert!(r.is_err(), "{what}: pvswitchd accepted the rings: {p}");
        drop(r);
        b.assert_alive();
        for q in p["queues"].as_array().unwrap() {
            assert!(q["running"] != true, "{what}: a queue runs: {p}");
        }
        let sw = &b.sw;
        wait_for("port evil back to listening", || (sw.port("evil")["state"] == "listening").then_some(()));
        // Count connections, so a refused *second* connection cannot pass for a refused ring.
        assert_eq!(b.sw.port("evil")["connects"], i as u64 + 1, "{what}");
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
    wait_for("port evil back to listening", || (sw.port("evil")["state"] == "listening").then_some(()));

    let mut vm = b.connect_evil();
    let p = b.sw.port("evil");
    for q in p["queues"].as_array().unwrap() {
        assert!(q["error"].is_null() && q["running"] == true, "after reconnect: {p}");
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
    let p = b.sw.port("evil");
    assert!(p["queues"].as_array().unwrap().iter().all(|q| q["error"].is_null()), "{p}");
    b.check_forwarding(50);
    b.assert_alive();
}

// ---- guest memory whose file is shorter than the region ----
//
/// The memory table announces a 16 MiB region, but the memfd behind it holds only 4 MiB:
/// pvswitchd refuses the table (touching the missing part would raise SIGBUS), says why, and
/// the other VMs keep forwarding.
#[test]
fn memory_region_longer_than_its_file() {
    let _g = serial();
    let mut b = Bench::start("h-mem-eof");
    let r = Vm::try_connect_with(&b.sw.sock("evil"), [RX_RING, TX_RING], 4 << 20);
    assert!(r.is_err(), "a memory table longer than its file was accepted");
    let err = wait_for("evil's error", || b.sw.port("evil")["last_error"].as_str().map(String::from));
    assert!(err.contains("needs 16777216 bytes of its file, which has 4194304"), "evil's error: {err}");
    b.assert_alive();
    b.check_forwarding(50);
}

/// A well-behaved setup, then the VM shrinks the file behind its memory to 4 MiB and points a
/// descriptor at 8 MiB. pvswitchd survives the SIGBUS (the fault is attributed to evil's
/// memory), disconnects evil, and keeps forwarding between the others.
#[test]
fn memory_file_shrunk_after_setup() {
    let _g = serial();
    let mut b = Bench::start("h-mem-shrink");
    let mut evil = b.connect_evil();
    b.evil_broadcasts(&mut evil);
    evil.mem.set_file_len(4 << 20);
    tx_chain(&mut evil, &[Desc { addr: 8 << 20, len: 76, flags: 0, next: 0 }]);
    let err = wait_for("evil to be disconnected", || {
        let p = b.sw.port("evil");
        (p["state"] == "listening").then(|| p["last_error"].as_str().unwrap_or("").to_string())
    });
    assert!(err.contains("guest memory fault"), "evil's error: {err}");
    b.assert_alive();
    b.check_forwarding(50);
}

/// The evil VM truncates the hugetlbfs memfd behind its memory (which cannot be sealed) to
/// nothing while the good VMs forward. pvswitchd's next touch of evil's rings faults on a huge
/// page: the SIGBUS handler replaces that whole page (2 MiB or 1 GiB) with anonymous memory,
/// evil is disconnected with the reason, and pvswitchd, the good VMs' forwarding and the
/// control socket carry on.
fn hugetlb_file_truncated(name: &str, page: u64) {
    let flags =
        if page == 1 << 30 { libc::MFD_HUGETLB | libc::MFD_HUGE_1GB } else { libc::MFD_HUGETLB | libc::MFD_HUGE_2MB };
    let _g = serial();
    let mut b = Bench::start(name);
    let mem = GuestMemory::new_memfd(MEM_SIZE, MEM_SIZE, flags, page)
        .unwrap_or_else(|e| panic!("a hugetlb memfd of {page}-byte pages: {e}"));
    let mut evil = Vm::connect_memory(&b.sw.sock("evil"), mem).expect("evil's setup");
    b.sw.wait_running("evil", 1);
    evil.post_rx_buffers(8, RX_BUF);
    b.evil_broadcasts(&mut evil);
    // Truncated under traffic: good1 broadcasts (to evil's RX ring too) and forwards to good2.
    evil.mem.set_file_len(0);
    let err = shrunk_under_traffic(&mut b, &format!("its {page}-byte-page memory file"), || {});
    assert!(err.contains("guest memory fault"), "evil's error: {err}");
    assert!(b.sw.ctl("ports").is_array() || b.sw.ctl("ports").is_object(), "no answer to ports");
    b.assert_alive();
}

/// After evil shrank a file the switch maps for it (`what`): good1 broadcasts (to evil's RX
/// ring too) and forwards to good2 until evil is disconnected (`drain_evil` takes what evil
/// receives meanwhile); then pvswitchd lives and the good VMs forward cleanly. Returns evil's
/// last error.
fn shrunk_under_traffic(b: &mut Bench, what: &str, mut drain_evil: impl FnMut()) -> String {
    let err = wait_for("evil to be disconnected", || {
        assert!(b.sw.alive(), "pvswitchd died after evil truncated {what}");
        if b.good1.tx_pending() < 64 {
            b.seq += 1;
            b.good1.send(&frame(BCAST, MAC_A, 200, 0xaa, b.seq));
        }
        let n = b.good2.recv().len();
        b.good2.post_rx_buffers(n as u16, RX_BUF);
        drain_evil();
        let p = b.sw.port("evil");
        (p["state"] == "listening").then(|| p["last_error"].as_str().unwrap_or("").to_string())
    });
    b.assert_alive();
    // good2 takes the last of those broadcasts before the forwarding check.
    let good1 = &mut b.good1;
    wait_for("good1's TX ring to be completed", || (good1.tx_pending() == 0).then_some(()));
    std::thread::sleep(std::time::Duration::from_millis(50));
    let n = b.good2.recv().len();
    b.good2.post_rx_buffers(n as u16, RX_BUF);
    b.assert_good_ports_clean();
    b.check_forwarding(100);
    b.assert_alive();
    err
}

/// The evil VM logs (as while its VMM migrates it) into a memfd that cannot be sealed, then
/// truncates it to nothing while good1 broadcasts to it: the switch's next mark in the log
/// faults, the SIGBUS handler replaces the page, evil is disconnected with the reason, and the
/// good VMs and the control socket carry on.
#[test]
fn dirty_log_file_truncated_under_traffic() {
    let _g = serial();
    let mut b = Bench::start("h-log-shrunk");
    let features = pvsgen::frontend::FEATURES | pvsgen::frontend::LOG_ALL;
    let mut evil = Vm::connect_features(&b.sw.sock("evil"), Layout::TEST, features).expect("evil's setup");
    b.sw.wait_running("evil", 1);
    assert_eq!(b.sw.port("evil")["migration"]["logging"], true, "{}", b.sw.port("evil"));
    evil.post_rx_buffers(8, RX_BUF);
    b.evil_broadcasts(&mut evil);
    evil.log.as_ref().expect("evil's log").file.set_len(0).unwrap();
    let err = shrunk_under_traffic(&mut b, "its dirty log", || {
        let n = evil.recv().len();
        evil.post_rx_buffers(n as u16, RX_BUF);
    });
    assert!(err.contains("dirty log"), "evil's error: {err}");
}

#[test]
fn hugetlb_2m_file_truncated_under_traffic() {
    if !require(&[Need::Hugepages(MEM_SIZE >> 21)]) {
        return;
    }
    hugetlb_file_truncated("h-huge-2m", 2 << 20);
}

/// Reserves a 1 GiB huge page if none is free (best effort: only root may, and the kernel may
/// find no gigabyte of contiguous memory left). Returns what nr_hugepages was before if this
/// raised it.
fn reserve_1g_page() -> Option<String> {
    let dir = "/sys/kernel/mm/hugepages/hugepages-1048576kB";
    let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok().map(|s| s.trim().to_string());
    if read("free_hugepages").and_then(|s| s.parse().ok()).unwrap_or(0u64) > 0 {
        return None;
    }
    let nr = read("nr_hugepages")?;
    let want = nr.parse::<u64>().unwrap_or(0) + 1;
    let _ = std::fs::write(format!("{dir}/nr_hugepages"), want.to_string());
    Some(nr)
}

#[test]
fn hugetlb_1g_file_truncated_under_traffic() {
    let before = reserve_1g_page();
    // A host that cannot give a 1 GiB page (memory too fragmented) is said to, not failed.
    if host_offers(Need::Gigapages(1)) {
        hugetlb_file_truncated("h-huge-1g", 1 << 30);
    }
    if let Some(nr) = before {
        let _ = std::fs::write("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", nr);
    }
}

// ---- guest address space ----

/// The VmSize of a process, in bytes.
fn vm_size(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let l = s.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() << 10
}

/// Opens a vhost-user connection as far as SET_MEM_TABLE, with acks on, and sends `regions`
/// (their files' fds in `mmap_handle`). Returns the connection and the table's outcome.
fn send_mem_table(
    sock: &str,
    regions: &[vhost::VhostUserMemoryRegionInfo],
) -> (vhost::vhost_user::Frontend, Result<(), vhost::Error>) {
    use vhost::VhostBackend;
    use vhost::vhost_user::message::VhostUserHeaderFlag;
    use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
    let mut fe = Frontend::connect(sock, 2).expect("connect");
    fe.set_owner().unwrap();
    let offered = fe.get_features().unwrap();
    fe.set_features(offered & FEATURES).unwrap();
    let pf = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(pf & VhostUserProtocolFeatures::REPLY_ACK).unwrap();
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let r = fe.set_mem_table(regions).map(|_| ());
    (fe, r)
}

/// A memory table of eight 4 KiB regions at offsets of 1 to 8 TiB into sparse memfds (32 KiB
/// of memory in all). pvswitchd maps only each region's page: its VmSize grows by no more than a
/// few MiB (mapping each file from offset 0 took 36 TiB, and a bigger table could take all of
/// the process's address space, so no other VM's memory table would map). A VM that connects
/// afterwards maps its memory and forwards; good1 and good2 forward; `ports` answers.
#[test]
fn memory_table_at_huge_file_offsets() {
    use std::os::fd::AsRawFd;
    let _g = serial();
    let mut b = Bench::start_with("h-mem-sparse", &[PortSpec::server("late")], "");
    let pid = b.sw.child.id();
    let before = vm_size(pid);
    let files: Vec<std::fs::File> = (1..=8u64)
        .map(|i| {
            use std::os::fd::FromRawFd;
            // SAFETY: memfd_create with a valid C string; the fd is owned by the File.
            let fd = unsafe { libc::memfd_create(c"evil".as_ptr(), 0) };
            assert!(fd >= 0);
            // SAFETY: a fresh descriptor nobody else owns.
            let f = unsafe { std::fs::File::from_raw_fd(fd) };
            f.set_len((i << 40) + 4096).unwrap();
            f
        })
        .collect();
    let regions: Vec<_> = files
        .iter()
        .zip(1..=8u64)
        .map(|(f, i)| vhost::VhostUserMemoryRegionInfo {
            guest_phys_addr: i << 30,
            memory_size: 4096,
            userspace_addr: 0x7000_0000_0000 + (i << 30),
            mmap_offset: i << 40,
            mmap_handle: f.as_raw_fd(),
        })
        .collect();
    let (_fe, r) = send_mem_table(&b.sw.sock("evil"), &regions);
    let after = vm_size(pid);
    match r {
        Ok(()) => {
            assert!(
                after < before + (8 << 20),
                "the table was accepted and pvswitchd's VmSize grew from {before} to {after} bytes"
            );
            let p = b.sw.port("evil");
            assert_eq!((p["memory_regions"].as_u64(), p["memory_bytes"].as_u64()), (Some(8), Some(8 * 4096)), "{p}");
        }
        Err(e) => {
            let err = wait_for("evil's error", || b.sw.port("evil")["last_error"].as_str().map(String::from));
            println!("the table was refused ({e}): {err}");
        }
    }
    // Another VM maps its memory and forwards.
    let mut late = Vm::connect(&b.sw.sock("late"));
    b.sw.wait_running("late", 1);
    late.post_rx_buffers(16, RX_BUF);
    let f = b.good1_broadcasts();
    assert_eq!(recv_n(&mut late, 1), vec![f], "the late VM did not get good1's broadcast");
    b.check_forwarding(100);
    assert_eq!(b.sw.port("late")["memory_bytes"].as_u64(), Some(MEM_SIZE));
    b.assert_alive();
}

/// `max_total_guest_memory_mib` bounds every VM's memory together: with good1 and good2
/// holding 32 of 48 MiB, evil's 16 MiB table maps and a fourth VM's is refused, naming the
/// setting; once evil has gone, its share is given back and the fourth VM connects.
#[test]
fn memory_tables_over_the_process_budget() {
    let _g = serial();
    let mut b = Bench::start_with("h-mem-total", &[PortSpec::server("late")], "max_total_guest_memory_mib = 48\n");
    let mut evil = b.connect_evil();
    evil.post_rx_buffers(8, RX_BUF);
    b.evil_broadcasts(&mut evil);
    assert!(Vm::try_connect(&b.sw.sock("late"), [RX_RING, TX_RING]).is_err(), "a table past the budget mapped");
    let err = wait_for("late's error", || b.sw.port("late")["last_error"].as_str().map(String::from));
    assert!(
        err.contains("pvswitchd maps 48 MiB of guest memory already and allows at most 48 MiB in all (max_total_guest_memory_mib)"),
        "{err}"
    );
    b.check_forwarding(50);
    drop(evil);
    wait_for("evil to be disconnected", || (b.sw.port("evil")["state"] == "listening").then_some(()));
    let late = wait_for("the late VM to connect", || Vm::try_connect(&b.sw.sock("late"), [RX_RING, TX_RING]).ok());
    drop(late);
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
        queue(&b.sw.port("evil"), GUEST_RX)["error"].as_str().map(String::from)
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

// ---- guest memory limits ----

/// Port evil may map 8 MiB of guest memory; the frontend's table has 16 MiB: refused, with
/// the setting named, and the others forward. Raised by a reload, the same frontend connects.
#[test]
fn memory_table_over_the_ports_limit() {
    let _g = serial();
    let dir = test_dir("h-mem-cap");
    let ports = [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
    // The last port's section is evil's.
    let text = Switch::config_text(&dir, &[1], &ports, "");
    let mut b = Bench::with_switch(Switch::start_config(dir, &(text.clone() + "max_guest_memory_mib = 8\n")));
    let evil_port = b.sw.port("evil");
    assert_eq!(
        (evil_port["max_guest_memory_mib"].as_u64(), evil_port["max_memory_regions"].as_u64()),
        (Some(8), Some(8))
    );
    assert_eq!(b.sw.port("good1")["memory_bytes"].as_u64(), Some(MEM_SIZE));
    assert!(Vm::try_connect(&b.sw.sock("evil"), [RX_RING, TX_RING]).is_err(), "a 16 MiB table was accepted");
    let err = wait_for("evil's error", || b.sw.port("evil")["last_error"].as_str().map(String::from));
    assert!(err.contains("memory table of 16 MiB: the port allows at most 8 MiB (max_guest_memory_mib)"), "{err}");
    b.assert_alive();
    b.check_forwarding(50);
    b.sw.write_config(&(text + "max_guest_memory_mib = 16\n"));
    b.sw.ctl("reload");
    let mut evil = b.connect_evil();
    evil.post_rx_buffers(8, RX_BUF);
    b.evil_broadcasts(&mut evil);
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
    let cases: [([u16; 6], &str); 7] = [
        ([1, 0, 0, 0, len - 10, 16], "offload_bad_csum"),
        ([1, 1, 54, 0, 34, 16], "offload_gso_size_too_small"),
        ([1, 1, 54, 1, 34, 16], "offload_gso_size_too_small"),
        ([1, 1, len + 1, 1448, 34, 16], "offload_bad_headers"),
        ([1, 3, 54, 1448, 34, 16], "offload_bad_gso_type"),
        ([1, 4, 54, 1448, 34, 16], "offload_not_negotiated"),
        ([1, 1, 54, 9000, 34, 16], "mtu_exceeded"),
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
        let before = b.sw.port("evil")["drops"][reason].as_u64().unwrap();
        send(&mut evil, h);
        wait_for(&format!("a {reason} drop"), || {
            (b.sw.port("evil")["drops"][reason].as_u64() > Some(before)).then_some(())
        });
        b.check_forwarding(20);
    }
    let evil_port = b.sw.port("evil");
    assert!(queue(&evil_port, GUEST_TX)["error"].is_null(), "a bad offload header stopped the queue: {evil_port}");
    // A good TSO frame after all that: good1 (no offloads) gets it as three segments.
    send(&mut evil, [1, 1, 54, 1448, 34, 16]);
    let got = recv_n(&mut b.good1, 3);
    assert_eq!(got.iter().map(|s| s.len()).collect::<Vec<_>>(), [1502, 1502, 158]);
    assert!(got.iter().flat_map(|s| s[54..].to_vec()).eq(f[54..].iter().copied()), "payload changed");
    b.check_forwarding(100);
    b.assert_alive();
}
