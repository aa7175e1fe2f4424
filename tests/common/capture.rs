//! Frames to and from files: pcap written and read back byte for byte, and the frames the tests
//! send (sequence-numbered, checked delivered in order).

#[allow(unused_imports)]
use super::*;
#[allow(unused_imports)]
use serde_json::{Value, json};
#[allow(unused_imports)]
use std::io::{Read, Write};
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
