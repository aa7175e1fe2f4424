//! pvswitchd against a hostile guest's memory: regions longer than their files, files shrunk
//! or truncated under traffic (memfd, dirty log, 2 MiB and 1 GiB hugetlb), tables at huge file
//! offsets, and the per-port and process-wide memory budgets. The bench of tests/hostile.rs:
//! "good1" and "good2" behave, "evil" attacks; each test checks that pvswitchd survives, only
//! evil is refused or disconnected (saying why), and the good VMs keep forwarding.

use crate::common;
use crate::frontend;

use std::time::{Duration, Instant};

use common::vms::*;
use common::*;
use frontend::*;
use pvswitch::proto::{PortInfo, Request};

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
    let err = wait_for("evil's error", || b.sw.port_info("evil").last_error);
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
        let p = b.sw.port_info("evil");
        (p.state == "listening").then(|| p.last_error.unwrap_or_default())
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
    let _: Vec<PortInfo> = b.sw.ports(); // panics if there is no answer to ports
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
        let p = b.sw.port_info("evil");
        (p.state == "listening").then(|| p.last_error.unwrap_or_default())
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
    let evil_port = b.sw.port_info("evil");
    assert!(evil_port.migration.logging, "{}", evil_port.json());
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
            let p = b.sw.port_info("evil");
            assert_eq!((p.memory_regions, p.memory_bytes), (8, 8 * 4096), "{}", p.json());
        }
        Err(e) => {
            let err = wait_for("evil's error", || b.sw.port_info("evil").last_error);
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
    assert_eq!(b.sw.port_info("late").memory_bytes, MEM_SIZE);
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
    let err = wait_for("late's error", || b.sw.port_info("late").last_error);
    assert!(
        err.contains("pvswitchd maps 48 MiB of guest memory already and allows at most 48 MiB in all (max_total_guest_memory_mib)"),
        "{err}"
    );
    b.check_forwarding(50);
    drop(evil);
    wait_for("evil to be disconnected", || (b.sw.port_info("evil").state == "listening").then_some(()));
    let late = wait_for("the late VM to connect", || Vm::try_connect(&b.sw.sock("late"), [RX_RING, TX_RING]).ok());
    drop(late);
    b.check_forwarding(50);
    b.assert_alive();
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
    let evil_port = b.sw.port_info("evil");
    assert_eq!((evil_port.max_guest_memory_mib, evil_port.max_memory_regions), (8, 8));
    assert_eq!(b.sw.port_info("good1").memory_bytes, MEM_SIZE);
    assert!(Vm::try_connect(&b.sw.sock("evil"), [RX_RING, TX_RING]).is_err(), "a 16 MiB table was accepted");
    let err = wait_for("evil's error", || b.sw.port_info("evil").last_error);
    assert!(err.contains("memory table of 16 MiB: the port allows at most 8 MiB (max_guest_memory_mib)"), "{err}");
    b.assert_alive();
    b.check_forwarding(50);
    b.sw.write_config(&(text + "max_guest_memory_mib = 16\n"));
    b.sw.reload();
    let mut evil = b.connect_evil();
    evil.post_rx_buffers(8, RX_BUF);
    b.evil_broadcasts(&mut evil);
}

// ---- the dirty log ----

/// pvswitchd's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A migrating VM (its frontend logs: LOG_ALL and a log) whose receive buffers are too small
/// for what it is sent (MRG_RXBUF buffers of one byte: no frame fits in the 256 a frame may
/// take), and which moves its avail index back and forth so that every frame walks them again
/// (issue 48's F2). Each walk pops 256 buffers and gives them back. Before, the log kept every
/// popped buffer until a publish that never came: pvswitchd grew by hundreds of MiB a second.
/// Now the log keeps nothing between pops: pvswitchd does not grow, `ports` answers within
/// 100 ms meanwhile, and the good VMs forward.
#[test]
fn a_logging_receiver_whose_frames_never_fit_grows_nothing() {
    let _g = serial();
    let mut b = Bench::start("h-log-retry");
    let mut evil =
        Vm::connect_features(&b.sw.sock("evil"), Layout::TEST, FEATURES | MRG_RXBUF | LOG_ALL).expect("evil's setup");
    b.sw.wait_running("evil", 1);
    b.evil_broadcasts(&mut evil);
    let l = Layout::TEST;
    {
        // Every buffer posted: the first holds the header and 4 bytes, the others one byte.
        let mut rx = evil.raw_rx();
        for d in 0..l.qsize {
            rx.desc(d, Desc { addr: l.rx_buf(d), len: if d == 0 { 16 } else { 1 }, flags: F_WRITE, next: 0 });
            rx.stage(d);
        }
        rx.publish();
    }
    let full = evil.raw_rx().avail_idx();
    let pid = b.sw.child.id();
    let before = rss_kib(pid);
    let (mut slowest, mut seq, t0) = (Duration::ZERO, 0u32, Instant::now());
    // 20,000 walks (a few seconds; at most a minute on a loaded machine): before, 80 MiB kept.
    while seq < 40_000 && t0.elapsed() < Duration::from_secs(60) {
        // A new avail index before each frame: the switch walks evil's buffers again for it.
        for _ in 0..2000 {
            let idx = evil.raw_rx().avail_idx();
            evil.raw_rx().set_avail_idx(if idx == full { full.wrapping_sub(1) } else { full });
            b.good1.send(&frame(MAC_C, MAC_A, 1000, 7, seq));
            seq += 1;
            let spin = Instant::now();
            while b.good1.tx_pending() > 0 && spin.elapsed() < Duration::from_secs(5) {
                std::hint::spin_loop();
            }
        }
        let asked = Instant::now();
        assert!(b.sw.try_ask::<Vec<PortInfo>>(&Request::Ports).is_ok());
        slowest = slowest.max(asked.elapsed());
    }
    let grown = rss_kib(pid).saturating_sub(before);
    let walked = b.sw.counters("evil").drops.get(DropReason::RxBufferTooSmall);
    eprintln!(
        "{seq} frames to evil ({walked} dropped as too small), pvswitchd grew {grown} KiB, slowest ports {slowest:?}"
    );
    assert!(walked >= 10_000, "too few walks to tell: {walked}");
    assert!(grown < 8 << 10, "pvswitchd grew by {grown} KiB");
    assert!(slowest < Duration::from_millis(100), "ports took {slowest:?}");
    b.check_forwarding(100);
    b.assert_alive();
}
