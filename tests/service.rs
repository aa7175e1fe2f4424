//! pvswitchd as a service: the systemd notify protocol (READY, STATUS, WATCHDOG, RELOADING,
//! STOPPING) as a service manager sees it on NOTIFY_SOCKET; a second daemon on the same
//! configuration refused; stale sockets of a crashed run replaced (never a file that is not a
//! socket); scripts/install.sh and the unit (`systemd-analyze verify`).

use crate::common;
use crate::frontend;

use common::*;
use frontend::*;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a service manager receives: every datagram pvswitchd sent, as lines.
struct Manager {
    sock: UnixDatagram,
    got: Vec<String>,
}

impl Manager {
    fn bind(path: &Path) -> Manager {
        let sock = UnixDatagram::bind(path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        Manager { sock, got: Vec::new() }
    }

    /// Waits for a datagram with a line `want` (a prefix of it), returning that datagram.
    fn wait(&mut self, what: &str, want: &str, sw: &mut Switch) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [0u8; 4096];
        loop {
            assert!(sw.alive(), "pvswitchd exited waiting for {what}\n{}", sw.log());
            assert!(Instant::now() < deadline, "no {what} ({want}) within 60 s; got {:?}\n{}", self.got, sw.log());
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).to_string();
                self.got.push(msg.clone());
                if msg.lines().any(|l| l.starts_with(want)) {
                    return msg;
                }
            }
        }
    }
}

/// Starts pvswitchd on `text` with NOTIFY_SOCKET (and a watchdog of `watchdog_usec`, if any),
/// without waiting for its control socket: the notifications are what is waited for.
fn start_notified(dir: &Path, text: &str, notify: &Path, watchdog_usec: Option<u64>) -> Switch {
    let conf = dir.join("pvswitch.toml");
    std::fs::write(&conf, text).unwrap();
    let log = std::fs::File::create(dir.join("pvswitchd.log")).unwrap();
    // As systemd does: WATCHDOG_PID is the daemon's own pid (sh's $$, kept across exec).
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("WATCHDOG_PID=$$ exec {} --config {}", env!("CARGO_BIN_EXE_pvswitchd"), conf.display()))
        .env("RUST_LOG", "info")
        .env("NOTIFY_SOCKET", notify)
        .envs(watchdog_usec.map(|u| ("WATCHDOG_USEC", u.to_string())))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn pvswitchd");
    Switch { child, ctl: dir.join("ctl.sock"), dir: dir.to_path_buf(), wrap: Vec::new() }
}

fn is_socket(p: &str) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket())
}

fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_service_manager_is_told_ready_status_watchdog_reload_and_stop() {
    let _g = serial();
    let dir = test_dir("notify");
    let notify = dir.join("notify.sock");
    let mut mgr = Manager::bind(&notify);
    let ports = [PortSpec::server("vm1"), PortSpec::server("vm2")];
    let text = Switch::config_text(&dir, &[1], &ports, "");
    let mut sw = start_notified(&dir, &text, &notify, Some(200_000));
    let ready = mgr.wait("READY=1", "READY=1", &mut sw);
    // READY=1 means everything is there: the control socket answers, both ports listen, the
    // poll thread runs.
    assert!(sw.try_ctl("version").is_ok(), "READY=1 before the control socket answers");
    assert!(is_socket(&sw.sock("vm1")) && is_socket(&sw.sock("vm2")), "READY=1 before the ports listen");
    assert!(thread_names(sw.child.id()).iter().any(|n| n == "pmd0"), "READY=1 before the poll thread runs");
    assert!(ready.contains("STATUS=0 of 2 vhost-user ports connected, 1 poll threads"), "{ready}");
    // The watchdog: WATCHDOG_USEC=200 ms, so a ping every 100 ms.
    for _ in 0..3 {
        mgr.wait("WATCHDOG=1", "WATCHDOG=1", &mut sw);
    }
    // A VM connects: STATUS follows.
    let _vm = Vm::connect(&sw.sock("vm1"));
    mgr.wait("STATUS with one port connected", "STATUS=1 of 2 vhost-user ports connected", &mut sw);
    // A reload (ExecReload is `pvswitchctl reload`): RELOADING=1 with the monotonic time, then READY=1.
    sw.write_config(&Switch::config_text(
        &dir,
        &[1],
        &[ports[0].clone(), ports[1].clone(), PortSpec::server("vm3")],
        "",
    ));
    sw.ctl("reload");
    let reloading = mgr.wait("RELOADING=1", "RELOADING=1", &mut sw);
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    let after = mgr.wait("READY=1 after the reload", "READY=1", &mut sw);
    assert!(after.contains("STATUS=1 of 3 vhost-user ports connected"), "{after}");
    // SIGTERM: STOPPING=1.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(sw.child.id() as i32, libc::SIGTERM) };
    mgr.wait("STOPPING=1", "STOPPING=1", &mut sw);
}

