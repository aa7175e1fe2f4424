//! `pvsgen-tso`: one VM sends TCP/IPv4 frames to another through the switch as fast as the
//! switch takes them, and the other counts what arrives: the switch-only cost of a byte with
//! and without segmentation offload.
//!
//! The sender offers `--size` byte frames (Ethernet header included). Above 1514 bytes each is
//! a TSO frame (gso_type TCPV4, `--mss` bytes per segment, NEEDS_CSUM with the pseudo
//! header's partial sum, as Linux hands them over); up to 1514 bytes a plain frame with its
//! checksum complete, as a guest without offloads sends. The receiver acks MRG_RXBUF and posts
//! 4 KiB buffers (as Linux's mergeable buffers are); with `--rx-offloads` it also acks
//! GUEST_CSUM and GUEST_TSO4, so TSO frames reach it whole; without, the switch segments them
//! and completes every checksum. One thread drives both rings (pin it with `--cpu`); frame
//! contents are written once, so the generator's own cost per byte is small.
//!
//! Prints `frames=N segments=S bytes=B seconds=T gbps=G`: frames and bytes (Ethernet, as the
//! receiver got them) and segments (MSS-sized, what reached the receiver in wire terms).
//!
//! Usage: pvsgen-tso --tx SOCK --rx SOCK [--size 65000] [--mss 1448] [--seconds 4]
//!        [--rx-offloads] [--cpu N]

use std::time::{Duration, Instant};

use pvsgen::frontend::{Desc, F_WRITE, FEATURES, HDR_LEN, Layout, MRG_RXBUF, Vm};

const CSUM: u64 = 1 << 0;
const GUEST_CSUM: u64 = 1 << 1;
const GUEST_TSO4: u64 = 1 << 7;
const HOST_TSO4: u64 = 1 << 11;
const TX_SLOT: u64 = 68 * 1024;
const RX_BUF: u32 = 4096;

struct Args {
    tx: String,
    rx: String,
    size: usize,
    mss: u16,
    seconds: f64,
    rx_offloads: bool,
    cpu: Option<usize>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        tx: String::new(),
        rx: String::new(),
        size: 65000,
        mss: 1448,
        seconds: 4.0,
        rx_offloads: false,
        cpu: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--tx" => a.tx = v()?,
            "--rx" => a.rx = v()?,
            "--size" => a.size = v()?.parse().map_err(|e| format!("--size: {e}"))?,
            "--mss" => a.mss = v()?.parse().map_err(|e| format!("--mss: {e}"))?,
            "--seconds" => a.seconds = v()?.parse().map_err(|e| format!("--seconds: {e}"))?,
            "--cpu" => a.cpu = Some(v()?.parse().map_err(|e| format!("--cpu: {e}"))?),
            "--rx-offloads" => a.rx_offloads = true,
            _ => return Err(format!("unknown argument {k}")),
        }
    }
    if a.tx.is_empty() || a.rx.is_empty() {
        return Err("--tx and --rx are needed".into());
    }
    if !(60..=65535 + 14).contains(&a.size) || a.mss == 0 || a.mss > 9000 {
        return Err("--size must be 60..65549 and --mss 1..9000".into());
    }
    Ok(a)
}

