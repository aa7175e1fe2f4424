//! pvswitchctl: asks a running pvswitchd over its control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::Duration;

use pvswitch::config::DEFAULT_CONTROL_SOCKET;
use serde_json::{Value, json};

const USAGE: &str = "usage: pvswitchctl [--control PATH] [--json] [--watch SECONDS] COMMAND
commands:
  ports     each port: connection state, negotiated features, queues, rx/tx/drop counters
  stats     each poll thread: core, NUMA node, queues, busy/idle cycles, frames, rates over the
            last second, burst sizes, cycles per frame, interrupts, drops by reason
            (stats --clear restarts what stats shows; ports and Prometheus keep totals)
  rxq       each receive queue: its poll thread and its share of that thread's busy cycles
  fdb       learned MAC addresses
  flows     the flow table with per-flow packet and byte counters (ovs-ofctl dump-flows style)
  trace F   which flow a frame with fields F (in_port=vm1,dl_dst=...,tcp,...) hits, and what happens
  reload    re-read the configuration file and apply it (as SIGHUP does)
  rebalance [roundrobin|cycles|group]
            recompute receive-queue placement (default: rxq_assign) and move queues live
  move P:Q N
            move receive queue Q of port P to poll thread N, live
  version   pvswitchd's version";

fn main() -> ExitCode {
    let mut control = std::env::var("PVSWITCH_CONTROL").unwrap_or_else(|_| DEFAULT_CONTROL_SOCKET.to_string());
    let mut as_json = false;
    let mut watch: Option<f64> = None;
    let mut command = None;
    let mut rest: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--control" => control = args.next().unwrap_or_default(),
            "--json" => as_json = true,
            "--clear" => rest.push(a.clone()),
            "--watch" => watch = args.next().and_then(|s| s.parse().ok()),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            c if command.is_none() && !c.starts_with('-') => command = Some(c.to_string()),
            c if command.is_some() && !c.starts_with("--") => rest.push(c.to_string()),
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(command) = command else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    loop {
        match request(&control, &command, &rest) {
            Ok(result) => {
                if as_json {
                    println!("{}", serde_json::to_string_pretty(&result).unwrap());
                } else {
                    print_human(&command, &result);
                }
            }
            Err(e) => {
                eprintln!("pvswitchctl: {e}");
                return ExitCode::FAILURE;
            }
        }
        match watch {
            Some(s) if s > 0.0 => std::thread::sleep(Duration::from_secs_f64(s)),
            _ => return ExitCode::SUCCESS,
        }
    }
}

fn request(path: &str, command: &str, args: &[String]) -> Result<Value, String> {
    let mut s = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            format!("pvswitchd is not running (no control socket at {path}: {e})")
        }
        _ => format!("cannot reach pvswitchd at {path}: {e}"),
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let req = json!({ "command": command, "args": args }).to_string();
    s.write_all(req.as_bytes()).and_then(|_| s.write_all(b"\n")).map_err(|e| format!("sending request: {e}"))?;
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).map_err(|e| format!("reading reply: {e}"))?;
    let v: Value = serde_json::from_str(&line).map_err(|e| format!("malformed reply: {e}"))?;
    if v["ok"].as_bool() == Some(true) {
        Ok(v["result"].clone())
    } else {
        Err(v["error"].as_str().unwrap_or("unknown error").to_string())
    }
}

