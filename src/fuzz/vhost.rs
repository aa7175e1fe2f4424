//! Target: the vhost-user message handler, as the control loop drives it (`control::vhost`):
//! a header is checked (`Header::check`; a bad one closes the connection), its payload and fds
//! come with it, `PortBackend::handle` answers; a refusal closes the connection (the backend is
//! dropped, a reconnect gets a fresh one). After each message, every ring the backend started
//! is walked a little (chains popped, every segment checked to lie inside guest memory).
//!
//! An input is a sequence of messages, each: one byte saying which fds come with it (low
//! nibble: how many, more than `MAX_FDS` closes the connection as the control loop does; high
//! nibble: the kind of the first, the next ones cycling: an eventfd, the guest's memory (a 64
//! KiB memfd holding rings and buffers), a 4 KiB memfd, a pipe), the 12-byte header, then the
//! payload the header announces (an input that ends early ends the stream).

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::vring::check_segs;
use super::{Rng, Target, fuzz, regressions};
use crate::mem::Segs;
use crate::port::Port;
use crate::port::vhost::msg::{HEADER_LEN, Header, MAX_FDS, code};
use crate::port::vhost::{OFFERED_FEATURES, OFFLOAD_FEATURES, PortBackend, VHOST_USER_F_PROTOCOL_FEATURES};

/// The guest's memory as its frontend would share it: 64 KiB, the frontend's address for it.
const MEM: u64 = 0x1_0000;
const UVA: u64 = 0x7f12_3400_0000;
/// Where the generated rings are, by queue index (as guest-physical offsets).
const RINGS: [(u64, u64, u64); 4] =
    [(0x0000, 0x1000, 0x1400), (0x2000, 0x3000, 0x3400), (0x4000, 0x5000, 0x5400), (0x6000, 0x7000, 0x7400)];
const QSIZE: u32 = 64;

fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a valid C string; the fd is owned by the returned File.
    let f = unsafe { File::from_raw_fd(libc::memfd_create(c"pvs-fuzz-vhost".as_ptr(), 0)) };
    f.set_len(len).unwrap();
    f
}

/// The guest memory file: each ring's first descriptors and avail entries written, so a ring
/// that starts has chains to pop (some good, one pointing past memory).
fn guest_file() -> File {
    let f = memfd(MEM);
    for (q, &(d, a, _)) in RINGS.iter().enumerate() {
        let write = if q % 2 == 0 { 2u16 } else { 0 };
        let descs: [(u64, u32, u16, u16); 3] =
            [(0x8000 + 0x800 * q as u64, 1500, write, 0), (0xc000, 64, write | 1, 2), (0xfff0, 0x40, write, 0)];
        for (i, (addr, len, flags, next)) in descs.iter().enumerate() {
            let mut b = [0u8; 16];
            b[0..8].copy_from_slice(&addr.to_le_bytes());
            b[8..12].copy_from_slice(&len.to_le_bytes());
            b[12..14].copy_from_slice(&flags.to_le_bytes());
            b[14..16].copy_from_slice(&next.to_le_bytes());
            f.write_all_at(&b, d + 16 * i as u64).unwrap();
        }
        // avail: flags 0, idx 2, ring [0, 1].
        f.write_all_at(&[0, 0, 2, 0, 0, 0, 1, 0], a).unwrap();
    }
    f
}

thread_local! {
    static GUEST: File = guest_file();
    static SMALL: File = memfd(4096);
}

fn fd(kind: u8) -> File {
    match kind % 4 {
        0 => {
            // SAFETY: a fresh eventfd, owned by the File.
            unsafe { File::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) }
        }
        1 => GUEST.with(|f| f.try_clone().unwrap()),
        2 => SMALL.with(|f| f.try_clone().unwrap()),
        _ => {
            let (r, _w) = std::io::pipe().unwrap();
            File::from(OwnedFd::from(r))
        }
    }
}

