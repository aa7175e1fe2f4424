//! The control protocol: one JSON object per line each way over the control socket.
//! Request `{"command": "ports"}`; reply `{"ok": true, "result": ...}` or
//! `{"ok": false, "error": "..."}`. Field names in results are stable (pvswitchctl --json).

use serde_json::{Value, json};

use crate::control::Control;
use crate::ctl_stats::drops_json;
use crate::datapath::counters::PortTotals;
use crate::port::vhost::feature_names;

/// The request's "args" strings (absent: none).
fn args(v: &Value) -> Vec<String> {
    v.get("args")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default()
}

pub fn error_reply(msg: &str) -> String {
    json!({"ok": false, "error": msg}).to_string()
}

pub fn handle(c: &mut Control, req: &[u8]) -> String {
    let v: Value = match serde_json::from_slice(req) {
        Ok(v) => v,
        Err(e) => return error_reply(&format!("malformed request: {e}")),
    };
    let Some(cmd) = v.get("command").and_then(|c| c.as_str()) else {
        return error_reply("malformed request: expected {\"command\": \"...\"}");
    };
    let result = match cmd {
        "ports" => ports(c),
        "stats" if args(&v).iter().any(|a| a == "--clear") => crate::ctl_stats::clear(c),
        "stats" => crate::ctl_stats::stats(c),
        "rxq" => crate::ctl_stats::rxq(c),
        "fdb" => fdb(c),
        "version" => json!({"version": env!("CARGO_PKG_VERSION")}),
        "flows" => crate::ctl_flows::flows(c),
        "trace" => match crate::ctl_flows::trace(c, &args(&v)) {
            Ok(r) => r,
            Err(e) => return error_reply(&e),
        },
        "rebalance" => match c.rebalance(args(&v).first().map(|s| s.as_str())) {
            Ok(r) => r,
            Err(e) => return error_reply(&format!("rebalance: {e}")),
        },
        "move" => match c.move_queue(&args(&v)) {
            Ok(r) => r,
            Err(e) => return error_reply(&e),
        },
        "reload" => match c.reload() {
            Ok(summary) => json!({"summary": summary}),
            Err(e) => return error_reply(&format!("reload rejected, running configuration unchanged: {e}")),
        },
        other => {
            return error_reply(&format!(
                "unknown command \"{other}\" (try ports, stats, rxq, fdb, flows, trace, rebalance, move, reload, version)"
            ));
        }
    };
    json!({"ok": true, "result": result}).to_string()
}

fn ports(c: &Control) -> Value {
    let mut out = Vec::new();
    for pc in c.ports.iter().flatten() {
        let p = &pc.port;
        let mut t = PortTotals::default();
        for th in &c.threads {
            t.add(&th.ports[p.id as usize]);
        }
        let (features, vr, regions) = match &pc.conn {
            Some(conn) => {
                let b = conn.backend.lock().unwrap();
                (b.features(), b.vring_status(), b.mem_regions())
            }
            None => (0, Vec::new(), 0),
        };
        let mut queues = Vec::new();
        for (i, lock) in p.vrings.iter().enumerate() {
            let broken = lock.lock().broken.map(|e| e.as_str());
            let (size, enabled, running) = vr.get(i).copied().unwrap_or((0, false, false));
            let owner = c.thread_queues.iter().position(|q| q.contains(&(p.id, i / 2)));
            let qs = if i % 2 == 1 { c.rxq_stats.get(&(p.id, i / 2)) } else { None };
            let counter = |f: fn(&crate::datapath::counters::RxqStats) -> &std::sync::atomic::AtomicU64| {
                qs.map(|s| f(s).load(std::sync::atomic::Ordering::Relaxed))
            };
            queues.push(json!({
                "index": i,
                "kind": if i % 2 == 0 { "guest_rx" } else { "guest_tx" },
                "size": size,
                "enabled": enabled,
                "running": running,
                "error": broken,
                "poll_thread": if i % 2 == 1 { owner.map(|o| json!(o)) } else { None },
                "rx_packets": counter(|s| &s.packets),
                "rx_bytes": counter(|s| &s.bytes),
            }));
        }
        if p.is_dpdk() {
            // A NIC's receive queues, and what DPDK itself counts.
            for q in 0..p.queue_pairs() {
                let owner = c.thread_queues.iter().position(|t| t.contains(&(p.id, q)));
                let qs = c.rxq_stats.get(&(p.id, q));
                let load = |f: fn(&crate::datapath::counters::RxqStats) -> &std::sync::atomic::AtomicU64| {
                    qs.map(|s| f(s).load(std::sync::atomic::Ordering::Relaxed))
                };
                queues.push(json!({"index": q, "kind": "nic_rx", "poll_thread": owner,
                    "rx_packets": load(|s| &s.packets), "rx_bytes": load(|s| &s.bytes)}));
            }
        }
        out.push(json!({
            "name": p.name(),
            "id": p.id,
            "type": if p.is_dpdk() { "dpdk" } else { "vhost-user" },
            "device": p.cfg.dpdk.as_ref().map(|d| d.device.clone()),
            "dpdk": p.nic.as_ref().map(|n| n.info()),
            "socket": p.cfg.socket.display().to_string(),
            "mode": format!("{:?}", p.cfg.mode).to_lowercase(),
            "state": pc.state(),
            "connects": pc.connects,
            "connected_secs": pc.conn.as_ref().map(|c| c.since.elapsed().as_secs()),
            "last_error": pc.last_error,
            "features": feature_names(features),
            "memory_regions": regions,
            "numa_node": pc.numa_node(),
            "queue_pairs": p.queue_pairs(),
            "mtu": pc.cfg.mtu,
            "weight_packets": pc.cfg.weight_packets,
            "weight_bytes": pc.cfg.weight_bytes,
            "queues": queues,
            "rx_packets": t.rx_packets,
            "rx_bytes": t.rx_bytes,
            "tx_packets": t.tx_packets,
            "tx_bytes": t.tx_bytes,
            "interrupts": t.interrupts,
            "rx_bursts": t.rx_bursts,
            "tx_batches": t.tx_batches,
            "drops": drops_json(&t.drops),
        }));
    }
    Value::Array(out)
}

fn fdb(c: &Control) -> Value {
    let mut v: Vec<Value> = c
        .mac
        .entries()
        .into_iter()
        .map(|(m, p)| {
            json!({
                "mac": m.to_string(),
                "port": c.port(p as usize).map(|pc| pc.port.name().to_string()),
            })
        })
        .collect();
    v.sort_by_key(|e| e["mac"].as_str().unwrap_or("").to_string());
    Value::Array(v)
}
