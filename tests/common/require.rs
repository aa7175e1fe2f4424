//! What an integration test needs from the machine, checked before it starts anything. A test
//! whose needs are not all met writes one line to standard error,
//! `SKIPPED <binary>::<test>: needs root (running as uid 1000), ...`, and returns (it passes
//! without having run), so plain `cargo test` as a normal user runs what it can and says what
//! it could not. With `PVS_REQUIRE_ALL=1` (scripts/test.sh sets it) an unmet need fails the
//! test instead, with the same words: CI runs everything or fails.

use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// Effective uid 0: hugetlbfs files (testpmd), network namespaces, veth and tap devices,
    /// socket groups the user is not in, reserving huge pages.
    Root,
    /// At least this many free 2 MiB huge pages.
    Hugepages(u64),
    /// At least this many free 1 GiB huge pages.
    Gigapages(u64),
    /// DPDK's `dpdk-testpmd` on PATH.
    Testpmd,
    /// `qemu-system-x86_64` (or `$PVS_QEMU`, as scripts/run-vm.sh) on PATH.
    Qemu,
    /// The test guest's kernel and initramfs (scripts/build-guest.sh), in `target/guest` or
    /// `$PVS_GUEST_DIR`.
    GuestImage,
    /// A command on PATH.
    Cmd(&'static str),
    /// libvirtd answering on its system socket, and virsh (scripts/install-deps.sh).
    Libvirtd,
    /// At least this many open files for this process: its soft limit is raised to its hard
    /// limit first (as pvswitchd and pvsgen do), so only a hard limit below it is unmet.
    OpenFiles(u64),
}

/// A test with DPDK testpmd "VMs": 256 free huge pages (testpmd maps 512 MiB of them, hugetlbfs
/// files only root may create).
pub const TESTPMD: &[Need] = &[Need::Root, Need::Hugepages(256), Need::Testpmd];
/// A test with QEMU Linux guests (TCG; no root).
pub const QEMU: &[Need] = &[Need::Qemu, Need::GuestImage];

/// Whether the test calling this may run: true when every need in `needs` is met. Otherwise
/// says which are not (see the module's documentation) and returns false, or panics under
/// `PVS_REQUIRE_ALL=1`. Call it first, before the test starts a process or makes a directory:
/// `if !require(TESTPMD) { return; }`.
pub fn require(needs: &[Need]) -> bool {
    let mut unmet: Vec<String> = Vec::new();
    for m in needs.iter().filter_map(|n| missing(*n)) {
        // Lists put together (`&[TESTPMD, NETNS].concat()`) may name a need twice.
        if !unmet.contains(&m) {
            unmet.push(m);
        }
    }
    if unmet.is_empty() {
        return true;
    }
    let line = format!("{}: needs {}", test_name(), unmet.join(", "));
    if std::env::var("PVS_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{line} (PVS_REQUIRE_ALL=1: a test that cannot run fails)");
    }
    // Straight to the process's standard error (the test harness captures eprintln!), in one
    // write: the harness's own output from other test threads must not split the line.
    let _ = std::io::stderr().write_all(format!("SKIPPED {line}\n").as_bytes());
    false
}

/// Whether the host offers `need`, something a machine may lack through no fault of its setup
/// (a 1 GiB huge page: the kernel may find no free gigabyte to give once memory is
/// fragmented). When it does not, says so (`NOT RUN <test>: the host has no ...`) and returns
/// false, even under `PVS_REQUIRE_ALL=1`: the test then checks what it can without it.
pub fn host_offers(need: Need) -> bool {
    let Some(m) = missing(need) else { return true };
    let _ = std::io::stderr().write_all(format!("NOT RUN {}: the host has no {m}\n", test_name()).as_bytes());
    false
}

/// `<test binary>::<test>`: the harness runs each test on a thread named after it.
fn test_name() -> String {
    let thread = std::thread::current();
    format!("{}::{}", env!("CARGO_CRATE_NAME"), thread.name().unwrap_or("?"))
}

/// What is missing of `need`, in words, or None when it is met.
fn missing(need: Need) -> Option<String> {
    match need {
        Need::Root => (euid() != 0).then(|| format!("root (running as uid {})", euid())),
        Need::Hugepages(n) => huge_pages(2048, n),
        Need::Gigapages(n) => huge_pages(1048576, n),
        Need::Testpmd => on_path("dpdk-testpmd").is_none().then(|| "dpdk-testpmd (scripts/install-deps.sh)".into()),
        Need::Qemu => {
            let qemu = std::env::var("PVS_QEMU").unwrap_or_else(|_| "qemu-system-x86_64".into());
            on_path(&qemu).is_none().then(|| format!("{qemu} (scripts/install-deps.sh)"))
        }
        Need::GuestImage => {
            let dir = guest_dir();
            let built =
                ["vmlinuz", "initrd.img"].iter().all(|f| std::fs::metadata(dir.join(f)).is_ok_and(|m| m.len() > 0));
            (!built).then(|| format!("the test guest in {} (scripts/build-guest.sh)", dir.display()))
        }
        Need::Cmd(c) => on_path(c).is_none().then(|| format!("{c} on PATH")),
        Need::Libvirtd => {
            let up = on_path("virsh").is_some() && Path::new("/run/libvirt/libvirt-sock").exists();
            (!up).then(|| "libvirtd running, and virsh (scripts/install-deps.sh installs and starts them)".into())
        }
        Need::OpenFiles(n) => {
            let (soft, hard) = pvsgen::raise_fd_limit();
            (soft < n).then(|| format!("{n} open files (the hard limit is {hard}: ulimit -Hn, or LimitNOFILE)"))
        }
    }
}

/// The effective uid, from /proc/self/status ("Uid: real effective saved fs").
pub fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1));
    uid.and_then(|u| u.parse().ok()).unwrap_or(u32::MAX)
}

fn huge_pages(kb: u64, want: u64) -> Option<String> {
    let dir = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
    let free: u64 =
        std::fs::read_to_string(format!("{dir}/free_hugepages")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    let (size, hint) = match kb {
        2048 => ("2 MiB", "scripts/install-deps.sh reserves them".to_string()),
        _ => ("1 GiB", format!("as root, early after boot: echo {want} > {dir}/nr_hugepages")),
    };
    (free < want).then(|| format!("{want} free {size} huge pages ({free} free; {hint})"))
}

/// Where scripts/run-vm.sh finds the guest unless told otherwise.
pub fn guest_dir() -> PathBuf {
    std::env::var_os("PVS_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/guest"))
}

fn on_path(cmd: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if cmd.contains('/') {
        return exec(Path::new(cmd)).then(|| cmd.into());
    }
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(cmd))
        .find(|p| exec(p))
}
