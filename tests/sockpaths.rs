//! Socket paths are never followed: pvswitchd binds, sets the mode and group of, connects to
//! and removes only the socket files it means to. A symbolic link planted at a server port's
//! path makes that port fail (its target untouched); a link swapped in while a reload recreates
//! the socket never gets the socket's mode; a client-mode port does not connect through a link
//! to another VM's socket; at shutdown only pvswitchd's own sockets are removed.

use crate::common;
use crate::frontend;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use frontend::*;

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

fn mode_of(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A file only its owner may read and write, as another VM's disk or key might be.
fn secret(dir: &Path) -> PathBuf {
    let p = dir.join("secret");
    std::fs::write(&p, "secret").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn ctl_human(sw: &Switch, cmd: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), cmd])
        .output()
        .unwrap();
    assert!(out.status.success(), "pvswitchctl {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// No private binding directory is left behind in `dir`.
fn no_temp_dirs(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(".pvswitchd-"))
        .collect();
    assert!(left.is_empty(), "temporary directories left: {left:?}");
}

/// At start: port "link"'s path is a symbolic link to a 0600 file, "file"'s a regular file,
/// "live"'s another process's listening socket. Each of those ports fails with its reason
/// (state "failed", in JSON and in the human output); "vm1" and "vm2" run. While running,
/// vm2's socket is replaced by another process's. At shutdown: vm1's socket and the control
/// socket are removed; the link, its target, the file, and both other sockets are not.
#[test]
fn planted_paths_fail_their_port_and_survive_shutdown() {
    let _g = serial();
    let dir = test_dir("sockpath-planted");
    let target = secret(&dir);
    std::os::unix::fs::symlink(&target, dir.join("link.sock")).unwrap();
    std::fs::write(dir.join("file.sock"), "not a socket").unwrap();
    let other = UnixListener::bind(dir.join("live.sock")).unwrap();
    let ports = ["vm1", "vm2", "link", "file", "live"].map(PortSpec::server);
    let text = Switch::config_text(&dir, &[1], &ports, "socket_mode = \"0666\"");
    let mut sw = Switch::start_config(dir.clone(), &text);

    let vm = Vm::connect(&sw.sock("vm1"));
    sw.wait_running("vm1", 1);
    drop(vm);
    assert_eq!(mode_of(&dir.join("vm1.sock")), 0o666, "socket_mode was not applied");
    for (port, why) in [("link", "symbolic link"), ("file", "not a socket"), ("live", "another process listens")] {
        let p = sw.port(port);
        assert_eq!(p["state"], "failed", "{p}");
        assert!(p["last_error"].as_str().unwrap_or("").contains(why), "{port}: {p}");
    }
    let human = ctl_human(&sw, "ports");
    assert!(human.contains("link.sock [failed]") && human.contains("failed: "), "{human}");
    assert_eq!(mode_of(&target), 0o600, "the link's target's mode changed");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret");
    no_temp_dirs(&dir);

    // vm2's socket file is replaced by another process's socket while pvswitchd runs.
    std::fs::remove_file(dir.join("vm2.sock")).unwrap();
    let other2 = UnixListener::bind(dir.join("vm2.sock")).unwrap();

    // SAFETY: signalling our own child.
    unsafe { libc::kill(sw.child.id() as i32, libc::SIGTERM) };
    let status = wait_for("pvswitchd to exit", || sw.child.try_wait().unwrap());
    assert!(status.success(), "{status}\n{}", sw.log());
    assert!(!dir.join("vm1.sock").exists() && !sw.ctl.exists(), "pvswitchd's own sockets were not removed");
    assert!(std::fs::symlink_metadata(dir.join("link.sock")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(dir.join("file.sock")).unwrap(), "not a socket");
    assert!(is_socket(&dir.join("live.sock")) && is_socket(&dir.join("vm2.sock")), "another process's socket removed");
    // They still reach their listeners.
    std::os::unix::net::UnixStream::connect(dir.join("live.sock")).unwrap();
    std::os::unix::net::UnixStream::connect(dir.join("vm2.sock")).unwrap();
    other.accept().unwrap();
    other2.accept().unwrap();
    assert_eq!(mode_of(&target), 0o600);
    no_temp_dirs(&dir);
}

/// A reload that recreates a server port's socket (its queue count and socket_mode toggled)
/// while another thread replaces the socket with a symbolic link to a 0600 file the moment it
/// appears: the file keeps its mode, every time. And a mode change alone, made on the bound
/// socket in place, leaves a link put over its name as it is.
#[test]
fn a_link_swapped_in_during_a_reload_never_gets_the_sockets_mode() {
    // Root: the socket's group (1) is one only root may give.
    let Some(_g) = run_alone(&[Need::Root]) else { return };
    let dir = test_dir("sockpath-race");
    let target = secret(&dir);
    // Adaptive polling: the idle poll thread sleeps, so the racer has a core of its own. The
    // race port's queue count alternates too: that replaces the port, so its socket is bound
    // anew each time (a mode change alone is made in place, below).
    let config = |mode: &str, queues: u16| {
        let ports = [PortSpec::server("vm1"), PortSpec::server("race").queues(queues)];
        let extra = format!("poll_mode = \"adaptive\"\nsocket_mode = \"{mode}\"\nsocket_group = \"1\"");
        Switch::config_text(&dir, &[1], &ports, &extra)
    };
    let sw = Switch::start_config(dir.clone(), &config("0660", 1));
    let path = PathBuf::from(sw.sock("race"));
    let start = Instant::now();
    let mut tries = 0;
    let mut swapped = 0;
    while tries < 1000 && start.elapsed() < Duration::from_secs(20) {
        tries += 1;
        // A link left by the last round is not pvswitchd's: the test clears it.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            std::fs::remove_file(&path).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let racer = {
            let (stop, path, target, dir) = (stop.clone(), path.clone(), target.clone(), dir.clone());
            std::thread::spawn(move || {
                let tmp = dir.join("link.tmp");
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&target, &tmp).unwrap();
                // Looked at and swapped through the directory's fd, as fast as it goes.
                let d = std::fs::File::open(&dir).unwrap();
                let cname = |p: &Path| std::ffi::CString::new(p.file_name().unwrap().as_encoded_bytes()).unwrap();
                let (name, tmp) = (cname(&path), cname(&tmp));
                let is_sock = || {
                    // SAFETY: fstatat into a local stat, NUL-terminated name.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    let r = unsafe { libc::fstatat(d.as_raw_fd(), name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
                    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
                };
                // The old socket goes first (the port closes), then a new one appears.
                let mut gone = false;
                while !stop.load(Ordering::Relaxed) {
                    let sock = is_sock();
                    gone |= !sock;
                    if gone && sock {
                        // SAFETY: NUL-terminated names relative to a directory fd we hold.
                        let r = unsafe { libc::renameat(d.as_raw_fd(), tmp.as_ptr(), d.as_raw_fd(), name.as_ptr()) };
                        assert_eq!(r, 0, "rename: {}", std::io::Error::last_os_error());
                        return true;
                    }
                }
                false
            })
        };
        let odd = tries % 2 == 1;
        sw.write_config(&config(if odd { "0666" } else { "0660" }, if odd { 2 } else { 1 }));
        let _ = sw.try_ctl("reload");
        // The new socket appeared (or the port failed): let the racer finish its swap.
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline && !racer.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        swapped += racer.join().unwrap() as u32;
        let m = std::fs::metadata(&target).unwrap();
        let (mode, gid) = (m.permissions().mode() & 0o7777, m.gid());
        assert_eq!((mode, gid), (0o600, 0), "try {tries}: the link's target got mode {mode:o}, group {gid}");
    }
    eprintln!("{tries} reloads, a link swapped in after {swapped} of them");
    assert!(swapped > 0, "the racer never swapped a link in");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "secret");

    // A mode change alone re-permissions the bound socket in place; a link put over its
    // name is not followed, and the answer says the name is left as it is.
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::remove_file(&path).unwrap();
    }
    let queues = if tries % 2 == 1 { 2 } else { 1 };
    sw.write_config(&config("0660", 3 - queues));
    sw.ctl("reload");
    assert!(is_socket(&path), "the race port's socket is back");
    let tmp = dir.join("link2.tmp");
    std::os::unix::fs::symlink(&target, &tmp).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    sw.write_config(&config("0666", 3 - queues));
    let answer = format!("{:?}", sw.try_ctl("reload"));
    assert!(answer.contains("left as it is"), "{answer}");
    let m = std::fs::metadata(&target).unwrap();
    assert_eq!((m.permissions().mode() & 0o7777, m.gid()), (0o600, 0), "in place: {answer}");
    std::fs::remove_file(&path).unwrap();
    let vm = Vm::connect(&sw.sock("vm1"));
    sw.wait_running("vm1", 1);
    drop(vm);
    no_temp_dirs(&dir);
}

