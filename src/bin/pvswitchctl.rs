//! pvswitchctl: asks a running pvswitchd over its control socket.

use std::process::ExitCode;
use std::time::Duration;

use pvswitch::config::DEFAULT_CONTROL_SOCKET;
use pvswitch::ctl::human;
use pvswitch::proto::{Client, CtlError, Request};
use serde_json::value::RawValue;

const USAGE: &str = "usage: pvswitchctl [--control PATH] [--json] [--watch SECONDS] COMMAND
commands:
  ports [NAME|GLOB]
            each port (or one, or those a glob such as 'vm1*' matches): connection state,
            negotiated features, queues, rx/tx/drop counters
  add-port [--may-exist] NAME KEY=VALUE...
            add a port (the keys of a [[port]] table: type=vhost-user socket=PATH mode=client ...),
            kept in the port directory (ports.d) across restarts
  del-port [--if-exists] NAME
            remove a port added with add-port, and its file
  set-port NAME KEY=VALUE...
            change settings of a port added with add-port (KEY= returns one to its default)
  stats     each poll thread: core, NUMA node, queues, busy/idle cycles, frames, rates over the
            last second, burst sizes, cycles per frame, interrupts, drops by reason
            (stats --clear restarts what stats shows; ports and Prometheus keep totals)
  rxq       each receive queue: its poll thread and its share of that thread's busy cycles
  fdb       learned MAC addresses
  flows     the flow table with per-flow packet and byte counters (ovs-ofctl dump-flows style)
  trace F   which flow a frame with fields F (in_port=vm1,dl_dst=...,tcp,...) hits, and what happens
  trace --live [-c COUNT] PORT [FILTER...]
            the next COUNT (default 1) real frames PORT sends that match FILTER (a tcpdump
            expression), each with what the data path did: offloads, VLAN, flows met, the MAC
            table's answer, every output (and how the frame leaves it) or the drop and its reason
  reload    re-read the configuration file and apply it (as SIGHUP does)
  rebalance [roundrobin|cycles|group]
            recompute receive-queue placement (default: rxq_assign) and move queues live
  move P:Q N
            move receive queue Q of port P to poll thread N, live
  vteps     each VTEP: its VNIs, the MACs local to this host, what its control plane said
  vtep-sync VTEP STATE
            a VTEP's whole remote state (JSON), from its control plane (pvs-evpn)
  conntrack [PORT|zone=N]
            connections security groups track (every port's, or one's): counts, limits, each
            connection as its first frame went, which way it opened, whether a rule change cut
            it; and those flows' ct() actions track (every zone's, or zone N's), with their marks
  conntrack-flush PORT|zone=N
            forget a port's tracked connections (their next frames meet the rules as new ones),
            or a flows' zone's
  capture [--direction in|out|both] [--drops] [-c COUNT] [-s SNAPLEN] [-w FILE|-] PORT... [--] [FILTER...]
            live capture of ports' frames as pcapng (tcpdump -r and tshark -r read it): what each
            port sent (in) and was given (out), --drops: frames dropped on the way in with their
            reason; FILTER is a tcpdump expression, run where the frame is; -w - (or a pipe):
            to standard output, e.g. pvswitchctl capture vm1 -w - icmp | tcpdump -nr -
  mirrors   each [[mirror]]: what it selects, its output, the copies made and dropped, and the
            ports it names that are absent
  add-mirror NAME output_port=PORT [select_src_port=P,..] [select_dst_port=P,..] [select_all=true]
            [select_vlan=V,..] [snaplen=N]
            a mirror, running at once, until del-mirror or pvswitchd stops (kept across reloads)
  del-mirror [--if-exists] NAME
            remove a mirror add-mirror added
  vrfs      each [[vrf]]: its gateway MAC, its networks and gateways, the neighbours routed to
  version   pvswitchd's version
`--` ends the options: every argument after it is the command's (a NAME beginning with -).
exit status: 0 done, 1 failed (or pvswitchd unreachable), 2 bad command line,
             3 invalid request or setting, 4 already exists, 5 not found";

fn main() -> ExitCode {
    let mut control = std::env::var("PVSWITCH_CONTROL").unwrap_or_else(|_| DEFAULT_CONTROL_SOCKET.to_string());
    let mut as_json = false;
    let mut watch: Option<f64> = None;
    let mut command = None;
    let mut rest: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    // After `--` every argument is the command's, whatever it looks like (a name a script
    // passes on, even one beginning with `-`).
    let mut operands = false;
    let mut write_to: Option<String> = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            c if operands => match command {
                None => command = Some(c.to_string()),
                Some(_) => rest.push(c.to_string()),
            },
            "--" => operands = true,
            "--control" => control = args.next().unwrap_or_default(),
            "--json" => as_json = true,
            "--clear" | "--may-exist" | "--if-exists" | "--drops" | "--live" => rest.push(a.clone()),
            // capture's options with a value (the value is a plain word that follows).
            "-c" | "-s" | "-Q" | "--direction" | "--count" | "--snaplen" if command.is_some() => rest.push(a.clone()),
            "-w" if command.is_some() => write_to = Some(args.next().unwrap_or_default()),
            "--watch" => watch = args.next().and_then(|s| s.parse().ok()),
            // Usage only as the request itself: after a command, an option this tool does not
            // know is an error (a script that passed `--help` as a port name must not be told
            // it succeeded).
            "-h" | "--help" if command.is_none() => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            c if command.is_none() && !c.starts_with('-') => command = Some(c.to_string()),
            c if command.is_some() && !c.starts_with('-') => rest.push(c.to_string()),
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
    let request = match Request::from_parts(&command, &rest) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pvswitchctl: {e}");
            return ExitCode::from(2);
        }
    };
    let client = Client::new(&control);
    if let Request::Capture { .. } = request {
        return capture(&client, &request, write_to.as_deref(), as_json);
    }
    if let Request::TraceLive { .. } = request {
        if write_to.is_some() {
            eprintln!("pvswitchctl: -w is capture's option (trace --live prints what it traces)");
            return ExitCode::from(2);
        }
        return capture(&client, &request, None, as_json);
    }
    if write_to.is_some() {
        eprintln!("pvswitchctl: -w is capture's option");
        return ExitCode::from(2);
    }
    loop {
        let out =
            client.ask_raw(&request).and_then(|result| output(&request, &result, as_json).map_err(CtlError::from));
        match out {
            Ok(text) => print!("{text}"),
            Err(e) => {
                eprintln!("pvswitchctl: {}", e.message);
                return ExitCode::from(e.code.map_or(1, |c| c.exit_status()));
            }
        }
        match watch {
            Some(s) if s > 0.0 => std::thread::sleep(Duration::from_secs_f64(s)),
            _ => return ExitCode::SUCCESS,
        }
    }
}

