#!/usr/bin/env python3
"""Two pvswitchd builds and the testpmd vhost ceiling, VM-to-VM as tools/bench_vm2vm.py
measures it (or any cell of tools/bench_matrix.py), rotated in the same run: did a change move
forwarding speed?

Usage: tools/bench_ab.py --base BINARY [--reps 7] [--seconds 5] [--size 64] [--cell CELL]
                         [--ring N] [--out FILE]
       tools/bench_ab.py --base BINARY --cycles [--reps 7] [--seconds 3] [--size 64,1518] [--out FILE]
CELL: learned, flood (the default: bench_vm2vm's setup), in_port, flows1k, flows10k, nic.
--cycles: what a frame costs each build's poll thread instead of a rate: pvsgen as two VMs (a
sends to b's MAC, learned unicast, as fast as its ring allows; pvsgen on the other core sets
the pace), the poll thread's busy cycles over the frames it switched, over a second in the
middle of each run, the two builds alternated in each rep (no ceiling: it has no such count).
Far less spread than a rate, and it sees what instructions do not (cache misses).
BINARY is another build's pvswitchd (e.g. a `git worktree` of the commit before, built with
`cargo build --release`); the tree's own is target/release/pvswitchd, or PVS_BENCH_PVSWITCHD
if set (to compare two other builds). Check the harness with the same binary on both sides:
an A/A run of the flows1k cell gave 1.001 (0.994..1.032, 6 reps) once testpmd kept its
hugepages between runs (before, 0.974 on the nic cell, 0.947..1.065), so read differences of a
percent or two as noise.
Needs root, hugepages and DPDK (scripts/install-deps.sh).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, line_ns, measure_cell, phase_of, run_pvsgen  # noqa: E402


def cycles(a):
    """The --cycles comparison: switch cycles a frame, new against base, per frame size."""
    lines = [f"Switch cycles a frame, this build (new) against {a.base} (base), pvsgen a -> b learned unicast, "
             f"{a.reps} alternated reps of {a.seconds:g} s", "",
             "| frame | new cycles/frame | base cycles/frame | new / base (median) | min..max |", "|---|---|---|---|---|"]
    for size in [int(s) for s in str(a.size).split(",")]:
        rows = []
        for rep in range(a.reps):
            r = {}
            for k in (["new", "base"] if rep % 2 == 0 else ["base", "new"]):
                st = run_pvsgen([("a", ""), ("b", "")], [f"name=a,dst=b,size={size}", "name=b,dst=none"], a.seconds,
                                binary=a.base if k == "base" else None)
                r[k] = st["switch"]["threads"][0]["cycles_per_packet"]
            rows.append(r)
            print(f"{size} B rep {rep + 1}: new {r['new']:.0f}  base {r['base']:.0f}  new/base {r['new'] / r['base']:.3f}",
                  flush=True)
        rs = [x["new"] / x["base"] for x in rows]
        lines.append(f"| {size} B | {statistics.median(x['new'] for x in rows):.0f} | "
                     f"{statistics.median(x['base'] for x in rows):.0f} | {statistics.median(rs):.3f} | "
                     f"{min(rs):.3f}..{max(rs):.3f} |")
    emit("\n".join(lines), a.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", default=None, help="64 (rates); 64,1518 (--cycles)")
    ap.add_argument("--cycles", action="store_true")
    ap.add_argument("--cell", default="flood")
    ap.add_argument("--ring", type=int, default=256)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.cycles:
        a.size = a.size or "64,1518"
        return cycles(a)
    a.size = int(a.size or 64)
    kinds = ["new", "base", "ceiling"]
    rows = []
    for rep in range(a.reps):
        order = kinds[rep % 3:] + kinds[:rep % 3]
        r, phases = {}, []
        for k in order:
            before = line_ns()
            kind = "ceiling" if k == "ceiling" else "pvswitch"
            r[k] = measure_cell(a.cell, kind, a.size, a.ring, a.seconds, binary=a.base if k == "base" else None)
            phases.append(phase_of(before, line_ns()))
        r["phase"] = phases[0] if len(set(phases)) == 1 else "mixed"
        rows.append(r)
        print(f"rep {rep + 1}: new {r['new'] / 1e6:6.3f}  base {r['base'] / 1e6:6.3f}  ceiling {r['ceiling'] / 1e6:6.3f} Mpps"
              f"  new/base {r['new'] / r['base']:.3f}  ({r['phase']})", flush=True)

    def ratio_row(name, num, den, sel=rows):
        rs = [x[num] / x[den] for x in sel]
        return f"| {name} | {statistics.median(rs):.3f} | {min(rs):.3f}..{max(rs):.3f} | {len(rs)} |"

    lines = [f"Two builds against the ceiling, cell {a.cell}, {a.size} B, ring {a.ring}, {a.reps} rotated reps of "
             f"{a.seconds:g} s",
             "", "| ratio | median | min..max | reps |", "|---|---|---|---|",
             ratio_row("new / base", "new", "base"), ratio_row("new / ceiling", "new", "ceiling"),
             ratio_row("base / ceiling", "base", "ceiling")]
    for ph in ("fast", "slow"):
        sel = [x for x in rows if x["phase"] == ph]
        if sel:
            lines.append(ratio_row(f"new / base, all three runs {ph}", "new", "base", sel))
    lines.append("")
    lines.append("Medians: " + ", ".join(f"{k} {statistics.median(x[k] for x in rows) / 1e6:.3f} Mpps" for k in kinds))
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    sys.exit(main())
