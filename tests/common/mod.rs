//! Test harness: a real pvswitchd process, real DPDK testpmd "VMs" (virtio-user frontends),
//! pcap files for exact frame contents. Every wait is on a counter or a socket, bounded by a
//! generous deadline that only a broken switch would hit.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod capture;
pub mod frames;
mod guests;
pub mod netns;
mod require;
mod switch;
mod testpmd;
pub mod vms;

#[allow(unused_imports)]
pub use capture::*;
#[allow(unused_imports)]
pub use guests::*;
#[allow(unused_imports)] // used by the tests that make namespaces only
pub use netns::{Netns, no_ipv6, sh};
pub use require::*;
#[allow(unused_imports)]
pub use switch::*;
#[allow(unused_imports)]
pub use testpmd::*;

/// Tests that run testpmd or QEMU share two CPUs and the hugepage pool: one at a time. The
/// guard reports the test's time when it is let go (`Alone`).
pub fn serial() -> Alone {
    static LOCK: Mutex<()> = Mutex::new(());
    Alone { _lock: LOCK.lock().unwrap_or_else(|e| e.into_inner()), since: Instant::now() }
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

/// A fresh directory for a test's files, `/tmp/pvs-test/<name>-<pid>[.<n>]` (scripts/test.sh
/// looks for processes left running there); another user's under `/tmp/pvs-test-<uid>/`, as
/// the first belongs to root once scripts/test.sh ran. The suite is one process: a name asked
/// for again (two tests of two files may use one) gets a number, not the first one's files.
pub fn test_dir(name: &str) -> PathBuf {
    static USED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let base = match euid() {
        0 => "/tmp/pvs-test".to_string(),
        uid => format!("/tmp/pvs-test-{uid}"),
    };
    let n = {
        let mut used = USED.lock().unwrap_or_else(|e| e.into_inner());
        used.push(name.to_string());
        used.iter().filter(|u| *u == name).count()
    };
    let suffix = if n > 1 { format!(".{n}") } else { String::new() };
    let d = PathBuf::from(format!("{base}/{name}-{}{suffix}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A test's preamble: its needs met (else SKIPPED, or failed under PVS_REQUIRE_ALL), then the
/// machine to itself (`serial`). `let Some(_g) = run_alone(NEEDS) else { return };`
pub fn run_alone(needs: &[Need]) -> Option<Alone> {
    require(needs).then(serial)
}

/// The machine held for one test (`serial`, `run_alone`); when it is let go, the test's time goes to
/// standard error as `TOOK <test> <seconds>` (scripts/test-summary.sh sums it by file: the
/// suite is one binary, whose harness times only the whole).
pub struct Alone {
    _lock: MutexGuard<'static, ()>,
    since: Instant,
}

impl Drop for Alone {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        let line = format!("TOOK {name} {:.1}\n", self.since.elapsed().as_secs_f64());
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
}
