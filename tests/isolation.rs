//! The control plane never waits on a frontend. For each way a frontend (or a control or
//! metrics client, or a VMM in client mode) can misbehave toward the control thread: while it
//! does, a VM never seen before connects to another port and passes traffic, `pvswitchctl
//! ports` answers, two other VMs keep forwarding; afterwards the offender's connection is
//! closed for the reason it earned; and SIGTERM still stops the daemon.

use crate::common;
use crate::frontend;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use common::vms::*;
use common::*;
use frontend::*;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// A vhost-user message: header (request, version 1 with `flags`, size) and payload.
fn message(request: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    for w in [request, 1 | flags, payload.len() as u32] {
        m.extend_from_slice(&w.to_le_bytes());
    }
    m.extend_from_slice(payload);
    m
}

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_MEM_TABLE: u32 = 5;
const SET_VRING_CALL: u32 = 13;

/// Connects a test VM to `sock`, failing (not hanging) if the switch does not complete the
/// setup in time.
fn connect_within(sock: &str) -> Vm {
    let sock = sock.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Vm::try_connect(&sock, [RX_RING, TX_RING]).map_err(|e| e.to_string()));
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(Ok(vm)) => vm,
        Ok(Err(e)) => panic!("a new VM's setup was refused: {e}"),
        Err(_) => panic!("a new VM's setup did not complete within {DEADLINE:?}: the control thread is stuck"),
    }
}

/// What must hold while an attack runs: a new VM on port "fresh" connects and receives a
/// broadcast, `ports` answers, good1 and good2 forward to each other.
fn others_unaffected(b: &mut Bench) {
    let t0 = Instant::now();
    let mut fresh = connect_within(&b.sw.sock("fresh"));
    eprintln!("a new VM's setup took {:?} during the attack", t0.elapsed());
    b.sw.wait_running("fresh", 1);
    fresh.post_rx_buffers(64, RX_BUF);
    let f = b.good1_broadcasts();
    assert_eq!(recv_n(&mut fresh, 1), vec![f], "the new VM did not get good1's broadcast");
    assert!(b.sw.try_ctl("ports").is_ok(), "pvswitchctl ports did not answer");
    b.check_forwarding(100);
}

/// The evil port's last error, once the switch has closed its connection.
fn evil_error(b: &Bench) -> String {
    wait_for("evil to be disconnected", || {
        let p = b.sw.port("evil");
        (p["state"] == "listening" && p["connects"].as_u64() >= Some(1))
            .then(|| p["last_error"].as_str().unwrap_or("").to_string())
    })
}

/// SIGTERM stops the daemon, whatever its clients are doing.
fn terminates(mut b: Bench) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(b.sw.child.id() as i32, libc::SIGTERM) };
    let sw = &mut b.sw;
    let status = wait_for("pvswitchd to exit on SIGTERM", || sw.child.try_wait().unwrap());
    assert!(status.success(), "pvswitchd exited with {status}");
}

fn bench(name: &str) -> Bench {
    Bench::start_with(name, &[PortSpec::server("fresh")], "")
}

/// A raw connection to the evil port that sent `bytes` and then waits.
fn stall_with(name: &str, bytes: &[u8], expect: &str) {
    let _g = serial();
    let mut b = bench(name);
    let mut evil = UnixStream::connect(b.sw.sock("evil")).unwrap();
    evil.write_all(bytes).unwrap();
    others_unaffected(&mut b);
    assert_closed_by_peer(&mut evil, "a stalled message");
    let err = evil_error(&b);
    assert!(err.contains(expect), "evil's error: {err}");
    terminates(b);
}

#[test]
fn a_partial_header_stops_nothing() {
    stall_with("iso-partial", &message(SET_FEATURES, 0, &[0; 8])[..5], "unfinished");
}

#[test]
fn a_header_promising_more_payload_stops_nothing() {
    stall_with("iso-short", &message(SET_FEATURES, 0, &[0; 8])[..16], "unfinished");
}

#[test]
fn an_impossible_size_closes_at_once() {
    let _g = serial();
    let mut b = bench("iso-size");
    let mut evil = UnixStream::connect(b.sw.sock("evil")).unwrap();
    let mut h = message(SET_MEM_TABLE, 0, &[]);
    h[8..12].copy_from_slice(&100_000u32.to_le_bytes());
    evil.write_all(&h).unwrap();
    assert_closed_by_peer(&mut evil, "a 100000-byte memory table");
    assert!(evil_error(&b).contains("payload"), "{}", evil_error(&b));
    others_unaffected(&mut b);
    terminates(b);
}