/// A client-mode port whose path is a symbolic link to another VM's listening socket does not
/// connect through it; it says why, and keeps trying (the link may become a socket).
#[test]
fn a_client_port_does_not_connect_through_a_link() {
    let _g = serial();
    let dir = test_dir("sockpath-client");
    let victim = UnixListener::bind(dir.join("other-vm.sock")).unwrap();
    victim.set_nonblocking(true).unwrap();
    std::os::unix::fs::symlink(dir.join("other-vm.sock"), dir.join("vmm.sock")).unwrap();
    let ports = [PortSpec::server("vm1"), PortSpec::server("vmm").client()];
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &ports, ""));
    let err = wait_for("the client port to report the link", || {
        sw.port("vmm")["last_error"].as_str().filter(|e| e.contains("symbolic link")).map(String::from)
    });
    assert!(err.contains("not followed"), "{err}");
    assert_eq!(sw.port("vmm")["state"], "connecting");
    assert!(
        matches!(victim.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "pvswitchd connected to the other VM's socket through the link"
    );
    // The link replaced by a real VMM socket: the port connects.
    std::fs::remove_file(dir.join("vmm.sock")).unwrap();
    let vmm = UnixListener::bind(dir.join("vmm.sock")).unwrap();
    let (_s, _) = vmm.accept().unwrap();
    wait_for("the client port to connect", || (sw.port("vmm")["state"] == "connected").then_some(()));
    assert!(
        matches!(victim.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "pvswitchd connected to the other VM's socket"
    );
}
