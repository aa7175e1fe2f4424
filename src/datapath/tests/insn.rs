//! The instructions a frame costs the data path, per table mode and frame layout: a fixed
//! in-process workload per cell for `tools/insn_per_frame.py`, which runs each ignored cell
//! test under valgrind's callgrind and counts only inside `measured_step` (one poll-thread
//! step; `--toggle-collect`), so the set-up, the warm-up bursts and the test VMs' own sending
//! and receiving are not counted. Instruction counts do not move with the machine's speed, and
//! the same binary counts the same twice: the MAC table has one bucket (its hash is keyed at
//! random per process) and everything else here is fixed.
//!
//! ```sh
//! python3 tools/insn_per_frame.py                      # every cell of this tree's test binary
//! python3 tools/insn_per_frame.py --base OLD-BINARY    # and of another, with the ratios
//! ```
//!
//! A cell by hand: `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*insn::measured_step*' target/release/deps/pvswitch-HASH --exact
//! datapath::tests::insn::flows1k_64 --ignored --nocapture`, then the `totals:` line of the
//! output file over the frames the test prints. `every_cell_forwards_its_frames` runs every
//! cell briefly in the suite, so the workload stays what it says.

use pvsgen::frontend::{Desc, F_INDIRECT, F_NEXT, Guest, HDR_LEN};

use super::*;
use crate::flow::table::FlowTable;

/// What the switch's table does with the cell's frames.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// No flows: NORMAL, vm0 to vm1's learned MAC.
    Normal,
    /// No flows: every frame to a MAC nobody has, its source MAC moving between the two ports
    /// every burst (testpmd flowgen's traffic in the flood cell of tools/bench_matrix.py).
    Flood,
    /// `in_port=vm0,actions=output:vm1` and the reverse.
    InPort,
    /// 1,000 exact `in_port,ip,nw_dst` flows the frames spread over, and a drop flow.
    Flows1k,
    /// No flows, both ports on access VLAN 10: NORMAL learned unicast, by VLAN.
    Access,
    /// No flows, vm0 on access VLAN 10 and vm1 a trunk of it: each frame gets its tag pushed.
    Trunk,
    /// No flows, vm0 with an ingress cap and vm1 with an egress cap, both far above the
    /// traffic: what checking and charging the buckets costs.
    Capped,
    /// `Flood`, with 14 more VMs whose receive rings are full (they never take a frame): what
    /// the ports that cannot take a flood cost it.
    FloodFull,
    /// NORMAL learned unicast with both VMs logging (a migration under way): what marking the
    /// dirty log costs.
    Logged,
    /// NORMAL learned unicast to vm1 in a security group that lets UDP in: every frame one
    /// lookup in vm1's zone of the connection table, the 500 connections committed in the
    /// warm-up (what a tracked, allowed connection costs).
    Secured,
    /// No flows, vm0 on VLAN 10 and vm1 on VLAN 20, two networks of a VRF: every frame, sent
    /// to the gateway's MAC, routed (its neighbour one of vm1's 500 addresses, its TTL and
    /// checksum rewritten). Against `Access`: what routing costs beside bridging.
    Routed,
    /// OVS's `ct` flows: `ct(table=1)` for IP, then in table 1 `ct(commit),output:vm1` for
    /// `+trk+new` (one-way UDP stays new: every frame two tracker lookups and a table-1
    /// lookup, its 500 connections committed in the warm-up).
    CtFlows,
}

/// How the sender lays a frame out in its TX ring.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    /// One descriptor: the virtio-net header and the frame after it (virtio-user).
    One,
    /// Two chained descriptors: the header, then the frame (pvsgen; a Linux guest when the
    /// packet has no room in front for the header).
    Chain,
    /// One descriptor pointing at an indirect table of those two.
    Indirect,
}

/// Bursts run before counting (the MAC learned, every flow key in the exact-match cache).
const WARM_BURSTS: usize = 40;
/// Bursts counted: 3,200 frames.
const BURSTS: usize = 100;
const BURST: usize = 32;
/// Distinct IPv4 destinations the frames spread over (each has its flow in flows1k).
const DESTS: usize = 500;

/// testpmd flowgen's addresses: every frame from the first to the second.
const FLOWGEN_SRC: [u8; 6] = [0, 1, 2, 3, 4, 0];
const FLOWGEN_DST: [u8; 6] = [0, 1, 2, 3, 4, 1];

/// Where callgrind counts: one loop iteration of every poll thread, nothing else.
#[inline(never)]
fn measured_step(b: &mut Bench) -> u32 {
    b.step()
}

