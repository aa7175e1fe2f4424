//! Captures (`pvswitchctl capture`) as the switch holds them: made for named ports, hooked into
//! the plans (each port's `Tap`s), and unhooked when their thread is done or one of their ports
//! goes away. The capture itself is `crate::capture`; the thread that reads it and writes to
//! the client is `control::capture`.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::capture::{Capture, Direction, Reader, Tap};
use crate::port::{Port, PortKind};
use crate::proto::{CaptureStarted, CtlError, ErrorCode};

use super::Switch;

/// Most captures at once (live traces count as captures).
pub const MAX_CAPTURES: usize = 32;
/// Bytes of a traced frame kept: its headers, for the trace's words (and its filter).
const TRACE_SNAPLEN: u32 = 256;

/// A capture the plans hold, and the ports it was made for (a port of the same name made
/// again is another port: the capture ends).
pub struct Hooked {
    pub capture: Arc<Capture>,
    ports: Vec<Arc<Port>>,
}

/// What `capture` asks for, as the command line gave it.
pub struct CaptureAsk<'a> {
    /// Port names, then the filter's words (`--` may end the ports).
    pub words: &'a [String],
    pub direction: Direction,
    pub drops: bool,
    pub snaplen: u32,
}

impl Switch {
    /// Starts a capture: its ports (the leading words that name ports), its filter (the rest,
    /// compiled), hooked into every thread's plan once this returns.
    pub fn start_capture(&mut self, ask: &CaptureAsk) -> Result<(Arc<Capture>, Reader, CaptureStarted), CtlError> {
        let invalid = |message: String| CtlError { code: Some(ErrorCode::Invalid), message };
        if self.captures.len() >= MAX_CAPTURES {
            return Err(invalid(format!("capture: {MAX_CAPTURES} captures run already")));
        }
        let mut ports: Vec<Arc<Port>> = Vec::new();
        let mut rest = ask.words;
        while let Some((w, tail)) = rest.split_first() {
            if w == "--" {
                rest = tail;
                break;
            }
            let Some(ps) = self.port_by_name(w) else { break };
            if !ports.iter().any(|p| p.id == ps.id()) {
                ports.push(ps.port.clone());
            }
            rest = tail;
        }
        if ports.is_empty() {
            let message = match ask.words.first() {
                Some(w) => format!("capture: no port named \"{w}\""),
                None => "capture: expected PORT... [FILTER...]".into(),
            };
            return Err(CtlError { code: Some(ErrorCode::NotFound), message });
        }
        let filter = rest.join(" ");
        let names: Vec<String> = ports.iter().map(|p| p.name().to_string()).collect();
        let (capture, reader) =
            Capture::new(names.clone(), ask.direction, ask.drops, ask.snaplen, &filter, self.threads.len()).map_err(
                |e| {
                    let hint = rest.first().map(|w| format!(" (is \"{w}\" a port? the ports: {})", self.port_names()));
                    invalid(format!("capture: {e}{}", hint.unwrap_or_default()))
                },
            )?;
        let started = CaptureStarted {
            ports: names,
            kinds: ports.iter().map(|p| kind(p).to_string()).collect(),
            direction: ask.direction,
            drops: ask.drops,
            snaplen: capture.snaplen,
            filter,
        };
        self.captures.push(Hooked { capture: capture.clone(), ports });
        self.publish();
        Ok((capture, reader, started))
    }

    /// Starts a live trace of `port`: its next frames that match `filter` (dropped ones too),
    /// each recorded with the data path's verdict. Returns the port's id with the capture.
    pub fn start_trace(
        &mut self,
        port: &str,
        filter: &[String],
    ) -> Result<(Arc<Capture>, Reader, CaptureStarted, u16), CtlError> {
        let invalid = |message: String| CtlError { code: Some(ErrorCode::Invalid), message };
        if self.captures.len() >= MAX_CAPTURES {
            return Err(invalid(format!("trace --live: {MAX_CAPTURES} captures and traces run already")));
        }
        let Some(ps) = self.port_by_name(port) else {
            return Err(CtlError {
                code: Some(ErrorCode::NotFound),
                message: format!("trace --live: no port named \"{port}\""),
            });
        };
        let p = ps.port.clone();
        let filter = filter.join(" ");
        let (capture, reader) =
            Capture::tracing(vec![p.name().to_string()], TRACE_SNAPLEN, &filter, self.threads.len())
                .map_err(|e| invalid(format!("trace --live: {e}")))?;
        let started = CaptureStarted {
            ports: vec![p.name().to_string()],
            kinds: vec![kind(&p).to_string()],
            direction: Direction::In,
            drops: true,
            snaplen: capture.snaplen,
            filter,
        };
        let id = p.id;
        self.captures.push(Hooked { capture: capture.clone(), ports: vec![p] });
        self.publish();
        Ok((capture, reader, started, id))
    }

    /// Unhooks the captures whose thread is done (and those the switch ended); each is told
    /// once no plan holds it.
    pub fn reap_captures(&mut self) {
        let (done, keep): (Vec<Hooked>, Vec<Hooked>) =
            std::mem::take(&mut self.captures).into_iter().partition(|h| h.capture.finished.load(Ordering::Acquire));
        self.captures = keep;
        if done.is_empty() {
            return;
        }
        self.publish();
        for h in done {
            h.capture.unhooked.store(true, Ordering::Release);
        }
    }

    /// Each port's captures, for the plans being made. A capture one of whose ports is gone
    /// (deleted, or made again) is ended and no longer tapped.
    pub(super) fn taps(&self) -> Vec<(u16, Tap)> {
        let mut taps = Vec::new();
        for h in &self.captures {
            let gone = h.ports.iter().find(|p| self.port(p.id as usize).is_none_or(|ps| !Arc::ptr_eq(&ps.port, p)));
            if let Some(p) = gone {
                h.capture.end(format!("port {} was deleted", p.name()));
                continue;
            }
            if h.capture.ended().is_some() || h.capture.finished.load(Ordering::Acquire) {
                continue;
            }
            for (i, p) in h.ports.iter().enumerate() {
                taps.push((p.id, Tap { capture: h.capture.clone(), iface: i as u32 }));
            }
        }
        taps
    }

    fn port_names(&self) -> String {
        let names: Vec<&str> = self.ports.iter().flatten().map(|p| p.name()).collect();
        let more = if names.len() > 8 { format!(" and {} more", names.len() - 8) } else { String::new() };
        format!("{}{more}", names[..names.len().min(8)].join(", "))
    }
}

/// A port's kind, for its pcapng interface's description.
fn kind(p: &Port) -> &'static str {
    match &p.kind {
        PortKind::VhostUser(_) => "vhost-user",
        PortKind::Nic(_) => "dpdk",
        PortKind::Tunnel(_) => "vxlan",
        PortKind::Failed => "failed",
    }
}
