#!/usr/bin/env python3
"""Flow table benchmark: VM-to-VM forwarding (as tools/bench_vm2vm.py) through pvswitchd with
1, 100 and 10,000 wildcard flows, measured alternately in the same run.

In every case one flow carries all the traffic (`priority=100,ip,actions=normal`); the others
are fillers of mixed masks (IPv4 prefixes of five lengths, TCP ports, masked source MACs, VLANs)
at higher priorities that the traffic never matches, so a lookup that misses the exact-match
cache must consult every filler's subtable before it settles on the carrier. The table reports
each size's median Mpps and its median ratio to the 1-flow case over alternating repetitions.

"0 flows" (if listed) is the switch with no flow table, which skips classification.

Usage: tools/bench_flows.py [--reps 5] [--seconds 4] [--flows 1,100,10000,0] [--size 64]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, measure  # noqa: E402


def flows(n):
    if n == 0:
        return ""  # no flow table at all: NORMAL without classification
    out = ["priority=100,ip,actions=normal"]
    i = 0
    while len(out) < n:
        p = 200 + i % 1000
        k = i // 5
        kind = i % 5
        if kind == 0:
            out.append(f"priority={p},ip,nw_dst=172.{16 + k % 16}.{k // 16 % 256}.0/24,actions=drop")
        elif kind == 1:
            out.append(f"priority={p},ip,nw_src=10.{k % 256}.{k // 256 % 256}.{k % 7}/32,actions=drop")
        elif kind == 2:
            out.append(f"priority={p},tcp,tp_dst={1 + k % 65000},actions=drop")
        elif kind == 3:
            out.append(f"priority={p},dl_src=0a:{k % 256:02x}:{k // 256 % 256:02x}:00:00:00/ff:ff:ff:00:00:00,actions=drop")
        else:
            out.append(f"priority={p},dl_vlan={1 + k % 4000},ip,nw_dst=192.168.{k % 256}.0/{16 + k % 9},actions=drop")
        i += 1
    return "flows = [\n" + "".join(f'  "{f}",\n' for f in out) + "]\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--flows", default="1,100,10000,0")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    counts = [int(s) for s in a.flows.split(",")]
    rows = []
    for rep in range(a.reps):
        order = counts if rep % 2 == 0 else list(reversed(counts))
        r = {n: measure("pvswitch", a.size, a.seconds, extra=flows(n)) for n in order}
        rows.append(r)
        print(f"rep {rep + 1}: " + "  ".join(f"{n} flows {r[n] / 1e6:6.3f} Mpps" for n in counts), flush=True)
    base = counts[0]
    lines = [
        f"Flow table cost, {a.size} B VM-to-VM, {a.reps} alternating repetitions of {a.seconds:g} s",
        "",
        f"| flows | Mpps (median) | ratio to {base} flow (median) | ratio min..max |",
        "|---|---|---|---|",
    ]
    for n in counts:
        ratios = [r[n] / r[base] for r in rows]
        lines.append(f"| {n} | {statistics.median(r[n] for r in rows) / 1e6:.3f} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}..{max(ratios):.3f} |")
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
