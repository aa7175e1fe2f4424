//! Checksum and segmentation offloads with real guests: two QEMU Linux guests (TCG) exchange
//! 16 MiB each way through pvswitchd over TCP, and the SHA-256 of what arrived (computed in
//! the guest) equals that of what was sent (computed on the host), both directions; once with every offload negotiated (64 KiB TSO frames handed
//! from guest to guest whole), once with one guest's receive offloads turned off in QEMU, so
//! pvswitchd segments and checksums every frame for it.

use crate::common;

use common::*;
use pvswitch::proto::PortInfo;
use std::process::Command;
use std::time::{Duration, Instant};

/// The stream each guest sends: 16 copies of one random MiB (the host knows its SHA-256):
/// thousands of TSO frames each way, over 11,000 segments for a guest without receive
/// offloads, each ring wrapped many times (64 and 200 copies proved no more and cost the
/// suite minutes).
const COPIES: usize = 16;

/// Shell helpers both guests use: the MiB (from the job, base64), the stream, a clock.
fn helpers(mib_base64: &str) -> String {
    format!(
        "base64 -d > /tmp/r <<'PVS-DATA'\n{mib_base64}\nPVS-DATA\n\
         gen() {{ i=0; while [ $i -lt {COPIES} ]; do cat /tmp/r; i=$((i+1)); done; }}\n\
         t0() {{ cut -d. -f1 /proc/uptime; }}\n"
    )
}

const JOB_A: &str = r#"
until ping -c 1 -W 1 10.10.0.2 >/dev/null 2>&1; do :; done
s=$(t0)
until gen | nc 10.10.0.2 6000; do sleep 0.5; done
echo "PVS-SENT-AB in $(( $(t0) - s ))s"
nc -l -p 6001 | sha256sum > /tmp/rx.sha
echo "PVS-SHA-RECV-BA $(cut -d' ' -f1 /tmp/rx.sha)"
echo PVS-DONE-A
while true; do sleep 1000; done
"#;

const JOB_B: &str = r#"
nc -l -p 6000 | sha256sum > /tmp/rx.sha
echo "PVS-SHA-RECV-AB $(cut -d' ' -f1 /tmp/rx.sha)"
s=$(t0)
until gen | nc 10.10.0.1 6001; do sleep 0.5; done
echo "PVS-SENT-BA in $(( $(t0) - s ))s"
echo PVS-DONE-B
while true; do sleep 1000; done
"#;

/// A random MiB as base64, and the SHA-256 of `COPIES` of it, computed on the host.
fn data(dir: &std::path::Path) -> (String, String) {
    let mut mib = vec![0u8; 1 << 20];
    std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut mib)).unwrap();
    let path = dir.join("mib");
    std::fs::write(&path, &mib).unwrap();
    let sh = |cmd: String| {
        let o = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let b64 = sh(format!("base64 {}", path.display()));
    let sha = sh(format!("for i in $(seq {COPIES}); do cat {}; done | sha256sum", path.display()));
    (b64.trim().to_string(), sha.split_whitespace().next().unwrap().to_string())
}

fn value(log: &str, tag: &str) -> Option<String> {
    log.lines().find_map(|l| l.strip_prefix(tag)).and_then(|v| v.split_whitespace().next()).map(String::from)
}

