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

mod flows;
mod ports;
mod stats;
#[cfg(test)]
pub(crate) mod tests;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use self::flows::{FlowInfo, FlowsReply, TraceReply};
pub use self::ports::{
    MigrationInfo, PortInfo, PortOffloads, PortVlanInfo, QueueInfo, QueueKind, RateCapsInfo, RateTokens,
};
pub use self::stats::{PollMode, RxqInfo, RxqInterval, StatsReply, ThreadInterval, ThreadStats, WakeBucket, Wakeups};
pub use crate::config::RxqAssign;
pub use crate::datapath::counters::{DropTotals as Drops, PortTotals as Counters, RxqTotals};
pub use crate::port::nic::{NicInfo, NicOffloads, NicStats};
pub use crate::switch::rebalance::{Moved as MoveReply, Rebalanced as RebalanceReply};

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
}

/// Every command's name, for the error about an unknown one.
pub const COMMANDS: &str = "ports, stats, rxq, fdb, flows, trace, rebalance, move, reload, version";

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
            "ports" => Request::Ports,
            "stats" => Request::Stats { clear: args.iter().any(|a| a == "--clear") },
            "rxq" => Request::Rxq,
            "fdb" => Request::Fdb,
            "flows" => Request::Flows,
            "trace" if args.join(",").is_empty() => return Err(TRACE_USAGE.into()),
            "trace" => Request::Trace { fields: args.join(",") },
            "rebalance" => Request::Rebalance {
                mode: args.first().map(|m| m.parse()).transpose().map_err(|e| format!("rebalance: {e}"))?,
            },
            "move" => parse_move(args)?,
            "reload" => Request::Reload,
            "version" => Request::Version,
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
        }
    }

    /// The arguments on the wire: `from_parts(self.command(), &self.args())` is `self`.
    pub fn args(&self) -> Vec<String> {
        match self {
            Request::Stats { clear: true } => vec!["--clear".into()],
            Request::Trace { fields } => vec![fields.clone()],
            Request::Rebalance { mode: Some(m) } => vec![m.to_string()],
            Request::Move { port, queue, thread } => vec![format!("{port}:{queue}"), thread.to_string()],
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
}

impl<T> Reply<T> {
    pub fn new(r: Result<T, String>) -> Reply<T> {
        match r {
            Ok(t) => Reply { ok: true, result: Some(t), error: None },
            Err(e) => Reply { ok: false, result: None, error: Some(e) },
        }
    }

    pub fn into_result(self) -> Result<T, String> {
        match (self.ok, self.result) {
            (true, Some(t)) => Ok(t),
            (true, None) => Err("malformed reply: no result".into()),
            (false, _) => Err(self.error.unwrap_or_else(|| "unknown error".into())),
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
