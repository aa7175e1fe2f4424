//! A VM moves its memory (new memory table, new ring addresses) while it has traffic: the
//! switch follows without a reconnect, loses nothing, and never touches the old memory (which
//! the test VM fills with garbage right after the move).

use crate::common;
use crate::frontend;

use common::*;
use frontend::*;

const RX_BUF: u32 = 2048;

struct Pair {
    sw: Switch,
    a: Vm,
    b: Vm,
    seq: u32,
}

impl Pair {
    fn start(name: &str) -> Pair {
        let sw = Switch::start(name, &[1], &[PortSpec::server("a"), PortSpec::server("b")]);
        let a = Vm::connect(&sw.sock("a"));
        let mut b = Vm::connect(&sw.sock("b"));
        b.post_rx_buffers(256, RX_BUF);
        sw.wait_running("a", 1);
        sw.wait_running("b", 1);
        Pair { sw, a, b, seq: 0 }
    }

    /// a sends `n` frames (fewer than b's posted buffers, so nothing may drop); b gets all of
    /// them intact and in order; a's TX ring is fully completed.
    fn burst(&mut self, n: u32) {
        let sent: Vec<Vec<u8>> =
            (0..n).map(|i| frame(MAC_B, MAC_A, 60 + (i as usize * 97) % 1400, 1, self.seq + i)).collect();
        self.seq += n;
        for f in &sent {
            self.a.send(f);
        }
        let mut got = Vec::new();
        let b = &mut self.b;
        let done = try_wait_for(|| {
            got.extend(b.recv());
            (got.len() >= sent.len()).then_some(())
        });
        assert!(
            done.is_some(),
            "{} of {} frames arrived\nport a: {}\nport b: {}",
            got.len(),
            sent.len(),
            self.sw.port("a"),
            self.sw.port("b")
        );
        self.b.post_rx_buffers(got.len() as u16, RX_BUF);
        assert_delivered(&sent, &got);
        let a = &mut self.a;
        wait_for("a's TX ring to be completed", || (a.tx_pending() == 0).then_some(()));
    }

    /// Nothing went wrong on either port: no reconnect, no drop, every queue running without
    /// error, and every frame a sent has been completed in its TX ring.
    fn check_clean(&mut self) {
        assert_eq!(self.a.tx_completed(), self.seq as u16, "a's TX completions");
        for name in ["a", "b"] {
            let p = self.sw.port(name);
            assert_eq!(p["connects"], 1, "port {name} reconnected: {p}");
            assert_eq!(p["drops"]["malformed"], 0, "{p}");
            assert_eq!(p["drops"]["rx_ring_full"], 0, "{p}");
            for q in p["queues"].as_array().unwrap() {
                assert!(q["error"].is_null() && q["running"] == true, "port {name}: {q}");
            }
        }
        // pvswitchd let go of every old memory table: it maps one test-VM memfd per VM.
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.sw.child.id())).unwrap();
        let memfds: std::collections::BTreeSet<&str> = maps
            .lines()
            .filter(|l| l.contains("memfd:pvs-vm"))
            .filter_map(|l| l.split_whitespace().nth(4)) // inode
            .collect();
        assert_eq!(memfds.len(), 2, "pvswitchd maps {} test-VM memfds:\n{maps}", memfds.len());
    }
}

#[test]
fn sender_moves_its_memory() {
    let _g = serial();
    let mut p = Pair::start("mem-tx");
    p.burst(100);
    p.a.remap_memory();
    p.burst(100);
    p.check_clean();
    assert_eq!(p.sw.counter("a", "rx_packets"), 200);
    assert_eq!(p.sw.counter("b", "tx_packets"), 200);
}

#[test]
fn receiver_moves_its_memory() {
    let _g = serial();
    let mut p = Pair::start("mem-rx");
    p.burst(100);
    p.b.remap_memory();
    p.burst(200);
    p.check_clean();
    assert_eq!(p.sw.counter("b", "tx_packets"), 300);
}

#[test]
fn both_move_their_memory_many_times() {
    let _g = serial();
    let mut p = Pair::start("mem-many");
    for i in 0..20 {
        p.burst(50);
        if i % 2 == 0 {
            p.a.remap_memory();
        } else {
            p.b.remap_memory();
        }
    }
    p.burst(50);
    p.check_clean();
    assert_eq!(p.sw.counter("b", "tx_packets"), 21 * 50);
}