/// Runs the two transfers; `b_opts` are virtio-net-pci properties for guest B. Returns
/// `pvswitchctl ports` for vm1 and vm2 as they were with the guests still connected.
fn transfer(name: &str, b_opts: &str) -> (PortInfo, PortInfo) {
    let sw = Switch::start(name, &[1], &[PortSpec::server("vm1"), PortSpec::server("vm2")]);
    let root = env!("CARGO_MANIFEST_DIR");
    let (job_a, job_b) = (sw.dir.join("job-a.sh"), sw.dir.join("job-b.sh"));
    let (b64, sha) = data(&sw.dir);
    std::fs::write(&job_a, format!("{}{JOB_A}", helpers(&b64))).unwrap();
    std::fs::write(&job_b, format!("{}{JOB_B}", helpers(&b64))).unwrap();
    let qemu = |vm: &str, sock: &str, ip: &str, mac: &str, job: &std::path::Path, opts: &str| {
        let mut c = Command::new(format!("{root}/scripts/run-vm.sh"));
        c.args(["--socket", &sw.sock(sock), "--name", vm, "--ip", ip, "--mac", mac])
            .args(["--job", job.to_str().unwrap(), "--log", sw.dir.join(format!("{vm}.log")).to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(sw.dir.join(format!("qemu-{vm}.log"))).unwrap());
        if !opts.is_empty() {
            c.args(["--net-opts", opts]);
        }
        c.spawn().expect("run scripts/run-vm.sh")
    };
    let mut vms = Qemus(vec![
        qemu("b", "vm2", "10.10.0.2/24", "52:54:00:0d:0d:02", &job_b, b_opts),
        qemu("a", "vm1", "10.10.0.1/24", "52:54:00:0d:0d:01", &job_a, ""),
    ]);
    let deadline = Instant::now() + Duration::from_secs(900);
    let read = |vm: &str| std::fs::read_to_string(sw.dir.join(format!("{vm}.log"))).unwrap_or_default();
    while !(read("a").contains("PVS-DONE-A") && read("b").contains("PVS-DONE-B")) {
        for c in &mut vms.0 {
            if let Some(st) = c.try_wait().unwrap() {
                panic!("QEMU exited ({st})\nA:\n{}\nB:\n{}\n{}", read("a"), read("b"), sw.log());
            }
        }
        assert!(Instant::now() < deadline, "transfers unfinished\nA:\n{}\nB:\n{}\n{}", read("a"), read("b"), sw.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    let (a, b) = (read("a"), read("b"));
    let (ab, ba) = (value(&b, "PVS-SHA-RECV-AB "), value(&a, "PVS-SHA-RECV-BA "));
    let times: Vec<&str> = a.lines().chain(b.lines()).filter(|l| l.starts_with("PVS-SENT")).collect();
    eprintln!("{name}: sent {sha}, A->B received {ab:?}, B->A received {ba:?}; {times:?}");
    assert_eq!(ab.as_deref(), Some(sha.as_str()), "A -> B: SHA-256 differs\nA:\n{a}\nB:\n{b}");
    assert_eq!(ba.as_deref(), Some(sha.as_str()), "B -> A: SHA-256 differs\nA:\n{a}\nB:\n{b}");
    // Neither port dropped a frame as malformed or for its offload header.
    for p in ["vm1", "vm2"] {
        let drops = sw.counters(p).drops;
        for ((k, _), v) in pvswitch::datapath::counters::DROP_REASONS.iter().zip(drops.0) {
            if k.starts_with("offload") || *k == "malformed" {
                assert_eq!(v, 0, "{p}: {k}\n{}", drops.json());
            }
        }
    }
    let ports = (sw.port_info("vm1"), sw.port_info("vm2"));
    drop(vms);
    ports
}

#[test]
fn two_guests_with_offloads_exchange_16_mib_each_way_intact() {
    let Some(_g) = run_alone(QEMU) else { return };
    let (a, b) = transfer("offload-on", "");
    for port in [&a, &b] {
        // (As the JSON list's text: null if the port shows no offloads.)
        let takes = port.offloads.as_ref().map(|o| o.guest_takes.json().to_string()).unwrap_or_default();
        assert!(takes.contains("tso4") && takes.contains("csum"), "{}", port.json());
        // TSO frames went through, whole: nothing segmented in software.
        assert!(port.counters.rx_gso > 0, "the guest sent no TSO frame: {}", port.json());
        assert_eq!(port.counters.sw_segmented, 0, "{}", port.json());
    }
}

#[test]
fn a_guest_without_receive_offloads_gets_segmented_checksummed_frames_intact() {
    let Some(_g) = run_alone(QEMU) else { return };
    let off = "guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off";
    let (a, b) = transfer("offload-b-off", off);
    assert!(a.counters.rx_gso > 0, "A sent no TSO frame: {}", a.json());
    let takes = b.offloads.as_ref().unwrap_or_else(|| panic!("no offloads: {}", b.json())).guest_takes.len();
    assert_eq!(takes, 0, "vm2 negotiated receive offloads: {}", b.json());
    // Every TSO frame A sent went to B, which takes none: each was segmented once. (A floor
    // on the count would depend on how the guest's stack sized its frames.)
    assert_eq!(
        b.counters.sw_segmented,
        a.counters.rx_gso,
        "the switch did not segment each of A's TSO frames for vm2:\n{}\n{}",
        a.json(),
        b.json()
    );
}
