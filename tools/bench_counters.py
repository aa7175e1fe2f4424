#!/usr/bin/env python3
"""What the counters cost: VM-to-VM forwarding (as tools/bench_vm2vm.py, 64 B) through pvswitchd
built normally and while its counters are read once a second (`pvswitchctl stats`, `rxq`
and a Prometheus scrape), against pvswitchd built with `--features no-counters` (every data-path
counter compiled out), alternating in the same run.

Usage: tools/bench_counters.py [--reps 5] [--seconds 4]
Needs root, hugepages and DPDK (scripts/install-deps.sh).
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import ROOT, ctl, emit, measure  # noqa: E402

PORT = 19400
# How often the counters are read during a run (pvswitchctl stats and rxq, one Prometheus scrape).
READ_EVERY = 1.0
METRICS = f'metrics_listen = "127.0.0.1:{PORT}"\n'


def collect(d, done):
    while not done.wait(READ_EVERY):
        for cmd in ("stats", "rxq"):
            ctl(d, cmd, check=False)
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=1) as s:
                s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                while s.recv(65536):
                    pass
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    off_dir = os.path.join(ROOT, "target", "no-counters")
    subprocess.run(["cargo", "build", "--release", "--bin", "pvswitchd"], cwd=ROOT, check=True)
    subprocess.run(["cargo", "build", "--release", "--bin", "pvswitchd", "--features", "no-counters",
                    "--target-dir", off_dir], cwd=ROOT, check=True)
    off_bin = os.path.join(off_dir, "release", "pvswitchd")
    rows = []
    for rep in range(a.reps):
        order = ["on", "off"] if rep % 2 == 0 else ["off", "on"]
        r = {}
        for k in order:
            if k == "on":
                r[k] = measure("pvswitch", 64, a.seconds, switch_extra=METRICS, during=collect)
            else:
                r[k] = measure("pvswitch", 64, a.seconds, binary=off_bin)
        rows.append(r)
        print(f"rep {rep + 1}: counters on+read {r['on'] / 1e6:6.3f} Mpps  compiled out {r['off'] / 1e6:6.3f} Mpps"
              f"  ratio {r['on'] / r['off']:.3f}", flush=True)
    ratios = [r["on"] / r["off"] for r in rows]
    lines = [
        f"Counter cost, 64 B VM-to-VM, {a.reps} alternating pairs of {a.seconds:g} s",
        "",
        "| counters on, read 1x/s (median) | compiled out (median) | median ratio | ratio min..max |",
        "|---|---|---|---|",
        f"| {statistics.median(r['on'] for r in rows) / 1e6:.3f} Mpps | {statistics.median(r['off'] for r in rows) / 1e6:.3f} Mpps"
        f" | {statistics.median(ratios):.3f} | {min(ratios):.3f}..{max(ratios):.3f} |",
    ]
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
