//! Target: the descriptor walk over ring memory the guest wrote (`vring::ActiveRing`: avail,
//! pop, the fast path and the general walk, indirect tables, prefetch_ahead, unpop, publish).
//!
//! An input is an 8-byte header and an image of guest memory written at guest-physical 0:
//!
//! | byte | meaning |
//! |---|---|
//! | 0 | bit 0: a receive queue (device-writable buffers); bit 1: EVENT_IDX; bit 2: ring addresses moved by bytes 4-7; bit 3: unpop each chain and pop it again |
//! | 1 | log2 of the ring size, mod 9 (1..256) |
//! | 2-3 | the base (SET_VRING_BASE), little-endian |
//! | 4-7 | with bit 2: desc moved by u16 * 16, avail by i8 * 2, used by i8 * 4 |
//!
//! The descriptor table is at 0, the avail ring right after it (16 * size), the used ring after
//! that, 4-aligned. Guest memory is two regions: 0..32 KiB (mapped at an offset of one page into
//! its file, the page before and the page after fenced off with PROT_NONE, so a read outside
//! the region faults) and 32..40 KiB in another file, so a buffer may cross from one into the
//! other. Every segment a pop returns must lie inside one region; every walk must end (at most
//! the ring size of chains, each at most `MAX_CHAIN_DESCS` descriptors).

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{Rng, Target, bit, fuzz, regressions};
use crate::mem::{GuestMem, MemLimits, RegionDesc, Segs};
use crate::vring::{Ahead, MAX_CHAIN_DESCS, Vring, ring_addrs};

pub const HDR: usize = 8;
const UVA: u64 = 0x7f00_0000_0000;
const R1: u64 = 0x8000;
const R2: u64 = 0x2000;
const PAGE: u64 = 4096;
const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

fn memfd(len: u64) -> File {
    // SAFETY: memfd_create with a valid C string; the fd is owned by the returned File.
    let f = unsafe { File::from_raw_fd(libc::memfd_create(c"pvs-fuzz".as_ptr(), 0)) };
    f.set_len(len).unwrap();
    f
}

thread_local! {
    static FILES: (File, File) = (memfd(R1 + 2 * PAGE), memfd(R2));
}

/// Guest memory with `image` at guest-physical 0 (zeros elsewhere), fenced as the module says.
pub fn guest_memory(image: &[u8]) -> GuestMem {
    FILES.with(|(f1, f2)| {
        let mut full = vec![0u8; (R1 + R2) as usize];
        let n = image.len().min(full.len());
        full[..n].copy_from_slice(&image[..n]);
        f1.write_all_at(&full[..R1 as usize], PAGE).unwrap();
        f2.write_all_at(&full[R1 as usize..], 0).unwrap();
        let regions = [
            RegionDesc { guest_phys_addr: 0, size: R1, user_addr: UVA, mmap_offset: PAGE },
            RegionDesc { guest_phys_addr: R1, size: R2, user_addr: UVA + R1, mmap_offset: 0 },
        ];
        let mem =
            GuestMem::map(&regions, vec![f1.try_clone().unwrap(), f2.try_clone().unwrap()], &MemLimits::NONE).unwrap();
        // Fence off the first region's file bytes outside the region: any read of them faults.
        let ((host, size), (start, len)) = mem.host_ranges()[0];
        for (at, n) in [(start, host - start), (host + size, start + len - (host + size))] {
            if n > 0 {
                // SAFETY: whole pages inside a mapping this GuestMem owns; nothing else uses them.
                assert_eq!(unsafe { libc::mprotect(at as *mut libc::c_void, n, libc::PROT_NONE) }, 0);
            }
        }
        mem
    })
}

/// Asserts that every segment of `segs` lies inside one region of `mem`.
pub fn check_segs(mem: &GuestMem, segs: &Segs) {
    let ranges = mem.host_ranges();
    let mut total = 0u64;
    for &(p, n) in segs.pieces() {
        let (p, n) = (p as usize, n as usize);
        assert!(
            ranges.iter().any(|&((h, s), _)| p >= h && p + n <= h + s),
            "segment {p:#x}+{n} outside guest memory {ranges:x?}"
        );
        total += n as u64;
    }
    assert_eq!(segs.len() as u64, total.min(u32::MAX as u64), "Segs::len is not the sum of its segments");
}

fn layout(size: u64) -> (u64, u64, u64) {
    let avail = 16 * size;
    let used = (avail + 6 + 2 * size).next_multiple_of(4);
    (0, avail, used)
}

