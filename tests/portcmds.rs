//! Ports at run time, as an orchestrator drives them: `pvswitchctl add-port`, `set-port`,
//! `del-port` and `ports NAME`, with the exit codes a script acts on, the drop-in files that
//! keep the ports across a restart, and what is refused (nothing else disturbed).

use crate::common;
use crate::frontend;

use std::path::Path;
use std::process::Command;

use common::*;
use frontend::Vm;
use pvswitch::proto::{PortInfo, PortReply};
use serde_json::Value;

/// `pvswitchctl --json ARGS`: exit status, the JSON reply (Null if none), stderr.
fn ctl(sw: &Switch, args: &[&str]) -> (i32, Value, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .args(["--control", sw.ctl.to_str().unwrap(), "--json"])
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (o.status.code().unwrap_or(-1), v, String::from_utf8_lossy(&o.stderr).into_owned())
}

fn ok(sw: &Switch, args: &[&str]) -> Value {
    let (code, v, err) = ctl(sw, args);
    assert_eq!(code, 0, "pvswitchctl {args:?}: {err}\n{}", sw.log());
    v
}

/// `ok`, its JSON read as the command's reply type (`PortReply`, `PortInfo`).
fn ok_as<T: serde::de::DeserializeOwned>(sw: &Switch, args: &[&str]) -> T {
    let v = ok(sw, args);
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("pvswitchctl {args:?}: {e}: {v}"))
}

/// Refused with exit status `code`, stderr holding `text`.
fn refused(sw: &Switch, args: &[&str], code: i32, text: &str) {
    let (got, _, err) = ctl(sw, args);
    assert_eq!(got, code, "pvswitchctl {args:?}: {err}");
    assert!(err.contains(text), "pvswitchctl {args:?}: expected {text:?} in {err:?}");
}

fn names(sw: &Switch) -> Vec<String> {
    sw.ports().into_iter().map(|p| p.name).collect()
}

/// a forwards a broadcast to b.
fn forwards(sw: &Switch, a: &mut Vm, b: &mut Vm, seq: u32) {
    let f = frame([0xff; 6], MAC_A, 60, 3, seq);
    a.send(&f);
    let got = wait_for(&format!("frame {seq} at the other VM"), || b.recv().pop());
    b.post_rx_buffers(1, 4096);
    assert_eq!(got, f, "{}", sw.log());
}

#[test]
fn an_added_port_carries_traffic_survives_a_restart_and_goes_with_del_port() {
    let _g = serial();
    let dir = test_dir("portcmd");
    let mut sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &[PortSpec::server("a")], ""));
    let added: PortReply =
        ok_as(&sw, &["add-port", "c", "type=vhost-user", "socket=c.sock", "mac_limit=4", "weight_packets=16"]);
    assert!(added.summary.starts_with("added port c (kept in "), "{}", added.json());
    let file = dir.join("ports.d/c.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("mac_limit = 4") && text.contains("socket = \"c.sock\""), "{text}");
    let c: PortInfo = ok_as(&sw, &["ports", "c"]);
    assert_eq!((c.mac_limit, c.weight_packets), (4, 16), "{}", c.json());
    assert_eq!(names(&sw), ["a", "c"]);

    let mut vm_a = Vm::connect(&sw.sock("a"));
    let mut vm_c = Vm::connect(&sw.sock("c"));
    sw.wait_running("a", 1);
    sw.wait_running("c", 1);
    vm_a.post_rx_buffers(64, 4096);
    vm_c.post_rx_buffers(64, 4096);
    forwards(&sw, &mut vm_a, &mut vm_c, 0);

    // set-port changes it in place: the same connection, the new limit in the data path's
    // view and in the file.
    let set: PortReply = ok_as(&sw, &["set-port", "c", "mac_limit=9", "weight_packets="]);
    assert_eq!(set.summary, "port c: weights, queues, mac_limit", "{}", set.json());
    let c = sw.port_info("c");
    assert_eq!((c.mac_limit, c.connects), (9, 1), "{}", c.json());
    assert_eq!(c.weight_packets, sw.port_info("a").weight_packets, "weight_packets= is the default again");
    assert!(std::fs::read_to_string(&file).unwrap().contains("mac_limit = 9"));
    forwards(&sw, &mut vm_a, &mut vm_c, 1);
    drop((vm_a, vm_c));

    // A restart reads the drop-in: c is back as set.
    sw.restart(false);
    assert_eq!(names(&sw), ["a", "c"]);
    assert_eq!(sw.port_info("c").mac_limit, 9);
    // So does a reload of the main file.
    let r = sw.reload();
    assert_eq!(names(&sw), ["a", "c"], "{}", r.json());

    let gone: PortReply = ok_as(&sw, &["del-port", "c"]);
    assert_eq!(gone.summary, "removed port c");
    assert_eq!(names(&sw), ["a"]);
    assert!(!file.exists(), "c.toml stays after del-port");
    assert!(!Path::new(&sw.sock("c")).exists(), "c's socket stays after del-port");
    sw.restart(false);
    assert_eq!(names(&sw), ["a"]);
}

