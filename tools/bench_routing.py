#!/usr/bin/env python3
"""Routing at the edge against OVS-DPDK routing with flows (issue 52's benchmark): the same
IPv4/UDP stream from VM a (VLAN 100) routed to VM b (VLAN 200) through the tenant's gateway, by
pvswitchd's `[[vrf]]` and by OVS-DPDK 3.1 with the flows a controller writes for it
(`ip,in_port=a,dl_dst=GATEWAY,nw_dst=10.253.0.0/16` -> `dec_ttl,mod_dl_src:GATEWAY,
mod_dl_dst:B,output:b`), rotated within each rep: frames a second into b, and the switch's
cycles a frame.

The generator is tools/pvsbench.py's flowgen (testpmd, two virtio-user ports on CPU 0; the
switch on CPU 1). DPDK 22.11's flowgen sends every frame from 00:01:02:03:04:00 and 10.254.0.0
to 00:01:02:03:04:01 and 10.253.0.0 on both ports, so the gateway's MAC is 00:01:02:03:04:01,
a's frames are routed, and b's (the same frames, from a MAC b's port does not allow, or that no
flow takes) are dropped by both switches at their first check: each switch's cycles a frame are
over every frame it received, b's drops included, in both. Routed against bridged, where the
generator cannot help, is `tools/insn_per_frame.py --cells 'access|routed'`.

Usage: tools/bench_routing.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), OVS-DPDK
(scripts/install-bench-peer.sh) and a release build of the workspace.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ct import cycles_probe, spread  # noqa: E402
from pvsbench import OVS_VSWITCHD, emit, measure  # noqa: E402

KINDS = ["pvswitch", "ovs"]
GW = "00:01:02:03:04:01"
MAC_A = "00:01:02:03:04:00"
MAC_B = "52:54:00:0b:02:05"
VRF = (
    f'[[vrf]]\nname = "t"\ngateway_mac = "{GW}"\n'
    '[[vrf.network]]\nvlan = 100\ngateway = "10.254.0.1/16"\n'
    '[[vrf.network]]\nvlan = 200\ngateway = "10.253.0.1/16"\n'
)
PORTS = [("a", f'tag = 100\nallowed_macs = ["{MAC_A}"]\nallowed_ips = ["10.254.0.0"]'),
         ("b", f'tag = 200\nallowed_macs = ["{MAC_B}"]\nallowed_ips = ["10.253.0.0"]')]
OVS_ROUTE = [
    f"table=0,priority=10,ip,in_port=a,dl_dst={GW},nw_dst=10.253.0.0/16,"
    f"actions=dec_ttl,mod_dl_src:{GW},mod_dl_dst:{MAC_B},output:b",
    "table=0,priority=0,actions=drop",
]


def run(kind, size, seconds):
    """One run: frames a second into b (flowgen counts what its ports receive), cycles a frame."""
    got = {}
    rate = measure(kind, size, seconds, extra=VRF if kind == "pvswitch" else "", flows=1,
                   ports=PORTS if kind == "pvswitch" else None, ovs_flows=OVS_ROUTE,
                   during=cycles_probe(kind, got))
    return rate, got.get("cycles", float("nan"))


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
        f"Routed between two VLANs of a tenant, pvswitchd's `[[vrf]]` and OVS-DPDK's flows, {a.reps} reps of "
        f"{a.seconds:g} s from {started}; Mpps into b and the switch's cycles a frame received, medians",
        "",
        "| frame | pvswitchd | OVS | pvswitchd / OVS, rate (min..max) | cycles a frame, pvswitchd, OVS "
        "| pvswitchd / OVS cycles (min..max) |",
        "|---|---|---|---|---|---|",
    ]
    med = statistics.median
    for size in map(int, a.sizes.split(",")):
        rs = []
        for rep in range(a.reps):
            order = KINDS[rep % 2:] + KINDS[:rep % 2]
            r = {k: run(k, size, a.seconds) for k in order}
            print(f"rep {rep + 1} {size:>4} B: "
                  + "  ".join(f"{k} {r[k][0] / 1e6:.3f} Mpps {r[k][1]:.0f} c/f" for k in KINDS), flush=True)
            rs.append(r)
        rate = [r["pvswitch"][0] / r["ovs"][0] for r in rs]
        cyc = [r["pvswitch"][1] / r["ovs"][1] for r in rs]
        lines.append(
            f"| {size} B | {med([r['pvswitch'][0] for r in rs]) / 1e6:.3f} | {med([r['ovs'][0] for r in rs]) / 1e6:.3f} "
            f"| **{med(rate):.2f}x** ({spread(rate)}) | {med([r['pvswitch'][1] for r in rs]):.0f}, "
            f"{med([r['ovs'][1] for r in rs]):.0f} | {med(cyc):.3f} ({spread(cyc)}) |"
        )
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
