//! The control protocol, typed: every request and every reply, defined once. pvswitchd parses
//! requests into [`Request`] and answers with these types (`ctl::handle`); pvswitchctl builds a
//! [`Request`], reads the reply back into the same types and prints them (`ctl::human`). A
//! renamed or retyped field is a compile error on both sides, and `tests.rs` checks README's
//! field lists against the types.
//!
//! On the wire (one JSON object per line each way over the control socket): a request is
//! `{"command": "...", "args": ["...", ...]}` (args absent: none; strings only, others ignored);
//! a reply is `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
//!
//! A new command is one [`Request`] variant (its name, its arguments parsed in
//! [`Request::from_parts`] and written in [`Request::args`]), its reply type here, and one arm
//! in `ctl::answer` (and one in `ctl::human` for its human output; without it, pretty JSON).

mod capture;
pub mod client;
mod conntrack;
mod flows;
mod mirrors;
mod placement;
mod ports;
mod stats;
#[cfg(test)]
pub(crate) mod tests;
pub mod vrfs;
mod vteps;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use self::capture::{CaptureEnd, CaptureStarted, Chunk, Direction};
pub use self::conntrack::{ConnInfo, ConntrackReply, FlowZone, MAX_LISTED, ZoneInfo};
pub use self::flows::{FlowInfo, FlowsReply, LiveTrace, TraceReply};
pub use self::ports::{
    MigrationInfo, PortInfo, PortOffloads, PortVlanInfo, QueueInfo, QueueKind, RateCapsInfo, RateTokens, VxlanInfo,
};
pub use self::stats::{
    FlowExportStats, Parking, PollMode, RunningInfo, RxqInfo, RxqInterval, StatsReply, ThreadInterval, ThreadStats,
    WakeBucket, Wakeups, WokenBy,
};
pub use crate::config::RxqAssign;
pub use crate::datapath::counters::{DropTotals as Drops, PortTotals as Counters, RxqTotals};
pub use crate::port::nic::{NicInfo, NicOffloads, NicStats};
pub use client::Client;
pub use mirrors::MirrorInfo;
pub use placement::{Moved as MoveReply, Rebalanced as RebalanceReply};
pub use vrfs::VrfInfo;
pub use vteps::{LocalMac, RemoteMac, RemoteNeighbour, RemoteVnis, VniInfo, VtepInfo, VtepState};

