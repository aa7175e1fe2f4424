#!/usr/bin/env python3
"""What capture costs a port at full rate: VM-to-VM forwarding (as tools/bench_vm2vm.py: testpmd
flowgen through ports a and b, one poll thread) with nothing captured, and with port a captured
(both directions) by `pvswitchctl capture` for the whole measured window: a filter that matches
nothing (every frame copied and filtered, none recorded), everything to a reader that keeps up
(`-w /dev/null`), and everything to a reader that has stopped (SIGSTOP: its rings fill, records
are lost). The cases alternate in each rep, in a rotated order.

Usage: tools/bench_capture.py [--reps 5] [--seconds 4] [--size 64]
Needs root, hugepages and DPDK (scripts/install-deps.sh).
"""

import argparse
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import PVSWITCHCTL, alternated, emit, measure, ratio_table  # noqa: E402

CASES = {
    "none": None,
    "filter matches nothing": ["ether", "proto", "0x1234"],
    "everything, reader keeps up": [],
    "everything, reader stopped": [],
}


def capturing(case):
    """A `during` for measure(): port a captured as `case` says while the window is measured."""
    words = CASES[case]

    def during(d, done):
        p = subprocess.Popen([PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "capture", "a", "-w",
                              "/dev/null", *words], stderr=subprocess.PIPE, text=True)
        p.stderr.readline()  # "capturing on ...": hooked
        if case.endswith("stopped"):
            p.send_signal(signal.SIGSTOP)
        done.wait()
        p.send_signal(signal.SIGCONT)
        p.terminate()
        p.wait()

    return during if words is not None else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--out")
    a = ap.parse_args()
    names = list(CASES)
    rows = alternated(names, lambda c: measure("pvswitch", a.size, a.seconds, during=capturing(c)), a.reps)
    lines = [f"Port a captured while testpmd flowgen forwards {a.size} B frames a <-> b through one poll thread, "
             f"{a.reps} reps of {a.seconds:g} s, cases rotated in each rep", "", ratio_table(names, rows, "none")]
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