#[test]
fn port_commands_refuse_with_exit_codes_and_disturb_nothing() {
    let _g = serial();
    let dir = test_dir("portcmd-bad");
    let sw = Switch::start_config(
        dir.clone(),
        &Switch::config_text(&dir, &[1], &[PortSpec::server("a"), PortSpec::server("b")], "max_ports = 3"),
    );
    let mut vm_a = Vm::connect(&sw.sock("a"));
    let mut vm_b = Vm::connect(&sw.sock("b"));
    sw.wait_running("a", 1);
    sw.wait_running("b", 1);
    vm_b.post_rx_buffers(64, 4096);
    forwards(&sw, &mut vm_a, &mut vm_b, 0);

    // Exists (4), and the idempotent form.
    refused(&sw, &["add-port", "a", "type=vhost-user", "socket=x.sock"], 4, "port \"a\" exists");
    // --may-exist: the same port is "unchanged"; a port of that name that is another (another
    // socket, mode, queue count or MAC) is not the one asked for.
    ok(&sw, &["add-port", "--may-exist", "a", "type=vhost-user", "socket=a.sock"]);
    refused(&sw, &["add-port", "--may-exist", "a", "type=vhost-user", "socket=x.sock"], 4, "with another socket");
    refused(
        &sw,
        &["add-port", "--may-exist", "a", "type=vhost-user", "socket=a.sock", "mode=client"],
        4,
        "another mode",
    );
    refused(&sw, &["add-port", "--may-exist", "a", "type=vhost-user", "socket=a.sock", "queues=2"], 4, "queue count");
    let mac = r#"allowed_macs=["02:00:00:00:00:01"]"#;
    refused(&sw, &["add-port", "--may-exist", "a", "type=vhost-user", "socket=a.sock", mac], 4, "allowed_macs");
    // Not found (5), and the idempotent form.
    refused(&sw, &["del-port", "nope"], 5, "no port \"nope\"");
    refused(&sw, &["set-port", "nope", "mtu=9000"], 5, "no port \"nope\"");
    refused(&sw, &["ports", "nope"], 5, "no port \"nope\"");
    ok(&sw, &["del-port", "--if-exists", "nope"]);
    // Invalid (3): the validator's own message, positioned in the port's text.
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=d.sock", "mac_limit=0"], 3, "mac_limit");
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=d.sock", "colour=blue"], 3, "unknown field `colour`");
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=b.sock"], 3, "b.sock");
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=/run/d.sock"], 3, "outside socket_dir");
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=../d.sock"], 3, "outside socket_dir");
    std::fs::create_dir(dir.join("real")).unwrap();
    std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=link/d.sock"], 3, "a symbolic link; not followed");
    // A run-time port names nothing of the host through DPDK's device arguments (a file
    // truncated, a socket listening outside socket_dir, a host interface attached), and takes
    // no name its drop-in could not keep (hidden files are never read back) or that a command
    // line would read as an option.
    let victim = dir.join("victim");
    std::fs::write(&victim, "keep me").unwrap();
    for device in [
        format!("device=net_pcap1,tx_pcap={}", victim.display()),
        format!("device=net_vhost3,iface={}", dir.join("elsewhere.sock").display()),
        "device=net_af_packet0,iface=lo".to_string(),
        "device=net_tap0,iface=pvsevil0".to_string(),
    ] {
        refused(&sw, &["add-port", "evil", "type=dpdk", &device], 3, "runtime_vdevs");
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(!dir.join("elsewhere.sock").exists());
    refused(&sw, &["set-port", "a", "device=net_pcap1,tx_pcap=/x"], 3, "change it there and reload");
    refused(&sw, &["add-port", ".vm9", "type=vhost-user", "socket=vm9.sock"], 3, "beginning with a letter");
    for name in ["-vm9", "--help"] {
        // After `--` a name is the command's, and refused as a name, not taken as an option.
        refused(&sw, &["add-port", "--", name, "type=vhost-user", "socket=vm9.sock"], 2, &format!("found \"{name}\""));
    }
    refused(&sw, &["add-port", "--may-exist", "--help", "type=vhost-user"], 2, "usage");
    // The port limit (max_ports = 3): a third port fits, a fourth is refused, and fits again
    // once the third is gone.
    ok(&sw, &["add-port", "c", "type=vhost-user", "socket=c.sock"]);
    refused(&sw, &["add-port", "d", "type=vhost-user", "socket=d.sock"], 3, "at most 3 ports (max_ports)");
    ok(&sw, &["del-port", "c"]);
    ok(&sw, &["add-port", "d", "type=vhost-user", "socket=d.sock"]);
    ok(&sw, &["del-port", "d"]);
    // The main file's ports are the operator's.
    refused(&sw, &["del-port", "a"], 3, "change it there and reload");
    refused(&sw, &["set-port", "b", "mtu=9000"], 3, "change it there and reload");
    // A malformed command line (2) is refused by pvswitchctl, and by pvswitchd on the wire.
    refused(&sw, &["add-port", "d", "socket"], 2, "expected KEY=VALUE");
    let e = sw.try_ctl_args("add-port", &["d", "socket"]).unwrap_err();
    assert!(e.contains("expected KEY=VALUE"), "{e}");

    assert_eq!(names(&sw), ["a", "b"]);
    let files = std::fs::read_dir(dir.join("ports.d")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(files, 0, "a refused command left a file");
    forwards(&sw, &mut vm_a, &mut vm_b, 1);
    assert_eq!(sw.port_info("a").connects, 1);
}

#[test]
fn two_orchestrators_adding_and_removing_at_once_leave_files_and_ports_agreeing() {
    let _g = serial();
    let dir = test_dir("portcmd-race");
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &[PortSpec::server("a")], ""));
    std::thread::scope(|s| {
        for t in 0..2 {
            let sw = &sw;
            s.spawn(move || {
                for i in 0..15 {
                    // Both work on the same names, one adding while the other removes.
                    let name = format!("p{}", i % 4);
                    if (i + t) % 2 == 0 {
                        let sock = format!("socket={name}.sock");
                        ok(sw, &["add-port", "--may-exist", &name, "type=vhost-user", &sock]);
                    } else {
                        ok(sw, &["del-port", "--if-exists", &name]);
                    }
                }
            });
        }
    });
    let mut running = names(&sw);
    running.retain(|n| n != "a");
    running.sort();
    let mut kept: Vec<String> = std::fs::read_dir(dir.join("ports.d"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().trim_end_matches(".toml").to_string()).collect())
        .unwrap_or_default();
    kept.sort();
    assert_eq!(running, kept, "ports running and ports kept differ");
    for n in &running {
        assert!(Path::new(&sw.sock(n)).exists(), "{n} runs without its socket");
    }
    assert_eq!(sw.port_info("a").state, "listening");
}

#[test]
fn a_broken_port_file_fails_alone_at_startup() {
    let _g = serial();
    let dir = test_dir("portcmd-start");
    std::fs::create_dir_all(dir.join("ports.d")).unwrap();
    let d = dir.display();
    std::fs::write(
        dir.join("ports.d/good.toml"),
        format!("name = \"good\"\ntype = \"vhost-user\"\nsocket = \"{d}/good.sock\"\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("ports.d/bad.toml"),
        format!("name = \"bad\"\ntype = \"vhost-user\"\nsocket = \"{d}/bad.sock\"\nmtu = 1\n"),
    )
    .unwrap();
    let sw = Switch::start_config(dir.clone(), &Switch::config_text(&dir, &[1], &[PortSpec::server("a")], ""));
    assert_eq!(names(&sw), ["a", "good"]);
    let log = sw.log();
    assert!(log.contains("ports.d/bad.toml:4:7") && log.contains("mtu"), "{log}");
    // A reload says so too.
    let r = sw.reload();
    assert!(r.summary.contains("1 port files failed"), "{}", r.json());
}