/// One request: the command and its arguments, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Every port (reply: `Vec<PortInfo>`).
    Ports,
    /// Every poll thread (reply: [`StatsReply`]), or with `clear` restart what `stats` shows
    /// (reply: [`Cleared`]).
    Stats { clear: bool },
    /// Every receive queue (reply: `Vec<RxqInfo>`).
    Rxq,
    /// Learned MAC addresses (reply: `Vec<FdbEntry>`).
    Fdb,
    /// The flow table (reply: [`FlowsReply`]).
    Flows,
    /// Which flow a frame with these fields (`in_port=vm1,dl_dst=...,tcp`) hits (reply:
    /// [`TraceReply`]).
    Trace { fields: String },
    /// Recompute receive-queue placement with `mode` (default: `rxq_assign`) (reply:
    /// [`RebalanceReply`]).
    Rebalance { mode: Option<RxqAssign> },
    /// Move receive queue `queue` of `port` to poll thread `thread` (reply: [`MoveReply`]).
    Move { port: String, queue: usize, thread: usize },
    /// Re-read the configuration file (reply: [`ReloadReply`]).
    Reload,
    /// pvswitchd's version (reply: [`VersionReply`]).
    Version,
    /// One port (reply: [`PortInfo`]; error code `not-found`); or, when `name` is a glob
    /// (`*`, `?`: `vm1*`), the ports whose names match it (reply: `Vec<PortInfo>`).
    Port { name: String },
    /// Adds a port with these settings, kept in the drop-in directory (reply: [`PortReply`]).
    /// `may_exist`: a port of that name is not an error (and is left as it is).
    AddPort { name: String, settings: Vec<(String, String)>, may_exist: bool },
    /// Removes a port added at run time (reply: [`PortReply`]); `if_exists`: no such port is
    /// not an error.
    DelPort { name: String, if_exists: bool },
    /// Changes settings of a port added at run time (reply: [`PortReply`]).
    SetPort { name: String, settings: Vec<(String, String)> },
    /// VTEPs as their control plane reads them.
    Vteps,
    /// Each mirror as it runs (reply: `Vec<`[`MirrorInfo`]`>`).
    Mirrors,
    /// Adds a mirror with these settings (`[[mirror]]`'s keys) until pvswitchd stops or
    /// `DelMirror` (reply: a summary).
    AddMirror { name: String, settings: Vec<(String, String)> },
    /// Removes a mirror added at run time (reply: a summary); `if_exists`: no such mirror is
    /// not an error.
    DelMirror { name: String, if_exists: bool },
    /// Each VRF, its networks and neighbours (reply: `Vec<`[`VrfInfo`]`>`).
    Vrfs,
    /// A VTEP's remote endpoints and MACs, whole (JSON, `VtepState`).
    VtepSync { vtep: String, state: String },
    /// The connections security groups track, every port's or `port`'s (reply:
    /// [`ConntrackReply`]).
    Conntrack { port: Option<String> },
    /// Forgets the connections of `port` (reply: [`PortReply`]).
    ConntrackFlush { port: String },
    /// Captures frames of ports (reply: [`CaptureStarted`], then a stream of pcapng and a
    /// [`CaptureEnd`]: `Chunk`). `words`: port names, then a pcap-filter expression's words
    /// (`--` may end the ports); `count`: stop after so many records; `snaplen`: bytes kept
    /// of each frame (0: all).
    Capture { words: Vec<String>, direction: Direction, drops: bool, count: Option<u64>, snaplen: u32 },
    /// Traces the next `count` frames `port` sends that match `filter` (a pcap-filter
    /// expression's words), each with what the data path did with it (reply: [`CaptureStarted`],
    /// then a stream of [`LiveTrace`]s and a [`CaptureEnd`]: `Chunk`).
    TraceLive { port: String, count: u64, filter: Vec<String> },
}

/// Whether a port name given to `ports` is a glob (`*` any run of characters, `?` one).
pub fn is_glob(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// Whether `name` matches the glob `pat` (`*`: any run of characters, `?`: one; nothing else
/// is special). Linear in their lengths: a `*` is retried from where it last matched only.
pub fn glob_match(pat: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pat.chars().collect(), name.chars().collect());
    let (mut i, mut j, mut star, mut from) = (0, 0, None, 0);
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            (i, j) = (i + 1, j + 1);
        } else if i < p.len() && p[i] == '*' {
            (star, from, i) = (Some(i), j, i + 1);
        } else if let Some(s) = star {
            (i, from) = (s + 1, from + 1);
            j = from;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// Why a request was refused, for a caller that acts on it (pvswitchctl's exit status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// The request or a setting is not valid; nothing changed.
    Invalid,
    /// What it would create exists.
    Exists,
    /// What it names does not exist.
    NotFound,
}

impl ErrorCode {
    /// pvswitchctl's exit status for it (README: 3 invalid, 4 exists, 5 not found).
    pub fn exit_status(self) -> u8 {
        match self {
            ErrorCode::Invalid => 3,
            ErrorCode::Exists => 4,
            ErrorCode::NotFound => 5,
        }
    }
}

/// A refused request: what to show, and its code if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtlError {
    pub code: Option<ErrorCode>,
    pub message: String,
}

impl From<String> for CtlError {
    fn from(message: String) -> CtlError {
        CtlError { code: None, message }
    }
}

/// `add-port`, `del-port`, `set-port`: what was done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortReply {
    pub summary: String,
}

