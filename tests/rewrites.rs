//! pvswitchd against a guest whose second vCPU rewrites its frames while the switch handles
//! them (issue 29: "classify what you deliver"). Four test VMs (tests/frontend) on one poll
//! thread: "evil" sends under port security or a flow ACL while another thread rewrites the
//! bytes the policy reads, "peer" must receive only frames the policy allows, and "good1" and
//! "good2" keep forwarding while `ports` answers. Needs no hugepages and no DPDK.
//! Against pvswitchd before the switch decided on its own copy of the front (4bc0e8c), each
//! test saw 29,000-89,000 of some 110,000-500,000 frames at the peer forged in its 5 s.

use crate::common;
use crate::frontend;

use common::vms::*;
use common::*;
use frontend::*;

/// The attacker's own MAC (the only one port security lets it send from), the MAC it forges
/// (differs in the last byte only), and its peer's.
const MAC_EVIL: [u8; 6] = [0x02, 0, 0, 0, 0, 0xe1];
const MAC_FORGED: [u8; 6] = [0x02, 0, 0, 0, 0, 0xe2];
const MAC_PEER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0d];
/// How long the attacker sends while its second vCPU rewrites.
const RACE: std::time::Duration = std::time::Duration::from_secs(5);

/// A UDP/IPv4 frame of `len` bytes to UDP port `port`.
fn udp(dst: [u8; 6], src: [u8; 6], len: usize, port: u16, seq: u32) -> Vec<u8> {
    let mut f = frame(dst, src, len, 0, seq);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[20..22].copy_from_slice(&[0, 0]); // no fragment
    f[23] = 17;
    f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f[36..38].copy_from_slice(&port.to_be_bytes());
    f
}

/// Pins the calling thread to every CPU but `core` (if there is another).
fn avoid_core(core: usize) {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t filled with CPU_SET, and sched_setaffinity on this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in (0..n).filter(|&c| c != core) {
            libc::CPU_SET(c, &mut set);
        }
        if n > 1 {
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// The guest's second vCPU: until `stop`, stores `values[0]`, then `values[1]`, then
/// `values[0]`, ... into byte `at` of every frame buffer of a VM's TX area (the odd
/// descriptors' buffers: `send` puts the header in the even one, the frame in the odd one),
/// with volatile stores through a mapping of the guest's memfd of its own, in a tight loop, on
/// a CPU other than the switch's poll core. Returns how many sweeps over the buffers it made.
fn rewriter(
    memfd: std::fs::File,
    at: u64,
    values: [u8; 2],
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    use std::os::fd::AsRawFd;
    std::thread::spawn(move || {
        avoid_core(1);
        let len = MEM_SIZE as usize;
        // SAFETY: a fresh shared mapping of the guest's memfd, unmapped below; only bytes of TX
        // buffer slots are written, with volatile stores (the switch reads them concurrently,
        // as it would a guest's).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                memfd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as *mut u8;
        let mut sweeps = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let v = values[(sweeps & 1) as usize];
            for d in (1..QSIZE).step_by(2) {
                let p = (TX_BUFS + d as u64 * BUF_SLOT + at) as usize;
                // SAFETY: inside the mapping (TX_BUFS + QSIZE * BUF_SLOT < MEM_SIZE).
                unsafe { std::ptr::write_volatile(base.add(p), v) };
            }
            sweeps += 1;
        }
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(base as *mut libc::c_void, len) };
        sweeps
    })
}