fn run(input: &[u8]) -> u64 {
    if input.len() < HDR {
        return 0;
    }
    let (hd, image) = input.split_at(HDR);
    let h = hd;
    let writable = h[0] & 1 != 0;
    let event_idx = h[0] & 2 != 0;
    let size = 1u16 << (h[1] % 9);
    let base = u16::from_le_bytes([h[2], h[3]]);
    let (mut d, mut a, mut u) = layout(size as u64);
    if h[0] & 4 != 0 {
        d = d.wrapping_add(u16::from_le_bytes([h[4], h[5]]) as u64 * 16);
        a = a.wrapping_add_signed(h[6] as i8 as i64 * 2);
        u = u.wrapping_add_signed(h[7] as i8 as i64 * 4);
    }
    let mem = Arc::new(guest_memory(image));

    let Some(addrs) = ring_addrs(&mem, size, UVA.wrapping_add(d), UVA.wrapping_add(a), UVA.wrapping_add(u)) else {
        return 1;
    };
    let mut ring = Vring::default();
    ring.start(addrs, base, event_idx, (None, None), mem.clone());
    let mut r = ring.active.as_mut().unwrap().lend();
    let again_too = input[0] & 8 != 0;
    let mut segs = Segs::default();
    let mut again = Segs::default();
    let (mut pops, mut walked) = (0u32, 0u32);
    let mut h = 0u64;
    let end = loop {
        let n = match r.avail() {
            Ok(0) => break 0,
            Ok(n) => n,
            Err(e) => break 100 + e as u64,
        };
        assert!(n <= size, "avail {n} > ring size {size}");
        r.prefetch_ahead(if writable { Ahead::Write(12) } else { Ahead::Read(0) });
        let res = r.pop(&mut segs, writable);
        let w = r.take_walked();
        assert!(w <= MAX_CHAIN_DESCS, "one pop walked {w} descriptors");
        walked += w;
        match res {
            Ok(head) => {
                assert!(head < size, "head {head} out of range");
                check_segs(&mem, &segs);
                // Read the whole chain through the segments (every byte of it).
                let mut buf = vec![0u8; segs.len().min(1 << 20) as usize];
                assert_eq!(segs.read_at(0, &mut buf), buf.len());
                if again_too {
                    // Given back and taken again, the same chain walks the same way.
                    r.unpop(1);
                    let head2 = r.pop(&mut again, writable).expect("a chain that walked once walks again");
                    r.take_walked();
                    assert_eq!(head2, head);
                    assert_eq!(again.pieces(), segs.pieces());
                }
                r.push_used(head, segs.len());
                h |= bit(&[7, segs.pieces().len().min(8) as u64, writable as u64]);
            }
            Err(e) => break 200 + e as u64,
        }
        pops += 1;
        // The guest's memory does not change here: once its chains are taken, avail says 0.
        assert!(pops <= size as u32, "{pops} chains popped from a ring of {size}");
    };
    r.publish();
    assert!(walked <= size as u32 * MAX_CHAIN_DESCS);
    h | bit(&[end, writable as u64]) | bit(&[8, pops.min(8) as u64])
}

/// A ring of `size` entries with well-formed chains (direct, linked, indirect, crossing into the
/// second region), some of them then broken.
fn generate(rng: &mut Rng) -> Vec<u8> {
    let size = 1u64 << (1 + rng.below(8));
    let writable = rng.one_in(2);
    let base = if rng.one_in(4) { rng.next() as u16 } else { 0 };
    let mut hdr =
        vec![writable as u8 | (rng.below(2) as u8) << 1 | (rng.one_in(8) as u8) << 3, size.trailing_zeros() as u8];
    hdr.extend_from_slice(&base.to_le_bytes());
    hdr.extend_from_slice(&[0; 4]);
    let (_, avail, used) = layout(size);
    let mut img = vec![0u8; (used + 6 + 8 * size) as usize + 0x1000];
    let wf = if writable { F_WRITE } else { 0 };
    let desc = |img: &mut Vec<u8>, at: u64, addr: u64, len: u32, flags: u16, next: u16| {
        let at = at as usize;
        if img.len() < at + 16 {
            img.resize(at + 16, 0);
        }
        img[at..at + 8].copy_from_slice(&addr.to_le_bytes());
        img[at + 8..at + 12].copy_from_slice(&len.to_le_bytes());
        img[at + 12..at + 14].copy_from_slice(&flags.to_le_bytes());
        img[at + 14..at + 16].copy_from_slice(&next.to_le_bytes());
    };
    // Buffers and indirect tables live past the rings, in 0x4000..R1 + R2.
    let mut free = 0x4000u64;
    let mut buf = |rng: &mut Rng, len: u32| {
        let at = if rng.one_in(6) { R1 - 1 - rng.below(len as usize) as u64 } else { free };
        free += len as u64;
        if free > R1 + R2 - 2048 {
            free = 0x4000;
        }
        at
    };
    let chains = 1 + rng.below(size as usize);
    let mut next_desc = 0u64;
    for c in 0..chains {
        if next_desc >= size {
            break;
        }
        let head = next_desc;
        let kind = rng.below(4);
        let n = if kind == 0 { 1 } else { 1 + rng.below(4) as u64 };
        if kind == 3 {
            // An indirect table of n entries.
            let table = buf(rng, 16 * n as u32) & !15;
            desc(&mut img, 16 * head, table, 16 * n as u32, F_INDIRECT, 0);
            next_desc += 1;
            for k in 0..n {
                let len = 1 + rng.below(1500) as u32;
                let b = buf(rng, len);
                let fl = wf | if k + 1 < n { F_NEXT } else { 0 };
                desc(&mut img, table + 16 * k, b, len, fl, (k + 1) as u16);
            }
        } else {
            for k in 0..n.min(size - head) {
                let len = 1 + rng.below(2000) as u32;
                let b = buf(rng, len);
                let last = k + 1 == n.min(size - head);
                let fl = wf | if last { 0 } else { F_NEXT };
                desc(&mut img, 16 * (head + k), b, len, fl, (head + k + 1) as u16);
                next_desc += 1;
            }
        }
        let slot = (base as u64 + c as u64) % size;
        let at = (avail + 4 + 2 * slot) as usize;
        img[at..at + 2].copy_from_slice(&(head as u16).to_le_bytes());
    }
    let idx = base.wrapping_add(chains as u16);
    img[avail as usize + 2..avail as usize + 4].copy_from_slice(&idx.to_le_bytes());
    // Trim trailing zeros: guest memory is zero past the image anyway.
    while img.last() == Some(&0) {
        img.pop();
    }
    hdr.extend_from_slice(&img);
    hdr
}