/// Every command's name, for the error about an unknown one.
pub const COMMANDS: &str = "ports, stats, rxq, fdb, flows, trace, rebalance, move, reload, version, add-port, del-port, set-port, vteps, vtep-sync, conntrack, conntrack-flush, capture, mirrors, vrfs";

const MOVE_USAGE: &str = "move: expected PORT:QUEUE THREAD, e.g. move vm1:0 1";
const TRACE_USAGE: &str = "trace: expected a frame description such as in_port=vm1,dl_dst=02:00:00:00:00:02,ip";

impl Request {
    /// Parses one request line as it comes over the control socket.
    pub fn parse(line: &[u8]) -> Result<Request, String> {
        let v: Value = serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))?;
        let Some(command) = v.get("command").and_then(|c| c.as_str()) else {
            return Err("malformed request: expected {\"command\": \"...\"}".into());
        };
        let args: Vec<String> = v
            .get("args")
            .and_then(|a| a.as_array())
            .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default();
        Request::from_parts(command, &args)
    }

    /// The request for `command` with `args` (pvswitchctl's command line, or the wire's).
    pub fn from_parts(command: &str, args: &[String]) -> Result<Request, String> {
        Ok(match command {
            "ports" => match args {
                [] => Request::Ports,
                [name] => Request::Port { name: name.clone() },
                _ => return Err("ports: expected at most one port name".into()),
            },
            "add-port" => {
                let (may_exist, rest) = flag(args, "--may-exist");
                let (name, settings) = port_settings("add-port", &rest)?;
                Request::AddPort { name, settings, may_exist }
            }
            "del-port" => {
                let (if_exists, rest) = flag(args, "--if-exists");
                let [name] = rest.as_slice() else { return Err("del-port: expected [--if-exists] NAME".into()) };
                Request::DelPort { name: name.to_string(), if_exists }
            }
            "set-port" => {
                let (name, settings) = port_settings("set-port", args)?;
                if settings.is_empty() {
                    return Err("set-port: expected NAME KEY=VALUE...".into());
                }
                Request::SetPort { name, settings }
            }
            "stats" => Request::Stats { clear: args.iter().any(|a| a == "--clear") },
            "rxq" => Request::Rxq,
            "fdb" => Request::Fdb,
            "flows" => Request::Flows,
            "trace" if args.join(",").is_empty() => return Err(TRACE_USAGE.into()),
            "trace" if args.first().is_some_and(|a| a == "--live") => parse_trace_live(&args[1..])?,
            "trace" => Request::Trace { fields: args.join(",") },
            "rebalance" => Request::Rebalance {
                mode: args.first().map(|m| m.parse()).transpose().map_err(|e| format!("rebalance: {e}"))?,
            },
            "move" => parse_move(args)?,
            "reload" => Request::Reload,
            "version" => Request::Version,
            "vteps" => Request::Vteps,
            "mirrors" => Request::Mirrors,
            "add-mirror" => {
                let (name, settings) = port_settings("add-mirror", args)?;
                Request::AddMirror { name, settings }
            }
            "del-mirror" => {
                let (if_exists, rest) = flag(args, "--if-exists");
                let [name] = rest.as_slice() else { return Err("del-mirror: expected [--if-exists] NAME".into()) };
                Request::DelMirror { name: name.to_string(), if_exists }
            }
            "vrfs" => Request::Vrfs,
            "vtep-sync" => match args {
                [vtep, state] => Request::VtepSync { vtep: vtep.clone(), state: state.clone() },
                _ => return Err("vtep-sync: expected VTEP STATE (JSON: {\"remotes\": [...], \"macs\": [...]})".into()),
            },
            "conntrack" => match args {
                [] => Request::Conntrack { port: None },
                [port] => Request::Conntrack { port: Some(port.clone()) },
                _ => return Err("conntrack: expected at most one port name".into()),
            },
            "conntrack-flush" => match args {
                [port] => Request::ConntrackFlush { port: port.clone() },
                _ => return Err("conntrack-flush: expected PORT".into()),
            },
            "capture" => parse_capture(args)?,
            other => return Err(format!("unknown command \"{other}\" (try {COMMANDS})")),
        })
    }

    /// The command's name on the wire.
    pub fn command(&self) -> &'static str {
        match self {
            Request::Ports => "ports",
            Request::Stats { .. } => "stats",
            Request::Rxq => "rxq",
            Request::Fdb => "fdb",
            Request::Flows => "flows",
            Request::Trace { .. } => "trace",
            Request::Rebalance { .. } => "rebalance",
            Request::Move { .. } => "move",
            Request::Reload => "reload",
            Request::Version => "version",
            Request::Port { .. } => "ports",
            Request::AddPort { .. } => "add-port",
            Request::DelPort { .. } => "del-port",
            Request::SetPort { .. } => "set-port",
            Request::Vteps => "vteps",
            Request::Mirrors => "mirrors",
            Request::AddMirror { .. } => "add-mirror",
            Request::DelMirror { .. } => "del-mirror",
            Request::Vrfs => "vrfs",
            Request::VtepSync { .. } => "vtep-sync",
            Request::Conntrack { .. } => "conntrack",
            Request::ConntrackFlush { .. } => "conntrack-flush",
            Request::Capture { .. } => "capture",
            Request::TraceLive { .. } => "trace",
        }
    }

    /// The arguments on the wire: `from_parts(self.command(), &self.args())` is `self`.
    pub fn args(&self) -> Vec<String> {
        match self {
            Request::Stats { clear: true } => vec!["--clear".into()],
            Request::Trace { fields } => vec![fields.clone()],
            Request::TraceLive { port, count, filter } => {
                let mut a = vec!["--live".to_string(), "-c".into(), count.to_string(), "--".into(), port.clone()];
                a.extend(filter.iter().cloned());
                a
            }
            Request::Rebalance { mode: Some(m) } => vec![m.to_string()],
            Request::Move { port, queue, thread } => vec![format!("{port}:{queue}"), thread.to_string()],
            Request::Port { name } => vec![name.clone()],
            Request::AddPort { name, settings, may_exist } => {
                let flag = may_exist.then(|| "--may-exist".to_string());
                flag.into_iter().chain(std::iter::once(name.clone())).chain(pairs(settings)).collect()
            }
            Request::DelPort { name, if_exists } => {
                if_exists.then(|| "--if-exists".to_string()).into_iter().chain(std::iter::once(name.clone())).collect()
            }
            Request::SetPort { name, settings } | Request::AddMirror { name, settings } => {
                std::iter::once(name.clone()).chain(pairs(settings)).collect()
            }
            Request::DelMirror { name, if_exists } => {
                if_exists.then(|| "--if-exists".to_string()).into_iter().chain(std::iter::once(name.clone())).collect()
            }
            Request::VtepSync { vtep, state } => vec![vtep.clone(), state.clone()],
            Request::Conntrack { port: Some(p) } | Request::ConntrackFlush { port: p } => vec![p.clone()],
            Request::Capture { words, direction, drops, count, snaplen } => {
                let mut a = Vec::new();
                if *direction != Direction::Both {
                    a.extend(["--direction".to_string(), direction.to_string()]);
                }
                if *drops {
                    a.push("--drops".into());
                }
                if let Some(c) = count {
                    a.extend(["-c".to_string(), c.to_string()]);
                }
                if *snaplen != 0 {
                    a.extend(["-s".to_string(), snaplen.to_string()]);
                }
                // Words that look like options are passed after `--`.
                if words.iter().any(|w| w.starts_with('-')) && !words.iter().any(|w| w == "--") {
                    a.push("--".into());
                }
                a.extend(words.iter().cloned());
                a
            }
            _ => Vec::new(),
        }
    }

    /// The request line to send (without its newline).
    pub fn to_line(&self) -> String {
        /// The wire's request object (keys in the order pvswitchctl always sent them).
        #[derive(Serialize)]
        struct Line {
            args: Vec<String>,
            command: &'static str,
        }
        let line = Line { args: self.args(), command: self.command() };
        serde_json::to_string(&line).expect("strings serialize")
    }
}

