#!/usr/bin/env python3
"""The generator sending 64 KiB TSO frames VM-to-VM, against 1514-byte frames: Gbit/s.

pvswitchd with ports a and b on CPU 1; tools/pvsgen's `pvsgen-tso` on CPU 0 sends TCP/IPv4
frames from a to b as fast as the switch takes them, and counts what b receives. Three modes,
run in a rotating order in each rep:

- whole: 65000-byte TSO frames (MSS 1448) to a receiver with GUEST_CSUM/GUEST_TSO4: handed on
  whole, one copy;
- segmented: the same frames to a receiver without receive offloads: pvswitchd cuts every
  frame into 45 segments and completes each checksum;
- plain: 1514-byte frames with complete checksums, as a guest without offloads sends them.

Prints Gbit/s (Ethernet bytes received) per mode and rep, and per-rep ratios against plain.

Usage: tools/bench_tso.py [--reps 5] [--seconds 3] [--out FILE]
Needs a release build (cargo build --release --workspace); run as root.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import ROOT, emit, start_pvswitch  # noqa: E402

GEN = os.path.join(ROOT, "target", "release", "pvsgen-tso")
MODES = {
    "whole": ["--size", "65000", "--rx-offloads"],
    "segmented": ["--size", "65000"],
    "plain": ["--size", "1514"],
}


def run(mode, seconds):
    with tempfile.TemporaryDirectory(prefix="pvs-tso-") as d:
        stop = start_pvswitch(d)
        try:
            out = subprocess.run([GEN, "--tx", f"{d}/a.sock", "--rx", f"{d}/b.sock", "--cpu", "0",
                                  "--seconds", str(seconds), *MODES[mode]],
                                 capture_output=True, text=True, timeout=120)
        finally:
            stop()
    m = re.search(r"gbps=([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        raise RuntimeError(f"pvsgen-tso {mode} failed:\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    names = list(MODES)
    rows, whole, seg = [], [], []
    for rep in range(a.reps):
        order = names[rep % 3:] + names[:rep % 3]
        g = {m: run(m, a.seconds) for m in order}
        print(f"rep {rep}: " + ", ".join(f"{m} {g[m]:.1f} Gbit/s" for m in order), flush=True)
        whole.append(g["whole"] / g["plain"])
        seg.append(g["segmented"] / g["plain"])
        rows.append(f"| {rep} | {', '.join(order)} | {g['whole']:.1f} | {g['segmented']:.1f} | {g['plain']:.1f} | "
                    f"{whole[-1]:.2f} | {seg[-1]:.2f} |")
    span = lambda v: f"median {statistics.median(v):.2f} ({min(v):.2f}..{max(v):.2f})"  # noqa: E731
    table = "\n".join([
        f"pvsgen-tso a -> b through pvswitchd (CPU 1), generator on CPU 0, {a.seconds:g} s per run, {a.reps} reps",
        "",
        "| rep | order | whole 64 KiB TSO (Gbit/s) | segmented by the switch | plain 1514 B | whole / plain | segmented / plain |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"whole / plain: {span(whole)}; segmented / plain: {span(seg)}",
    ])
    emit(table, a.out)


if __name__ == "__main__":
    main()