#[test]
fn more_fds_than_a_message_takes_close_its_connection() {
    let _g = serial();
    let mut b = bench("iso-fds");
    for (n, expect) in [(2, "carries 2 file descriptors"), (12, "more than 8 file descriptors")] {
        let mut evil = UnixStream::connect(b.sw.sock("evil")).unwrap();
        let fds: Vec<EventFd> = (0..n).map(|_| EventFd::new(0).unwrap()).collect();
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let m = message(SET_VRING_CALL, 0, &0u64.to_le_bytes());
        evil.send_with_fds(&[&m[..]], &raw).unwrap();
        assert_closed_by_peer(&mut evil, &format!("a message with {n} fds"));
        let err = evil_error(&b);
        assert!(err.contains(expect), "{n} fds: evil's error: {err}");
        others_unaffected(&mut b);
        // The new VM of others_unaffected is gone: wait until port fresh is free again.
        wait_for("port fresh to be free", || (b.sw.port("fresh")["state"] == "listening").then_some(()));
    }
    terminates(b);
}

/// How many file descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// A header, then one byte at a time, each byte with 8 fds: the fds of one unfinished message
/// are counted across reads, so the connection closes at the ninth fd instead of pvswitchd
/// collecting thousands of them (near its fd limit, other VMs' connections would fail).
#[test]
fn fds_spread_over_many_reads_close_the_connection() {
    let _g = serial();
    let mut b = bench("iso-fdspread");
    let pid = b.sw.child.id();
    let baseline = open_fds(pid);
    let evil = UnixStream::connect(b.sw.sock("evil")).unwrap();
    // A request pvswitchd does not implement may carry up to 4 KiB: room for 4000 one-byte
    // reads.
    let mut h = message(99, 0, &[]);
    h[8..12].copy_from_slice(&4096u32.to_le_bytes());
    (&evil).write_all(&h).unwrap();
    let fds: Vec<EventFd> = (0..8).map(|_| EventFd::new(0).unwrap()).collect();
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(open_fds(pid));
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            most
        })
    };
    let mut sent = 0;
    let mut refused = None;
    for _ in 0..4000 {
        match evil.send_with_fds(&[&[0u8][..]], &raw) {
            Ok(_) => sent += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    // What pvswitchd holds once every send went out (or the connection was closed).
    let after = open_fds(pid);
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let most = watcher.join().unwrap().max(after);
    eprintln!(
        "{sent} one-byte sends with 8 fds each went out ({refused:?}); pvswitchd's fds: {baseline} before, at most {most} during"
    );
    assert!(most < baseline + 64, "pvswitchd held {most} fds (baseline {baseline}) for one unfinished message");
    let mut evil = evil;
    assert_closed_by_peer(&mut evil, "a message whose fds came over many reads");
    let err = evil_error(&b);
    assert!(err.contains("a message carried more than 8 file descriptors"), "evil's error: {err}");
    others_unaffected(&mut b);
    assert!(open_fds(pid) < baseline + 64, "pvswitchd's fds: {} (baseline {baseline})", open_fds(pid));
    terminates(b);
}

#[test]
fn a_frontend_that_never_reads_replies_is_disconnected() {
    let _g = serial();
    let mut b = bench("iso-noread");
    let mut evil = UnixStream::connect(b.sw.sock("evil")).unwrap();
    let mut writer = evil.try_clone().unwrap();
    // GET_FEATURES asks for a reply each time; the replies are never read.
    let spam = std::thread::spawn(move || {
        let one = message(GET_FEATURES, 0, &[]);
        let many: Vec<u8> = one.iter().copied().cycle().take(one.len() * 4096).collect();
        let mut sent = 0usize;
        while writer.write_all(&many).is_ok() {
            sent += many.len();
            if sent > 64 << 20 {
                break;
            }
        }
        sent
    });
    others_unaffected(&mut b);
    let err = evil_error(&b);
    assert!(err.contains("replies unread"), "evil's error: {err}");
    assert_closed_by_peer(&mut evil, "replies left unread");
    let sent = spam.join().unwrap();
    assert!(sent < 64 << 20, "the switch read 64 MiB of requests without closing");
    terminates(b);
}

#[test]
fn a_vmm_that_never_accepts_stops_nothing() {
    let _g = serial();
    // The VMM of client-mode port "vmm" listens with a backlog of 1 and never accepts; we fill
    // the backlog ourselves, so pvswitchd's connects find it full.
    let vmm_dir = test_dir("iso-vmm-side");
    let path = vmm_dir.join("vmm.sock");
    let _listener = listen_backlog(&path, 1);
    let fillers: Vec<UnixStream> = (0..4).filter_map(|_| nonblocking_connect(&path)).collect();
    assert!(!fillers.is_empty());
    let dir = test_dir("iso-vmm");
    let ports = [
        PortSpec::server("good1"),
        PortSpec::server("good2"),
        PortSpec::server("evil"),
        PortSpec::server("fresh"),
        PortSpec::server("vmm").client(),
    ];
    let text = Switch::config_text(&dir, &[1], &ports, "")
        .replace("socket = \"vmm.sock\"", &format!("socket = \"{}\"", path.display()));
    let mut b = Bench::with_switch(Switch::start_config(dir, &text));
    let sw = &b.sw;
    let err = wait_for("the vmm port to report its connect failing", || {
        sw.port("vmm")["last_error"].as_str().map(String::from)
    });
    assert!(err.contains("os error 11"), "vmm: {err}");
    others_unaffected(&mut b);
    assert_eq!(b.sw.port("vmm")["state"], "connecting");
    terminates(b);
}

fn listen_backlog(path: &std::path::Path, backlog: i32) -> UnixListener {
    let l = UnixListener::bind(path).unwrap();
    // SAFETY: listen(2) on our own socket, to shrink its backlog.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), backlog) }, 0);
    l
}

fn nonblocking_connect(path: &std::path::Path) -> Option<UnixStream> {
    use socket2::{Domain, SockAddr, Socket, Type};
    let s = Socket::new(Domain::UNIX, Type::STREAM.nonblocking(), None).ok()?;
    s.connect(&SockAddr::unix(path).ok()?).ok()?;
    Some(UnixStream::from(std::os::fd::OwnedFd::from(s)))
}

#[test]
fn idle_control_and_metrics_clients_stop_nothing() {
    let _g = serial();
    let port = 19900 + (std::process::id() % 100) as u16;
    let addr = format!("127.0.0.1:{port}");
    let mut b = Bench::start_with("iso-clients", &[PortSpec::server("fresh")], &format!("metrics_listen = \"{addr}\""));
    // Far more idle control clients than are served at once, and half a request from each of
    // many metrics clients.
    let ctl: Vec<UnixStream> = (0..300).map(|_| UnixStream::connect(&b.sw.ctl).unwrap()).collect();
    let metrics: Vec<std::net::TcpStream> = (0..300)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.write_all(b"GET /metr").unwrap();
            s
        })
        .collect();
    // A client that asks for a big reply and never reads it.
    let mut greedy = UnixStream::connect(&b.sw.ctl).unwrap();
    greedy.write_all(b"{\"command\": \"ports\"}\n").unwrap();
    others_unaffected(&mut b);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", b.sw.ctl.to_str().unwrap(), "version"])
        .output()
        .unwrap();
    assert!(out.status.success(), "pvswitchctl: {}", String::from_utf8_lossy(&out.stderr));
    // Idle clients are closed (the oldest evicted at once, the rest after the idle timeout).
    for mut s in ctl {
        assert_closed_by_peer(&mut s, "an idle control connection");
    }
    for mut s in metrics {
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut buf = [0u8; 64];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)), "an idle metrics connection stayed open");
    }
    terminates(b);
}