/// An IPv4/UDP frame of `len` bytes from `src` to `dst`, to 10.253.x.y for destination `i`.
fn ipv4_frame(dst: [u8; 6], src: [u8; 6], len: usize, i: usize) -> Vec<u8> {
    let mut f = frame(dst, src, len, i as u32);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14..18].copy_from_slice(&[0x45, 0, 0, 0]);
    f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    f[18..24].copy_from_slice(&[0, 0, 0, 0, 64, 17]);
    f[26..30].copy_from_slice(&[10, 0, 0, 99]);
    f[30..34].copy_from_slice(&[10, 253, (i / 256) as u8, (i % 256) as u8]);
    f
}

/// The cell's flow table (empty for NORMAL).
fn flows(mode: Mode) -> Vec<String> {
    match mode {
        Mode::Normal
        | Mode::Flood
        | Mode::FloodFull
        | Mode::Access
        | Mode::Routed
        | Mode::Trunk
        | Mode::Capped
        | Mode::Logged
        | Mode::Secured => {
            vec![]
        }
        Mode::CtFlows => vec![
            "priority=100,ip,ct_state=-trk,actions=ct(table=1)".into(),
            "table=1,ip,ct_state=+trk+new,actions=ct(commit),output:vm1".into(),
            "table=1,ip,ct_state=+trk+est,actions=output:vm1".into(),
            "table=1,priority=0,actions=drop".into(),
        ],
        Mode::InPort => vec!["in_port=vm0,actions=output:vm1".into(), "in_port=vm1,actions=output:vm0".into()],
        Mode::Flows1k => (0..DESTS)
            .flat_map(|i| {
                let nw = format!("ip,nw_dst=10.253.{}.{}", i / 256, i % 256);
                [
                    format!("priority=10,in_port=vm0,{nw},actions=output:vm1"),
                    format!("priority=10,in_port=vm1,{nw},actions=output:vm0"),
                ]
            })
            .chain(["priority=0,actions=drop".to_string()])
            .collect(),
    }
}

/// Makes `frames` available in `g`'s TX ring at once, each as an indirect table of two
/// descriptors (header, frame). Avail slot `s` uses ring descriptor 2(s mod qsize/2) and that
/// descriptor's buffer slot for the header and the frame after it, the next slot for the table.
fn send_indirect(g: &mut Guest, frames: &[&Vec<u8>]) {
    assert_eq!(g.tx_pending(), 0, "the switch left frames in the TX ring");
    let l = *g.layout();
    let pairs = l.qsize / 2;
    for f in frames {
        let d = 2 * (g.raw_tx().avail_idx() % pairs);
        let (hdr, table) = (l.tx_buf(d), l.tx_buf(d + 1));
        assert!(64 + f.len() as u64 <= l.buf_slot);
        g.mem.write(hdr, &[0u8; HDR_LEN]);
        g.mem.write(hdr + 64, f);
        let descs = [
            Desc { addr: hdr, len: HDR_LEN as u32, flags: F_NEXT, next: 1 },
            Desc { addr: hdr + 64, len: f.len() as u32, flags: 0, next: 0 },
        ];
        pvsgen::frontend::write_descs(&g.mem, table, &descs);
        let mut tx = g.raw_tx();
        tx.desc(d, Desc { addr: table, len: 32, flags: F_INDIRECT, next: 0 });
        tx.stage(d);
    }
    g.raw_tx().publish();
}

