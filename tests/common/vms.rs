//! Three test VMs on one switch: "good1" and "good2" behave and forward to each other; a third
//! port, "evil", is for a frontend that misbehaves. Shared by the hostile-frontend tests (rings)
//! and the isolation tests (the control plane).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use pvsgen::frontend::Vm;
use pvswitch::proto::{PortInfo, QueueInfo};

use super::*;

pub const MAC_C: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0c];
pub const BCAST: [u8; 6] = [0xff; 6];
pub const RX_BUF: u32 = 2048;
/// Vhost-user queue indices of queue pair 0.
pub const GUEST_RX: usize = 0;
pub const GUEST_TX: usize = 1;

/// Writes `descs` into `vm`'s TX descriptor table from entry 0 and makes entry 0 available:
/// one chain laid out by hand, however broken.
pub fn tx_chain(vm: &mut Vm, descs: &[pvsgen::frontend::Desc]) {
    let mut tx = vm.raw_tx();
    for (i, d) in descs.iter().enumerate() {
        tx.desc(i as u16, *d);
    }
    tx.push(0);
}

/// Receives exactly `n` frames (waiting for them), reposting as many RX buffers.
pub fn recv_n(vm: &mut Vm, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let done = try_wait_for(|| {
        got.extend(vm.recv());
        (got.len() >= n).then_some(())
    });
    assert!(done.is_some(), "waited for {n} frames, {} arrived", got.len());
    vm.post_rx_buffers(got.len() as u16, RX_BUF);
    got
}

/// Queue `q` of a port (None: the port shows no such queue).
pub fn queue(port: &PortInfo, q: usize) -> Option<&QueueInfo> {
    port.queues.get(q)
}

/// The error queue `q` of a port reports (None: none, or no such queue).
pub fn queue_error(port: &PortInfo, q: usize) -> Option<String> {
    queue(port, q).and_then(|q| q.error.clone())
}

pub struct Bench {
    pub sw: Switch,
    pub good1: Vm,
    pub good2: Vm,
    pub seq: u32,
}

impl Bench {
    /// A switch with ports good1, good2 and evil; good1 and good2 connected, receiving, and
    /// forwarding to each other (checked); evil not connected yet.
    pub fn start(name: &str) -> Bench {
        Bench::start_with(name, &[], "")
    }

    /// Like `start`, with more ports after evil and more `[switch]` settings.
    pub fn start_with(name: &str, more: &[PortSpec], extra_switch: &str) -> Bench {
        let mut ports = vec![PortSpec::server("good1"), PortSpec::server("good2"), PortSpec::server("evil")];
        ports.extend(more.iter().cloned());
        Bench::with_switch(Switch::start_with(name, &[1], &ports, extra_switch))
    }

    /// good1 and good2 on a switch whose configuration has ports good1, good2 and evil.
    pub fn with_switch(sw: Switch) -> Bench {
        let mut good1 = Vm::connect(&sw.sock("good1"));
        let mut good2 = Vm::connect(&sw.sock("good2"));
        sw.wait_running("good1", 1);
        sw.wait_running("good2", 1);
        good1.post_rx_buffers(128, RX_BUF);
        good2.post_rx_buffers(128, RX_BUF);
        // good2 announces MAC_B, so good1's frames to it are known unicast.
        let hello = frame(BCAST, MAC_B, 64, 0xff, 0);
        good2.send(&hello);
        assert_eq!(recv_n(&mut good1, 1), vec![hello]);
        let mut b = Bench { sw, good1, good2, seq: 0 };
        b.check_forwarding(20);
        b
    }

    /// good1 sends `n` frames of assorted sizes to MAC_B: all arrive at good2 intact and in
    /// order, and good1's TX ring is fully completed.
    pub fn check_forwarding(&mut self, n: u32) {
        let sent: Vec<Vec<u8>> =
            (0..n).map(|i| frame(MAC_B, MAC_A, 60 + (i as usize * 331) % 1455, 1, self.seq + i)).collect();
        self.seq += n;
        for f in &sent {
            self.good1.send(f);
        }
        let got = recv_n(&mut self.good2, n as usize);
        assert_delivered(&sent, &got);
        let good1 = &mut self.good1;
        wait_for("good1's TX ring to be completed", || (good1.tx_pending() == 0).then_some(()));
    }

