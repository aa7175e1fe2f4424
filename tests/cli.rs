//! The command-line contract: config errors, --check, the control socket's answers to bad
//! requests, and pvswitchctl without a daemon.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;

fn pvswitchd(args: &[&str]) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_pvswitchd")).args(args).output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout),
    )
}

#[test]
fn config_errors_name_file_line_column_and_exit_2() {
    let dir = test_dir("cli-config");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[switch]\npoll_cores = [1]\n\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"/tmp/x.sock\"\nqueues = \"two\"\n").unwrap();
    for mode in ["--config", "--check"] {
        let (code, out) = pvswitchd(&[mode, bad.to_str().unwrap()]);
        assert_eq!(code, 2, "{out}");
        assert!(out.contains(&format!("{}:8:10:", bad.display())), "{out}");
        assert!(out.contains("queues = \"two\""), "the offending line is shown: {out}");
    }
    let (code, out) = pvswitchd(&["--config", dir.join("missing.toml").to_str().unwrap()]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("cannot read"), "{out}");
    let (code, out) = pvswitchd(&["--check", concat!(env!("CARGO_MANIFEST_DIR"), "/conf/pvswitch.toml")]);
    assert_eq!(code, 0, "the shipped config is valid: {out}");
    let (code, out) = pvswitchd(&["--check", concat!(env!("CARGO_MANIFEST_DIR"), "/conf/pvswitch.example.toml")]);
    assert_eq!(code, 0, "the example config is valid: {out}");
}

fn raw_request(sw: &Switch, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(&sw.ctl).unwrap();
    s.write_all(bytes).unwrap();
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).unwrap();
    line
}

#[test]
fn control_socket_survives_bad_requests() {
    let _g = serial();
    let sw = Switch::start("cli-ctl", &[1], &[PortSpec::server("vm1")]);
    for (req, want) in [
        (&b"not json\n"[..], "malformed request"),
        (b"{\"command\": 7}\n", "malformed request"),
        (b"{\"command\": \"reboot\"}\n", "unknown command"),
        (b"\xff\xfe\n", "malformed request"),
    ] {
        let r = raw_request(&sw, req);
        assert!(r.contains("\"ok\":false") && r.contains(want), "{r}");
    }
    let huge = vec![b'x'; 100 * 1024];
    let r = raw_request(&sw, &huge);
    assert!(r.contains("larger than"), "{r}");
    // A client that connects and goes away without a request.
    drop(UnixStream::connect(&sw.ctl).unwrap());
    // The daemon still answers, and pvswitchctl renders it.
    let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "ports"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("vm1 (id 0): vhost-user server") && text.contains("[listening]"), "{text}");
    let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "--json", "stats"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["threads"][0]["core"], 1);
}

#[test]
fn pvswitchctl_without_daemon_says_so() {
    let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", "/tmp/pvs-test/nobody.sock", "ports"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("pvswitchd is not running"));
}
