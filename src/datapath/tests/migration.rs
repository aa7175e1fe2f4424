//! Dirty logging for live migration, stepped: while a frontend logs, every guest page the
//! data path writes for its VM (receive buffers, used ring) is marked in the frontend's
//! bitmap, exactly those pages; logging stops and starts again on SET_FEATURES (a failed
//! migration retried); a bad log is refused for that port alone.

use std::fs::File;
use std::os::fd::FromRawFd;

use super::*;
use crate::datapath::counters::DropReason;
use crate::datapath::plan::PortPolicy;
use crate::port::vhost::VHOST_USER_F_PROTOCOL_FEATURES;

/// VM 0 sends `n` frames of `len` bytes to VM 1; returns VM 1's used entries (id, len).
fn deliver(b: &mut Bench, n: u32, len: usize, seq: u32) -> Vec<(u32, u32)> {
    for k in 0..n {
        b.vms[0].guest.send(&frame(mac(1), mac(0), len, seq + k));
    }
    b.settle(10);
    let mut rx = b.vms[1].guest.raw_rx();
    let idx = rx.used_idx();
    let used: Vec<(u32, u32)> = std::iter::from_fn(|| rx.next_used(idx)).collect();
    let rx_buf = b.vms[1].rx_buf;
    b.vms[1].guest.post_rx_buffers(used.len() as u16, rx_buf);
    used
}

/// What the switch wrote into VM 1 for `used`: each buffer's pages (header and frame), and
/// its receive queue's used ring.
fn written(b: &Bench, used: &[(u32, u32)]) -> Vec<u64> {
    let l = *b.vms[1].guest.layout();
    let mut want: Vec<u64> = used.iter().flat_map(|&(id, len)| pages(l.rx_buf(id as u16), len as u64)).collect();
    want.extend(pages(l.rings[0].used, 6 + 8 * l.qsize as u64));
    want.sort_unstable();
    want.dedup();
    want
}

#[test]
fn every_page_written_for_a_logging_vm_is_marked_and_nothing_else() {
    let mut b = Bench::new(BenchCfg::default());
    b.post(0);
    b.step();
    let log = start_logging(&mut b, 1);
    take_marked(&log);
    let used = deliver(&mut b, 5, 1518, 1);
    assert_eq!(used.len(), 5);
    assert_eq!(take_marked(&log), written(&b, &used), "the pages marked are exactly the pages written");
    // A page is marked again once it is written again (the frontend cleared it meanwhile).
    let used = deliver(&mut b, 3, 60, 10);
    assert_eq!(take_marked(&log), written(&b, &used));
    // What VM 1 sends: its TX buffers are only read, but its TX used ring is written.
    b.vms[1].guest.send(&frame(mac(0), mac(1), 100, 20));
    b.settle(10);
    let l = *b.vms[1].guest.layout();
    let tx_used: Vec<u64> = pages(l.rings[1].used, 6 + 8 * l.qsize as u64).collect();
    assert_eq!(take_marked(&log), tx_used);
}

#[test]
fn logging_stops_and_starts_again_with_the_features() {
    let mut b = Bench::new(BenchCfg::default());
    b.post(0);
    b.step();
    let log = start_logging(&mut b, 1);
    let used = deliver(&mut b, 2, 200, 1);
    assert_eq!(take_marked(&log), written(&b, &used));
    // The migration failed: QEMU turns logging off. Nothing is marked any more.
    let vm = &mut b.vms[1];
    vm.backend.set_features(vm.features | VHOST_USER_F_PROTOCOL_FEATURES).unwrap();
    assert_eq!(deliver(&mut b, 2, 200, 3).len(), 2, "frames still flow");
    assert!(take_marked(&log).is_empty());
    // Retried: a new log, marked as the first.
    let log2 = start_logging(&mut b, 1);
    let used = deliver(&mut b, 2, 200, 5);
    assert_eq!(take_marked(&log2), written(&b, &used));
    assert!(take_marked(&log).is_empty(), "the old log is no longer written");
}

