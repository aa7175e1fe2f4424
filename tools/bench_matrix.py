#!/usr/bin/env python3
"""The benchmark matrix: pvswitchd against the no-switching ceiling (DPDK testpmd's vhost PMD in
io-forward mode) in every configuration a user is likely to try, each pair measured alternately
in the same run, with each run's machine phase.

Cells (VM-to-VM: a generator "VM" with two ports on CPU 0, the switch on CPU 1):
  learned   pvsgen: port a sends to b's MAC and b to a's, each from its own (learned) MAC
  flood     testpmd flowgen with its built-in addresses: every frame on both ports from
            00:01:02:03:04:00 to the never-seen 00:01:02:03:04:01, so for NORMAL every frame is
            an unknown-unicast flood and the source MAC moves between the ports every burst
  in_port   flowgen, with `in_port=a,actions=output:b` and `in_port=b,actions=output:a`
  flows1k   flowgen over 500 destination IPs per port, 1,000 exact flows
            (`priority=10,in_port=a,ip,nw_dst=10.253.x.y,actions=output:b`, the same from b),
            every frame matching one, and `priority=0,actions=drop`
  flows10k  the same 1,000 flows and 9,000 more of the same shape that no frame matches
  nic       NIC -> VM -> NIC (64 B only): net_null0 DPDK port, a testpmd io-forward VM, two
            in_port flows (tools/bench_nic.py)
each at ring sizes 256 and 1024 (virtio-user queue_size and testpmd --txd/--rxd, or pvsgen's
--qsize) and at 64 and 1518 B. The ceiling forwards port to port whatever the frames carry, so it
is the same for every VM-to-VM cell of one generator, ring and size; it is still run next to
each cell's pvswitchd run, so a pair sees the same phase as often as the machine allows.

Runs used to alternate in speed by about 10%, whichever system ran: the generator's hugepages
came back in reverse order every run (see pvsbench.Testpmd, which now keeps them). Pairs still
alternate which system goes first, and the table still gives the order-balanced ratio: the
median, over consecutive pairs (one of each order), of the geometric mean of their two ratios.

Usage: tools/bench_matrix.py [--reps 8] [--seconds 4] [--sizes 64,1518] [--rings 256,1024]
                             [--cells learned,flood,in_port,flows1k,flows10k,nic]
                             [--reps-1518 3] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of the workspace.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import CELLS, alternating_pair, cell_keys, emit, measure_cell  # noqa: E402



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=8, help="alternating pairs per 64 B cell")
    ap.add_argument("--reps-1518", type=int, default=3, help="alternating pairs per 1518 B cell")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--rings", default="256,1024")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    keys = cell_keys(a.cells, a.sizes, a.rings)
    rows = {k: [] for k in keys}
    started = time.strftime("%Y-%m-%d %H:%M")
    for rep in range(max(a.reps, a.reps_1518)):
        for k in keys:
            cell, size, ring = k
            if rep >= (a.reps if size == 64 else a.reps_1518):
                continue
            r = alternating_pair(rep, lambda kind: measure_cell(cell, kind, size, ring, a.seconds))
            rows[k].append(r)
            ph = dict(zip(["pvswitch", "ceiling"], r["phases"]))
            print(f"rep {rep + 1} {cell:>8} {size:>4} B ring {ring:>4}: pvswitch {r['pvswitch'] / 1e6:6.3f} Mpps "
                  f"({ph['pvswitch']})  ceiling {r['ceiling'] / 1e6:6.3f} Mpps ({ph['ceiling']})  "
                  f"ratio {r['pvswitch'] / r['ceiling']:.3f}", flush=True)
    lines = [
        f"Benchmark matrix, {started}: alternating pairs of {a.seconds:g} s ({a.reps} per 64 B cell, "
        f"{a.reps_1518} per 1518 B cell), generator on CPU 0, switch on CPU 1",
        "",
        "| cell | frame | ring | pvswitchd (median Mpps) | ceiling (median Mpps) | median ratio | min..max "
        "| order-balanced | both fast: median (pairs) | both slow: median (pairs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def same(rs, ph):
        v = [r["pvswitch"] / r["ceiling"] for r in rs if r["phases"] == (ph, ph)]
        return f"{statistics.median(v):.3f} ({len(v)})" if v else "- (0)"

    for k in keys:
        rs = rows[k]
        if not rs:
            continue
        cell, size, ring = k
        ratios = [r["pvswitch"] / r["ceiling"] for r in rs]
        balanced = [(ratios[i] * ratios[i + 1]) ** 0.5 for i in range(0, len(ratios) - 1, 2)]
        lines.append(
            f"| {cell} | {size} B | {ring if cell != 'nic' else '-'} | "
            f"{statistics.median(r['pvswitch'] for r in rs) / 1e6:.3f} | "
            f"{statistics.median(r['ceiling'] for r in rs) / 1e6:.3f} | **{statistics.median(ratios):.3f}** | "
            f"{min(ratios):.3f}..{max(ratios):.3f} | "
            f"{f'{statistics.median(balanced):.3f}' if balanced else '-'} | {same(rs, 'fast')} | {same(rs, 'slow')} |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    sys.exit(main())
