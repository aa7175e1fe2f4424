//! Machine-readable output keeps its fields, and the Prometheus endpoint serves the counters.

use crate::common;
use crate::frontend;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;

use pvswitch::datapath::counters::{DROP_REASONS, LoopCounters, PortCounters, RxqStats};
use pvswitch::proto;
use serde_json::Value;
use std::collections::BTreeSet;

/// The field names README's "JSON" list gives for `command` (the backticked words of its
/// bullet, the command's own name left out).
fn documented(command: &str) -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let readme = &readme[readme.find("**JSON**").expect("README's JSON section")..];
    let start = readme.find(&format!("\n- `{command}`:")).unwrap_or_else(|| panic!("README documents no `{command}`"));
    let rest = &readme[start + 1..];
    let end = rest[1..].find("\n- ").map_or(rest.len(), |i| i + 1);
    let end = end.min(rest.find("\n\n").unwrap_or(rest.len()));
    // The first backticked word is the bullet's own name.
    rest[..end].split('`').skip(1).step_by(2).skip(1).map(|w| w.to_string()).collect()
}

/// Every key of every object in `v`, however deep.
fn keys(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.insert(k.clone());
                keys(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
        _ => {}
    }
}

/// `v` read into its type in `proto`.
fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}\n{v:#}"))
}

/// `output`'s keys and README's list for `command` are the same set (keys under `skip`, maps
/// keyed by data such as drop reasons, left out).
fn same_fields(command: &str, output: &Value, skip: &[&str]) {
    let mut have = BTreeSet::new();
    let mut v = output.clone();
    strip(&mut v, skip);
    keys(&v, &mut have);
    let doc = documented(command);
    let undocumented: Vec<_> = have.difference(&doc).collect();
    let missing: Vec<_> = doc.difference(&have).collect();
    assert!(undocumented.is_empty(), "`{command}` has fields README does not list: {undocumented:?}");
    assert!(missing.is_empty(), "README lists `{command}` fields the output lacks: {missing:?}\n{output:#}");
}

/// Replaces the contents of every object under a key in `skip` by nothing.
fn strip(v: &mut Value, skip: &[&str]) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if skip.contains(&k.as_str()) {
                    if let Value::Object(inner) = x {
                        inner.clear();
                    }
                    if let Value::Array(inner) = x {
                        inner.clear();
                    }
                } else {
                    strip(x, skip);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip(x, skip)),
        _ => {}
    }
}

/// The JSON of every command has exactly the fields README documents, and the counters and
/// drop reasons README names are the ones `datapath::counters` declares.
#[test]
fn json_output_matches_its_documentation() {
    let _g = serial();
    let dir = test_dir("json");
    let ports = [PortSpec::server("a"), PortSpec::server("b").queues(2)];
    // An [ipfix] table, so `stats` carries its `flow_export` object (null without one); the
    // collector is a socket nobody reads.
    let collector = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let text = format!(
        "flows = [\"priority=1,actions=normal\"]\n{}[ipfix]\ncollector = \"{}\"\n",
        Switch::config_text(&dir, &[1], &ports, ""),
        collector.local_addr().unwrap()
    );
    let sw = Switch::start_config(dir, &text);
    let ctl = |args: &[&str]| -> Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
            .args(["--control", sw.ctl.to_str().unwrap(), "--json"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    // A connected frontend, so every field has a value worth checking.
    let _vm = frontend::Vm::connect(&sw.sock("a"));
    sw.wait_running("a", 1);
    let ports = ctl(&["ports"]);
    assert_eq!(ports[1]["queues"].as_array().unwrap().len(), 4);
    same_fields("ports", &ports, &["drops"]);
    for (name, _) in PortCounters::FIELDS {
        assert!(ports[0].get(name).is_some(), "ports: counter {name} missing");
        assert!(documented("ports").contains(*name), "README does not list port counter {name}");
    }
    let reasons: BTreeSet<String> = DROP_REASONS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(documented("drops"), reasons, "README's drop reasons differ from datapath::counters");
    let in_output: BTreeSet<String> = ports[0]["drops"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(in_output, reasons);

    // After two samples (one a second), rates over the last interval appear.
    wait_for("a rate interval", || ctl(&["stats"])["threads"][0]["last_interval"].is_object().then_some(()));
    let stats = ctl(&["stats"]);
    same_fields("stats", &stats, &["drops"]);
    let rxq = ctl(&["rxq"]);
    assert_eq!(rxq.as_array().unwrap().len(), 3, "{rxq}");
    wait_for("an rxq interval", || ctl(&["rxq"])[0]["last_interval"].is_object().then_some(()));
    same_fields("rxq", &ctl(&["rxq"]), &[]);
    for (name, _) in RxqStats::FIELDS {
        assert!(rxq[0].get(name).is_some(), "rxq: counter {name} missing");
    }
    same_fields("flows", &ctl(&["flows"]), &[]);
    assert!(ctl(&["fdb"]).is_array());
    assert!(ctl(&["version"]).get("version").is_some());
    // And each reads back into its type in ctl::proto (what pvswitchctl's human output does).
    let ports: Vec<proto::PortInfo> = typed(&ports);
    assert_eq!(ports[1].queues.len(), 4);
    let stats: proto::StatsReply = typed(&stats);
    assert!(stats.threads[0].last_interval.is_some());
    let rxq = ctl(&["rxq"]);
    let rxq: Vec<proto::RxqInfo> = typed(&rxq);
    assert_eq!(rxq.len(), 3);
    let flows = ctl(&["flows"]);
    let flows: proto::FlowsReply = typed(&flows);
    assert_eq!(flows.flows[0].priority, 1);
}

fn http(addr: &str, req: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn prometheus_endpoint_serves_counters() {
    let _g = serial();
    let port = 19464 + (std::process::id() % 1000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let sw = Switch::start_with(
        "prom",
        &[1],
        &[PortSpec::server("a"), PortSpec::server("b")],
        &format!("metrics_listen = \"{addr}\""),
    );
    let body = http(&addr, "GET /metrics HTTP/1.0\r\n\r\n");
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    for line in [
        "# TYPE pvswitch_port_rx_packets_total counter",
        "pvswitch_port_rx_packets_total{port=\"a\"} 0",
        "pvswitch_port_drops_total{port=\"b\",reason=\"rx_ring_full\"} 0",
        "pvswitch_rxq_packets_total{port=\"a\",queue=\"0\",thread=\"0\"} 0",
        "pvswitch_pmd_busy_cycles_total{thread=\"0\",core=\"1\"}",
        "pvswitch_uptime_seconds ",
    ] {
        assert!(body.contains(line), "missing {line} in\n{body}");
    }
    // Every declared counter is exported, with its help text.
    let families = [("pmd", LoopCounters::FIELDS), ("port", PortCounters::FIELDS), ("rxq", RxqStats::FIELDS)];
    for (family, fields) in families {
        for (name, help) in fields {
            let metric = format!("pvswitch_{family}_{name}_total");
            assert!(body.contains(&format!("# HELP {metric} {help}")), "missing {metric} in\n{body}");
        }
    }
    for (reason, _) in DROP_REASONS {
        assert!(body.contains(&format!("reason=\"{reason}\"")), "missing drop reason {reason}");
    }
    assert!(http(&addr, "GET /nope HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
    assert!(http(&addr, "garbage\r\n\r\n").starts_with("HTTP/1.0 400"));
    assert!(http(&addr, &format!("GET /{} HTTP/1.0\r\n\r\n", "x".repeat(10000))).starts_with("HTTP/1.0 400"));
    // The control socket still answers after all that.
    sw.ctl("version");
}
