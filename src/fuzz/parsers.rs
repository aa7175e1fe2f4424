//! Targets: the flow parser (`flow::parse_flow`, ovs-ofctl syntax) and the configuration
//! parser (`Config::parse`, TOML text; and the same text as one port's keys added to a running
//! configuration, `Config::parse_port`). All read what an operator typed; none may panic, and
//! every error must point inside the text it was given.

use std::sync::OnceLock;

use super::{Rng, Target, bit, fuzz, regressions, shape};
use crate::config::{Config, ConfigError};
use crate::flow::parse_flow;

const FLOW_DICT: &[&[u8]] = &[
    b"actions=",
    b"output:",
    b"priority=",
    b"in_port=",
    b"dl_src=",
    b"dl_dst=",
    b"dl_type=0x0800",
    b"dl_vlan=",
    b"dl_vlan_pcp=",
    b"vlan_tci=",
    b"nw_src=",
    b"nw_dst=",
    b"nw_proto=",
    b"nw_tos=",
    b"tp_src=",
    b"tp_dst=",
    b"ip",
    b"arp",
    b"tcp",
    b"udp",
    b"icmp",
    b"sctp",
    b"normal",
    b"NORMAL",
    b"flood",
    b"all",
    b"drop",
    b"in_port",
    b"strip_vlan",
    b"mod_vlan_vid:",
    b"mod_vlan_pcp:",
    b"push_vlan:0x8100",
    b"mod_dl_src:",
    b"mod_dl_dst:",
    b"vm1",
    b"vm2",
    b"uplink",
    b",",
    b" ",
    b"=",
    b":",
    b"/",
    b"0x",
    b"65535",
    b"65536",
    b"4294967295",
    b"10.0.0.0/24",
    b"255.255.255.255",
    b"02:00:00:00:00:01",
    b"ff:ff:ff:ff:ff:ff/01:00:00:00:00:00",
    b"\xc3\xa9",
    b"\xe2\x82\xac",
    b"\xf0\x9f\x92\xa9",
    b"\t",
];

fn port(s: &str) -> Option<u16> {
    match s {
        "vm1" => Some(1),
        "vm2" => Some(2),
        "uplink" => Some(0),
        _ => None,
    }
}

/// Each line of the input is one flow.
fn run_flows(input: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(input);
    let mut bits = 0u64;
    for line in text.split('\n') {
        match parse_flow(line, &port) {
            Ok(f) => {
                // What parsed once parses the same again: the parser keeps no state.
                assert_eq!(parse_flow(line, &port).ok(), Some(f.clone()), "{line:?}");
                bits |= bit(&[1, f.actions.len().min(3) as u64]);
            }
            Err(e) => {
                assert!(e.offset <= line.len(), "{line:?}: error offset {} past the end: {e}", e.offset);
                assert!(line.is_char_boundary(e.offset), "{line:?}: error offset {} inside a character", e.offset);
                assert!(!e.message.is_empty());
                bits |= shape(&e.message);
            }
        }
    }
    bits
}

/// A flow from pieces of the grammar.
fn gen_flow(rng: &mut Rng) -> Vec<u8> {
    let mut s = String::new();
    if rng.one_in(2) {
        s += &format!("priority={},", rng.below(70000));
    }
    let fields = [
        "in_port=vm1",
        "in_port=uplink",
        "dl_src=02:00:00:00:00:01",
        "dl_dst=ff:ff:ff:ff:ff:ff",
        "dl_type=0x0806",
        "dl_vlan=10",
        "dl_vlan=0xffff",
        "dl_vlan_pcp=3",
        "vlan_tci=0x1000/0x1000",
        "ip",
        "arp",
        "tcp",
        "udp",
        "icmp",
        "nw_src=10.0.0.1",
        "nw_dst=10.0.0.0/24",
        "nw_dst=10.0.0.0/255.255.0.0",
        "nw_proto=17",
        "nw_tos=16",
        "tp_src=1000/0xff00",
        "tp_dst=22",
    ];
    for _ in 0..rng.below(5) {
        s += *rng.pick(&fields);
        s += if rng.one_in(3) { " " } else { "," };
    }
    let actions = [
        "normal",
        "drop",
        "flood",
        "all",
        "in_port",
        "output:vm2",
        "vm1",
        "output:uplink",
        "strip_vlan",
        "mod_vlan_vid:5",
        "mod_vlan_pcp:7",
        "push_vlan:0x8100",
        "mod_dl_src:02:00:00:00:00:09",
        "mod_dl_dst:02:00:00:00:00:0a",
    ];
    s += "actions=";
    for i in 0..1 + rng.below(4) {
        if i > 0 {
            s += ",";
        }
        s += *rng.pick(&actions);
    }
    s.into_bytes()
}