/// Runs one cell: `warm` bursts, then `bursts` bursts through `measured_step`, every burst
/// checked to arrive whole and unchanged; returns the frames the measured steps took.
fn run(mode: Mode, size: usize, lay: Lay, warm: usize, bursts: usize) -> u64 {
    let vms = if mode == Mode::FloodFull { 16 } else { 2 };
    let mut b = Bench::new(BenchCfg { vms, mac_buckets: 1, ..BenchCfg::default() });
    let (dst, src) = match mode {
        Mode::Flood | Mode::FloodFull => (FLOWGEN_DST, FLOWGEN_SRC),
        Mode::Routed => (GATEWAY, mac(0)),
        _ => (mac(1), mac(0)),
    };
    match mode {
        Mode::Access | Mode::Trunk => {
            use crate::config::vlan::PortVlan;
            b.policies[0].vlan = PortVlan::access(10);
            b.policies[1].vlan = if mode == Mode::Trunk { PortVlan::trunk(&[10]) } else { PortVlan::access(10) };
            b.post(0);
        }
        Mode::Routed => {
            use crate::config::ips::IpPrefix;
            use crate::config::vlan::PortVlan;
            use crate::config::vrf::{NetworkConfig, VrfConfig};
            b.policies[0].vlan = PortVlan::access(10);
            b.policies[1].vlan = PortVlan::access(20);
            b.policies[1].allowed_macs = vec![crate::wire::MacAddr(mac(1))];
            b.policies[1].allowed_ips =
                (0..DESTS).map(|i| IpPrefix::parse(&format!("10.253.{}.{}", i / 256, i % 256)).unwrap()).collect();
            let net = |vlan, gateway: [u8; 4], prefix_len| NetworkConfig {
                vlan,
                gateway: gateway.into(),
                prefix_len,
                gateway6: None,
            };
            b.vrfs = vec![VrfConfig {
                name: "t".into(),
                gateway_mac: crate::wire::MacAddr(GATEWAY),
                networks: vec![net(10, [10, 0, 0, 1], 24), net(20, [10, 253, 255, 254], 16)],
            }];
            b.post(0);
        }
        Mode::Capped => {
            let cap = |ingress_pps, egress_pps| crate::config::RateCaps {
                ingress_pps,
                egress_pps,
                ingress_bps: 1 << 40,
                egress_bps: 1 << 40,
                ..Default::default()
            };
            b.vms[0].port.rates.apply(&cap(1 << 29, 0));
            b.vms[1].port.rates.apply(&cap(0, 1 << 29));
        }
        Mode::Logged => {
            // The logs stay open for the run (held by the backends); nothing syncs them.
            start_logging(&mut b, 0);
            start_logging(&mut b, 1);
        }
        Mode::Secured => {
            let text = "[[security_group]]\nname = \"g\"\n[[security_group.rule]]\ndirection = \"ingress\"\n\
                        protocol = \"udp\"\n[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\n\
                        socket = \"/tmp/x/vm1.sock\"\nsecurity_groups = [\"g\"]\n";
            let c = crate::config::Config::parse("t.toml", text).unwrap();
            let all: Vec<_> = c.ports.iter().collect();
            let rules = crate::secgroup::compile(&c.ports[0], &c.security_groups, &all, 2).unwrap();
            b.policies[1].rules = Some(std::sync::Arc::new(rules));
            let limits = crate::conntrack::Limits { total: 4096, per_zone: 4096 };
            b.conntrack = Some(std::sync::Arc::new(crate::conntrack::Conntrack::new(limits, Default::default())));
            b.post(0);
        }
        Mode::CtFlows => {
            let limits = crate::conntrack::Limits { total: 4096, per_zone: 4096 };
            b.flow_conntrack = Some(std::sync::Arc::new(crate::conntrack::Conntrack::new(limits, Default::default())));
        }
        _ => {}
    }
    match mode {
        Mode::Normal | Mode::Access | Mode::Capped | Mode::Logged | Mode::Secured => b.announce(1),
        Mode::Trunk => {
            // The trunk's own frames are tagged.
            b.vms[1].guest.send(&tagged(&frame([0xff; 6], mac(1), 60, 0), 0x8100, 10));
            b.settle(10);
            assert_eq!(b.vms[0].recv().len(), 1);
        }
        _ => {}
    }
    let table = flows(mode);
    if !table.is_empty() {
        let id = |s: &str| s.strip_prefix("vm").and_then(|n| n.parse().ok());
        b.flows = std::sync::Arc::new(FlowTable::build(table.iter().map(|s| s.as_str()), &id, 1, None).unwrap());
        b.post(0);
    }
    // A port floods found full stays skipped for the whole run: how long a skip lasts is real
    // time, which the steps (under callgrind, 50x slower) must not depend on.
    b.set_flood_retry(u64::MAX / 4);
    let frames: Vec<Vec<u8>> = (0..DESTS).map(|i| ipv4_frame(dst, src, size, i)).collect();
    let mut taken = 0;
    for burst in 0..warm + bursts {
        // Flood: the two VMs take turns sending, so the source MAC moves every burst.
        let from = if matches!(mode, Mode::Flood | Mode::FloodFull) { burst % 2 } else { 0 };
        let batch: Vec<&Vec<u8>> = (0..BURST).map(|j| &frames[(burst * BURST + j) % DESTS]).collect();
        let g = &mut b.vms[from].guest;
        match lay {
            Lay::One => g.send_all_one_desc(&batch),
            Lay::Chain => g.send_all(&batch),
            Lay::Indirect => send_indirect(g, &batch),
        }
        let got = if burst < warm { b.step() } else { measured_step(&mut b) };
        assert_eq!(got as usize, BURST, "{mode:?} {size} {lay:?}, burst {burst}: frames taken");
        if burst >= warm {
            taken += got as u64;
        }
        let recv = b.vms[1 - from].recv();
        assert_eq!(recv.len(), BURST, "{mode:?} {size} {lay:?}, burst {burst}: frames arrived");
        let expected = |s: &Vec<u8>| match mode {
            Mode::Trunk => tagged(s, 0x8100, 10),
            Mode::Routed => routed(s, mac(1)),
            _ => s.clone(),
        };
        assert!(
            recv.iter().zip(&batch).all(|(r, s)| *r == expected(s)),
            "{mode:?} {size} {lay:?}, burst {burst}: frames changed"
        );
    }
    taken
}

