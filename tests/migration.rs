//! Live migration of a Linux guest (QEMU, TCG) between two pvswitch ports of one pvswitchd,
//! while a second guest streams TCP to it: QEMU's own migration (`migrate` over a local
//! socket, the destination started with `-incoming`), pvswitchd logging the pages it writes
//! (dirty log), the rings handed over by GET_VRING_BASE / SET_VRING_BASE, the MAC found on its
//! new port. The transfer's SHA-256 must match and the TCP connection survive two moves (there and back: each port both destination and, after, source); a
//! ping every 10 ms from the peer measures the gap. Server-mode ports with a guest that
//! announces itself (GUEST_ANNOUNCE); client-mode ports with one that cannot, so QEMU asks
//! pvswitchd to (SEND_RARP). `ports` shows the source port logging while a move is active.
//! A third test streams UDP (nothing retransmits a datagram a stale buffer lost) and stops
//! both sides after each move to compare the guest's memory page by page.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use pvswitch::proto::MigrationInfo;
use serde_json::{Value, json};

/// A QMP connection to one QEMU.
struct Qmp(BufReader<UnixStream>);

impl Qmp {
    fn connect(path: &Path) -> Qmp {
        let start = Instant::now();
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(start.elapsed() < Duration::from_secs(120), "QMP {}: {e}", path.display());
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut q = Qmp(BufReader::new(s));
        q.line(); // the greeting
        q.cmd("qmp_capabilities", json!({}));
        q
    }

    fn line(&mut self) -> Value {
        let mut l = String::new();
        self.0.read_line(&mut l).expect("QMP read");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("QMP: {e}: {l}"))
    }

    /// Runs a command; its `return` (events in between are skipped).
    fn cmd(&mut self, name: &str, args: Value) -> Value {
        let msg = json!({ "execute": name, "arguments": args });
        self.0.get_mut().write_all(format!("{msg}\n").as_bytes()).unwrap();
        loop {
            let r = self.line();
            if let Some(e) = r.get("error") {
                panic!("QMP {name}: {e}");
            }
            if let Some(v) = r.get("return") {
                return v.clone();
            }
        }
    }
}

/// The guest that migrates: its MAC, address and name stay with it from QEMU to QEMU.
const VM_MAC: &str = "52:54:00:4d:00:01";
const VM_IP: &str = "10.41.0.1";
/// The transfer: an 8 MiB random file sent again and again until both moves are done (the
/// test then says stop on the peer's console). A fixed 200 MiB outlasted the moves by 80 s.
const CHUNK_MIB: u32 = 8;

struct Run {
    dir: PathBuf,
    sw: Switch,
    server: bool,
    announce: Announce,
    /// Destinations start paused, and each move ends by comparing the guest's memory on both
    /// sides before the destination runs.
    compare: bool,
}

/// How the moved guest is announced on its new port.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Announce {
    /// The guest announces itself (VIRTIO_NET_F_GUEST_ANNOUNCE, through QEMU's control queue).
    Guest,
    /// The guest cannot (`guest_announce=off`), so QEMU asks pvswitchd (SEND_RARP).
    Rarp,
}