/// `--json`: the daemon's result as it sent it (pretty, streamed from its text: no tree of it is
/// built); else the human text from its type.
fn output(request: &Request, result: &RawValue, as_json: bool) -> Result<String, String> {
    if as_json {
        let mut out = Vec::with_capacity(result.get().len() * 2);
        let mut de = serde_json::Deserializer::from_str(result.get());
        let mut ser = serde_json::Serializer::pretty(&mut out);
        serde_transcode::transcode(&mut de, &mut ser).map_err(|e| format!("malformed reply: {e}"))?;
        out.push(b'\n');
        String::from_utf8(out).map_err(|e| e.to_string())
    } else {
        human::render(request, result.get())
    }
}

/// `capture`: the stream's pcapng to `-w FILE` (or standard output: `-w -`, or no `-w` when it
/// is not a terminal), as it comes; what was captured and how it ended to standard error.
/// `trace --live`: each traced frame to standard output as it comes (`--json`: a line of JSON
/// each).
fn capture(client: &Client, request: &Request, write_to: Option<&str>, as_json: bool) -> ExitCode {
    use std::io::{IsTerminal, Read, Write};
    let tracing = matches!(request, Request::TraceLive { .. });
    let mut out: Box<dyn Write> = match write_to {
        None if tracing => Box::new(std::io::stdout().lock()),
        None if std::io::stdout().is_terminal() => {
            eprintln!("pvswitchctl: capture writes pcapng: give -w FILE, or pipe it (-w - | tcpdump -nr -)");
            return ExitCode::from(2);
        }
        None | Some("-") => Box::new(std::io::stdout().lock()),
        Some(path) => match std::fs::File::create(path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("pvswitchctl: {path}: {e}");
                return ExitCode::from(1);
            }
        },
    };
    let (started, mut conn) = match client.stream(request) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pvswitchctl: {}", e.message);
            return ExitCode::from(e.code.map_or(1, |c| c.exit_status()));
        }
    };
    match serde_json::from_str(started.get()) {
        Ok(s) if tracing => eprint!("{}", human::trace_started(&s)),
        Ok(s) => eprint!("{}", human::capture_started(&s)),
        Err(e) => {
            eprintln!("pvswitchctl: malformed reply: {e}");
            return ExitCode::from(1);
        }
    }
    let mut buf = Vec::new();
    loop {
        let mut hdr = [0u8; 5];
        if let Err(e) = conn.read_exact(&mut hdr) {
            eprintln!("pvswitchctl: the capture stopped without its end ({e}): pvswitchd went away?");
            return ExitCode::from(1);
        }
        let len = u32::from_le_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
        buf.resize(len, 0);
        if let Err(e) = conn.read_exact(&mut buf) {
            eprintln!("pvswitchctl: the capture stopped in a chunk ({e})");
            return ExitCode::from(1);
        }
        match pvswitch::proto::Chunk::from_byte(hdr[0]) {
            Some(pvswitch::proto::Chunk::Pcapng) => {
                if let Err(e) = out.write_all(&buf).and_then(|_| out.flush()) {
                    // The reader went away (tcpdump ended): so does the capture.
                    eprintln!("pvswitchctl: writing the capture: {e}");
                    return ExitCode::from(1);
                }
            }
            Some(pvswitch::proto::Chunk::Trace) => {
                let text = match serde_json::from_slice::<pvswitch::proto::LiveTrace>(&buf) {
                    Ok(_) if as_json => format!("{}\n", String::from_utf8_lossy(&buf)),
                    Ok(t) => human::live_trace(&t),
                    Err(e) => {
                        eprintln!("pvswitchctl: malformed trace record: {e}");
                        return ExitCode::from(1);
                    }
                };
                if out.write_all(text.as_bytes()).and_then(|_| out.flush()).is_err() {
                    return ExitCode::from(1);
                }
            }
            Some(pvswitch::proto::Chunk::End) => {
                match serde_json::from_slice(&buf) {
                    Ok(end) if tracing => eprint!("{}", human::trace_end(&end)),
                    Ok(end) => eprint!("{}", human::capture_end(&end)),
                    Err(e) => eprintln!("pvswitchctl: malformed end of capture: {e}"),
                }
                return ExitCode::SUCCESS;
            }
            None => {
                eprintln!("pvswitchctl: malformed capture stream (chunk kind {})", hdr[0]);
                return ExitCode::from(1);
            }
        }
    }
}