/// The routed cell's gateway MAC.
const GATEWAY: [u8; 6] = [0x02, 0, 0, 0, 0, 0xfe];

/// Frame `s` as the gateway routes it to `to`: the MACs, the TTL one less, the checksum
/// updated for it.
fn routed(s: &[u8], to: [u8; 6]) -> Vec<u8> {
    let mut r = s.to_vec();
    r[0..6].copy_from_slice(&to);
    r[6..12].copy_from_slice(&GATEWAY);
    r[22] -= 1;
    let sum = u16::from_be_bytes([r[24], r[25]]);
    r[24..26].copy_from_slice(&crate::wire::checksum::combine(sum, 0x0100).to_be_bytes());
    r
}

/// Runs a cell for the measure and prints what the tool reads beside callgrind's count.
fn measure(cell: &str, mode: Mode, size: usize, lay: Lay) {
    let frames = run(mode, size, lay, WARM_BURSTS, BURSTS);
    println!("insn cell={cell} mode={mode:?} size={size} layout={lay:?} frames={frames}");
}

macro_rules! cells {
    ($($name:ident: $mode:ident, $size:literal, $lay:ident;)*) => {
        /// Every cell, for the test that runs them all.
        const CELLS: &[(Mode, usize, Lay)] = &[$((Mode::$mode, $size, Lay::$lay)),*];
        $(
            /// One cell of the measure (ignored: `tools/insn_per_frame.py` runs it under callgrind).
            #[test]
            #[ignore]
            fn $name() {
                measure(stringify!($name), Mode::$mode, $size, Lay::$lay);
            }
        )*
    };
}

cells! {
    normal_64: Normal, 64, One;
    normal_64_chain: Normal, 64, Chain;
    normal_64_indirect: Normal, 64, Indirect;
    normal_1518: Normal, 1518, One;
    normal_1518_chain: Normal, 1518, Chain;
    flood_64: Flood, 64, One;
    flood_64_chain: Flood, 64, Chain;
    flood_64_indirect: Flood, 64, Indirect;
    flood_1518: Flood, 1518, One;
    flood_1518_chain: Flood, 1518, Chain;
    inport_64: InPort, 64, One;
    inport_64_chain: InPort, 64, Chain;
    inport_64_indirect: InPort, 64, Indirect;
    inport_1518: InPort, 1518, One;
    inport_1518_chain: InPort, 1518, Chain;
    flows1k_64: Flows1k, 64, One;
    flows1k_64_chain: Flows1k, 64, Chain;
    flows1k_64_indirect: Flows1k, 64, Indirect;
    flows1k_1518: Flows1k, 1518, One;
    flows1k_1518_chain: Flows1k, 1518, Chain;
    access_64: Access, 64, One;
    access_1518: Access, 1518, One;
    routed_64: Routed, 64, One;
    routed_1518: Routed, 1518, One;
    trunk_64: Trunk, 64, One;
    trunk_1518: Trunk, 1518, One;
    capped_64: Capped, 64, One;
    capped_1518: Capped, 1518, One;
    flood_full_64: FloodFull, 64, One;
    logged_64: Logged, 64, One;
    logged_1518: Logged, 1518, One;
    secured_64: Secured, 64, One;
    secured_1518: Secured, 1518, One;
    ct_flows_64: CtFlows, 64, One;
    ct_flows_1518: CtFlows, 1518, One;
}

/// Every cell's traffic arrives whole, in order, under its table (a short run of each).
#[test]
fn every_cell_forwards_its_frames() {
    for &(mode, size, lay) in CELLS {
        assert_eq!(run(mode, size, lay, 20, 4), 4 * BURST as u64, "{mode:?} {size} {lay:?}");
    }
}