#[test]
fn a_bad_log_is_refused_and_the_port_keeps_its_old_one() {
    let mut b = Bench::new(BenchCfg::default());
    b.post(0);
    b.step();
    let log = start_logging(&mut b, 1);
    let need = log_bytes(b.vms[1].guest.layout().mem_size);
    let be = &mut b.vms[1].backend;
    let small = be.set_log_base(1, 0, Some(memfd(1))).unwrap_err();
    assert!(small.contains("cannot cover"), "{small}");
    let past = be.set_log_base(need, 1 << 20, Some(memfd(need))).unwrap_err();
    assert!(past.contains("log"), "an offset past the file's end: {past}");
    let mut fds = [0; 2];
    // SAFETY: pipe fills two fds we then own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the fds are ours; the write end is closed by its File.
    let (r, _w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let pipe = be.set_log_base(need, 0, Some(r)).unwrap_err();
    assert!(pipe.contains("log"), "{pipe}");
    assert!(be.set_log_base(need, 0, None).is_err(), "no fd");
    be.set_protocol_features(0);
    let unnegotiated = be.set_log_base(need, 0, Some(memfd(need))).unwrap_err();
    assert!(unnegotiated.contains("LOG_SHMFD"), "{unnegotiated}");
    // The log already mapped still works: nothing was replaced by a refused one.
    let used = deliver(&mut b, 2, 300, 1);
    assert_eq!(take_marked(&log), written(&b, &used));
}

/// What QEMU's destination does for a guest that cannot announce itself: SEND_RARP with its
/// MAC, on the port it now has (VM 2 here, the guest's MAC `mac(1)`).
fn send_rarp(b: &mut Bench, i: usize, m: [u8; 6]) -> Result<(), String> {
    let be = &mut b.vms[i].backend;
    be.set_protocol_features(crate::port::vhost::OFFERED_PROTOCOL_FEATURES);
    be.send_rarp(crate::wire::MacAddr(m))
}

#[test]
fn send_rarp_announces_the_guest_from_its_new_port_at_once() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.post(0);
    b.announce(1);
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(mac(1)), 0), Some(1), "the guest is first on port 1");
    // The destination's guest has not sent anything, and its TX ring is not even running.
    b.vms[2].backend.get_vring_base(1).unwrap();
    send_rarp(&mut b, 2, mac(1)).unwrap();
    b.step();
    let rarp = crate::wire::arp::rarp_announcement(crate::wire::MacAddr(mac(1))).to_vec();
    assert_eq!(b.vms[0].recv(), vec![rarp.clone()], "the others get the RARP, from the guest's MAC");
    assert_eq!(b.vms[1].recv(), vec![rarp]);
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(mac(1)), 0), Some(2), "the MAC moved with the first frame");
    assert_eq!(b.vms[2].port.queues().unwrap().announcer.sent(), 1);
    assert_eq!(b.totals(2).rx_packets, 1, "counted as the port's own frame");
    // Frames for the guest now go to its new port, none to the old one.
    b.vms[0].guest.send(&frame(mac(1), mac(0), 100, 7));
    b.settle(10);
    assert_eq!(b.vms[2].recv().len(), 1);
    assert!(b.vms[1].recv().is_empty());
    // Sent once: a later loop sends nothing more.
    b.settle(5);
    assert!(b.vms[0].recv().is_empty());
    assert_eq!(b.vms[2].port.queues().unwrap().announcer.sent(), 1);
}

#[test]
fn send_rarp_obeys_the_ports_policy() {
    // A tenant cannot use SEND_RARP to claim a MAC its port may not use.
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.policies[2] = PortPolicy { allowed_macs: vec![crate::wire::MacAddr(mac(2))], ..Default::default() };
    b.post(0);
    b.announce(1);
    send_rarp(&mut b, 2, mac(1)).unwrap();
    b.settle(5);
    assert!(b.vms[0].recv().is_empty() && b.vms[1].recv().is_empty());
    assert_eq!(b.drops(2, DropReason::PortSecurity), 1);
    assert_eq!(b.mac.lookup(&crate::wire::MacAddr(mac(1)), 0), Some(1), "the MAC stays where it was");
}

#[test]
fn bad_send_rarp_is_refused() {
    let mut b = Bench::new(BenchCfg::default());
    let be = &mut b.vms[1].backend;
    be.set_protocol_features(0);
    let e = be.send_rarp(crate::wire::MacAddr(mac(1))).unwrap_err();
    assert!(e.contains("RARP protocol feature"), "{e}");
    for m in [[0xff; 6], [1, 0, 0x5e, 0, 0, 1], [0; 6]] {
        let e = send_rarp(&mut b, 1, m).unwrap_err();
        assert!(e.contains("no guest can have"), "{e}");
    }
    b.settle(5);
    assert!(b.vms[0].recv().is_empty(), "nothing was announced");
}

/// A frontend that floods SEND_RARP gets a few announcements, each answered: past the port's
/// budget (8 at once, then 4 a second) a request announces nothing and is counted, and the
/// others on the thread see a handful of broadcasts, not one per request. Before, every
/// request was a flooded announcement (and a log line).
#[test]
fn a_send_rarp_flood_announces_a_few_times() {
    let mut b = Bench::new(BenchCfg { vms: 3, ..BenchCfg::default() });
    b.announce(1);
    b.announce(2);
    let mut announced = 0;
    for _ in 0..2000 {
        send_rarp(&mut b, 1, mac(1)).unwrap();
        b.step();
        announced += b.vms[0].recv().len();
    }
    let port = &b.vms[1].port;
    let sent = port.queues().unwrap().announcer.sent();
    assert_eq!(sent as usize, announced);
    assert!((8..=12).contains(&sent), "{sent} announcements for 2000 requests");
    assert_eq!(port.limits.announce.refused(), 2000 - sent);
    assert_eq!(b.vms[2].recv().len(), announced, "the bystander got as many");
}
