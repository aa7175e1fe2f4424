#!/usr/bin/env python3
"""pvswitchd against the established peer, Open vSwitch with DPDK (Debian's
openvswitch-switch-dpdk, OVS 3.1 on the DPDK 22.11 that pvswitchd uses), and the testpmd vhost
ceiling, in the cells of tools/bench_matrix.py: the same generator, the same flows (OVS's NORMAL
flow for the learned and flood cells), the switch on CPU 1. The three are rotated within each
rep, so each rep's three runs share the machine's phase as far as it allows.

OVS runs with its defaults but for what puts it on the same footing: one PMD thread on CPU 1,
its other threads started on CPU 1 too, DPDK in 512 MiB of hugepages, dpdkvhostuser ports (OVS
the vhost-user server, as pvswitchd is).

Usage: tools/bench_peer.py [--reps 5] [--seconds 3] [--sizes 64] [--rings 256,1024]
                           [--cells learned,flood,in_port,flows1k,flows10k,nic] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), OVS-DPDK
(scripts/install-bench-peer.sh) and a release build of the workspace.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import CELLS, OVS_VSWITCHD, cell_keys, emit, line_ns, measure_cell, phase_of  # noqa: E402

KINDS = ["pvswitch", "ovs", "ceiling"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64")
    ap.add_argument("--rings", default="256,1024")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    if not os.path.exists(OVS_VSWITCHD):
        sys.exit(f"no {OVS_VSWITCHD}: run scripts/install-bench-peer.sh")
    keys = cell_keys(a.cells, a.sizes, a.rings)
    rows = {k: [] for k in keys}
    started = time.strftime("%Y-%m-%d %H:%M")
    for rep in range(a.reps):
        for k in keys:
            cell, size, ring = k
            # Each kind goes first, second and third in turn.
            order = KINDS[rep % 3:] + KINDS[:rep % 3]
            r, ph = {}, {}
            for kind in order:
                before = line_ns()
                r[kind] = measure_cell(cell, kind, size, ring, a.seconds)
                ph[kind] = phase_of(before, line_ns())
            rows[k].append(r)
            print(f"rep {rep + 1} {cell:>8} {size:>4} B ring {ring:>4}: "
                  + "  ".join(f"{kind} {r[kind] / 1e6:6.3f} ({ph[kind]})" for kind in KINDS)
                  + f"  pvswitch/ovs {r['pvswitch'] / r['ovs']:.3f}", flush=True)

    def ratio(rs, x, y):
        v = [r[x] / r[y] for r in rs]
        return f"**{statistics.median(v):.3f}** ({min(v):.3f}..{max(v):.3f})"

    lines = [
        f"pvswitchd, OVS-DPDK and the ceiling, {started}: {a.reps} rotated reps of {a.seconds:g} s per cell, "
        "generator on CPU 0, switch on CPU 1",
        "",
        "| cell | frame | ring | pvswitchd | OVS-DPDK | ceiling (median Mpps) | pvswitchd / OVS (min..max) "
        "| pvswitchd / ceiling | OVS / ceiling |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for k in keys:
        rs = rows[k]
        cell, size, ring = k
        med = {kind: statistics.median(r[kind] for r in rs) / 1e6 for kind in KINDS}
        lines.append(
            f"| {cell} | {size} B | {ring if cell != 'nic' else '-'} | {med['pvswitch']:.3f} | {med['ovs']:.3f} | "
            f"{med['ceiling']:.3f} | {ratio(rs, 'pvswitch', 'ovs')} | {ratio(rs, 'pvswitch', 'ceiling')} | "
            f"{ratio(rs, 'ovs', 'ceiling')} |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    sys.exit(main())
