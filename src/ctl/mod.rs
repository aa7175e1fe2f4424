//! The control protocol: one JSON object per line each way over the control socket.
//! Request `{"command": "ports"}`; reply `{"ok": true, "result": ...}` or
//! `{"ok": false, "error": "..."}`. Field names in results are stable (pvswitchctl --json).

pub mod flows;
pub mod stats;

use serde_json::{Value, json};

use crate::port::PortKind;
use crate::port::vhost::{VringStatus, feature_names};
use crate::switch::{Endpoints, Switch};

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

/// The command a request line names, if it is well formed.
pub fn command(req: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(req).ok()?;
    v.get("command")?.as_str().map(String::from)
}

/// Answers one request line. `ep` is the control loop's side of the ports (for reload).
pub fn handle(c: &mut Switch, ep: &mut dyn Endpoints, req: &[u8]) -> String {
    let v: Value = match serde_json::from_slice(req) {
        Ok(v) => v,
        Err(e) => return error_reply(&format!("malformed request: {e}")),
    };
    let Some(cmd) = v.get("command").and_then(|c| c.as_str()) else {
        return error_reply("malformed request: expected {\"command\": \"...\"}");
    };
    let result = match cmd {
        "ports" => ports(c),
        "stats" if args(&v).iter().any(|a| a == "--clear") => {
            c.clear_stats();
            json!({ "cleared": true })
        }
        "stats" => stats::stats(c),
        "rxq" => stats::rxq(c),
        "fdb" => fdb(c),
        "version" => json!({"version": env!("CARGO_PKG_VERSION")}),
        "flows" => flows::flows(c),
        "trace" => match flows::trace(c, &args(&v)) {
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
        "reload" => match c.reload(ep) {
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

fn ports(c: &Switch) -> Value {
    let mut out = Vec::new();
    for ps in c.ports.iter().flatten() {
        let p = &ps.port;
        let t = c.port_totals(p.id);
        let status = ps.link.as_ref().map(|l| &l.status);
        let rxq_counter = |q: usize, f: fn(&crate::datapath::counters::RxqStats) -> &std::sync::atomic::AtomicU64| {
            c.rxq_stats.get(&(p.id, q)).map(|s| f(s).load(std::sync::atomic::Ordering::Relaxed))
        };
        let mut queues = Vec::new();
        match &p.kind {
            PortKind::VhostUser(vq) => {
                for (i, lock) in vq.all().iter().enumerate() {
                    let broken = lock.lock().broken.map(|e| e.as_str());
                    let vs = status.and_then(|s| s.vrings.get(i)).copied().unwrap_or(VringStatus::default());
                    let tx = i % 2 == 1;
                    queues.push(json!({
                        "index": i,
                        "kind": if tx { "guest_tx" } else { "guest_rx" },
                        "size": vs.size,
                        "enabled": vs.enabled,
                        "running": vs.running,
                        "error": broken,
                        "poll_thread": if tx { c.owner((p.id, i / 2)).map(|o| json!(o)) } else { None },
                        "rx_packets": if tx { rxq_counter(i / 2, |s| &s.packets) } else { None },
                        "rx_bytes": if tx { rxq_counter(i / 2, |s| &s.bytes) } else { None },
                    }));
                }
            }
            // A NIC's receive queues.
            PortKind::Nic(_) | PortKind::Failed => {
                for q in 0..p.rx_queues() {
                    queues.push(json!({"index": q, "kind": "nic_rx", "poll_thread": c.owner((p.id, q)),
                        "rx_packets": rxq_counter(q, |s| &s.packets), "rx_bytes": rxq_counter(q, |s| &s.bytes)}));
                }
            }
        }
        let vhost = ps.cfg.vhost_user();
        out.push(json!({
            "name": p.name(),
            "id": p.id,
            "type": ps.cfg.type_name(),
            "device": ps.cfg.dpdk().map(|d| d.device.clone()),
            "dpdk": p.nic().map(|n| n.info()),
            "socket": vhost.map_or(String::new(), |v| v.socket.display().to_string()),
            "mode": vhost.map_or("server", |v| match v.mode {
                crate::config::SocketMode::Server => "server",
                crate::config::SocketMode::Client => "client",
            }),
            "state": ps.state(),
            "connects": ps.connects,
            "connected_secs": ps.link.as_ref().map(|l| l.since.elapsed().as_secs()),
            "last_error": ps.last_error,
            "features": feature_names(status.map_or(0, |s| s.features)),
            // What each direction negotiated: the guest may send (tx) and can take (rx).
            "offloads": vhost.map(|v| {
                let f = status.map_or(0, |s| s.features);
                let names = |n: crate::wire::gso::Negotiated| {
                    [("csum", n.csum), ("tso4", n.tso4), ("tso6", n.tso6), ("ecn", n.ecn)]
                        .into_iter()
                        .filter_map(|(k, on)| on.then_some(k))
                        .collect::<Vec<_>>()
                };
                json!({
                    "offered": v.offloads,
                    "guest_sends": names(crate::wire::gso::Negotiated::host(f)),
                    "guest_takes": names(crate::wire::gso::Negotiated::guest(f)),
                })
            }),
            "memory_regions": status.map_or(0, |s| s.memory_regions),
            "memory_bytes": status.map_or(0, |s| s.memory_bytes),
            "max_memory_regions": ps.cfg.mem_limits.max_regions,
            "max_guest_memory_mib": ps.cfg.mem_limits.max_bytes >> 20,
            "macs_learned": c.mac.learned(p.id),
            "mac_limit": ps.cfg.mac_limit,
            "numa_node": ps.numa_node(),
            "queue_pairs": p.rx_queues(),
            "mtu": ps.cfg.mtu,
            "weight_packets": ps.cfg.weight_packets,
            "weight_bytes": ps.cfg.weight_bytes,
            "queues": queues,
        }));
        stats::merge(out.last_mut().unwrap(), &t);
    }
    Value::Array(out)
}

fn fdb(c: &Switch) -> Value {
    let mut v: Vec<Value> = c
        .mac
        .entries()
        .into_iter()
        .map(|(m, p)| json!({ "mac": m.to_string(), "port": c.port(p as usize).map(|ps| ps.name().to_string()) }))
        .collect();
    v.sort_by_key(|e| e["mac"].as_str().unwrap_or("").to_string());
    Value::Array(v)
}