#[test]
fn without_a_watchdog_no_pings_are_sent() {
    let _g = serial();
    let dir = test_dir("notify-nowd");
    let notify = dir.join("notify.sock");
    let mut mgr = Manager::bind(&notify);
    let text = Switch::config_text(&dir, &[1], &[PortSpec::server("vm1")], "");
    let mut sw = start_notified(&dir, &text, &notify, None);
    mgr.wait("READY=1", "READY=1", &mut sw);
    // Ask something and wait for a once-a-second sample: still no WATCHDOG=1.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(1500) {
        sw.ctl("version");
        let mut buf = [0u8; 4096];
        if let Ok(n) = mgr.sock.recv(&mut buf) {
            mgr.got.push(String::from_utf8_lossy(&buf[..n]).to_string());
        }
    }
    assert!(!mgr.got.iter().any(|m| m.contains("WATCHDOG=1")), "{:?}", mgr.got);
}

#[test]
fn a_second_daemon_on_the_same_configuration_is_refused() {
    let _g = serial();
    let sw = Switch::start("second", &[1], &[PortSpec::server("vm1"), PortSpec::server("vm2")]);
    let err_path = sw.dir.join("second.log");
    let mut second = Command::new(env!("CARGO_BIN_EXE_pvswitchd"))
        .arg("--config")
        .arg(sw.dir.join("pvswitch.toml"))
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    // It either exits, or gets as far as being ready (then it took over: the test fails).
    let status = wait_for("the second pvswitchd to exit or start", || {
        if let Some(st) = second.try_wait().unwrap() {
            return Some(Ok(st));
        }
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        err.contains("ready:").then_some(Err(err))
    });
    let err = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = second.kill();
    let _ = second.wait();
    let status = status.unwrap_or_else(|e| panic!("a second pvswitchd started on the same configuration:\n{e}"));
    assert!(!status.success(), "a second pvswitchd exited successfully:\n{err}");
    assert!(err.contains("another pvswitchd is running") && err.contains("refusing to start"), "{err}");
    // The first one lost nothing: its control socket and its ports still answer.
    sw.ctl("ports");
    let vm = Vm::connect(&sw.sock("vm1"));
    sw.wait_running("vm1", 1);
    drop(vm);
}

#[test]
fn a_crashed_runs_sockets_are_replaced_but_never_a_file_that_is_not_a_socket() {
    let _g = serial();
    let mut sw = Switch::start("stale", &[1], &[PortSpec::server("vm1"), PortSpec::server("vm2")]);
    // kill -9: the socket files stay behind.
    sw.child.kill().unwrap();
    sw.child.wait().unwrap();
    assert!(is_socket(sw.ctl.to_str().unwrap()) && is_socket(&sw.sock("vm1")), "kill -9 should leave the sockets");
    // vm2's path is now a regular file someone else owns: never removed, only that port fails.
    std::fs::remove_file(sw.sock("vm2")).unwrap();
    std::fs::write(sw.sock("vm2"), "not a socket").unwrap();
    let text = std::fs::read_to_string(sw.dir.join("pvswitch.toml")).unwrap();
    let sw2 = Switch::start_config(sw.dir.clone(), &text);
    let vm = Vm::connect(&sw2.sock("vm1"));
    sw2.wait_running("vm1", 1);
    drop(vm);
    assert_eq!(std::fs::read_to_string(sw2.sock("vm2")).unwrap(), "not a socket");
    let p = sw2.port("vm2");
    assert!(p["last_error"].as_str().unwrap_or("").contains("not a socket"), "{p}");
    std::mem::forget(sw); // its process is gone; sw2 owns the directory now
}

