#!/usr/bin/env python3
"""iperf3 TCP between two QEMU guests (TCG) through pvswitchd, offloads on against off.

Each rep starts pvswitchd with `offloads = true` on both ports, then with `offloads = false`
(the order flips every rep), and runs scripts/vm-pair.sh (ping, then iperf3 A->B and B->A for
--iperf-time seconds). Offloads on: the guests exchange 64 KiB TSO frames with partial
checksums, handed whole; off: 1500-byte frames, each checksummed by the guest. Prints Mbit/s
per run and the ratio on/off per rep (floor: 3x).

--poll-mode adaptive (the default here) lets the poll thread sleep when idle, so on this
2-core machine the two TCG guests get the second core whenever the switch has nothing to do;
with busy the poll thread keeps one core and the guests share the other.

Usage: tools/bench_offloads.py [--reps 3] [--iperf-time 10] [--poll-mode adaptive|busy] [--iperf-args "-Z"] [--out FILE]
Needs a release build and the guest image (bash scripts/prepare.sh does both); run as root.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import ROOT, ctl, emit, start_pvswitchd, write_config  # noqa: E402


def run(offloads, iperf_time, poll_mode, iperf_args=""):
    """Mbit/s A->B and B->A with offloads on or off, and the frames pvswitchd moved."""
    with tempfile.TemporaryDirectory(prefix="pvs-offl-") as d:
        extra = f"offloads = {'true' if offloads else 'false'}\n"
        conf = write_config(d, [("vm1", extra), ("vm2", extra)], (1,), f'poll_mode = "{poll_mode}"')
        stop = start_pvswitchd(d, conf)
        try:
            out = subprocess.run(
                [os.path.join(ROOT, "scripts", "vm-pair.sh"), os.path.join(d, "vm1.sock"), os.path.join(d, "vm2.sock"),
                 "--logdir", os.path.join(d, "vm-pair"), "--pings", "3", "--iperf-time", str(iperf_time),
                 "--iperf-args", iperf_args],
                capture_output=True, text=True, timeout=900)
            ports, stats = ctl(d, "ports"), ctl(d, "stats")
        finally:
            stop()
        text = out.stdout + out.stderr
        got = dict(re.findall(r"iperf (a-b|b-a) mbps=([0-9.]+)", text))
        if out.returncode != 0 or len(got) != 2:
            raise RuntimeError(f"vm-pair failed (offloads {offloads}):\n{text}")
        frames = sum(p["tx_packets"] for p in ports)
        mbytes = sum(p["tx_bytes"] for p in ports) / 1e6
        cycles = sum(t["busy_cycles"] for t in stats["threads"])
        return float(got["a-b"]), float(got["b-a"]), frames, cycles / mbytes / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iperf-time", type=int, default=10)
    ap.add_argument("--poll-mode", default="adaptive", choices=["adaptive", "busy"])
    ap.add_argument("--iperf-args", default="", help='more iperf3 client options, e.g. "-Z" (sendfile)')
    ap.add_argument("--out")
    a = ap.parse_args()
    rows, ratios = [], []
    for rep in range(a.reps):
        order = [True, False] if rep % 2 == 0 else [False, True]
        res = {}
        for on in order:
            res[on] = run(on, a.iperf_time, a.poll_mode, a.iperf_args)
            ab, ba, frames, kc = res[on]
            print(f"rep {rep}: offloads {'on ' if on else 'off'}: A->B {ab:.0f} Mbit/s, B->A {ba:.0f} Mbit/s, "
                  f"{frames} frames, switch {kc:.0f} kcycles/MB", flush=True)
        (on_ab, on_ba, on_fr, on_kc), (off_ab, off_ba, off_fr, off_kc) = res[True], res[False]
        ratio = (on_ab + on_ba) / (off_ab + off_ba)
        ratios.append(ratio)
        rows.append(f"| {rep} | {'on, off' if rep % 2 == 0 else 'off, on'} | {on_ab:.0f} / {on_ba:.0f} | "
                    f"{off_ab:.0f} / {off_ba:.0f} | {on_fr} / {off_fr} | {on_kc:.0f} / {off_kc:.0f} | {ratio:.2f} |")
    table = "\n".join([
        f"iperf3 {a.iperf_args + ' ' if a.iperf_args else ''}TCP between two QEMU guests (TCG) through pvswitchd "
        f"({a.poll_mode} polling), {a.iperf_time} s each way, {a.reps} reps",
        "",
        "| rep | order | offloads on: A->B / B->A (Mbit/s) | offloads off | frames moved (on / off) "
        "| poll thread busy kcycles per MB moved (on / off) | throughput on / off |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"on / off: median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f}); floor 3.0",
    ])
    emit(table, a.out)


if __name__ == "__main__":
    main()