/// Whether `args` hold `flag` (anywhere), and the others.
fn flag<'a>(args: &'a [String], flag: &str) -> (bool, Vec<&'a String>) {
    (args.iter().any(|a| a == flag), args.iter().filter(|a| *a != flag).collect())
}

/// `NAME KEY=VALUE...` (a value may hold '=': the key is before the first).
fn port_settings<S: AsRef<str>>(command: &str, args: &[S]) -> Result<(String, Vec<(String, String)>), String> {
    let Some((name, rest)) = args.split_first() else { return Err(format!("{command}: expected NAME KEY=VALUE...")) };
    let name = name.as_ref();
    if name.starts_with('-') || name.contains('=') {
        return Err(format!("{command}: expected NAME KEY=VALUE..., found \"{name}\" first"));
    }
    let settings = rest
        .iter()
        .map(|kv| {
            let kv = kv.as_ref();
            kv.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("{command}: expected KEY=VALUE, found \"{kv}\""))
        })
        .collect::<Result<_, _>>()?;
    Ok((name.to_string(), settings))
}

fn pairs(settings: &[(String, String)]) -> impl Iterator<Item = String> + '_ {
    settings.iter().map(|(k, v)| format!("{k}={v}"))
}

const CAPTURE_USAGE: &str =
    "capture: expected [--direction in|out|both] [--drops] [-c COUNT] [-s SNAPLEN] PORT... [--] [FILTER...]";

