//! A sender that rewrites its frames while the switch handles them: a second vCPU storing into
//! the TX buffers it posted, between classify and delivery (the data path's test hook
//! `BETWEEN_STAGES` runs it exactly there). What the policy decided on must be what is
//! delivered: port security and flow matches read the switch's copy of a frame's front, and
//! delivery sends that copy, so no frame arrives with bytes the policy never saw.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::*;
use crate::datapath::counters::DropReason as Why;
use crate::datapath::plan::PortPolicy;
use crate::datapath::rx::BETWEEN_STAGES;
use crate::flow::table::FlowTable;

/// While alive, sets byte `at` of every frame buffer in VM `vm`'s TX area to `v` whenever the
/// data path is between classify and delivery, through a mapping of the guest's memory of its
/// own (as the guest's other vCPU would).
struct Rewriter;

impl Rewriter {
    fn start(b: &Bench, vm: usize, at: u64, v: u8) -> Rewriter {
        let l = *b.vms[vm].guest.layout();
        let fd = b.vms[vm].guest.memfd().try_clone().unwrap();
        let len = l.mem_size as usize;
        // SAFETY: a fresh shared mapping of the guest's memfd, unmapped when the hook goes; only
        // bytes of TX buffer slots are written, with volatile stores.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        } as usize;
        assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
        struct Map(usize, usize);
        impl Drop for Map {
            fn drop(&mut self) {
                // SAFETY: the mapping made above, no longer used.
                unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
            }
        }
        let map = Map(base, len);
        BETWEEN_STAGES.set(Some(Box::new(move || {
            let map = &map; // the whole mapping, so it lives as long as the hook
            // Frames sit in the odd descriptors' buffers (pvsgen: header, then frame).
            for d in (1..l.qsize).step_by(2) {
                let p = (l.tx_buf(d) + at) as usize;
                // SAFETY: inside the mapping (tx_buf(d) + at < mem_size).
                unsafe { std::ptr::write_volatile((map.0 as *mut u8).add(p), v) };
            }
        })));
        Rewriter
    }
}

impl Drop for Rewriter {
    fn drop(&mut self) {
        BETWEEN_STAGES.set(None);
    }
}

/// Sends 20 rounds of 32 frames made by `make` from vm0 while a rewriter is active, one burst
/// a round (the rewriter rewrites every TX buffer, so a second burst in a round would be
/// classified rewritten); returns every frame vm1 received.
fn under_rewrites(b: &mut Bench, make: impl Fn(u32) -> Vec<u8>) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    for r in 0..20 {
        let burst: Vec<Vec<u8>> = (0..32).map(|i| make((r * 32 + i) as u32)).collect();
        b.vms[0].guest.send_all(&burst);
        b.settle(20);
        got.extend(b.vms[1].recv());
    }
    assert_eq!(b.vms[0].guest.tx_pending(), 0, "vm0's chains were not all completed");
    got
}

/// Port security on vm0 (it may send from mac(0) only) while its second vCPU rewrites each
/// frame's source MAC, after classify, to one it may not use: every frame arrives, as
/// classified, from mac(0). Before the front was copied, every one arrived forged.
#[test]
fn port_security_holds_against_a_sender_rewriting_its_frames() {
    for flows in [&[][..], &["in_port=vm0,actions=output:vm1"], &["ip,actions=output:vm1", "priority=0,actions=drop"]] {
        let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
        b.policies[0] = PortPolicy { allowed_macs: vec![crate::wire::MacAddr(mac(0))], ..Default::default() };
        b.post(0);
        b.announce(1);
        if !flows.is_empty() {
            let id = |s: &str| s.strip_prefix("vm").and_then(|n| n.parse().ok());
            b.flows = Arc::new(FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap());
            b.post(0);
        }
        let _rw = Rewriter::start(&b, 0, 11, 0x99);
        let got = under_rewrites(&mut b, |i| udp(mac(1), mac(0), 200, 80, i));
        assert_eq!(got.len(), 640, "{flows:?}: frames lost");
        let forged = got.iter().filter(|f| f[11] != mac(0)[5]).count();
        assert_eq!(forged, 0, "{flows:?}: {forged} frames delivered with a source port security refuses");
    }
}

/// A flow ACL (vm0 may send UDP to port 80 only; everything else is dropped) while vm0's second
/// vCPU rewrites each frame's destination port to 22 after classify: the frames arrive as
/// classified, to port 80, and the payload beyond the front is still the sender's.
#[test]
fn a_flow_acl_holds_against_a_sender_rewriting_its_frames() {
    let mut b = Bench::new(BenchCfg { vms: 2, ..BenchCfg::default() });
    let id = |s: &str| s.strip_prefix("vm").and_then(|n| n.parse().ok());
    let flows = ["priority=10,in_port=vm0,udp,tp_dst=80,actions=output:vm1", "priority=0,actions=drop"];
    b.flows = Arc::new(FlowTable::build(flows.iter().copied(), &id, 1, None).unwrap());
    b.post(0);
    let _rw = Rewriter::start(&b, 0, 37, 22);
    let sent: Vec<Vec<u8>> = (0..640).map(|i| udp(mac(1), mac(0), 200, 80, i)).collect();
    let got = under_rewrites(&mut b, |i| sent[i as usize].clone());
    let to_22 = got.iter().filter(|f| f[37] != 80).count();
    assert_eq!(to_22, 0, "{to_22} of {} frames delivered to a port the ACL drops", got.len());
    assert!(got == sent, "frames lost or changed");
    drop(_rw);
    // And a rewrite before classify is simply what the guest sent: dropped by the ACL.
    let f = udp(mac(1), mac(0), 200, 22, 0);
    b.vms[0].guest.send(&f);
    b.settle(5);
    assert!(b.vms[1].recv().is_empty());
    assert_eq!(b.drops(0, Why::FlowDrop), 1);
}

/// A UDP/IPv4 frame of `len` bytes to UDP port `port`.
fn udp(dst: [u8; 6], src: [u8; 6], len: usize, port: u16, seq: u32) -> Vec<u8> {
    let mut f = frame(dst, src, len, seq);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    let ip_len = (f.len() - 14) as u16;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[20..22].copy_from_slice(&[0, 0]);
    f[23] = 17;
    f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f[36..38].copy_from_slice(&port.to_be_bytes());
    f
}
