//! Frames to and from files: pcap written and read back byte for byte, the frames the tests
//! send (sequence-numbered, checked delivered in order), and `pvswitchctl capture` run and its
//! pcapng read back.

#[allow(unused_imports)]
use super::*;
#[allow(unused_imports)]
use serde_json::{Value, json};
#[allow(unused_imports)]
use std::io::{BufRead, BufReader, Read, Write};

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
use pcap_file::pcapng::{Block, PcapNgReader};
#[allow(unused_imports)]
use std::path::{Path, PathBuf};
#[allow(unused_imports)]
use std::process::{Child, ChildStdin, Command, Stdio};
#[allow(unused_imports)]
use std::sync::{Arc, Mutex};
#[allow(unused_imports)]
use std::time::{Duration, Instant};

// ---- pcap files: frames with sequence numbers, written and read back byte for byte ----

pub fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut f = Vec::new();
    f.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&65535u32.to_le_bytes());
    f.extend_from_slice(&1u32.to_le_bytes());
    for fr in frames {
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.extend_from_slice(&(fr.len() as u32).to_le_bytes());
        f.extend_from_slice(fr);
    }
    std::fs::write(path, f).unwrap();
}

pub fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut o = 24;
    let mut out = Vec::new();
    while o + 16 <= d.len() {
        let cl = u32::from_le_bytes(d[o + 8..o + 12].try_into().unwrap()) as usize;
        out.push(d[o + 16..o + 16 + cl].to_vec());
        o += 16 + cl;
    }
    out
}

/// A frame from `src` to `dst` of `len` bytes whose payload encodes `stream` and `seq`
/// throughout, so any corruption or misordering shows.
pub fn frame(dst: [u8; 6], src: [u8; 6], len: usize, stream: u8, seq: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x88b5u16.to_be_bytes()); // local experimental ethertype
    f.push(stream);
    f.extend_from_slice(&seq.to_be_bytes());
    let mut x = seq.wrapping_mul(2654435761) ^ stream as u32;
    while f.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        f.push(x as u8);
    }
    f
}

pub fn seq_of(f: &[u8]) -> (u8, u32) {
    (f[14], u32::from_be_bytes(f[15..19].try_into().unwrap()))
}

/// Checks `out` holds exactly the frames of `sent` for each stream, in order, intact.
pub fn assert_delivered(sent: &[Vec<u8>], out: &[Vec<u8>]) {
    assert_eq!(out.len(), sent.len(), "frame count: sent {}, arrived {}", sent.len(), out.len());
    let mut by_stream: std::collections::BTreeMap<u8, Vec<&Vec<u8>>> = Default::default();
    for f in sent {
        by_stream.entry(f[14]).or_default().push(f);
    }
    let mut got: std::collections::BTreeMap<u8, Vec<&Vec<u8>>> = Default::default();
    for f in out {
        got.entry(f[14]).or_default().push(f);
    }
    for (s, frames) in &by_stream {
        let g = got.get(s).map(|v| v.as_slice()).unwrap_or(&[]);
        assert_eq!(g.len(), frames.len(), "stream {s}: count");
        for (i, (a, b)) in frames.iter().zip(g).enumerate() {
            assert!(
                a == b,
                "stream {s}: frame {i} differs (sent seq {:?}, got seq {:?}, len {} vs {})",
                seq_of(a),
                seq_of(b),
                a.len(),
                b.len()
            );
        }
    }
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

// ---- `pvswitchctl capture`: started, ended, its pcapng read back ----

/// A record read back: its interface, way (1 in, 2 out), bytes and comment.
#[derive(Debug, Clone)]
pub struct Rec {
    pub iface: u32,
    pub way: u32,
    pub data: Vec<u8>,
    pub comment: Option<String>,
}

/// The records of a pcapng file, and its interfaces' names.
pub fn read_pcapng(path: &Path) -> (Vec<String>, Vec<Rec>) {
    let bytes = std::fs::read(path).unwrap();
    let mut rd = PcapNgReader::new(&bytes[..]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut names, mut recs) = (Vec::new(), Vec::new());
    while let Some(b) = rd.next_block() {
        match b.unwrap() {
            Block::InterfaceDescription(i) => names.push(
                i.options
                    .iter()
                    .find_map(|o| match o {
                        pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption::IfName(n) => {
                            Some(n.to_string())
                        }
                        _ => None,
                    })
                    .unwrap_or_default(),
            ),
            Block::EnhancedPacket(e) => recs.push(Rec {
                iface: e.interface_id,
                way: e
                    .options
                    .iter()
                    .find_map(|o| if let EnhancedPacketOption::Flags(f) = o { Some(*f & 3) } else { None })
                    .unwrap_or(0),
                data: e.data.to_vec(),
                comment: e
                    .options
                    .iter()
                    .find_map(|o| if let EnhancedPacketOption::Comment(c) = o { Some(c.to_string()) } else { None }),
            }),
            _ => {}
        }
    }
    (names, recs)
}

/// `pvswitchctl ARGS`, started with its standard error (and output) piped; returns once
/// pvswitchd has hooked the stream (its first line on standard error starts with `first`).
fn stream(sw: &Switch, args: &[&str], first: &str) -> (Child, BufReader<std::process::ChildStderr>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pvswitchctl"))
        .arg("--control")
        .arg(&sw.ctl)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.starts_with(first), "pvswitchctl {args:?}: {line}\n{}", sw.log());
    (child, err)
}