/// `capture [--direction D] [--drops] [-c COUNT] [-s SNAPLEN] PORT... [--] [FILTER...]`: the
/// options anywhere before a `--`; the other words (ports, then the filter) in order.
fn parse_capture(args: &[String]) -> Result<Request, String> {
    let (mut words, mut direction, mut drops, mut count, mut snaplen) = (Vec::new(), Direction::Both, false, None, 0);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().ok_or_else(|| format!("capture: {a} needs {what} ({CAPTURE_USAGE})"));
        match a.as_str() {
            "--direction" | "-Q" => {
                direction = value("in, out or both")?.parse().map_err(|e| format!("capture: {e}"))?
            }
            "--drops" => drops = true,
            "-c" | "--count" => {
                let v = value("a count")?;
                count = Some(
                    v.parse::<u64>()
                        .ok()
                        .filter(|&c| c > 0)
                        .ok_or(format!("capture: -c {v}: expected a count above 0"))?,
                );
            }
            "-s" | "--snaplen" => {
                let v = value("a length")?;
                snaplen = v.parse::<u32>().map_err(|_| format!("capture: -s {v}: expected a length in bytes"))?;
            }
            "--" => {
                words.push(a.clone());
                words.extend(it.by_ref().cloned());
            }
            o if o.starts_with('-') && o.len() > 1 => {
                return Err(format!("capture: unknown option {o} ({CAPTURE_USAGE})"));
            }
            _ => words.push(a.clone()),
        }
    }
    if words.iter().all(|w| w == "--") {
        return Err(CAPTURE_USAGE.into());
    }
    Ok(Request::Capture { words, direction, drops, count, snaplen })
}

const TRACE_LIVE_USAGE: &str = "trace --live: expected [-c COUNT] PORT [FILTER...]";

