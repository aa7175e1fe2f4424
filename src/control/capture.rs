//! A capture's own thread: takes over the client's connection once the switch has hooked the
//! capture (`switch::captures`), drains the poll threads' rings into pcapng and streams it,
//! then says how it ended. The control thread never waits on a capture's client: a reader that
//! stops holds this thread (in a write) and nothing else; the poll threads then lose records
//! into full rings, counted.
//!
//! The stream: the first reply line (`CaptureStarted`), then chunks (`proto::Chunk`): pcapng
//! bytes as they come (the section and interfaces first), and last the end (`CaptureEnd`,
//! JSON). It ends when `count` records were written, when the client goes away, or when the
//! switch ends it (one of its ports was deleted); then the control thread unhooks it
//! (`Token::CaptureDone`) and the records still in the rings are written before the end.
#![forbid(unsafe_code)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use log::info;
use vmm_sys_util::eventfd::EventFd;

use crate::capture::pcapng::PcapNg;
use crate::capture::{Capture, Reader, Record};
use crate::ctl::live::Explainer;
use crate::datapath::counters::DROP_REASONS;
use crate::proto::{CaptureEnd, CaptureStarted, Chunk, Reply};

/// How long the thread waits for the client (or for records) before it looks again.
const IDLE: Duration = Duration::from_millis(10);
/// How long it waits for the control thread to unhook it.
const UNHOOK_WAIT: Duration = Duration::from_secs(2);
/// pcapng bytes gathered before a chunk is sent while records keep coming.
const CHUNK: usize = 256 << 10;

/// What the thread is given.
pub struct Job {
    pub stream: UnixStream,
    pub started: CaptureStarted,
    pub capture: Arc<Capture>,
    pub reader: Reader,
    pub count: Option<u64>,
    /// Written when the thread is done with the capture: the control thread unhooks it.
    pub done: Arc<EventFd>,
    /// A live trace (`trace --live`): each record told in words, not written as pcapng.
    pub explain: Option<Explainer>,
}

/// What the records become on the stream: pcapng, gathered into chunks; or a live trace's
/// [`crate::proto::LiveTrace`]s, a chunk each.
enum Sink {
    Pcap(PcapNg),
    Trace { explain: Explainer, pending: Vec<Vec<u8>>, bytes: usize },
}

impl Sink {
    fn record(&mut self, r: &Record) -> Result<(), String> {
        match self {
            Sink::Pcap(p) => p.packet(r, drop_name(r)),
            Sink::Trace { explain, pending, bytes } => {
                let json = serde_json::to_vec(&explain.explain(r)).map_err(|e| e.to_string())?;
                *bytes += json.len();
                pending.push(json);
                Ok(())
            }
        }
    }

    fn pending(&self) -> usize {
        match self {
            Sink::Pcap(p) => p.pending(),
            Sink::Trace { bytes, .. } => *bytes,
        }
    }

    /// Sends what it holds.
    fn flush(&mut self, stream: &mut UnixStream) -> std::io::Result<()> {
        match self {
            Sink::Pcap(p) => send(stream, Chunk::Pcapng, &p.take()),
            Sink::Trace { pending, bytes, .. } => {
                *bytes = 0;
                std::mem::take(pending).iter().try_for_each(|j| send(stream, Chunk::Trace, j))
            }
        }
    }
}

/// Starts the capture's thread.
pub fn spawn(job: Job) -> std::io::Result<()> {
    std::thread::Builder::new().name("capture".into()).spawn(move || run(job)).map(|_| ())
}

fn run(job: Job) {
    let Job { mut stream, started, capture, mut reader, count, done, explain } = job;
    let ports = started.ports.join(",");
    let (packets, reason) = match stream_records(&mut stream, &started, &capture, &mut reader, count, explain) {
        Ok((packets, reason, mut sink)) => {
            let packets = finish(&capture, &done, &mut reader, &mut sink, packets, count);
            let end = summary(&capture, packets, reason.clone());
            let json = serde_json::to_vec(&end).unwrap_or_default();
            let sent = sink.flush(&mut stream).and_then(|_| send(&mut stream, Chunk::End, &json));
            if let Err(e) = sent {
                info!("capture of {ports}: its end not sent: {e}");
            }
            (packets, reason)
        }
        Err(reason) => {
            // Nothing was written: only unhooked.
            unhook(&capture, &done);
            (0, reason)
        }
    };
    info!("capture of {ports} ended: {reason} ({packets} packets)");
}

