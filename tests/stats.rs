//! Machine-readable output keeps its fields, and the Prometheus endpoint serves the counters.

mod common;

use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;

fn has(v: &serde_json::Value, fields: &[&str], what: &str) {
    for f in fields {
        assert!(v.get(f).is_some(), "{what}: field {f} missing in {v}");
    }
}

/// The documented JSON fields (README, "pvswitchctl --json") are all there.
#[test]
fn json_output_keeps_its_fields() {
    let _g = serial();
    let sw = Switch::start("json", &[1], &[PortSpec::server("a"), PortSpec::server("b").queues(2)]);
    let ctl = |args: &[&str]| -> serde_json::Value {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
            .args(["--control", sw.ctl.to_str().unwrap(), "--json"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let ports = ctl(&["ports"]);
    let p = &ports[1];
    has(
        p,
        &[
            "name",
            "id",
            "type",
            "socket",
            "mode",
            "state",
            "connects",
            "last_error",
            "features",
            "queue_pairs",
            "mtu",
            "numa_node",
            "queues",
            "rx_packets",
            "rx_bytes",
            "tx_packets",
            "tx_bytes",
            "interrupts",
            "drops",
        ],
        "ports",
    );
    assert_eq!(p["queues"].as_array().unwrap().len(), 4);
    has(
        &p["queues"][1],
        &["index", "kind", "size", "enabled", "running", "error", "poll_thread", "rx_packets"],
        "queue",
    );
    has(
        &p["drops"],
        &[
            "rx_ring_full",
            "rx_buffer_too_small",
            "port_down",
            "mtu_exceeded",
            "runt",
            "malformed",
            "port_security",
            "no_match",
            "flow_drop",
        ],
        "drops",
    );
    let stats = ctl(&["stats"]);
    has(&stats, &["uptime_secs", "tsc_hz", "threads"], "stats");
    has(
        &stats["threads"][0],
        &[
            "thread",
            "core",
            "numa_node",
            "queues",
            "iterations",
            "busy_cycles",
            "idle_cycles",
            "busy_pct",
            "rx_packets",
            "rx_bytes",
            "tx_packets",
            "tx_bytes",
            "cycles_per_packet",
            "avg_rx_burst",
            "avg_tx_batch",
            "interrupts",
            "drops",
            "last_interval",
        ],
        "thread",
    );
    let rxq = ctl(&["rxq"]);
    assert_eq!(rxq.as_array().unwrap().len(), 3, "{rxq}");
    has(
        &rxq[0],
        &["port", "queue", "thread", "core", "numa_node", "packets", "bytes", "cycles", "busy_share_pct"],
        "rxq",
    );
    // After two samples (one a second), rates over the last interval appear.
    wait_for("a rate interval", || ctl(&["stats"])["threads"][0]["last_interval"].is_object().then_some(()));
    has(&ctl(&["stats"])["threads"][0]["last_interval"], &["seconds", "rx_pps", "tx_pps", "busy_pct"], "interval");
    let flows = ctl(&["flows"]);
    has(&flows, &["normal_only", "flows", "missed_packets"], "flows");
    assert!(ctl(&["fdb"]).is_array());
    has(&ctl(&["version"]), &["version"], "version");
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
    ] {
        assert!(body.contains(line), "missing {line} in\n{body}");
    }
    assert!(http(&addr, "GET /nope HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
    assert!(http(&addr, "garbage\r\n\r\n").starts_with("HTTP/1.0 400"));
    assert!(http(&addr, &format!("GET /{} HTTP/1.0\r\n\r\n", "x".repeat(10000))).starts_with("HTTP/1.0 400"));
    // The control socket still answers after all that.
    sw.ctl("version");
}