/// Ports good1, good2, peer and evil on one poll thread (core 1); evil may send from MAC_EVIL
/// only; `flows` if any. Evil sends UDP frames to port 80 of MAC_PEER, from MAC_EVIL, for
/// `RACE`, while its second vCPU flips byte `at` of every TX buffer between `values`. Every
/// frame peer receives must pass `allowed` (be one the policy lets through); some must arrive;
/// evil must have `drop_reason` drops (the rewrites were seen, before classify); meanwhile
/// good1 and good2 forward to each other losing nothing, and `ports` answers.
fn rewritten_in_flight(
    name: &str,
    flows: &[&str],
    at: u64,
    values: [u8; 2],
    allowed: fn(&[u8]) -> bool,
    drop_reason: &str,
) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    let _g = serial();
    let dir = test_dir(name);
    let ports =
        [PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("peer"), PortSpec::server("evil")];
    // The last port's section is evil's.
    let mut text = Switch::config_text(&dir, &[1], &ports, "") + "allowed_macs = [\"02:00:00:00:00:e1\"]\n";
    if !flows.is_empty() {
        let list: Vec<String> = flows.iter().map(|f| format!("\"{f}\"")).collect();
        text = format!("flows = [{}]\n{text}", list.join(", "));
    }
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    let mut peer = Vm::connect(&b.sw.sock("peer"));
    b.sw.wait_running("peer", 1);
    peer.post_rx_buffers(QSIZE, RX_BUF);
    if flows.is_empty() {
        // Peer announces its MAC, so evil's frames to it are known unicast (not flooded to the
        // bystanders).
        let hello = frame(BCAST, MAC_PEER, 64, 0xff, 0);
        peer.send(&hello);
        assert_eq!(recv_n(&mut b.good1, 1), vec![hello.clone()]);
        assert_eq!(recv_n(&mut b.good2, 1), vec![hello]);
    }
    let mut evil = b.connect_evil();
    // Untouched, evil's frame arrives: the policy lets it through.
    let f = udp(MAC_PEER, MAC_EVIL, 200, 80, 0);
    evil.send(&f);
    assert_eq!(recv_n(&mut peer, 1), vec![f]);
    let drops_before = b.sw.port("evil")["drops"][drop_reason].as_u64().unwrap();
    let peer_before = b.sw.counter("peer", "tx_packets");

    let stop = Arc::new(AtomicBool::new(false));
    let rw = rewriter(evil.memfd().try_clone().unwrap(), at, values, stop.clone());
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let burst: Vec<Vec<u8>> = (0..32).map(|i| udp(MAC_PEER, MAC_EVIL, 200, 80, i)).collect();
            let mut sent = 0u64;
            while !stop.load(Ordering::Relaxed) {
                evil.send_all(&burst);
                sent += burst.len() as u64;
            }
            (evil, sent)
        })
    };
    let mut got = 0u64;
    let mut bad: Vec<Vec<u8>> = Vec::new();
    let take = |peer: &mut Vm, got: &mut u64, bad: &mut Vec<Vec<u8>>| {
        let fs = peer.recv();
        peer.post_rx_buffers(fs.len() as u16, RX_BUF);
        *got += fs.len() as u64;
        bad.extend(fs.into_iter().filter(|f| !allowed(f)));
    };
    let start = Instant::now();
    let mut checks = 0;
    let mut last_check = start;
    while start.elapsed() < RACE {
        take(&mut peer, &mut got, &mut bad);
        if last_check.elapsed() > std::time::Duration::from_millis(250) {
            b.check_forwarding(50);
            assert!(b.sw.try_ctl("ports").is_ok(), "pvswitchctl ports did not answer during the attack");
            checks += 1;
            last_check = Instant::now();
        }
        std::thread::sleep(std::time::Duration::from_micros(200)); // pacing, not synchronization
    }
    stop.store(true, Ordering::Relaxed);
    let (mut evil, sent) = attacker.join().unwrap();
    let sweeps = rw.join().unwrap();
    wait_for("evil's TX ring to be completed", || (evil.tx_pending() == 0).then_some(()));
    // Everything the switch delivered to peer arrives (peer's RX ring may have run dry now and
    // then: those frames are dropped, not delivered).
    let sw = &b.sw;
    let delivered = wait_for("peer's frames", || {
        take(&mut peer, &mut got, &mut bad);
        let n = sw.counter("peer", "tx_packets") - peer_before;
        (got >= n).then_some(n)
    });
    let p = b.sw.port("evil");
    let dropped = p["drops"][drop_reason].as_u64().unwrap() - drops_before;
    eprintln!(
        "{name}: evil sent {sent} frames, its second vCPU made {sweeps} sweeps; peer received {got} \
         ({delivered} counted), {} not allowed; {dropped} {drop_reason} drops; {checks} bystander checks",
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} of {got} frames peer received are ones the policy refuses, the first: {:02x?}",
        bad.len(),
        &bad[0][..40]
    );
    assert!(got >= 1000, "peer received only {got} frames: the test checked too little");
    assert!(dropped > 0, "no {drop_reason} drops on evil: the rewrites were never seen ({p})");
    assert!(checks > 0);
    b.assert_good_ports_clean();
    b.check_forwarding(100);
    assert!(b.sw.try_ctl("ports").is_ok(), "pvswitchctl ports did not answer");
    b.assert_alive();
}

/// Port security: evil may send from MAC_EVIL only; its second vCPU flips the source MAC's
/// last byte between MAC_EVIL and MAC_FORGED. Peer gets no frame from MAC_FORGED.
#[test]
fn port_security_holds_against_a_second_vcpu_rewriting_frames() {
    rewritten_in_flight("h-rw-mac", &[], 11, [MAC_FORGED[5], MAC_EVIL[5]], |f| f[6..12] == MAC_EVIL, "port_security");
}

/// A flow ACL: evil may send UDP to port 80 only, to peer; its second vCPU flips the UDP
/// destination port between 80 and 22. Peer gets no frame to port 22.
#[test]
fn a_flow_acl_holds_against_a_second_vcpu_rewriting_frames() {
    let flows = [
        "priority=10,in_port=evil,udp,tp_dst=80,actions=output:peer",
        "priority=10,in_port=good1,actions=output:good2",
        "priority=10,in_port=good2,actions=output:good1",
        "priority=0,actions=drop",
    ];
    rewritten_in_flight("h-rw-acl", &flows, 37, [22, 80], |f| f[36..38] == [0, 80], "flow_drop");
}
