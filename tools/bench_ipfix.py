#!/usr/bin/env python3
"""What flow export costs at full rate: VM-to-VM forwarding (as tools/bench_vm2vm.py: testpmd
flowgen through ports a and b, one poll thread) without [ipfix], and with it exporting to a
local UDP port nobody reads, observing one frame in 1000 and every frame. The cases alternate
in each rep, in a rotated order.

Usage: tools/bench_ipfix.py [--reps 5] [--seconds 4] [--size 64]
Needs root, hugepages and DPDK (scripts/install-deps.sh).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import alternated, emit, measure, ratio_table  # noqa: E402

CASES = {
    "no export": "",
    "ipfix, 1 in 1000": "[ipfix]\ncollector = \"127.0.0.1:9\"\nsampling = 1000\n",
    "ipfix, every frame": "[ipfix]\ncollector = \"127.0.0.1:9\"\n",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    names = list(CASES)
    rows = alternated(names, lambda c: measure("pvswitch", a.size, a.seconds, extra=CASES[c]), a.reps)
    lines = [f"Flow export while testpmd flowgen forwards {a.size} B frames a <-> b through one poll thread, "
             f"{a.reps} reps of {a.seconds:g} s, cases rotated in each rep", "", ratio_table(names, rows, "no export")]
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
