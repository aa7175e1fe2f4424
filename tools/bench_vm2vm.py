#!/usr/bin/env python3
"""VM-to-VM forwarding benchmark: pvswitchd against DPDK testpmd's vhost PMD (the no-switching
ceiling), measured alternately in the same run.

One testpmd "VM" with two virtio-user ports in flowgen mode (it generates on both ports at full
speed and drains what it receives) runs on CPU 0; the switch under test runs on CPU 1:
  - pvswitch: pvswitchd with one poll thread on CPU 1, two vhost-user ports, MAC learning;
  - ceiling:  dpdk-testpmd with two net_vhost ports in io-forward mode on CPU 1.
The forwarded rate is what the generator receives on both ports over a timed window. Around
each run, lineprobe (tools/pvsgen) times a cache line's trip between the two CPUs, which tells
the machine's fast phase from its slow one; the summary also gives same-phase pairs apart.

Usage: tools/bench_vm2vm.py [--reps 5] [--seconds 5] [--sizes 64,1518] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import SLOW_LINE_NS, alternating_pair, emit, measure  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = {s: [] for s in sizes}
    for rep in range(a.reps):
        for s in sizes:
            r = alternating_pair(rep, lambda kind: measure(kind, s, a.seconds))
            rows[s].append(r)
            ph = dict(zip(["pvswitch", "ceiling"], r["phases"]))
            print(f"rep {rep + 1} {s:>5} B: pvswitch {r['pvswitch'] / 1e6:6.3f} Mpps ({ph['pvswitch']})  "
                  f"ceiling {r['ceiling'] / 1e6:6.3f} Mpps ({ph['ceiling']})  "
                  f"ratio {r['pvswitch'] / r['ceiling']:.3f}", flush=True)
    lines = [
        f"VM-to-VM forwarding, {a.reps} alternating pairs of {a.seconds:g} s, generator on CPU 0, switch on CPU 1",
        "",
        "| frame | pvswitchd (median) | testpmd vhost io-fwd ceiling (median) | median ratio | ratio min..max |",
        "|---|---|---|---|---|",
    ]
    for s in sizes:
        pv = statistics.median(r["pvswitch"] for r in rows[s])
        ce = statistics.median(r["ceiling"] for r in rows[s])
        ratios = [r["pvswitch"] / r["ceiling"] for r in rows[s]]
        unit = lambda pps: f"{pps / 1e6:.3f} Mpps" + (f" = {pps * s * 8 / 1e9:.2f} Gbit/s" if s > 64 else "")
        lines.append(f"| {s} B | {unit(pv)} | {unit(ce)} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}..{max(ratios):.3f} |")
    lines += ["", f"Phases (lineprobe before and after each run; slow: a cache line takes over {SLOW_LINE_NS} ns "
              "between the two CPUs), pairs whose two runs saw the same phase throughout:", ""]
    for s in sizes:
        for ph in ("fast", "slow"):
            same = [r["pvswitch"] / r["ceiling"] for r in rows[s] if r["phases"] == (ph, ph)]
            lines.append(f"- {s} B, both {ph}: " + (f"median ratio {statistics.median(same):.3f} over {len(same)} "
                         f"pairs ({min(same):.3f}..{max(same):.3f})" if same else "no pair"))
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
