//! A reload applies every setting of the example configuration or says it cannot. Each key of
//! conf/pvswitch.example.toml (the commented ones too) is changed on its own on a running
//! pvswitchd and then changed back, and one of these holds:
//! - `Live`: the running switch follows, seen where it runs: the poll threads' own record of
//!   their tuning (`stats` `running`), the socket file, the data path's buckets and counters,
//!   the port replaced with the reply saying why;
//! - `Restart`: the reply names it as taking effect at restart;
//! - `Elsewhere`: another reload test checks the data path for it (named);
//! - `AtUse`: the control thread reads it from the running configuration each time it acts on
//!   it (placement, rebalancing, the next memory table), so there is no copy to go stale.
//!
//! A key the example gains without a case here fails the test.

use crate::common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use pvswitch::proto::{MirrorInfo, PollMode, PortInfo, RebalanceReply, Request, ThreadStats, VtepInfo, VxlanInfo};

enum Expect {
    Live(fn(&Switch, &Path, &str)),
    Restart(&'static str),
    Elsewhere(&'static str),
    AtUse(&'static str),
}
use Expect::*;

/// Where a case's lines go.
#[derive(Clone, Copy, PartialEq)]
enum At {
    Top,
    Switch,
    PortA,
    QueueA,
    Nic,
    Dpdk,
    /// A `[[vtep]]` on nic0, after everything else.
    Vtep,
    /// A `[[security_group]]` (or a `[[mirror]]`) of its own, after the base's group "web".
    Group,
}

struct Case {
    /// The example's section and key it covers.
    section: &'static str,
    key: &'static str,
    at: At,
    lines: &'static str,
    expect: Expect,
}

const fn case(section: &'static str, key: &'static str, at: At, lines: &'static str, expect: Expect) -> Case {
    Case { section, key, at, lines, expect }
}

/// The running switch's configuration with `extra` lines in section `at`: ports a and b
/// (vhost-user), nic0 (net_ring), one adaptive poll thread, a security group "web" no port is
/// in.
fn config(dir: &Path, at: At, extra: &str) -> String {
    let put = |here: At| if here == at { format!("{extra}\n") } else { String::new() };
    // The base's [switch] lines, less those the case sets itself.
    let key = |l: &str| l.split_once(" = ").map(|(k, _)| k.to_string());
    let own: Vec<String> = if at == At::Switch { extra.lines().filter_map(key).collect() } else { vec![] };
    let dir_line = format!("socket_dir = \"{}\"", dir.display());
    let base = ["poll_cores = [1]", &dir_line, "control_socket = \"ctl.sock\"", "poll_mode = \"adaptive\""];
    let base: String = base.iter().filter(|l| !own.contains(&key(l).unwrap())).map(|l| format!("{l}\n")).collect();
    format!(
        "{top}[switch]\n{base}{sw}\
         [[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"\n{a}{q}\
         [[port]]\nname = \"b\"\ntype = \"vhost-user\"\nsocket = \"b.sock\"\n\
         [[port]]\nname = \"nic0\"\ntype = \"dpdk\"\ndevice = \"net_ring0\"\n{nic}\
         [dpdk]\n{dpdk}{vtep}\
         [[security_group]]\nname = \"web\"\n{group}",
        top = put(At::Top),
        sw = put(At::Switch),
        a = put(At::PortA),
        q = if at == At::QueueA { format!("[[port.queue]]\n{extra}\n") } else { String::new() },
        nic = put(At::Nic),
        dpdk = put(At::Dpdk),
        vtep = put(At::Vtep),
        group = put(At::Group),
    )
}

/// A `[[vtep]]` on nic0 with `$extra` lines, one VNI and its remote 10.9.0.2 (`$remote`
/// lines replace the VNI's).
macro_rules! vtep {
    ($extra:literal) => {
        vtep!($extra, "[[vtep.vni]]\nvni = 100\nvlan = 10\nremotes = [\"10.9.0.2\"]\n")
    };
    ($extra:literal, $vni:literal) => {
        concat!("[[vtep]]\nname = \"vt\"\nunderlay = \"nic0\"\nlocal_ip = \"10.9.0.1/24\"\n", $extra, $vni)
    };
}

/// A `[[security_group]]` "g" with one ingress rule of `$extra` lines.
macro_rules! group {
    ($extra:literal) => {
        concat!("[[security_group]]\nname = \"g\"\n[[security_group.rule]]\ndirection = \"ingress\"\n", $extra)
    };
}

/// What a group's own key changes: the plans' rules, which datapath::tests::secgroups and
/// tests/secgroups.rs (QEMU guests, a rule removed live) check in the data path.
const GROUP_DATA_PATH: &str = "secgroups.rs";

fn groups_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("security groups changed"), "{summary}");
}

/// An `[ipfix]` table exporting to a port nobody listens on, with `$extra` lines.
macro_rules! ipfix {
    ($extra:literal) => {
        concat!("[ipfix]\ncollector = \"127.0.0.1:9\"\n", $extra)
    };
}

fn export_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("flow export changed"), "{summary}");
}

