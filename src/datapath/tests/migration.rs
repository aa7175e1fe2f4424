//! Dirty logging for live migration, stepped: while a frontend logs, every guest page the
//! data path writes for its VM (receive buffers, used ring) is marked in the frontend's
//! bitmap, exactly those pages; logging stops and starts again on SET_FEATURES (a failed
//! migration retried); a bad log is refused for that port alone.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use super::*;
use crate::port::vhost::{VHOST_F_LOG_ALL, VHOST_USER_F_PROTOCOL_FEATURES};

fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a valid C string; the new fd is owned by the File.
    let f = unsafe { File::from_raw_fd(libc::memfd_create(c"pvs-log".as_ptr(), libc::MFD_CLOEXEC)) };
    f.set_len(len).unwrap();
    f
}

/// Bytes of bitmap a guest of `mem` bytes needs.
fn log_bytes(mem: u64) -> u64 {
    mem.div_ceil(4096).div_ceil(8)
}

/// What QEMU does for VM `i` when a migration starts: SET_LOG_BASE, LOG_ALL in the features,
/// each ring's addresses again with its used ring's guest address to log. Returns the log.
fn start_logging(b: &mut Bench, i: usize) -> File {
    let vm = &mut b.vms[i];
    let l = *vm.guest.layout();
    let log = memfd(log_bytes(l.mem_size));
    vm.backend.set_log_base(log_bytes(l.mem_size), 0, Some(log.try_clone().unwrap())).unwrap();
    vm.backend.set_features(vm.features | VHOST_USER_F_PROTOCOL_FEATURES | VHOST_F_LOG_ALL).unwrap();
    let uva = vm.guest.mem.uva();
    for (q, at) in l.rings.iter().enumerate() {
        vm.backend.set_vring_addr(q as u32, uva + at.desc, uva + at.used, uva + at.avail, Some(at.used)).unwrap();
    }
    log
}

/// The pages marked in `log` (and clears it, as the frontend does when it syncs).
fn take_marked(log: &File) -> Vec<u64> {
    let len = log.metadata().unwrap().len();
    let mut bytes = vec![0u8; len as usize];
    log.read_exact_at(&mut bytes, 0).unwrap();
    log.write_all_at(&vec![0u8; len as usize], 0).unwrap();
    let mut pages = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                pages.push(i as u64 * 8 + bit);
            }
        }
    }
    pages
}

/// The pages of `[gpa, gpa + len)`.
fn pages(gpa: u64, len: u64) -> impl Iterator<Item = u64> {
    (gpa >> 12)..=((gpa + len - 1) >> 12)
}

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
