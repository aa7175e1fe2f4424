//! DPDK testpmd as VMs: one process with virtio-user ports (`Testpmd`), frames looped between
//! ports (`mac_loop_vm`), and pcap in, pcap out through two of them (`pcap_vms`).

#[allow(unused_imports)]
use super::*;
#[allow(unused_imports)]
use serde_json::{Value, json};
#[allow(unused_imports)]
use std::io::{Read, Write};
#[allow(unused_imports)]
use std::path::{Path, PathBuf};
#[allow(unused_imports)]
use std::process::{Child, ChildStdin, Command, Stdio};
#[allow(unused_imports)]
use std::sync::{Arc, Mutex};
#[allow(unused_imports)]
use std::time::{Duration, Instant};

/// A DPDK testpmd process in interactive mode, acting as one or more VMs.
pub struct Testpmd {
    child: Child,
    stdin: ChildStdin,
    /// Standard output: prompts and command replies.
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
    prefix: String,
    nports: usize,
}

impl Testpmd {
    /// `vdevs` are full `--vdev` values. testpmd runs its main and forwarding lcores on CPU 0.
    /// The test must have checked `require(TESTPMD)` first.
    pub fn spawn(prefix: &str, vdevs: &[String], extra: &[&str]) -> Testpmd {
        remove_hugepage_files(prefix);
        // Unbuffered stdout, so command output comes before the next prompt.
        let mut cmd = Command::new("stdbuf");
        cmd.args([
            "-o0",
            "-e0",
            "dpdk-testpmd",
            "--lcores",
            "0@0,1@0,2@0,3@0,4@0",
            "--no-pci",
            "-m",
            "512",
            "--single-file-segments",
        ])
        .arg(format!("--file-prefix={prefix}"));
        for v in vdevs {
            cmd.arg("--vdev").arg(v);
        }
        cmd.args(["--", "-i", "--total-num-mbufs=32768", "--disable-link-check", "--no-flush-rx"]);
        cmd.args(extra);
        let mut child =
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn testpmd");
        // stdout and stderr apart: a stderr line can land in the middle of the prompt.
        let out = Arc::new(Mutex::new(String::new()));
        let err = Arc::new(Mutex::new(String::new()));
        for (stream, out) in [
            (Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, out.clone()),
            (Box::new(child.stderr.take().unwrap()), err.clone()),
        ] {
            std::thread::spawn(move || {
                let mut r = stream;
                let mut buf = [0u8; 4096];
                // Raw chunks, not lines: the prompt has no newline after it.
                while let Ok(n @ 1..) = r.read(&mut buf) {
                    out.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let stdin = child.stdin.take().unwrap();
        let mut t = Testpmd { child, stdin, out, err, prefix: prefix.to_string(), nports: vdevs.len() };
        t.wait_output("testpmd prompt", "testpmd> ");
        t
    }

    /// Everything testpmd printed: standard output, then standard error.
    pub fn output(&self) -> String {
        format!("{}\n--- stderr ---\n{}", self.out.lock().unwrap(), self.err.lock().unwrap())
    }

    pub fn wait_output(&mut self, what: &str, pat: &str) {
        let out = self.out.clone();
        let exited = |c: &mut Child| c.try_wait().ok().flatten().is_some();
        let start = Instant::now();
        loop {
            if out.lock().unwrap().contains(pat) {
                return;
            }
            if exited(&mut self.child) || start.elapsed() > DEADLINE {
                panic!("testpmd: no {what}; output:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends a command and waits for the next prompt.
    pub fn cmd(&mut self, c: &str) -> String {
        let (before, prompts) = {
            let o = self.out.lock().unwrap();
            (o.len(), o.matches("testpmd> ").count())
        };
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
        // The command is done when the next prompt appears.
        wait_for(&format!("testpmd to finish `{c}`"), || {
            let o = self.out.lock().unwrap();
            (o.matches("testpmd> ").count() > prompts).then(|| o[before..].to_string())
        })
    }

    /// (rx_packets, tx_packets) per port from `show port stats all`.
    pub fn port_stats(&mut self) -> Vec<(u64, u64)> {
        let before = self.out.lock().unwrap().len();
        self.cmd("show port stats all");
        // The prompt can overtake the tail of the report: wait for every port's last line.
        let n = self.nports;
        let out = self.out.clone();
        let o = wait_for("testpmd's port stats", || {
            let o = out.lock().unwrap();
            (o[before..].matches("Tx-bps:").count() >= n).then(|| o[before..].to_string())
        });
        let num = |l: &str, key: &str| -> u64 {
            l.split(key).nth(1).and_then(|s| s.split_whitespace().next()).and_then(|s| s.parse().ok()).unwrap_or(0)
        };
        let mut v = Vec::new();
        let mut rx = 0;
        for l in o.lines() {
            if l.contains("RX-packets:") {
                rx = num(l, "RX-packets:");
            }
            if l.contains("TX-packets:") {
                v.push((rx, num(l, "TX-packets:")));
            }
        }
        v
    }

    pub fn quit(mut self) -> String {
        let _ = writeln!(self.stdin, "stop");
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.output()
    }
}

fn remove_hugepage_files(prefix: &str) {
    if let Ok(d) = std::fs::read_dir("/dev/hugepages") {
        for e in d.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        remove_hugepage_files(&self.prefix);
    }
}

/// A testpmd "VM" whose virtio-user ports, paired (0,1), (2,3), ..., bounce frames between
/// each other through the switch forever (`mac` forwarding rewrites the destination to the
/// paired port's MAC), after `start tx_first` injects a first burst on every port.
/// `server` makes testpmd own the sockets (`server=1`), for the switch's client-mode ports.
pub fn mac_loop_vm(sw: &Switch, prefix: &str, ports: &[&str], mac_base: u8, server: bool) -> Testpmd {
    let mut vdevs = Vec::new();
    let mut peers = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        let mac = |j: usize| format!("02:00:00:00:{mac_base:02x}:{j:02x}");
        vdevs.push(format!(
            "net_virtio_user{i},path={},queues=1,mac={}{}",
            sw.sock(p),
            mac(i),
            if server { ",server=1" } else { "" }
        ));
        peers.push(format!("--eth-peer={i},{}", mac(i ^ 1)));
    }
    let mut args: Vec<&str> = vec!["--forward-mode=mac"];
    args.extend(peers.iter().map(|s| s.as_str()));
    Testpmd::spawn(prefix, &vdevs, &args)
}

/// Two testpmd "VMs", each a virtio-user port io-forwarded to a pcap port:
/// pcap(in) -> VM A -> pvswitchd -> VM B -> pcap(out).
/// VM B starts first and announces its MAC with one broadcast frame per queue, so the switch
/// learns it and A's traffic to it is known unicast (which waits for room in B's ring rather
/// than being flooded best-effort).
pub struct PcapVms {
    pub a: Testpmd,
    pub b: Testpmd,
}

pub fn pcap_vms(dir: &Path, sw: &Switch, queues: u16, jumbo: bool) -> PcapVms {
    pcap_vms_opts(dir, sw, queues, jumbo, true)
}

/// As `pcap_vms`; `learn` waits until the switch learned VM B's MAC from its hello (only
/// meaningful when forwarding is NORMAL).
pub fn pcap_vms_opts(dir: &Path, sw: &Switch, queues: u16, jumbo: bool, learn: bool) -> PcapVms {
    let q = queues;
    let list = |key: &str, name: &dyn Fn(u16) -> String| -> String {
        (0..q).map(|i| format!(",{key}={}/{}", dir.display(), name(i))).collect()
    };
    write_pcap(&dir.join("hello.pcap"), &[frame([0xff; 6], MAC_B, 64, 0xff, 0)]);
    let qs = format!("--rxq={q}");
    let qt = format!("--txq={q}");
    let cores = format!("--nb-cores={q}");
    let args = vec!["--forward-mode=io", qs.as_str(), qt.as_str(), cores.as_str()];
    // Jumbo frames: VM A sends them from 10 KiB mbufs (pcap cannot scatter); VM B receives
    // them in 2 KiB mbufs with scatter on its virtio port only, so it posts small MRG_RXBUF
    // buffers and each frame spans several (num_buffers > 1).
    let (mut args_a, mut args_b) = (args.clone(), args);
    if jumbo {
        args_a.extend(["--mbuf-size=10240", "--max-pkt-len=9018"]);
        args_b.push("--max-pkt-len=9018");
    }
    let pid = std::process::id();
    let b = Testpmd::spawn(
        &format!("pvsb{pid}"),
        &[
            format!("net_virtio_user0,path={},queues={q},queue_size=1024", sw.sock("b")),
            format!(
                "net_pcap1{}{}",
                list("rx_pcap", &|_| "hello.pcap".into()),
                list("tx_pcap", &|i| format!("out{i}.pcap"))
            ),
        ],
        &args_b,
    );
    let mut b = b;
    if jumbo {
        b.cmd("port stop all");
        b.cmd("port config 0 rx_offload scatter on");
        b.cmd("port start all");
    }
    sw.wait_running("b", q as usize);
    b.cmd("start");
    if learn {
        let learned = try_wait_for(|| sw.fdb().iter().any(|e| e.port.as_deref() == Some("b")).then_some(()));
        assert!(
            learned.is_some(),
            "the switch never learned VM B's MAC; VM B:\n{}\nswitch: {}",
            b.output(),
            sw.port_info("b").json()
        );
    } else {
        wait_for("VM B's hello", || (sw.counters("b").rx_packets >= queues as u64).then_some(()));
    }
    let a = Testpmd::spawn(
        &format!("pvsa{pid}"),
        &[
            format!(
                "net_pcap0{}{}",
                list("rx_pcap", &|i| format!("in{i}.pcap")),
                list("tx_pcap", &|i| format!("junk{i}.pcap"))
            ),
            format!("net_virtio_user1,path={},queues={q},queue_size=1024", sw.sock("a")),
        ],
        &args_a,
    );
    sw.wait_running("a", q as usize);
    PcapVms { a, b }
}