pub const FLOW: Target =
    Target { name: "flow", max_len: 512, run: run_flows, generate: Some(gen_flow), mutate: None, dict: FLOW_DICT };

const CONFIG_DICT: &[&[u8]] = &[
    b"[switch]\n",
    b"[[port]]\n",
    b"[dpdk]\n",
    b"[[port.queue]]\n",
    b"[[queue]]\n",
    b"index = ",
    b"device = \"net_ring0\"\n",
    b"name = \"nic\"\n",
    b"flows = [\n",
    b"]\n",
    b"\"",
    b"'''",
    b"\"\"\"",
    b"\\u00e9",
    b"\\n",
    b"\\\\",
    b"\xc3\xa9",
    b"\xe2\x82\xac",
    b"name = \"vm1\"\n",
    b"type = \"vhost-user\"\n",
    b"type = \"dpdk\"\n",
    b"socket = \"vm1.sock\"\n",
    b"mode = \"client\"\n",
    b"mtu = ",
    b"poll_cores = ",
    b"\"auto\"",
    b"[0, 1]",
    b"poll_mode = \"adaptive\"\n",
    b"allowed_macs = [\"02:00:00:00:00:01\"]\n",
    b"socket_group = \"kvm\"\n",
    b"socket_mode = \"0660\"\n",
    b"queue_pairs = ",
    b"affinity = ",
    b"weight_packets = ",
    b"weight_bytes = ",
    b"mac_limit = ",
    b"max_guest_memory_mib = ",
    b"max_memory_regions = ",
    b"offloads = false\n",
    b"burst = ",
    b"4294967296",
    b"-1",
    b"0",
    b"1e10",
    b"actions=normal",
    b"actions=output:vm1",
    b"in_port=vm1,",
    b"\n",
    b" = ",
    b"#",
    b",",
];

fn run_config(input: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(input);
    // An error points at a line of the text (line 1 of an empty text).
    let positioned = |e: &ConfigError| {
        let lines = text.split('\n').count();
        assert!(e.line >= 1 && e.line <= lines.max(1), "line {} of {lines}: {e}", e.line);
        assert!(e.col >= 1, "column {}: {e}", e.col);
        shape(&e.message)
    };
    let file = match Config::parse("fuzz.toml", &text) {
        Ok(c) => bit(&[1, c.ports.len().min(4) as u64, c.flows.len().min(4) as u64]),
        Err(e) => positioned(&e),
    };
    // The same text as one port's keys, added to a running configuration (an add-port request).
    static RUNNING: OnceLock<Config> = OnceLock::new();
    let running = RUNNING.get_or_init(|| Config::parse("running.toml", RUNNING_CONFIG).expect("valid"));
    let port = match running.parse_port("add-port", &text) {
        Ok(p) => bit(&[2, p.queue_cfg.len().min(4) as u64, p.type_name().len() as u64]),
        Err(e) => positioned(&e),
    };
    file | port
}

/// What `run_config` adds a port to: two ports, two poll cores, a socket directory.
const RUNNING_CONFIG: &str = "[switch]\npoll_cores = [0, 1]\nsocket_dir = \"/run/x\"\n\
    [[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"vm1.sock\"\n\
    [[port]]\nname = \"nic\"\ntype = \"vhost-user\"\nsocket = \"nic.sock\"\n";

/// Splices lines: a config is a list of lines, and most mutations that matter move, repeat or
/// drop a whole one.
fn mutate_lines(rng: &mut Rng, v: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(v).into_owned();
    let mut lines: Vec<&str> = text.split('\n').collect();
    if lines.is_empty() {
        return;
    }
    let i = rng.below(lines.len());
    match rng.below(3) {
        0 => {
            lines.remove(i);
        }
        1 => {
            let l = lines[rng.below(lines.len())];
            lines.insert(i, l);
        }
        _ => {
            let j = rng.below(lines.len());
            lines.swap(i, j);
        }
    }
    *v = lines.join("\n").into_bytes();
}

pub const CONFIG: Target = Target {
    name: "config",
    max_len: 8192,
    run: run_config,
    generate: None,
    mutate: Some(mutate_lines),
    dict: CONFIG_DICT,
};

#[test]
fn flow() {
    fuzz(&FLOW);
}

#[test]
fn flow_regressions() {
    regressions(&FLOW);
}

#[test]
fn config() {
    fuzz(&CONFIG);
}

#[test]
fn config_regressions() {
    regressions(&CONFIG);
}