#[test]
fn install_and_uninstall_leave_nothing_behind() {
    let Some(_g) = run_alone(&[Need::Cmd("systemd-analyze")]) else { return };
    let root = env!("CARGO_MANIFEST_DIR");
    let t = test_dir("install");
    let (prefix, etc, units) = (t.join("usr"), t.join("etc"), t.join("units"));
    let install = |extra: &[&str]| {
        let out = Command::new("bash")
            .arg(format!("{root}/scripts/install.sh"))
            .args(["--no-build", "--prefix", prefix.to_str().unwrap(), "--sysconfdir", etc.to_str().unwrap()])
            .args(["--unitdir", units.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "install.sh {extra:?}:\n{text}");
        text
    };
    install(&[]);
    for f in [
        "usr/sbin/pvswitchd",
        "usr/sbin/pvs-evpn",
        "usr/bin/pvswitchctl",
        "etc/pvswitch/pvswitch.toml",
        "units/pvswitchd.service",
        "units/pvs-evpn.service",
    ] {
        assert!(t.join(f).exists(), "{f} not installed");
    }
    let unit = std::fs::read_to_string(units.join("pvswitchd.service")).unwrap();
    assert!(
        unit.contains(&format!(
            "ExecStart={}/sbin/pvswitchd --config {}/pvswitch/pvswitch.toml",
            prefix.display(),
            etc.display()
        )),
        "{unit}"
    );
    let evpn = std::fs::read_to_string(units.join("pvs-evpn.service")).unwrap();
    assert!(evpn.contains(&format!("ExecStart={}/sbin/pvs-evpn --ctl ", prefix.display())), "{evpn}");
    for u in [&unit, &evpn] {
        assert!(!u.contains('@'), "unfilled placeholder:\n{u}");
    }
    // The installed daemon validates the installed configuration.
    let check = Command::new(prefix.join("sbin/pvswitchd"))
        .arg("--check")
        .arg(etc.join("pvswitch/pvswitch.toml"))
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    // systemd's own check of the units (every key known, every command executable).
    for u in ["pvswitchd.service", "pvs-evpn.service"] {
        let verify = Command::new("systemd-analyze").arg("verify").arg(units.join(u)).output();
        match verify {
            Ok(v) => assert!(
                v.status.success() && v.stderr.is_empty(),
                "systemd-analyze verify {u}:\n{}{}",
                String::from_utf8_lossy(&v.stdout),
                String::from_utf8_lossy(&v.stderr)
            ),
            Err(e) => panic!("systemd-analyze: {e} (scripts/install-deps.sh installs systemd)"),
        }
    }
    // A configuration the operator edited is never overwritten.
    std::fs::write(etc.join("pvswitch/pvswitch.toml"), "# mine\n").unwrap();
    let again = install(&[]);
    assert!(again.contains("kept the existing"), "{again}");
    assert_eq!(std::fs::read_to_string(etc.join("pvswitch/pvswitch.toml")).unwrap(), "# mine\n");
    // Uninstall keeps the configuration; --purge removes it too; then nothing is left.
    install(&["--uninstall"]);
    assert!(etc.join("pvswitch/pvswitch.toml").exists());
    install(&["--uninstall", "--purge"]);
    let left: Vec<_> = walk(&t);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Every file (not directory) under `d`.
fn walk(d: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() { out.extend(walk(&p)) } else { out.push(p) }
    }
    out
}

/// `socket_mode` and `socket_group` give server-mode sockets the mode and group a VMM running
/// as another user needs; an unknown group is a configuration error at its place in the file.
#[test]
fn server_sockets_get_the_configured_mode_and_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // Only root may give a socket a group it is not in.
    let Some(_g) = run_alone(&[Need::Root]) else { return };
    let sw = Switch::start_with(
        "sockperm",
        &[1],
        &[PortSpec::server("vm1")],
        "socket_mode = \"0660\"\nsocket_group = \"daemon\"",
    );
    let m = std::fs::metadata(sw.sock("vm1")).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o660, "socket mode");
    assert_eq!(m.gid(), 1, "socket group (daemon is gid 1 on Debian)");
    let vm = Vm::connect(&sw.sock("vm1"));
    sw.wait_running("vm1", 1);
    drop(vm);
    let bad = sw.dir.join("bad.toml");
    std::fs::write(
        &bad,
        Switch::config_text(&sw.dir, &[1], &[PortSpec::server("x")], "socket_group = \"no-such-group\""),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pvswitchd")).arg("--check").arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("socket_group: no group \"no-such-group\"") && err.contains("bad.toml:"), "{err}");
}