/// A `[[vrf]]` "t" with one network, of `$extra` lines after its name.
macro_rules! vrf {
    ($extra:literal) => {
        concat!("[[vrf]]\nname = \"t\"\n", $extra, "[[vrf.network]]\nvlan = 100\ngateway = \"10.1.0.1/24\"\n")
    };
}

fn vrfs_changed(_: &Switch, _: &Path, summary: &str) {
    assert!(summary.contains("vrfs changed"), "{summary}");
}

/// A `[[mirror]]` "m" of `$extra` lines (after its name and output, b).
macro_rules! mirror {
    ($extra:literal) => {
        concat!("[[mirror]]\nname = \"m\"\noutput_port = \"b\"\n", $extra)
    };
}

/// The running mirror, after a reload that said mirrors changed.
fn mirror_now(sw: &Switch, summary: &str) -> MirrorInfo {
    assert!(summary.contains("mirrors changed"), "{summary}");
    let mut m = sw.mirrors();
    assert_eq!(m.len(), 1, "{}", m.json());
    assert_eq!((m[0].name.as_str(), m[0].output_port.as_str(), m[0].active), ("m", "b", true), "{}", m.json());
    m.remove(0)
}

/// The tunnel port of a `vtep!` case's remote.
fn tunnel(sw: &Switch, remote: &str) -> PortInfo {
    let p = sw.port_info(&format!("vt-{remote}"));
    assert_eq!(p.kind, "vxlan", "{}", p.json());
    p
}

/// The tunnel port of a `vtep!` case's remote: its `vxlan` object.
fn tunnel_vxlan(sw: &Switch, remote: &str) -> VxlanInfo {
    let p = tunnel(sw, remote);
    p.vxlan.clone().unwrap_or_else(|| panic!("no vxlan: {}", p.json()))
}

fn vtep(sw: &Switch) -> VtepInfo {
    let mut v = sw.vteps();
    assert_eq!(v.len(), 1, "{}", v.json());
    v.remove(0)
}

fn thread(sw: &Switch) -> ThreadStats {
    sw.thread_stats(0)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn stat(sw: &Switch, port: &str) -> std::fs::Metadata {
    std::fs::symlink_metadata(sw.sock(port)).unwrap()
}

fn replaced(summary: &str, port: &str, why: &str) {
    assert!(summary.contains(&format!("replaced: {port} ({why})")), "{summary}");
}

mod cases;
use cases::CASES;

/// The keys conf/pvswitch.example.toml sets or shows commented out, by section.
fn example_keys() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/pvswitch.example.toml")).unwrap();
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim();
        // A section header, or one shown commented out (`# [[mirror]]`).
        let header = l.strip_prefix('#').map(str::trim).filter(|h| {
            let name = h.trim_matches(|c| c == '[' || c == ']');
            h.starts_with('[') && h.ends_with(']') && name.chars().all(|c| c.is_ascii_lowercase() || "_.".contains(c))
        });
        if let Some(s) = header.or(Some(l)).and_then(|h| h.strip_prefix('[')) {
            section = s.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        // `key = ...`, or a commented-out `# key = ...` (a word, a space, an equals sign).
        let l = l.strip_prefix('#').map_or(l, str::trim);
        if let Some((k, _)) = l.split_once(" = ")
            && !k.is_empty()
            && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            keys.insert((section.clone(), k.to_string()));
        }
    }
    keys
}