/// Sets one field of one descriptor (in the ring's table or anywhere 16-aligned) or of the avail
/// ring to a value chosen to break it: out of range, just in range, looping, flags flipped.
fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    if v.len() < HDR {
        v.resize(HDR, 0);
    }
    let size = 1u64 << (v[1] % 9);
    let (_, avail, _) = layout(size);
    let slot = if rng.one_in(3) { rng.below(size as usize) as u64 * 16 } else { rng.below(0x800) as u64 * 16 };
    let (at, val): (u64, Vec<u8>) = match rng.below(6) {
        0 => {
            let r = rng.next();
            let addr = *rng.pick(&[0, R1 - 8, R1 - 1, R1, R1 + R2 - 1, R1 + R2, 0x4000, u64::MAX - 7, r]);
            (slot, addr.to_le_bytes().to_vec())
        }
        1 => {
            let r = rng.next() as u32 & 0xffff;
            let len = *rng.pick(&[0u32, 1, 16, 4096, 0x8000, 0xffff_fff0, u32::MAX, r]);
            (slot + 8, len.to_le_bytes().to_vec())
        }
        2 => ((slot + 12), (rng.below(8) as u16).to_le_bytes().to_vec()),
        3 => {
            let next = *rng.pick(&[0u16, 1, (size - 1) as u16, size as u16, 0xffff, (slot / 16) as u16]);
            (slot + 14, next.to_le_bytes().to_vec())
        }
        4 => {
            // avail->idx
            let r = rng.next() as u16;
            let idx = *rng.pick(&[0u16, 1, size as u16, size as u16 + 1, 0xffff, r]);
            (avail + 2, idx.to_le_bytes().to_vec())
        }
        _ => {
            // an avail entry
            let e = rng.below(size as usize) as u64;
            let head = *rng.pick(&[0u16, (size - 1) as u16, size as u16, 0xffff]);
            (avail + 4 + 2 * e, head.to_le_bytes().to_vec())
        }
    };
    let at = HDR + at as usize;
    if v.len() < at + val.len() {
        v.resize(at + val.len(), 0);
    }
    v[at..at + val.len()].copy_from_slice(&val);
}

pub const TARGET: Target =
    Target { name: "vring", max_len: HDR + 0x3000, run, generate: Some(generate), mutate: Some(mutate), dict: &[] };

#[test]
fn vring() {
    fuzz(&TARGET);
}

#[test]
fn vring_regressions() {
    regressions(&TARGET);
}

/// The fuzzer's first finding: a chain that loops through a whole 256-entry table was refused
/// (ChainTooLong) but charged 257 descriptors, one more than it walked and than
/// `MAX_CHAIN_DESCS`, the most one pop may cost.
#[test]
fn a_refused_chain_is_charged_only_what_it_walked() {
    let input = std::fs::read(super::repo_dir("fuzz/regressions/vring/refused-chain-charged-257.bin")).unwrap();
    run(&input);
}
