//! QEMU Linux guests (scripts/run-vm.sh): booted on a port, their jobs awaited, and the
//! processes a test started, killed when it ends.

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