    /// Connects the evil VM (properly) and waits until its queues run.
    pub fn connect_evil(&self) -> Vm {
        let vm = Vm::connect(&self.sw.sock("evil"));
        self.sw.wait_running("evil", 1);
        vm
    }

    /// A VM on port evil sends a broadcast from MAC_C: both good VMs get it.
    pub fn evil_broadcasts(&mut self, evil: &mut Vm) {
        self.seq += 1;
        let f = frame(BCAST, MAC_C, 100, 0xee, self.seq);
        evil.send(&f);
        assert_eq!(recv_n(&mut self.good1, 1), vec![f.clone()], "good1 did not get evil's broadcast");
        assert_eq!(recv_n(&mut self.good2, 1), vec![f], "good2 did not get evil's broadcast");
        wait_for("evil's TX ring to be completed", || (evil.tx_pending() == 0).then_some(()));
    }

    /// good1 broadcasts one frame; good2 gets it intact. Returns the frame.
    pub fn good1_broadcasts(&mut self) -> Vec<u8> {
        self.seq += 1;
        let f = frame(BCAST, MAC_A, 200, 0xaa, self.seq);
        self.good1.send(&f);
        assert_eq!(recv_n(&mut self.good2, 1), vec![f.clone()], "good2 did not get good1's broadcast");
        f
    }

    /// Waits until queue `q` of port `port` reports an error, and returns it.
    pub fn wait_queue_error(&self, port: &str, q: usize) -> String {
        let err = try_wait_for(|| queue_error(&self.sw.port_info(port), q));
        err.unwrap_or_else(|| {
            panic!(
                "port {port} queue {q} reports no error: {}\nlog:\n{}",
                self.sw.port_info(port).json(),
                self.sw.log()
            )
        })
    }

    pub fn assert_alive(&mut self) {
        if let Some(status) = self.sw.child.try_wait().unwrap() {
            panic!("pvswitchd died ({status}); log:\n{}", self.sw.log());
        }
    }

    /// No queue of the good ports reports an error.
    pub fn assert_good_ports_clean(&self) {
        for p in ["good1", "good2"] {
            let port = self.sw.port_info(p);
            for q in &port.queues {
                assert!(q.error.is_none() && q.running == Some(true), "port {p}: {}", q.json());
            }
            assert_eq!(port.counters.drops.get(DropReason::Malformed), 0, "port {p}: {}", port.json());
        }
    }
}

/// Reads until the peer closes; fails if it has not within the deadline.
pub fn assert_closed_by_peer(s: &mut UnixStream, what: &str) {
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue, // a reply; keep reading until the close
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("pvswitchd did not close the connection after {what}")
            }
            Err(_) => return, // ECONNRESET: closed with our bytes unread
        }
    }
}

/// Writes `bytes` on a raw connection to the evil port's socket and checks pvswitchd hangs up,
/// stays alive, keeps forwarding, and lets a proper VM use the port afterwards.
pub fn socket_attack(name: &str, what: &str, bytes: &[u8]) {
    let _g = serial();
    let mut b = Bench::start(name);
    let mut s = UnixStream::connect(b.sw.sock("evil")).unwrap();
    s.write_all(bytes).unwrap();
    assert_closed_by_peer(&mut s, what);
    b.assert_alive();
    let sw = &b.sw;
    wait_for("port evil back to listening", || (sw.port_info("evil").state == "listening").then_some(()));
    let p = b.sw.port_info("evil");
    assert_eq!(p.connects, 1, "the connection was never accepted: {}", p.json());
    assert!(p.last_error.is_some(), "{}", p.json());
    b.check_forwarding(100);
    b.assert_good_ports_clean();
    let mut evil = b.connect_evil();
    b.evil_broadcasts(&mut evil);
    b.assert_alive();
}