impl Run {
    /// A QEMU for the migrating guest on `port`: the first with the receiving job, the others
    /// migration destinations (`-incoming`). Its QMP socket is `qmp-N.sock`, its console `vm-N.log`.
    fn qemu(&self, port: &str, n: usize, job: Option<&Path>) -> Child {
        let root = env!("CARGO_MANIFEST_DIR");
        let mut cmd = Command::new(format!("{root}/scripts/run-vm.sh"));
        let sock =
            if self.server { self.sw.sock(port) } else { self.dir.join(format!("{port}.sock")).display().to_string() };
        cmd.args(["--socket", &sock, "--name", "mig", "--mac", VM_MAC, "--ip", &format!("{VM_IP}/24")])
            .arg("--qmp")
            .arg(self.dir.join(format!("qmp-{n}.sock")))
            .arg("--log")
            .arg(self.dir.join(format!("vm-{n}.log")));
        if !self.server {
            cmd.arg("--vhost-server");
        }
        if self.announce == Announce::Rarp {
            cmd.args(["--net-opts", "guest_announce=off"]);
        }
        if self.compare && job.is_none() {
            cmd.arg("--paused");
        }
        match job {
            Some(j) => cmd.arg("--job").arg(j),
            None => cmd.arg("--incoming").arg(format!("unix:{}", self.dir.join(format!("mig-{n}.sock")).display())),
        };
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join(format!("qemu-{n}.log"))).unwrap())
            .spawn()
            .expect("run scripts/run-vm.sh")
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    fn wait_log(&self, name: &str, marker: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !self.log(name).contains(marker) {
            assert!(
                Instant::now() < deadline,
                "{name}: no {marker} after {secs} s:\n{}\nswitch:\n{}",
                self.log(name),
                self.sw.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Once migration `n` completed: waits for the destination to hold the whole state, saves
    /// the guest's RAM on both sides and counts the 4 KiB pages that differ.
    fn differing_pages(&self, src: &mut Qmp, dst: &mut Qmp, n: usize) -> usize {
        wait_for(&format!("destination {n} loaded"), || {
            (dst.cmd("query-status", json!({}))["status"] != "inmigrate").then_some(())
        });
        let bytes = GUEST_MIB << 20;
        let save = |q: &mut Qmp, side: &str| {
            let f = self.dir.join(format!("ram-{side}-{n}"));
            q.cmd("pmemsave", json!({ "val": 0, "size": bytes, "filename": f.display().to_string() }));
            let b = std::fs::read(&f).unwrap();
            std::fs::remove_file(&f).unwrap();
            assert_eq!(b.len() as u64, bytes, "pmemsave of {side}");
            b
        };
        let (a, b) = (save(src, "src"), save(dst, "dst"));
        a.chunks(4096).zip(b.chunks(4096)).filter(|(x, y)| x != y).count()
    }

    /// Port `name`'s `migration` in `ports`.
    fn migration(&self, name: &str) -> MigrationInfo {
        self.sw.ports().into_iter().find(|p| p.name == name).expect("the port").migration
    }

    /// RARPs pvswitchd sent from port `name`.
    fn announcements(&self, name: &str) -> u64 {
        self.migration(name).announcements
    }
}

/// What the peer sends the moving guest.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// A stream over TCP (nc) for as long as the moves take, its SHA-256 checked.
    Tcp,
    /// iperf3 UDP at 40 Mbit/s: a datagram the guest reads from a receive buffer that reached
    /// the destination stale (a page the switch wrote but did not log) is an older datagram
    /// again, which iperf3 counts as out of order; nothing retransmits it away.
    Udp,
}

/// The peer's job for `load`: waits for the guest, starts pinging it every 10 ms, says
/// PVS-START, sends, then reports.
fn peer_job(load: Load) -> String {
    let wait =
        format!("i=0; until ping -c 1 -W 1 {VM_IP} >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 300 ] || break; done\n");
    let send = match load {
        // Chunks until the test says stop on the console (the moves are done), each counted
        // once whole; then the SHA-256 of what was sent.
        Load::Tcp => format!(
            r#"dd if=/dev/urandom of=/tmp/r bs=1M count={CHUNK_MIB} 2>/dev/null
ping -i 0.01 {VM_IP} > /tmp/ping 2>&1 & PING=$!
(read l < /dev/console; touch /tmp/stop) &
echo PVS-START
: > /tmp/n
(while [ ! -e /tmp/stop ]; do cat /tmp/r; echo >> /tmp/n; done) | nc {VM_IP} 5000; echo PVS-NC-EXIT $?
n=$(wc -l < /tmp/n); echo "PVS-CHUNKS $n"
(for i in $(seq 1 $n); do cat /tmp/r; done) | sha256sum | sed 's/^/PVS-SENT /'
"#
        ),
        Load::Udp => format!(
            r#"ping -i 0.01 {VM_IP} > /tmp/ping 2>&1 & PING=$!
echo PVS-START
# The server may still be starting: retry only a refused connection.
for i in $(seq 1 20); do
  iperf3 -u -c {VM_IP} -b 40M -l 1000 -t {UDP_SECS} --json > /tmp/u.json; rc=$?
  grep -q 'unable to connect' /tmp/u.json || break; sleep 1
done
echo PVS-IPERF-EXIT $rc
num() {{ grep -o "\"$1\":[[:space:]]*[0-9]*" /tmp/u.json | tail -1 | grep -o '[0-9]*$'; }}
echo PVS-UDP out_of_order=$(num out_of_order) lost=$(num lost_packets) packets=$(num packets)
"#
        ),
    };
    let report = r#"kill -INT $PING 2>/dev/null; sleep 1
# The longest run of missing replies: the seq numbers answered, in order.
grep -o 'seq=[0-9]*' /tmp/ping | cut -d= -f2 | awk 'NR>1 && $1-p>g {g=$1-p} {p=$1} END {print "PVS-GAP", g-1, NR}'
"#;
    format!("{wait}{send}{report}")
}

/// How long the UDP stream runs: through two moves, whatever the machine's speed.
const UDP_SECS: u32 = 50;
/// The moving guest's RAM (run-vm.sh's default).
const GUEST_MIB: u64 = 256;
/// Moves a test makes.
const MOVES: usize = 2;

/// Moves the guest twice (a -> b -> a) while the peer streams `load` to it: there and back,
/// each port a destination once and the first a source again after it was one (a third move
/// repeated the first and cost the suite two minutes).
fn migrate_under(name: &str, server: bool, announce: Announce, load: Load) {
    let _g = serial();
    let dir = test_dir(name);
    let spec = |p: &str| if server { PortSpec::server(p) } else { PortSpec::server(p).client() };
    let text = Switch::config_text(&dir, &[1], &[spec("a"), spec("b"), spec("peer")], "");
    let sw = Switch::start_config(dir.clone(), &text);
    let run = Run { dir: dir.clone(), sw, server, announce, compare: load == Load::Udp };
    let job = |name: &str, text: String| {
        let p = dir.join(format!("job-{name}.sh"));
        std::fs::write(&p, text).unwrap();
        p
    };
    let vm_job = match load {
        Load::Tcp => job("vm", "nc -l -p 5000 | sha256sum | sed 's/^/PVS-SHA /'\n".into()),
        Load::Udp => job("vm", "iperf3 -s -1 >/dev/null 2>&1; echo PVS-IPERF-SERVED $?\n".into()),
    };
    let peer_job = job("peer", peer_job(load));
    let root = env!("CARGO_MANIFEST_DIR");
    let peer_sock = if server { run.sw.sock("peer") } else { dir.join("peer.sock").display().to_string() };
    let mut peer_cmd = Command::new(format!("{root}/scripts/run-vm.sh"));
    let peer_console = dir.join("peer-console.sock");
    peer_cmd.args(["--socket", &peer_sock, "--name", "peer", "--ip", "10.41.0.2/24"]);
    peer_cmd.arg("--console-in").arg(&peer_console);
    if !server {
        peer_cmd.arg("--vhost-server");
    }
    let peer = peer_cmd
        .arg("--job")
        .arg(&peer_job)
        .arg("--log")
        .arg(dir.join("peer.log"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("qemu-peer.log")).unwrap())
        .spawn()
        .expect("run scripts/run-vm.sh");
    let mut qemus = Qemus(vec![peer, run.qemu("a", 0, Some(&vm_job))]);
    run.wait_log("peer", "PVS-START", 300);
    let mut current = Qmp::connect(&dir.join("qmp-0.sock"));
    let mut report = Vec::new();
    let mut logging_seen = 0;
    let mut differing = Vec::new();
    for n in 1..=MOVES {
        let port = if n % 2 == 1 { "b" } else { "a" };
        let announced = run.announcements(port);
        qemus.0.push(run.qemu(port, n, None));
        let mut next = Qmp::connect(&dir.join(format!("qmp-{n}.sock")));
        // Let the stream run on this host's port before the next move.
        std::thread::sleep(Duration::from_secs(2));
        let uri = format!("unix:{}", dir.join(format!("mig-{n}.sock")).display());
        // The destination listens once QEMU is up; its QMP answering means it is.
        let _ = next.cmd("query-status", json!({}));
        current.cmd("migrate", json!({ "uri": uri }));
        let deadline = Instant::now() + Duration::from_secs(300);
        let from = if port == "a" { "b" } else { "a" };
        let info = loop {
            let r = current.cmd("query-migrate", json!({}));
            if r["status"] == "active" && run.migration(from).logging {
                logging_seen += 1;
            }
            match r["status"].as_str() {
                Some("completed") => break r,
                Some("failed") | Some("cancelled") => panic!("migration {n} to {port}: {r}\n{}", run.sw.log()),
                _ => {}
            }
            assert!(Instant::now() < deadline, "migration {n} did not complete: {r}");
            std::thread::sleep(Duration::from_millis(100));
        };
        report.push(format!("move {n} to {port}: total {} ms, downtime {} ms", info["total-time"], info["downtime"]));
        if run.compare {
            // Both sides stopped: the source for good (the switch wrote its last frame before
            // GET_VRING_BASE), the destination before its rings start. What the destination got
            // must be what the source holds, page for page.
            let pages = run.differing_pages(&mut current, &mut next, n);
            differing.push(pages);
            next.cmd("cont", json!({}));
        }
        current.cmd("quit", json!({}));
        current = next;
        // The guest's next frame (its ACKs, its announcement) moves its MAC to the new port.
        wait_for(&format!("{VM_MAC} learned on {port}"), || {
            let fdb = run.sw.fdb();
            fdb.iter().any(|e| e.mac == VM_MAC && e.port.as_deref() == Some(port)).then_some(())
        });
        if announce == Announce::Rarp {
            // QEMU asks for the RARP (five times, its announce rounds) once the guest runs on
            // its new port; pvswitchd sends it from there.
            wait_for(&format!("a RARP sent from {port} after move {n}"), || {
                (run.announcements(port) > announced).then_some(())
            });
        }
    }
    // Both moves done with the stream running: the peer stops sending (the connection kept
    // until the peer has reported, so the line is read whole).
    let _stop = (load == Load::Tcp).then(|| {
        assert!(
            !run.log("peer").contains("PVS-NC-EXIT"),
            "the stream ended before the moves did:\n{}",
            run.log("peer")
        );
        let mut c = UnixStream::connect(&peer_console).expect("the peer's console");
        c.write_all(b"stop\n").unwrap();
        c
    });
    run.wait_log("peer", "PVS-GAP", 900);
    // The guest's console after the last move.
    let last = format!("vm-{MOVES}");
    if load == Load::Tcp {
        run.wait_log(&last, "PVS-SHA", 120);
    }
    drop(qemus);
    let peer_log = run.log("peer");
    let pick = |log: &str, m: &str| log.lines().find(|l| l.starts_with(m)).map(|l| l[m.len()..].trim().to_string());
    let gap = pick(&peer_log, "PVS-GAP").unwrap_or_default();
    eprintln!("{}\nping: longest gap, answered: {gap} (x 10 ms)", report.join("\n"));
    match load {
        Load::Tcp => {
            let sent = pick(&peer_log, "PVS-SENT").expect("the sender's SHA-256");
            let got = pick(&run.log(&last), "PVS-SHA").expect("the receiver's SHA-256");
            assert_eq!(pick(&peer_log, "PVS-NC-EXIT").as_deref(), Some("0"), "the TCP connection broke:\n{peer_log}");
            let chunks = pick(&peer_log, "PVS-CHUNKS").and_then(|c| c.parse::<u32>().ok()).unwrap_or(0);
            eprintln!("TCP: {} MiB sent", chunks * CHUNK_MIB);
            assert!(chunks > 0, "nothing was sent:\n{peer_log}");
            assert_eq!(got, sent, "the stream arrived changed");
        }
        Load::Udp => {
            let udp = pick(&peer_log, "PVS-UDP").expect("iperf3's report");
            eprintln!("UDP: {udp}");
            assert_eq!(pick(&peer_log, "PVS-IPERF-EXIT").as_deref(), Some("0"), "iperf3 failed:\n{peer_log}");
            let field = |k: &str| -> u64 {
                let v = udp.split_whitespace().find_map(|f| f.strip_prefix(k)?.strip_prefix('='));
                v.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {k} in {udp:?}"))
            };
            assert!(field("packets") > 0, "{udp}");
            // A datagram seen again after a move came from a receive buffer that arrived stale:
            // a page the switch wrote and did not log.
            assert_eq!(field("out_of_order"), 0, "datagrams out of order after the moves: {udp}");
        }
    }
    if run.compare {
        eprintln!("pages that differ between source and destination, per move: {differing:?}");
        assert!(
            differing.iter().all(|&d| d == 0),
            "the destination's memory differs from the source's in {differing:?} pages (per move): pages written and not logged"
        );
    }
    // Dirty logging was used on each move, `ports` showed it on (sampled while the migration
    // was active), and it is off now that no migration is running.
    let logs = run.sw.log().matches("dirty log of").count();
    assert!(logs >= MOVES, "pvswitchd mapped {logs} dirty logs for {MOVES} moves:\n{}", run.sw.log());
    eprintln!("ports showed the source logging in {logging_seen} samples of its migration");
    assert!(logging_seen > 0, "`ports` never showed dirty logging on during {MOVES} migrations");
    let b = run.migration("b");
    assert!(!b.logging, "{}", b.json());
    let sent = run.announcements("a") + run.announcements("b");
    eprintln!("RARPs sent: {sent}");
    if announce == Announce::Guest {
        assert_eq!(sent, 0, "the guest announced itself: pvswitchd sent no RARP");
    }
}

#[test]
fn a_guest_migrates_there_and_back_under_a_tcp_stream_server_ports() {
    if !require(QEMU) {
        return;
    }
    migrate_under("migrate-server", true, Announce::Guest, Load::Tcp);
}

#[test]
fn a_guest_without_guest_announce_migrates_there_and_back_under_a_tcp_stream_client_ports() {
    if !require(QEMU) {
        return;
    }
    migrate_under("migrate-client", false, Announce::Rarp, Load::Tcp);
}

#[test]
fn a_guest_migrates_there_and_back_under_a_udp_stream_and_arrives_with_every_page_written() {
    if !require(QEMU) {
        return;
    }
    migrate_under("migrate-udp", true, Announce::Guest, Load::Udp);
}