/// A frontend closes and connects again while the control thread is not looking (here: the
/// daemon is stopped, as a long stall would leave it), so the new connection and the old one's
/// hangup are reported in the same epoll round, the new one first: it is the port's, not
/// refused as a second one, starts from nothing, and works.
#[test]
fn reconnecting_in_the_same_round_is_never_refused() {
    let _g = serial();
    let mut b = bench("iso-reconnect");
    for i in 0..10 {
        let old = connect_within(&b.sw.sock("evil"));
        b.sw.wait_running("evil", 1);
        let pid = b.sw.child.id() as i32;
        // SAFETY: stopping and continuing our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let new = UnixStream::connect(b.sw.sock("evil")).unwrap(); // queued: the daemon is stopped
        drop(old);
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Vm::on_stream(new).map_err(|e| e.to_string()));
        });
        let mut evil = match rx.recv_timeout(DEADLINE) {
            Ok(Ok(vm)) => vm,
            Ok(Err(e)) => panic!("cycle {i}: the new connection was refused: {e}\n{}", b.sw.log()),
            Err(_) => panic!("cycle {i}: the new connection's setup did not complete"),
        };
        evil.post_rx_buffers(8, RX_BUF);
        b.sw.wait_running("evil", 1);
        let f = b.good1_broadcasts();
        assert_eq!(recv_n(&mut evil, 1), vec![f], "cycle {i}: the new connection does not receive");
    }
    assert!(!b.sw.log().contains("refusing a second frontend"), "a reconnect was refused");
    terminates(b);
}
