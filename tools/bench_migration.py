#!/usr/bin/env python3
"""What dirty logging costs the data path, timed (issue 32).

VM-to-VM through pvswitchd, pvsgen as both VMs (a sends to b as fast as its ring allows), with
dirty logging on for both (LOG_ALL and a log that pvsgen reads and clears every 10 ms, as QEMU
does while it migrates a VM) against off, alternating within each rep (which goes first
alternates too), at 64 B and 1518 B. Reported, each as on / off per rep (median and spread):
the switch's cycles a frame (its poll thread's busy cycles over the frames it switched, over a
second in the middle of the run: the generator, not the switch, sets the rate on this machine)
and the rate b received. Also the pages marked per second while logging.

Migration downtime and total time under a TCP stream come from tests/migration.rs (QEMU).

Usage: tools/bench_migration.py [--reps 5] [--seconds 4] [--sizes 64,1518] [--out FILE]
Needs root and a release build (pvswitchd, pvsgen).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, run_pvsgen  # noqa: E402


def one(size, log, seconds):
    flag = 1 if log else 0
    rep = run_pvsgen([("a", ""), ("b", "")],
                     [f"name=a,dst=b,size={size},log={flag}", f"name=b,dst=none,log={flag}"], seconds)
    t = rep["switch"]["threads"][0]
    pages = sum(v["dirty_pages"] for v in rep["vms"])
    return {"cpp": t["cycles_per_packet"], "mpps": rep["totals"]["rx_mpps"], "pages_s": pages / rep["seconds"]}


def spread(xs):
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}..{max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = [f"pvsgen a -> b through pvswitchd (one poll thread), dirty logging on (both VMs) against off, "
             f"{a.reps} alternating reps of {a.seconds:g} s", "",
             "| frame | cycles/frame off | cycles/frame on | on / off (cycles) | Mpps off | Mpps on "
             "| on / off (rate) | pages marked/s |",
             "|---|---|---|---|---|---|---|---|"]
    for size in [int(s) for s in a.sizes.split(",")]:
        rows = []
        for rep in range(a.reps):
            order = [False, True] if rep % 2 == 0 else [True, False]
            r = {log: one(size, log, a.seconds) for log in order}
            rows.append(r)
            print(f"{size} B rep {rep + 1}: off {r[False]['cpp']:.0f} cyc {r[False]['mpps']:.3f} Mpps, "
                  f"on {r[True]['cpp']:.0f} cyc {r[True]['mpps']:.3f} Mpps", flush=True)
        med = lambda log, k: statistics.median(x[log][k] for x in rows)  # noqa: E731
        lines.append(
            f"| {size} B | {med(False, 'cpp'):.0f} | {med(True, 'cpp'):.0f} "
            f"| {spread([x[True]['cpp'] / x[False]['cpp'] for x in rows])} "
            f"| {med(False, 'mpps'):.3f} | {med(True, 'mpps'):.3f} "
            f"| {spread([x[True]['mpps'] / x[False]['mpps'] for x in rows])} | {med(True, 'pages_s'):,.0f} |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    sys.exit(main())
