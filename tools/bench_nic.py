#!/usr/bin/env python3
"""NIC -> VM -> NIC benchmark: pvswitchd with a DPDK port against DPDK testpmd's vhost PMD (the
no-switching ceiling), measured alternately in the same run.

The NIC is a cost-free DPDK vdev, `net_null0`: its receive side hands out as many 64-byte
frames as are asked for, its transmit side frees what it is given. The "VM" is one testpmd
virtio-user port in io-forward mode (it sends every frame it receives straight back) on CPU 0.
The switch under test runs on CPU 1:
  - pvswitch: pvswitchd with one poll thread, a `type = "dpdk"` port on net_null0 and one
    vhost-user port, flows `in_port=nic,actions=output:vm` and `in_port=vm,actions=output:nic`;
  - ceiling:  dpdk-testpmd with net_null0 and a net_vhost port in io-forward mode.
The rate is what the VM receives (and sends back) per second over a timed window.

Usage: tools/bench_nic.py [--reps 5] [--seconds 4] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, measure_nic  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    rows = []
    for rep in range(a.reps):
        order = ["pvswitch", "ceiling"] if rep % 2 == 0 else ["ceiling", "pvswitch"]
        r = {k: measure_nic(k, a.seconds) for k in order}
        rows.append(r)
        print(f"rep {rep + 1}: pvswitch {r['pvswitch'] / 1e6:6.3f} Mpps  ceiling {r['ceiling'] / 1e6:6.3f} Mpps  "
              f"ratio {r['pvswitch'] / r['ceiling']:.3f}", flush=True)
    pv = statistics.median(r["pvswitch"] for r in rows)
    ce = statistics.median(r["ceiling"] for r in rows)
    ratios = [r["pvswitch"] / r["ceiling"] for r in rows]
    table = "\n".join([
        f"NIC (net_null) -> VM -> NIC, 64 B, {a.reps} alternating pairs of {a.seconds:g} s, VM on CPU 0, switch on CPU 1",
        "",
        "| frame | pvswitchd (median) | testpmd vhost+null io-fwd ceiling (median) | median ratio | ratio min..max |",
        "|---|---|---|---|---|",
        f"| 64 B | {pv / 1e6:.3f} Mpps | {ce / 1e6:.3f} Mpps | {statistics.median(ratios):.3f} | "
        f"{min(ratios):.3f}..{max(ratios):.3f} |",
    ])
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
