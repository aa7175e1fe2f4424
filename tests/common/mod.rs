//! Test harness: a real pvswitchd process, real DPDK testpmd "VMs" (virtio-user frontends),
//! pcap files for exact frame contents. Every wait is on a counter or a socket, bounded by a
//! generous deadline that only a broken switch would hit.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub mod netns;
mod require;
pub mod vms;

#[allow(unused_imports)] // used by the tests that make namespaces only
pub use netns::{Netns, no_ipv6, sh};
pub use require::*;

/// Tests that run testpmd or QEMU share two CPUs and the hugepage pool: one at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub const DEADLINE: Duration = Duration::from_secs(30);

/// Polls `f` until it returns Some, or panics with `what` after `DEADLINE`.
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    try_wait_for(f).unwrap_or_else(|| panic!("timed out after {DEADLINE:?} waiting for {what}"))
}

/// Polls `f` until it returns Some, or gives up with None after `DEADLINE`.
pub fn try_wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > DEADLINE {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

#[derive(Clone)]
pub struct PortSpec {
    pub name: String,
    pub mode: &'static str,
    pub queues: u16,
    pub mtu: u32,
}

impl PortSpec {
    pub fn server(name: &str) -> PortSpec {
        PortSpec { name: name.into(), mode: "server", queues: 1, mtu: 1500 }
    }
    pub fn queues(mut self, q: u16) -> PortSpec {
        self.queues = q;
        self
    }
    pub fn mtu(mut self, m: u32) -> PortSpec {
        self.mtu = m;
        self
    }
    pub fn client(mut self) -> PortSpec {
        self.mode = "client";
        self
    }
}

pub struct Switch {
    pub child: Child,
    pub dir: PathBuf,
    pub ctl: PathBuf,
    /// A command pvswitchd runs under (e.g. `setpriv` with the unit's capabilities), at every
    /// start and restart; empty: none.
    pub wrap: Vec<String>,
}

/// `setpriv` arguments that run a command with exactly the capabilities the shipped unit
/// gives pvswitchd (its `CapabilityBoundingSet=`, read from dist/pvswitchd.service.in).
pub fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/dist/pvswitchd.service.in")).unwrap();
    let caps = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit's capabilities");
    let set: Vec<String> =
        caps.split_whitespace().map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())).collect();
    vec![
        "setpriv".into(),
        format!("--bounding-set=-all,{}", set.join(",")),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

fn pvswitchd_cmd(wrap: &[String]) -> Command {
    let mut c = match wrap.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(env!("CARGO_BIN_EXE_pvswitchd"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_pvswitchd")),
    };
    c.env("RUST_LOG", "info");
    c
}

/// A fresh directory for a test's files, `/tmp/pvs-test/<name>-<pid>` (scripts/test.sh looks
/// for processes left running there); another user's under `/tmp/pvs-test-<uid>/`, as the
/// first belongs to root once scripts/test.sh ran.
pub fn test_dir(name: &str) -> PathBuf {
    let base = match euid() {
        0 => "/tmp/pvs-test".to_string(),
        uid => format!("/tmp/pvs-test-{uid}"),
    };
    let d = PathBuf::from(format!("{base}/{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

impl Switch {
    pub fn start(name: &str, cores: &[usize], ports: &[PortSpec]) -> Switch {
        Switch::start_with(name, cores, ports, "")
    }

    /// A configuration file's text: `[switch]` with `extra_switch` appended, then the ports.
    pub fn config_text(dir: &Path, cores: &[usize], ports: &[PortSpec], extra_switch: &str) -> String {
        let mut cfg = format!(
            "[switch]\npoll_cores = {cores:?}\nsocket_dir = \"{}\"\ncontrol_socket = \"ctl.sock\"\n{extra_switch}\n",
            dir.display()
        );
        for p in ports {
            cfg += &format!(
                "[[port]]\nname = \"{}\"\ntype = \"vhost-user\"\nsocket = \"{}.sock\"\nmode = \"{}\"\nqueues = {}\nmtu = {}\n",
                p.name, p.name, p.mode, p.queues, p.mtu
            );
        }
        cfg
    }

    pub fn start_with(name: &str, cores: &[usize], ports: &[PortSpec], extra_switch: &str) -> Switch {
        let dir = test_dir(name);
        Switch::start_config(dir.clone(), &Switch::config_text(&dir, cores, ports, extra_switch))
    }

    /// Starts pvswitchd on a configuration file with this text, written to `dir/pvswitch.toml`.
    pub fn start_config(dir: PathBuf, text: &str) -> Switch {
        Switch::start_wrapped(dir, text, Vec::new())
    }

    /// Like `start_config`, pvswitchd running under the command `wrap` (see `Switch::wrap`).
    pub fn start_wrapped(dir: PathBuf, text: &str, wrap: Vec<String>) -> Switch {
        let conf = dir.join("pvswitch.toml");
        std::fs::write(&conf, text).unwrap();
        let log = std::fs::File::create(dir.join("pvswitchd.log")).unwrap();
        let child = pvswitchd_cmd(&wrap)
            .arg("--config")
            .arg(&conf)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pvswitchd");
        let sw = Switch { child, ctl: dir.join("ctl.sock"), dir, wrap };
        wait_for("pvswitchd control socket", || sw.try_ctl("version").ok());
        sw
    }

    /// Stops this pvswitchd (SIGKILL if `kill`, else SIGTERM and wait for it) and starts a new
    /// one on the same configuration file at once, as a service manager would; the new one's
    /// log is appended to the same file. Returns when its control socket answers.
    pub fn restart(&mut self, kill: bool) {
        if kill {
            let _ = self.child.kill();
        } else {
            // SAFETY: sending SIGTERM to our own child process.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let _ = self.child.wait();
        let log = std::fs::OpenOptions::new().append(true).open(self.dir.join("pvswitchd.log")).unwrap();
        self.child = pvswitchd_cmd(&self.wrap)
            .arg("--config")
            .arg(self.dir.join("pvswitch.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn pvswitchd");
        wait_for("the new pvswitchd's control socket", || self.try_ctl("version").ok());
    }

    pub fn sock(&self, port: &str) -> String {
        self.dir.join(format!("{port}.sock")).display().to_string()
    }

    /// Rewrites the configuration file (then `ctl("reload")` applies it).
    pub fn write_config(&self, text: &str) {
        std::fs::write(self.dir.join("pvswitch.toml"), text).unwrap();
    }

    pub fn try_ctl(&self, cmd: &str) -> Result<Value, String> {
        self.try_ctl_args(cmd, &[])
    }

    pub fn try_ctl_args(&self, cmd: &str, args: &[&str]) -> Result<Value, String> {
        let mut s = UnixStream::connect(&self.ctl).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(json!({ "command": cmd, "args": args }).to_string().as_bytes()).map_err(|e| e.to_string())?;
        s.write_all(b"\n").map_err(|e| e.to_string())?;
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        if v["ok"] == json!(true) { Ok(v["result"].clone()) } else { Err(v["error"].to_string()) }
    }

    pub fn ctl(&self, cmd: &str) -> Value {
        self.try_ctl(cmd).unwrap_or_else(|e| panic!("pvswitchctl {cmd}: {e}\nlog:\n{}", self.log()))
    }

    pub fn port(&self, name: &str) -> Value {
        let ports = self.ctl("ports");
        ports.as_array().unwrap().iter().find(|p| p["name"] == name).cloned().unwrap()
    }

    pub fn counter(&self, port: &str, field: &str) -> u64 {
        self.port(port)[field].as_u64().unwrap()
    }

    /// Waits until every queue of `port` that the frontend enabled is running.
    pub fn wait_running(&self, port: &str, queue_pairs: usize) {
        wait_for(&format!("port {port} running {queue_pairs} queue pairs"), || {
            let p = self.port(port);
            let running = p["queues"].as_array().unwrap().iter().filter(|q| q["running"] == json!(true)).count();
            (running >= 2 * queue_pairs).then_some(())
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pvswitchd.log")).unwrap_or_default()
    }

    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id())).unwrap().count()
    }

    /// The daemon's open files.
    pub fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).unwrap().count()
    }

    /// The daemon's resident memory, in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        // SAFETY: sending SIGTERM to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Processes a test started (QEMU guests), killed and reaped when the test ends, however it
/// ends.
pub struct Qemus(pub Vec<Child>);

impl Drop for Qemus {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

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

// ---- pcap files: frames with sequence numbers, written and read back byte for byte ----

pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    for fr in frames {
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.extend_from_slice(fr);
    }
    std::fs::write(path, f).unwrap();
}

pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut o = 24;
    let mut out = Vec::new();
    while o + 16 <= d.len() {
        let cl = u32::from_le_bytes(d[o + 8..o + 12].try_into().unwrap()) as usize;
        out.push(d[o + 16..o + 16 + cl].to_vec());
        o += 16 + cl;
    }
    out
}

/// A frame from `src` to `dst` of `len` bytes whose payload encodes `stream` and `seq`
/// throughout, so any corruption or misordering shows.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize, stream: u8, seq: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    f.push(stream);
    f.extend_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(2654435761) ^ stream as u32;
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f.push(x as u8);
    }
    f
}

pub fn seq_of(f: &[u8]) -> (u8, u32) {
    (f[14], u32::from_be_bytes(f[15..19].try_into().unwrap()))
}

/// Checks `out` holds exactly the frames of `sent` for each stream, in order, intact.
pub fn assert_delivered(sent: &[Vec<u8>], out: &[Vec<u8>]) {
    assert_eq!(out.len(), sent.len(), "frame count: sent {}, arrived {}", sent.len(), out.len());
    let mut by_stream: std::collections::BTreeMap<u8, Vec<&Vec<u8>>> = Default::default();
    for f in sent {
        by_stream.entry(f[14]).or_default().push(f);
    }
    let mut got: std::collections::BTreeMap<u8, Vec<&Vec<u8>>> = Default::default();
    for f in out {
        got.entry(f[14]).or_default().push(f);
    }
    for (s, frames) in &by_stream {
        let g = got.get(s).map(|v| v.as_slice()).unwrap_or(&[]);
        assert_eq!(g.len(), frames.len(), "stream {s}: count");
        for (i, (a, b)) in frames.iter().zip(g).enumerate() {
            assert!(
                a == b,
                "stream {s}: frame {i} differs (sent seq {:?}, got seq {:?}, len {} vs {})",
                seq_of(a),
                seq_of(b),
                a.len(),
                b.len()
            );
        }
    }
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

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
        let learned = try_wait_for(|| sw.ctl("fdb").as_array().unwrap().iter().any(|e| e["port"] == "b").then_some(()));
        assert!(
            learned.is_some(),
            "the switch never learned VM B's MAC; VM B:\n{}\nswitch: {}",
            b.output(),
            sw.port("b")
        );
    } else {
        wait_for("VM B's hello", || (sw.counter("b", "rx_packets") >= queues as u64).then_some(()));
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

/// A child process killed (and reaped) when this goes out of scope, a test failing included.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Boots a QEMU guest (scripts/run-vm.sh) on `sw`'s port `name` with `ip` and `mac`, running
/// `job` (its console in `dir`/NAME.log).
pub fn guest(sw: &Switch, dir: &Path, name: &str, ip: &str, mac: &str, job: &str) -> std::process::Child {
    let path = dir.join(format!("job-{name}.sh"));
    std::fs::write(&path, job).unwrap();
    Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/run-vm.sh"))
        .args(["--socket", &sw.sock(name), "--name", name, "--ip", ip, "--mac", mac])
        .args(["--job", path.to_str().unwrap(), "--log", dir.join(format!("{name}.log")).to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("qemu-{name}.log"))).unwrap())
        .spawn()
        .expect("run scripts/run-vm.sh")
}

pub fn guest_log(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default()
}

/// Waits until the guests' own jobs end them (PVS-JOB-EXIT); bounded for a machine that
/// boots slowly.
pub fn await_jobs(dir: &Path, names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while !names.iter().all(|n| guest_log(dir, n).contains("PVS-JOB-EXIT")) {
        let logs: Vec<String> = names.iter().map(|n| format!("{n}:\n{}", guest_log(dir, n))).collect();
        assert!(Instant::now() < deadline, "the guests' jobs did not end\n{}", logs.join("\n"));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Boots a QEMU Linux guest (scripts/run-vm.sh) on vhost-user socket `sock` with address `ip`,
/// which pings `peer` and runs iperf3 to it both ways (an `iperf3 -s` must listen there);
/// returns the guest, still running, and its console log once the job is done. Panics if the
/// guest exits or takes longer than `timeout_s`.
pub fn guest_ping_iperf(
    dir: &Path,
    sock: &str,
    ip: &str,
    peer: &str,
    name: &str,
    mac: Option<&str>,
    timeout_s: u64,
) -> (KillOnDrop, String) {
    let job = dir.join("job.sh");
    std::fs::write(
        &job,
        format!(
            r#"P={peer}
i=0
until ping -c 1 -W 1 $P >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 60 ] || break; done
ping -c 5 -i 0.2 -W 2 $P | tail -n 2
for args in "" "-R"; do
  n=0
  until out=$(timeout 30 iperf3 -c $P -t 3 -f m $args 2>&1); do n=$((n+1)); [ $n -lt 20 ] || break; sleep 0.5; done
  echo "$out" | grep -E "receiver" | sed "s/^/PVS-IPERF$args /"
done
echo PVS-READY
sleep 60
"#
        ),
    )
    .unwrap();
    let root = env!("CARGO_MANIFEST_DIR");
    let log = dir.join("guest.log");
    let mut cmd = Command::new(format!("{root}/scripts/run-vm.sh"));
    cmd.args(["--socket", sock, "--ip", ip, "--name", name]);
    if let Some(mac) = mac {
        cmd.args(["--mac", mac]);
    }
    cmd.arg("--job").arg(&job).arg("--log").arg(&log).stdout(Stdio::null()).stderr(Stdio::null());
    if let Ok(g) = std::env::var("PVS_GUEST_DIR") {
        cmd.args(["--guest-dir", &g]);
    }
    let mut vm = KillOnDrop(cmd.spawn().expect("scripts/run-vm.sh"));
    let start = Instant::now();
    let guest = || std::fs::read_to_string(&log).unwrap_or_default();
    while !guest().contains("PVS-READY") {
        assert!(start.elapsed().as_secs() < timeout_s, "guest did not finish its job:\n{}", guest());
        assert!(vm.0.try_wait().unwrap().is_none(), "QEMU exited:\n{}", guest());
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = guest();
    eprintln!(
        "{}",
        out.lines().filter(|l| l.contains("PVS-") || l.contains("packet loss")).collect::<Vec<_>>().join("\n")
    );
    (vm, out)
}