#[test]
fn every_setting_of_the_example_is_applied_live_or_named() {
    let Some(_g) = run_alone(TESTPMD) else { return };
    let dir = test_dir("rl-every");
    std::fs::create_dir_all(dir.join("pd2")).unwrap();
    std::fs::write(dir.join("pd2/c.toml"), "name = \"c\"\ntype = \"vhost-user\"\nsocket = \"c.sock\"\n").unwrap();
    let sw = Switch::start_config(dir.clone(), &config(&dir, At::Top, ""));
    let base_ids: Vec<u16> = ["a", "b", "nic0"].iter().map(|p| sw.port_info(p).id).collect();

    let covered: BTreeSet<(String, String)> = CASES.iter().map(|c| (c.section.into(), c.key.into())).collect();
    let missing: Vec<_> = example_keys().difference(&covered).cloned().collect();
    assert!(missing.is_empty(), "example settings no case here changes: {missing:?}");

    for c in CASES {
        // Cases whose change is a port's identity spell the whole port.
        let text = match (c.section, c.key) {
            (_, "socket_dir") => config(&dir, At::Top, "").replace(
                &format!("socket_dir = \"{}\"", dir.display()),
                &format!("socket_dir = \"{}\"", dir.join("alt").display()),
            ),
            ("port", "name") => config(&dir, At::Top, "").replace("name = \"a\"", "name = \"a2\""),
            (_, "type") => config(&dir, At::Top, "").replace(
                "name = \"a\"\ntype = \"vhost-user\"\nsocket = \"a.sock\"",
                "name = \"a\"\ntype = \"dpdk\"\ndevice = \"net_ring7\"",
            ),
            ("port", "socket") => config(&dir, At::Top, "").replace("socket = \"a.sock\"", "socket = \"a-new.sock\""),
            (_, "device") => config(&dir, At::Top, "").replace("net_ring0", "net_ring1"),
            _ => config(&dir, c.at, c.lines),
        };
        if c.key == "socket_dir" {
            std::fs::create_dir_all(dir.join("alt")).unwrap();
        }
        sw.write_config(&text);
        let summary = match sw.try_reload() {
            Ok(r) => r.summary,
            Err(e) => panic!("{}.{}: reload refused: {e}\n{text}", c.section, c.key),
        };
        match &c.expect {
            Live(check) => check(&sw, &dir, &summary),
            Restart(name) => {
                assert!(summary.contains(name) && summary.contains("take effect at restart"), "{}: {summary}", c.key)
            }
            Elsewhere(test) => assert!(!summary.contains("restart"), "{}: {summary} (its data path: {test})", c.key),
            AtUse(place) => assert!(!summary.contains("restart"), "{}: {summary} (read at use by {place})", c.key),
        }
        // And back: the reply for that says nothing of restarting either way but the same.
        sw.write_config(&config(&dir, At::Top, ""));
        let back = sw.reload().summary;
        if !matches!(c.expect, Restart(_)) {
            assert!(!back.contains("restart") || c.key == "socket_dir", "{} back: {back}", c.key);
        }
        for p in ["a", "b"] {
            let port = sw.port_info(p);
            assert_eq!(port.state, "listening", "{} back: port {p}: {}", c.key, port.json());
        }
    }
    // Ports never replaced by a case kept their ids.
    assert_eq!(sw.port_info("b").id, base_ids[1]);
    // The poll thread runs the file's tuning again.
    let r = thread(&sw).running;
    assert_eq!((r.burst, r.rx_retry_us), (32, 100), "{}", r.json());
}