/// Ones' complement sum of `b` (big-endian 16-bit words), not folded.
fn sum(b: &[u8]) -> u32 {
    let mut s = 0u32;
    for w in b.chunks(2) {
        s += u32::from(w[0]) << 8 | u32::from(*w.get(1).unwrap_or(&0));
    }
    s
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The frame and its virtio-net header: Ethernet to 02:00:00:00:00:02 from ..:01, IPv4
/// 10.0.0.1 -> 10.0.0.2, TCP 40000 -> 5201 with ACK|PSH, a byte pattern as payload.
fn frame(size: usize, mss: u16) -> ([u8; HDR_LEN], Vec<u8>) {
    let mut f = vec![0u8; size];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (size - 14) as u16;
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[20] = 0x40; // DF
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    let c = !fold(sum(&f[14..34]));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&5201u16.to_be_bytes());
    f[38..42].copy_from_slice(&1u32.to_be_bytes());
    f[42..46].copy_from_slice(&1u32.to_be_bytes());
    f[46..48].copy_from_slice(&(5u16 << 12 | 0x18).to_be_bytes());
    f[48..50].copy_from_slice(&65535u16.to_be_bytes());
    for (i, b) in f[54..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7);
    }
    let tcp_len = (size - 34) as u32;
    let pseudo = sum(&f[26..34]) + 6 + tcp_len;
    let mut h = [0u8; HDR_LEN];
    if size > 1514 {
        // TSO: NEEDS_CSUM over the TCP header on, partial sum in the field.
        h[0] = 1;
        h[1] = 1;
        h[2..4].copy_from_slice(&54u16.to_le_bytes());
        h[4..6].copy_from_slice(&mss.to_le_bytes());
        h[6..8].copy_from_slice(&34u16.to_le_bytes());
        h[8..10].copy_from_slice(&16u16.to_le_bytes());
        f[50..52].copy_from_slice(&fold(pseudo).to_be_bytes());
    } else {
        let c = !fold(pseudo + sum(&f[34..]));
        f[50..52].copy_from_slice(&c.to_be_bytes());
    }
    (h, f)
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "pvsgen-tso: {e}\nusage: pvsgen-tso --tx SOCK --rx SOCK [--size 65000] [--mss 1448] [--seconds 4] [--rx-offloads] [--cpu N]"
            );
            std::process::exit(2);
        }
    };
    if let Some(cpu) = a.cpu {
        pvsgen::engine::pin_to(cpu).unwrap_or_else(|e| panic!("pin to CPU {cpu}: {e}"));
    }
    let rx_features = FEATURES | MRG_RXBUF | if a.rx_offloads { GUEST_CSUM | GUEST_TSO4 } else { 0 };
    let mut rx = Vm::connect_features(&a.rx, Layout::packed(1024, RX_BUF as u64), rx_features)
        .unwrap_or_else(|e| panic!("receiver on {}: {e}", a.rx));
    let mut tx = Vm::connect_features(&a.tx, Layout::packed(256, TX_SLOT), FEATURES | CSUM | HOST_TSO4)
        .unwrap_or_else(|e| panic!("sender on {}: {e}", a.tx));
    // The receiver speaks first, so the switch learns where its address is.
    let mut hello = vec![0u8; 60];
    hello[0..6].copy_from_slice(&[0xff; 6]);
    hello[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    hello[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    rx.send(&hello);

    // Every receive buffer posted; every sender slot holds the same frame, written once.
    let rl = *rx.layout();
    {
        let mut r = rx.raw_rx();
        for d in 0..rl.qsize {
            r.desc(d, Desc { addr: rl.rx_buf(d), len: RX_BUF, flags: F_WRITE, next: 0 });
            r.stage(d);
        }
        r.publish();
    }
    let (h, f) = frame(a.size, a.mss);
    let tl = *tx.layout();
    for d in 0..tl.qsize {
        tx.mem.write(tl.tx_buf(d), &h);
        tx.mem.write(tl.tx_buf(d) + HDR_LEN as u64, &f);
        tx.raw_tx().desc(d, Desc { addr: tl.tx_buf(d), len: (HDR_LEN + f.len()) as u32, flags: 0, next: 0 });
    }
    let mut free: Vec<u16> = (0..tl.qsize).collect();

    let (mut frames, mut bytes, mut left) = (0u64, 0u64, 0u16);
    let mut hdr = [0u8; HDR_LEN];
    let warmup = Duration::from_millis(500);
    let start = Instant::now();
    let mut measuring: Option<(Instant, u64, u64)> = None;
    let mut spins = 0u32;
    let mut got: Vec<(u32, u32)> = Vec::with_capacity(rl.qsize as usize);
    loop {
        {
            let mut t = tx.raw_tx();
            let used = t.used_idx();
            while let Some((id, _)) = t.next_used(used) {
                free.push(id as u16);
            }
            if !free.is_empty() {
                for id in free.drain(..) {
                    t.stage(id);
                }
                t.publish();
            }
        }
        {
            let mut r = rx.raw_rx();
            let used = r.used_idx();
            while let Some(e) = r.next_used(used) {
                got.push(e);
            }
        }
        if !got.is_empty() {
            for &(id, len) in &got {
                let id = id as u16 % rl.qsize;
                if left == 0 {
                    rx.mem.read_into(rl.rx_buf(id), &mut hdr);
                    left = u16::from_le_bytes([hdr[10], hdr[11]]).max(1) - 1;
                    frames += 1;
                    bytes += (len as u64).saturating_sub(HDR_LEN as u64);
                } else {
                    left -= 1;
                    bytes += len as u64;
                }
            }
            let mut r = rx.raw_rx();
            for &(id, _) in &got {
                r.stage(id as u16 % rl.qsize);
            }
            r.publish();
            got.clear();
        }
        spins += 1;
        if !spins.is_multiple_of(64) {
            continue;
        }
        let now = Instant::now();
        match measuring {
            None if now - start >= warmup => measuring = Some((now, frames, bytes)),
            Some((t0, f0, b0)) if (now - t0).as_secs_f64() >= a.seconds => {
                let secs = (now - t0).as_secs_f64();
                let (nf, nb) = (frames - f0, bytes - b0);
                let seg_payload = a.mss as u64;
                // Whole TSO frames are counted as the segments they stand for.
                let segments =
                    if a.size > 1514 && a.rx_offloads { nf * ((a.size as u64 - 54).div_ceil(seg_payload)) } else { nf };
                println!(
                    "frames={nf} segments={segments} bytes={nb} seconds={secs:.3} gbps={:.3}",
                    nb as f64 * 8.0 / secs / 1e9
                );
                return;
            }
            _ => {}
        }
    }
}