/// `trace --live [-c COUNT] PORT [FILTER...]` (after `--live`): one port, then the filter's
/// words; the count (default 1) before the port, or after it.
fn parse_trace_live(args: &[String]) -> Result<Request, String> {
    let (mut words, mut count) = (Vec::new(), 1u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-c" | "--count" => {
                let v = it.next().ok_or_else(|| format!("{TRACE_LIVE_USAGE}: {a} needs a count"))?;
                count = v
                    .parse::<u64>()
                    .ok()
                    .filter(|&c| (1..=MAX_LIVE_TRACES).contains(&c))
                    .ok_or(format!("trace --live: -c {v}: expected a count from 1 to {MAX_LIVE_TRACES}"))?;
            }
            "--" => words.extend(it.by_ref().cloned()),
            o if o.starts_with('-') && o.len() > 1 && words.is_empty() => {
                return Err(format!("trace --live: unknown option {o} ({TRACE_LIVE_USAGE})"));
            }
            _ => words.push(a.clone()),
        }
    }
    let Some((port, filter)) = words.split_first() else { return Err(TRACE_LIVE_USAGE.into()) };
    Ok(Request::TraceLive { port: port.clone(), count, filter: filter.to_vec() })
}

/// Most frames one `trace --live` traces (each is a reply of its own: a trace is for looking at).
pub const MAX_LIVE_TRACES: u64 = 10_000;

/// `move PORT:QUEUE THREAD` (a port name may itself hold ':'; the queue is after the last).
fn parse_move(args: &[String]) -> Result<Request, String> {
    let [q, t] = args else { return Err(MOVE_USAGE.into()) };
    let (port, queue) = q.rsplit_once(':').ok_or(MOVE_USAGE)?;
    let queue = queue.parse().map_err(|_| MOVE_USAGE.to_string())?;
    let thread = t.parse().map_err(|_| MOVE_USAGE.to_string())?;
    Ok(Request::Move { port: port.to_string(), queue, thread })
}

/// The reply envelope: `{"ok": true, "result": T}` or `{"ok": false, "error": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply<T> {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why, for a caller that acts on it (absent: no particular reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
}

impl<T> Reply<T> {
    pub fn new(r: Result<T, String>) -> Reply<T> {
        Reply::coded(r.map_err(CtlError::from))
    }

    pub fn coded(r: Result<T, CtlError>) -> Reply<T> {
        match r {
            Ok(t) => Reply { ok: true, result: Some(t), error: None, code: None },
            Err(e) => Reply { ok: false, result: None, error: Some(e.message), code: e.code },
        }
    }

    pub fn into_result(self) -> Result<T, String> {
        self.into_outcome().map_err(|e| e.message)
    }

    /// The result, or the error with its code.
    pub fn into_outcome(self) -> Result<T, CtlError> {
        match (self.ok, self.result) {
            (true, Some(t)) => Ok(t),
            (true, None) => Err(CtlError::from("malformed reply: no result".to_string())),
            (false, _) => {
                Err(CtlError { code: self.code, message: self.error.unwrap_or_else(|| "unknown error".into()) })
            }
        }
    }
}

impl<T: Serialize> Reply<T> {
    /// The reply line (without its newline). Keys are sorted, as pvswitchd always sent them.
    pub fn to_line(&self) -> String {
        match serde_json::to_value(self) {
            Ok(v) => v.to_string(),
            Err(e) => Reply::<()>::new(Err(format!("cannot serialize the reply: {e}"))).to_line(),
        }
    }
}

/// `stats --clear`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cleared {
    pub cleared: bool,
}

/// One learned MAC address (`fdb`): on which port (None: a port since removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdbEntry {
    pub mac: String,
    /// The VLAN it was learned on (0: untagged, or no VLANs).
    #[serde(default)]
    pub vlan: u16,
    pub port: Option<String>,
}

/// `reload`: what changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadReply {
    pub summary: String,
}

/// `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionReply {
    pub version: String,
}

impl VersionReply {
    /// This build's version.
    pub fn current() -> VersionReply {
        VersionReply { version: env!("CARGO_PKG_VERSION").to_string() }
    }
}
