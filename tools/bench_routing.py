#!/usr/bin/env python3
"""Routing at the edge against bridging and against OVS-DPDK routing with flows (issue 52's
benchmark): a 64 B IPv4/UDP stream from VM a (VLAN 100, 10.1.0.5) to VM b (VLAN 200, 10.2.0.5)
through the tenant's anycast gateway, and the same stream bridged (a and b in one VLAN, to b's
MAC), frames a second into b and the switch's cycles a frame.

- pvswitch-routed: a `[[vrf]]` with the two networks; a sends to the gateway's MAC.
- pvswitch-bridged: both ports in VLAN 100; a sends to b's MAC (learned: b announces itself).
- ovs-routed: OVS-DPDK 3.1 routing the same frames with flows, as a controller would write
  them: `ip,in_port=a,dl_dst=GATEWAY,nw_dst=10.2.0.0/24` ->
  `dec_ttl,mod_dl_src:GATEWAY,mod_dl_dst:B,output:b`.

The generator is testpmd txonly on port a (`--tx-ip`, `--eth-peer`), the sink a second testpmd
in rxonly on port b, both on CPU 0; the switch runs on CPU 1. Cycles a frame: pvswitchd's poll
thread's busy cycles over the frames it received (`pvswitchctl stats`), OVS's PMD "avg
processing cycles per packet", over the measured window (tools/bench_ct.py's probe). The kinds
are rotated within each rep. Where the generator, not the switch, sets the rate, compare the
cycles.

Usage: tools/bench_routing.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), OVS-DPDK
(scripts/install-bench-peer.sh) and a release build of the workspace.
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ct import cycles_probe, spread  # noqa: E402
from pvsbench import OVS_VSWITCHD, Testpmd, emit, start_ovs, start_pvswitch  # noqa: E402

KINDS = ["pvswitch-routed", "pvswitch-bridged", "ovs-routed"]
GW = "02:00:00:00:01:01"
MAC_A = "52:54:00:0b:01:05"
MAC_B = "52:54:00:0b:02:05"
VRF = (
    f'[[vrf]]\nname = "t"\ngateway_mac = "{GW}"\n'
    '[[vrf.network]]\nvlan = 100\ngateway = "10.1.0.1/24"\n'
    '[[vrf.network]]\nvlan = 200\ngateway = "10.2.0.1/24"\n'
)
OVS_ROUTE = [
    f"table=0,priority=10,ip,in_port=a,dl_dst={GW},nw_dst=10.2.0.0/24,"
    f"actions=dec_ttl,mod_dl_src:{GW},mod_dl_dst:{MAC_B},output:b",
    "table=0,priority=0,actions=drop",
]


def start(kind, d):
    """The switch of `kind` with ports a and b in `d`; returns (stop, where a sends, b's
    address)."""
    if kind == "ovs-routed":
        return start_ovs(d, OVS_ROUTE), GW, "10.2.0.5"
    if kind == "pvswitch-routed":
        ports = [("a", f'tag = 100\nallowed_macs = ["{MAC_A}"]\nallowed_ips = ["10.1.0.5"]'),
                 ("b", f'tag = 200\nallowed_macs = ["{MAC_B}"]\nallowed_ips = ["10.2.0.5"]')]
        return start_pvswitch(d, extra=VRF, ports=ports), GW, "10.2.0.5"
    ports = [("a", f'tag = 100\nallowed_macs = ["{MAC_A}"]'), ("b", f'tag = 100\nallowed_macs = ["{MAC_B}"]')]
    return start_pvswitch(d, ports=ports), MAC_B, "10.1.0.6"


def run(kind, size, seconds):
    """One run: frames a second into b, and the switch's cycles a frame."""
    d = tempfile.mkdtemp(prefix="pvs-bench-rt-")
    stop, dst_mac, dst_ip = start(kind, d)
    got = {}
    try:
        sink = Testpmd("rtsink", ["--lcores", "0@0,1@0", "-m", "256", "--single-file-segments",
                                  "--vdev", f"net_virtio_user0,path={d}/b.sock,queues=1,mac={MAC_B}"],
                       ["--forward-mode=rxonly", "--nb-cores=1", f"--txpkts={size}", f"--eth-peer=0,{MAC_A}"])
        gen = Testpmd("rtgen", ["--lcores", "2@0,3@0", "-m", "256", "--single-file-segments",
                                "--vdev", f"net_virtio_user1,path={d}/a.sock,queues=1,mac={MAC_A}"],
                      ["--forward-mode=txonly", "--nb-cores=1", f"--txpkts={size}", f"--eth-peer=0,{dst_mac}",
                       f"--tx-ip=10.1.0.5,{dst_ip}"])
        try:
            # b announces itself (one burst from its MAC: the bridged switch learns it), then
            # only receives.
            sink.cmd("start tx_first 1")
            time.sleep(1.0)
            gen.cmd("start")
            time.sleep(1.5)
            done = threading.Event()
            side = threading.Thread(target=cycles_probe(kind.split("-")[0], got), args=(d, done))
            side.start()
            r0, t0 = sink.rx_packets(1), time.time()
            time.sleep(seconds)
            r1, t1 = sink.rx_packets(1), time.time()
            done.set()
            side.join()
            return (r1 - r0) / (t1 - t0), got.get("cycles", float("nan"))
        finally:
            gen.close()
            sink.close()
    finally:
        stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--out")
    a = ap.parse_args()
    if not os.path.exists(OVS_VSWITCHD):
        sys.exit(f"no {OVS_VSWITCHD}: run scripts/install-bench-peer.sh")
    started = time.strftime("%Y-%m-%d %H:%M")
    lines = [
        f"Routed and bridged, pvswitchd and OVS-DPDK routing with flows, {a.reps} reps of {a.seconds:g} s "
        f"from {started}; Mpps into b and the switch's cycles a frame, medians",
        "",
        "| frame | pvswitchd routed | pvswitchd bridged | OVS routed | pvswitchd / OVS, routed rate (min..max) "
        "| cycles a frame: pvswitchd routed, bridged, OVS routed | pvswitchd routed / bridged cycles (min..max) "
        "| pvswitchd / OVS routed cycles (min..max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for size in map(int, a.sizes.split(",")):
        rs = []
        for rep in range(a.reps):
            order = KINDS[rep % len(KINDS):] + KINDS[:rep % len(KINDS)]
            r = {k: run(k, size, a.seconds) for k in order}
            print(f"rep {rep + 1} {size:>4} B: "
                  + "  ".join(f"{k} {r[k][0] / 1e6:.3f} Mpps {r[k][1]:.0f} c/f" for k in KINDS), flush=True)
            rs.append(r)
        col = {k: ([r[k][0] for r in rs], [r[k][1] for r in rs]) for k in KINDS}
        vs_ovs = [r["pvswitch-routed"][0] / r["ovs-routed"][0] for r in rs]
        rb = [r["pvswitch-routed"][1] / r["pvswitch-bridged"][1] for r in rs]
        co = [r["pvswitch-routed"][1] / r["ovs-routed"][1] for r in rs]
        lines.append(
            f"| {size} B | {med(col['pvswitch-routed'][0]) / 1e6:.3f} | {med(col['pvswitch-bridged'][0]) / 1e6:.3f} "
            f"| {med(col['ovs-routed'][0]) / 1e6:.3f} | **{med(vs_ovs):.2f}x** ({spread(vs_ovs)}) "
            f"| {med(col['pvswitch-routed'][1]):.0f}, {med(col['pvswitch-bridged'][1]):.0f}, "
            f"{med(col['ovs-routed'][1]):.0f} | {med(rb):.3f} ({spread(rb)}) | {med(co):.3f} ({spread(co)}) |"
        )
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