/// Waits for a stream's command to end (it is killed, and the test fails, if it has not after
/// `DEADLINE`); returns its standard error after the first line, and its output.
fn ended(mut child: Child, mut err: BufReader<std::process::ChildStderr>, what: &str) -> (String, String) {
    let status = try_wait_for(|| child.try_wait().unwrap());
    let (mut rest, mut out) = (String::new(), String::new());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        err.read_to_string(&mut rest).unwrap();
        panic!("the {what} did not end within {DEADLINE:?}: {rest}");
    };
    err.read_to_string(&mut rest).unwrap();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(status.success(), "{what} failed: {rest}\n{out}");
    (rest, out)
}

/// `pvswitchctl capture ARGS -w FILE`, started; returns once pvswitchd has hooked it.
pub fn start_capture(sw: &Switch, file: &Path, args: &[&str]) -> (Child, BufReader<std::process::ChildStderr>) {
    let args: Vec<&str> =
        ["capture"].into_iter().chain(args.iter().copied()).chain(["-w", file.to_str().unwrap()]).collect();
    stream(sw, &args, "capturing on ")
}

/// Waits for a capture's command to end (see `ended`); its standard error after the first line.
pub fn end_of(child: Child, err: BufReader<std::process::ChildStderr>) -> String {
    ended(child, err, "capture").0
}

/// What tcpdump prints of a capture file (one line a frame), failing if it cannot read it.
pub fn tcpdump(file: &Path, filter: &[&str]) -> Vec<String> {
    let o = Command::new("tcpdump").arg("-nn").arg("-r").arg(file).args(filter).output().expect("tcpdump");
    assert!(o.status.success(), "tcpdump -r {}: {}", file.display(), String::from_utf8_lossy(&o.stderr));
    // One line a frame; an unknown ethertype's hex dump follows it, indented.
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with(char::is_whitespace))
        .map(String::from)
        .collect()
}

/// `pvswitchctl --json trace --live ARGS`, started; returns once pvswitchd has hooked it.
pub fn start_trace(sw: &Switch, args: &[&str]) -> (Child, BufReader<std::process::ChildStderr>) {
    let args: Vec<&str> = ["--json", "trace", "--live"].into_iter().chain(args.iter().copied()).collect();
    stream(sw, &args, "tracing the frames ")
}

/// Waits for the trace to end (see `ended`); the traced frames, and its standard error after
/// the first line.
pub fn traces(child: Child, err: BufReader<std::process::ChildStderr>) -> (Vec<pvswitch::proto::LiveTrace>, String) {
    let (rest, out) = ended(child, err, "trace --live");
    let t = out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    (t, rest)
}