/// After each message: what the backend says and what its rings are must agree, and a ring
/// that runs can be walked without leaving guest memory.
fn check_rings(port: &Port, b: &PortBackend) {
    let st = b.status();
    assert_eq!(st.features & !(OFFERED_FEATURES | OFFLOAD_FEATURES), 0, "features never offered");
    let rings = port.queues().unwrap().all();
    for (i, lock) in rings.iter().enumerate() {
        let mut g = lock.lock();
        let ready = g.is_ready();
        assert!(!ready || st.vrings[i].running, "ring {i} runs but the backend thinks it stopped");
        if let Some(r) = g.active.as_mut() {
            let mut r = r.lend();
            let mut segs = Segs::default();
            let writable = i % 2 == 0;
            for _ in 0..4 {
                match r.avail() {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                match r.pop(&mut segs, writable) {
                    Ok(_) => check_segs(r.mem(), &segs),
                    Err(_) => break,
                }
            }
        }
    }
}

fn run(input: &[u8]) -> u64 {
    let port = Arc::new(Port::vhost_user(1, "fuzz", 9000, 2));
    let mut b = PortBackend::new(port.clone());
    let mut at = 0;
    // Which requests were answered (bit 2r) and which refused (bit 2r + 1).
    let mut h_sig = 0u64;
    while at + 1 + HEADER_LEN <= input.len() {
        let spec = input[at];
        let h = Header::parse(input[at + 1..at + 1 + HEADER_LEN].try_into().unwrap());
        at += 1 + HEADER_LEN;
        let close = |b: &mut PortBackend| {
            *b = PortBackend::new(port.clone());
            for (i, r) in port.queues().unwrap().all().iter().enumerate() {
                assert!(!r.lock().is_ready(), "ring {i} still runs after its connection closed");
            }
        };
        if h.check().is_err() || (spec & 0xf) as usize > MAX_FDS {
            close(&mut b);
            continue;
        }
        let Some(payload) = input.get(at..at + h.size as usize) else { break };
        at += h.size as usize;
        let fds: Vec<File> = (0..spec & 0xf).map(|k| fd((spec >> 4).wrapping_add(k))).collect();
        match b.handle(&h, payload, fds) {
            Ok(reply) => {
                if let Some(r) = &reply {
                    let rh = Header::parse(r[..HEADER_LEN].try_into().unwrap());
                    assert_eq!(rh.request, h.request, "reply to another request");
                    assert_eq!(rh.flags, 0x5, "reply flags");
                    assert_eq!(rh.size as usize, r.len() - HEADER_LEN, "reply size");
                    assert!(rh.size <= 8);
                }
                h_sig |= 1 << (2 * (h.request % 32));
                check_rings(&port, &b);
            }
            Err((e, ack)) => {
                assert!(!e.is_empty());
                if let Some(r) = ack {
                    assert_eq!(&r[HEADER_LEN..], &1u64.to_le_bytes(), "a failed ack says 1");
                }
                h_sig |= 2 << (2 * (h.request % 32));
                close(&mut b);
            }
        }
    }
    drop(b);
    for r in port.queues().unwrap().all() {
        assert!(!r.lock().is_ready(), "a ring runs after its backend was dropped");
    }
    h_sig
}

/// One message: fd spec, header, payload.
fn msg(out: &mut Vec<u8>, fds: u8, request: u32, flags: u32, payload: &[u8]) {
    out.push(fds);
    out.extend_from_slice(&request.to_le_bytes());
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
}

fn u64s(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn state(index: u32, num: u32) -> Vec<u8> {
    [index.to_le_bytes(), num.to_le_bytes()].concat()
}

/// A frontend's whole setup (as `datapath::tests::harness::attach` does it, as messages), with
/// a few of its values, or the order of its messages, changed.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    let flags = |rng: &mut Rng| if rng.one_in(3) { 0x9 } else { 0x1 };
    let f = flags(rng);
    msg(&mut out, 0, code::GET_FEATURES, f, &[]);
    msg(&mut out, 0, code::SET_OWNER, flags(rng), &[]);
    let mut feats = pvsgen::frontend::FEATURES | VHOST_USER_F_PROTOCOL_FEATURES;
    if rng.one_in(2) {
        feats |= OFFLOAD_FEATURES & rng.next();
    }
    if rng.one_in(2) {
        feats |= crate::wire::virtio_net::feature::MRG_RXBUF | crate::wire::virtio_net::feature::RING_EVENT_IDX;
    }
    msg(&mut out, 0, code::GET_PROTOCOL_FEATURES, 1, &[]);
    msg(&mut out, 0, code::SET_PROTOCOL_FEATURES, 1, &u64s(&[rng.below(16) as u64 & 0x9]));
    msg(&mut out, 0, code::SET_FEATURES, flags(rng), &u64s(&[feats]));
    msg(&mut out, 0, code::GET_QUEUE_NUM, 1, &[]);
    let (gpa, off) = if rng.one_in(4) { (rng.next() & 0xffff_f000, rng.below(3) as u64 * 0x1000) } else { (0, 0) };
    let mut table = u64s(&[1, gpa, MEM - off, UVA, off]);
    if rng.one_in(5) {
        // A second region, from the small file.
        table[0] = 2;
        table.extend(u64s(&[1 << 30, 4096, UVA + (1 << 30), 0]));
        msg(&mut out, 0x12, code::SET_MEM_TABLE, flags(rng), &table);
    } else {
        msg(&mut out, 0x11, code::SET_MEM_TABLE, flags(rng), &table);
    }
    for q in 0..1 + rng.below(4) as u32 {
        let (d, a, u) = RINGS[q as usize];
        let size = if rng.one_in(8) { 1 << rng.below(17) } else { QSIZE };
        msg(&mut out, 0, code::SET_VRING_NUM, flags(rng), &state(q, size));
        msg(
            &mut out,
            0,
            code::SET_VRING_BASE,
            flags(rng),
            &state(q, if rng.one_in(6) { rng.below(70000) as u32 } else { 0 }),
        );
        let mut addr = vec![0u8; 40];
        addr[0..4].copy_from_slice(&q.to_le_bytes());
        let mut at = |x: u64| if rng.one_in(10) { UVA + rng.below(MEM as usize) as u64 } else { UVA + x - off };
        let (d, u, a) = (at(d), at(u), at(a));
        addr[8..16].copy_from_slice(&d.to_le_bytes());
        addr[16..24].copy_from_slice(&u.to_le_bytes());
        addr[24..32].copy_from_slice(&a.to_le_bytes());
        msg(&mut out, 0, code::SET_VRING_ADDR, flags(rng), &addr);
        let nofd = rng.one_in(6);
        let kick_fds = if nofd {
            0
        } else if rng.one_in(8) {
            0x11
        } else {
            0x01
        };
        msg(&mut out, kick_fds, code::SET_VRING_KICK, flags(rng), &u64s(&[q as u64 | if nofd { 0x100 } else { 0 }]));
        msg(&mut out, 0x01, code::SET_VRING_CALL, flags(rng), &u64s(&[q as u64]));
        msg(&mut out, 0, code::SET_VRING_ENABLE, flags(rng), &state(q, 1));
    }
    if rng.one_in(3) {
        // Remap: a new table, then the rings' addresses again.
        msg(&mut out, 0x11, code::SET_MEM_TABLE, 1, &u64s(&[1, 0, MEM, UVA + 0x100_0000, 0]));
    }
    if rng.one_in(3) {
        msg(&mut out, 0, code::GET_VRING_BASE, flags(rng), &state(rng.below(5) as u32, 0));
    }
    if rng.one_in(4) {
        msg(&mut out, 0, code::RESET_OWNER, 1, &[]);
    }
    if rng.one_in(4) {
        let r = *rng.pick(&[code::SET_LOG_BASE, code::SET_CONFIG, code::GET_STATUS, code::ADD_MEM_REG, 99]);
        let n = rng.below(64);
        let p = rng.bytes(n);
        msg(&mut out, rng.below(3) as u8, r, 1, &p);
    }
    out
}

/// The messages of an input: (start, end) of each.
fn split(v: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 1 + HEADER_LEN <= v.len() {
        let size = u32::from_le_bytes(v[at + 9..at + 13].try_into().unwrap()) as usize;
        let end = (at + 1 + HEADER_LEN).saturating_add(size).min(v.len());
        out.push((at, end));
        at = end;
    }
    out
}

/// Message-level mutations: drop, repeat or swap whole messages, or set one field of one
/// message (its fd spec, flags, an index or value in its payload) to an edge value, keeping
/// its size right.
fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    let m = split(v);
    if m.is_empty() {
        *v = generate(rng);
        return;
    }
    let (s, e) = *rng.pick(&m);
    match rng.below(6) {
        0 => {
            v.drain(s..e);
        }
        1 => {
            let copy = v[s..e].to_vec();
            let (at, _) = *rng.pick(&m);
            v.splice(at..at, copy);
        }
        2 => {
            let (s2, e2) = *rng.pick(&m);
            if s2 > e {
                let (a, b) = (v[s..e].to_vec(), v[s2..e2].to_vec());
                v.splice(s2..e2, a);
                v.splice(s..e, b);
            }
        }
        3 => {
            let r = rng.next() as u8;
            v[s] = *rng.pick(&[0u8, 1, 2, 8, 9, 0x11, 0x21, 0x31, 0x18, r]);
        }
        4 => {
            let fl = *rng.pick(&[0u32, 1, 5, 9, 0xd, 0xffff_ffff]);
            v[s + 5..s + 9].copy_from_slice(&fl.to_le_bytes());
        }
        _ => {
            let body = s + 1 + HEADER_LEN;
            if e >= body + 4 {
                let at = body + 4 * rng.below((e - body) / 4);
                let x = *rng.pick(&[0u32, 1, 2, 3, 4, 7, 8, 9, 0x100, 0x101, 0x8000, 0x1_0000 - 1, u32::MAX]);
                v[at..at + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}

pub const TARGET: Target =
    Target { name: "vhost", max_len: 4096, run, generate: Some(generate), mutate: Some(mutate), dict: &[] };

#[test]
fn vhost() {
    fuzz(&TARGET);
}

#[test]
fn vhost_regressions() {
    regressions(&TARGET);
}