fn drops_str(d: &Value) -> String {
    let parts: Vec<String> = d
        .as_object()
        .map(|m| m.iter().filter(|(_, v)| v.as_u64() != Some(0)).map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    if parts.is_empty() { "0".into() } else { parts.join(" ") }
}

fn print_human(command: &str, r: &Value) {
    match command {
        "ports" => {
            for p in r.as_array().into_iter().flatten() {
                println!(
                    "{} (id {}): {} {} {} [{}]",
                    p["name"].as_str().unwrap_or("?"),
                    p["id"],
                    p["type"].as_str().unwrap_or(""),
                    p["mode"].as_str().unwrap_or(""),
                    p["socket"].as_str().unwrap_or(""),
                    p["state"].as_str().unwrap_or("")
                );
                let feats: Vec<&str> =
                    p["features"].as_array().into_iter().flatten().filter_map(|f| f.as_str()).collect();
                println!("  features: {}", if feats.is_empty() { "-".into() } else { feats.join(" ") });
                println!(
                    "  rx: {} packets {} bytes   tx: {} packets {} bytes   interrupts: {}",
                    p["rx_packets"], p["rx_bytes"], p["tx_packets"], p["tx_bytes"], p["interrupts"]
                );
                println!("  drops: {}", drops_str(&p["drops"]));
                for q in p["queues"].as_array().into_iter().flatten() {
                    let state = if !q["error"].is_null() {
                        format!("STOPPED: {}", q["error"].as_str().unwrap_or(""))
                    } else if q["running"].as_bool() == Some(true) {
                        "running".into()
                    } else {
                        "stopped".into()
                    };
                    let owner = if q["poll_thread"].is_null() {
                        String::new()
                    } else {
                        format!(" poll thread {}", q["poll_thread"])
                    };
                    println!(
                        "  queue {} {} size {} {}{}",
                        q["index"],
                        q["kind"].as_str().unwrap_or(""),
                        q["size"],
                        state,
                        owner
                    );
                }
                if let Some(e) = p["last_error"].as_str() {
                    // A failed port's error is why it is not running; another port's is the
                    // last thing that happened to its connection.
                    let what = if p["state"] == "failed" { "failed" } else { "last event" };
                    println!("  {what}: {e}");
                }
            }
        }
        "stats" if r["cleared"] == json!(true) => println!("counters cleared"),
        "stats" => {
            println!(
                "uptime {} s{}",
                r["uptime_secs"],
                match r["cleared_secs_ago"].as_f64() {
                    Some(s) => format!(", counters cleared {s:.0} s ago"),
                    None => String::new(),
                }
            );
            for t in r["threads"].as_array().into_iter().flatten() {
                println!("poll thread {} on core {} (NUMA node {}):", t["thread"], t["core"], t["numa_node"]);
                let qs: Vec<&str> = t["queues"].as_array().into_iter().flatten().filter_map(|q| q.as_str()).collect();
                println!("  queues: {}", qs.join(" "));
                println!(
                    "  iterations {}  busy {:.1}% ({} cycles)  idle {} cycles",
                    t["iterations"],
                    t["busy_pct"].as_f64().unwrap_or(0.0),
                    t["busy_cycles"],
                    t["idle_cycles"]
                );
                println!(
                    "  rx {} frames {} bytes  tx {} frames {} bytes  interrupts {}",
                    t["rx_packets"], t["rx_bytes"], t["tx_packets"], t["tx_bytes"], t["interrupts"]
                );
                println!(
                    "  {:.0} cycles/frame  avg burst taken {:.1}  avg batch delivered {:.1}",
                    t["cycles_per_packet"].as_f64().unwrap_or(0.0),
                    t["avg_rx_burst"].as_f64().unwrap_or(0.0),
                    t["avg_tx_batch"].as_f64().unwrap_or(0.0)
                );
                let l = &t["last_interval"];
                if l.is_object() {
                    println!(
                        "  last {:.1} s: rx {:.0} frames/s  tx {:.0} frames/s  busy {:.1}%  {:.0} cycles/frame",
                        l["seconds"].as_f64().unwrap_or(0.0),
                        l["rx_pps"].as_f64().unwrap_or(0.0),
                        l["tx_pps"].as_f64().unwrap_or(0.0),
                        l["busy_pct"].as_f64().unwrap_or(0.0),
                        l["cycles_per_packet"].as_f64().unwrap_or(0.0)
                    );
                }
                println!("  drops: {}", drops_str(&t["drops"]));
            }
        }
        "rxq" => {
            for q in r.as_array().into_iter().flatten() {
                let l = &q["last_interval"];
                println!(
                    "thread {} core {}  {}:{}  numa {}  {} frames  busy share {:.1}% overall{}",
                    q["thread"],
                    q["core"],
                    q["port"].as_str().unwrap_or("?"),
                    q["queue"],
                    q["numa_node"],
                    q["packets"],
                    q["busy_share_pct"].as_f64().unwrap_or(0.0),
                    if l.is_object() {
                        format!(
                            ", {:.1}% last {:.1} s ({:.0} frames/s)",
                            l["busy_share_pct"].as_f64().unwrap_or(0.0),
                            l["seconds"].as_f64().unwrap_or(0.0),
                            l["pps"].as_f64().unwrap_or(0.0)
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
        "fdb" => {
            for e in r.as_array().into_iter().flatten() {
                println!("{}  {}", e["mac"].as_str().unwrap_or(""), e["port"].as_str().unwrap_or("?"));
            }
        }
        "reload" => println!("reloaded: {}", r["summary"].as_str().unwrap_or("")),
        "rebalance" => {
            let moved: Vec<&str> = r["moved"].as_array().into_iter().flatten().filter_map(|m| m.as_str()).collect();
            println!(
                "{}: {} queues moved in {} us; load spread {:.2} -> {:.2}",
                r["policy"].as_str().unwrap_or(""),
                moved.len(),
                r["took_us"],
                r["spread_before"].as_f64().unwrap_or(0.0),
                r["spread_after"].as_f64().unwrap_or(0.0)
            );
            for m in moved {
                println!("  {m}");
            }
            for w in r["warnings"].as_array().into_iter().flatten() {
                println!("  warning: {}", w.as_str().unwrap_or(""));
            }
        }
        "flows" => {
            if r["normal_only"] == json!(true) {
                println!("no flows: every frame takes actions=NORMAL (MAC learning)");
            }
            for f in r["flows"].as_array().into_iter().flatten() {
                println!(
                    " duration={:.3}s, n_packets={}, n_bytes={}, {}",
                    f["duration_secs"].as_f64().unwrap_or(0.0),
                    f["n_packets"],
                    f["n_bytes"],
                    f["flow"].as_str().unwrap_or("")
                );
            }
            if r["missed_packets"].as_u64().unwrap_or(0) > 0 {
                println!(" (no flow matched: n_packets={}, n_bytes={})", r["missed_packets"], r["missed_bytes"]);
            }
        }
        "trace" => {
            for s in r["steps"].as_array().into_iter().flatten() {
                println!("{}", s.as_str().unwrap_or(""));
            }
        }
        _ => println!("{}", serde_json::to_string_pretty(r).unwrap()),
    }
}