/// Streams records until the capture should end; returns the records written, why it ends,
/// and the sink (for what is left). Err: the client left before it began.
fn stream_records(
    stream: &mut UnixStream,
    started: &CaptureStarted,
    capture: &Capture,
    reader: &mut Reader,
    count: Option<u64>,
    explain: Option<Explainer>,
) -> Result<(u64, String, Sink), String> {
    let fail = |e: std::io::Error| format!("the client: {e}");
    stream.set_nonblocking(false).map_err(fail)?;
    stream.set_write_timeout(Some(IDLE)).map_err(fail)?;
    stream.set_read_timeout(Some(IDLE)).map_err(fail)?;
    let mut line = Reply::new(Ok(started.clone())).to_line();
    line.push('\n');
    write_patiently(stream, line.as_bytes()).map_err(fail)?;
    let ifaces: Vec<(String, String)> = started
        .ports
        .iter()
        .zip(&started.kinds)
        .map(|(p, k)| (p.clone(), format!("pvswitch port {p} ({k})")))
        .collect();
    let mut sink = match explain {
        Some(explain) => Sink::Trace { explain, pending: Vec::new(), bytes: 0 },
        None => Sink::Pcap(PcapNg::new(&ifaces, capture.snaplen)?),
    };
    sink.flush(stream).map_err(fail)?;
    let mut packets = 0u64;
    let limit = count.unwrap_or(u64::MAX);
    loop {
        let mut bad = None;
        let got = reader.drain(|r| {
            if let Err(e) = sink.record(&r) {
                bad = Some(e);
                return false;
            }
            packets += 1;
            packets < limit && sink.pending() < CHUNK
        });
        if let Some(e) = bad {
            return Ok((packets, format!("pcapng: {e}"), sink));
        }
        if sink.pending() > 0
            && let Err(e) = sink.flush(stream)
        {
            return Ok((packets, format!("the reader left ({e})"), sink));
        }
        if packets >= limit {
            return Ok((packets, "count reached".into(), sink));
        }
        if let Some(why) = capture.ended() {
            return Ok((packets, why, sink));
        }
        if got == 0 && client_left(stream) {
            return Ok((packets, "the reader left".into(), sink));
        }
    }
}

/// Waits up to `IDLE` for the client to close its side: true if it did (or sent anything:
/// it never sends after its request).
fn client_left(mut stream: &UnixStream) -> bool {
    let mut b = [0u8; 1];
    match std::io::Read::read(&mut stream, &mut b) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// Has the capture unhooked (waiting for the control thread, at most `UNHOOK_WAIT`), then
/// writes what the rings still hold (up to `count`) and, into pcapng, each interface's
/// statistics. Returns the records written in all.
fn finish(
    capture: &Capture,
    done: &EventFd,
    reader: &mut Reader,
    sink: &mut Sink,
    mut packets: u64,
    count: Option<u64>,
) -> u64 {
    unhook(capture, done);
    let limit = count.unwrap_or(u64::MAX);
    reader.drain(|r| {
        if packets >= limit {
            return false;
        }
        if sink.record(&r).is_ok() {
            packets += 1;
        }
        true
    });
    if let Sink::Pcap(pcap) = sink {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        for i in 0..capture.ifaces.len() {
            let _ = pcap.stats(i as u32, now, capture.counts(i));
        }
    }
    packets
}

/// Says the thread is done with `capture` and waits (at most `UNHOOK_WAIT`) until the control
/// thread has unhooked it: no poll thread offers it frames any more.
fn unhook(capture: &Capture, done: &EventFd) {
    capture.finished.store(true, Ordering::Release);
    let _ = done.write(1);
    let until = Instant::now() + UNHOOK_WAIT;
    while !capture.unhooked.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The name of the reason a recorded frame was dropped for, if it was.
fn drop_name(r: &Record) -> Option<&'static str> {
    r.drop.and_then(|d| DROP_REASONS.get(d as usize)).map(|d| d.0)
}

/// The end record: the counts over every interface.
fn summary(capture: &Capture, packets: u64, reason: String) -> CaptureEnd {
    let mut end = CaptureEnd { packets, reason, ..Default::default() };
    for i in 0..capture.ifaces.len() {
        let c = capture.counts(i);
        end.seen += c.seen;
        end.matched += c.matched;
        end.lost += c.lost;
    }
    end
}

/// Sends one chunk (nothing for empty pcapng bytes).
fn send(stream: &mut UnixStream, kind: Chunk, bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() && kind == Chunk::Pcapng {
        return Ok(());
    }
    let mut hdr = [0u8; 5];
    hdr[0] = kind as u8;
    hdr[1..].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    write_patiently(stream, &hdr)?;
    write_patiently(stream, bytes)
}

/// Writes all of `buf`, however long the client takes to read it (a stopped reader holds
/// this thread and nothing else); an error once it is gone.
fn write_patiently(stream: &mut UnixStream, buf: &[u8]) -> std::io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match stream.write(&buf[at..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
