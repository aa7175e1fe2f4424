#!/usr/bin/env python3
"""VLANs and rate caps, timed (issue 31).

1. VM-to-VM at 64 B (testpmd flowgen as the two VMs, as tools/bench_vm2vm.py): pvswitchd
   untagged, with both ports access VLAN 10, and with b a native-tagged port of VLAN 10 (every
   frame toward b gets its tag pushed, as toward a trunk), against the testpmd vhost ceiling;
   the four rotated in each rep, so drift hits all alike. The floor: tagged within 5% of
   untagged.
2. The switch's cycles a frame (`--part cycles`): pvsgen as both VMs, a sending to b as fast as
   its ring allows, untagged, access and tag pushed rotated in each rep; the poll thread's busy
   cycles over the frames it switched, over a second in the middle of the run (pvsgen, on the
   other core, sets the rate, so this is what each frame costs the switch, with less noise than
   a rate), at 64 B and 1518 B.
3. Cap accuracy: a pvsgen VM sending as fast as its ring allows through an ingress cap, at
   several rates in packets/s (64 B) and bits/s (1518 B), and through an egress cap on its
   receiver: what the receiver got against the cap.

Usage: tools/bench_vlans.py [--reps 5] [--seconds 5] [--part vm2vm,cycles,caps] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), a release build.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, line_ns, measure, phase_of, run_pvsgen  # noqa: E402

SETUPS = {
    "untagged": [("a", ""), ("b", "")],
    "access": [("a", "tag = 10"), ("b", "tag = 10")],
    "tag pushed": [("a", "tag = 10"), ("b", 'vlan_mode = "native-tagged"\ntag = 10\ntrunks = [10]')],
}

CAPS = [  # (key, value, frame size, what the receiver's rate is read as)
    ("ingress_pps", 2_000, 64, "pps"),
    ("ingress_pps", 20_000, 64, "pps"),
    ("ingress_pps", 200_000, 64, "pps"),
    ("ingress_bps", 10_000_000, 1518, "bps"),
    ("ingress_bps", 100_000_000, 1518, "bps"),
    ("ingress_bps", 1_000_000_000, 1518, "bps"),
    ("egress_pps", 20_000, 64, "pps"),
    ("egress_bps", 100_000_000, 1518, "bps"),
]


def vm2vm(a):
    kinds = list(SETUPS) + ["ceiling"]
    rows = []
    for rep in range(a.reps):
        order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
        r, phases = {}, []
        for k in order:
            before = line_ns()
            if k == "ceiling":
                r[k] = measure("ceiling", 64, a.seconds)
            else:
                r[k] = measure("pvswitch", 64, a.seconds, ports=SETUPS[k])
            phases.append(phase_of(before, line_ns()))
        r["phase"] = phases[0] if len(set(phases)) == 1 else "mixed"
        rows.append(r)
        print(f"rep {rep + 1}: " + "  ".join(f"{k} {r[k] / 1e6:.3f}" for k in kinds) + f" Mpps ({r['phase']})",
              flush=True)

    def ratio(num, den):
        rs = [x[num] / x[den] for x in rows]
        return f"{statistics.median(rs):.3f} ({min(rs):.3f}..{max(rs):.3f})"

    lines = [f"VM-to-VM 64 B, testpmd flowgen, {a.reps} rotated reps of {a.seconds:g} s", "",
             "| setup | Mpps (median) | / ceiling | / untagged |", "|---|---|---|---|"]
    for k in SETUPS:
        med = statistics.median(x[k] for x in rows) / 1e6
        lines.append(f"| {k} | {med:.3f} | {ratio(k, 'ceiling')} | {ratio(k, 'untagged') if k != 'untagged' else '1'} |")
    lines.append(f"| testpmd ceiling | {statistics.median(x['ceiling'] for x in rows) / 1e6:.3f} | 1 | |")
    return "\n".join(lines)


def cycles(a):
    lines = [f"Switch cycles a frame, pvsgen a -> b, {a.reps} rotated reps of {a.seconds:g} s", "",
             "| setup | frame | cycles/frame (median) | / untagged |", "|---|---|---|---|"]
    for size in (64, 1518):
        kinds = list(SETUPS)
        rows = []
        for rep in range(a.reps):
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
            r = {}
            for k in order:
                st = run_pvsgen(SETUPS[k], [f"name=a,dst=b,size={size}", "name=b,dst=none"], a.seconds)
                r[k] = st["switch"]["threads"][0]["cycles_per_packet"]
            rows.append(r)
            print(f"{size} B rep {rep + 1}: " + "  ".join(f"{k} {r[k]:.0f}" for k in kinds), flush=True)
        for k in kinds:
            med = statistics.median(x[k] for x in rows)
            rs = [x[k] / x["untagged"] for x in rows]
            rel = "1" if k == "untagged" else f"{statistics.median(rs):.3f} ({min(rs):.3f}..{max(rs):.3f})"
            lines.append(f"| {k} | {size} B | {med:.0f} | {rel} |")
    return "\n".join(lines)


def caps(a):
    lines = ["Cap accuracy: pvsgen VM a sends to b as fast as its ring allows; what the switch delivered to b "
             "over a second in the middle of the run",
             "", "| cap | frame | received | / cap | reps |", "|---|---|---|---|---|"]
    for key, value, size, unit in CAPS:
        got = []
        for _ in range(max(1, a.reps // 2)):
            side = "a" if key.startswith("ingress") else "b"
            ports = [("a", f"{key} = {value}" if side == "a" else ""), ("b", f"{key} = {value}" if side == "b" else "")]
            rep = run_pvsgen(ports, [f"name=a,dst=b,size={size}", "name=b,dst=none"], a.seconds)
            # What the switch delivered over a second in the middle of the run (pvsgen's own
            # rates count, after its window, the capped ring it drains: a ring's worth too many).
            st = rep["switch"]
            t = st["threads"][0]
            secs = st["cleared_secs_ago"]
            got.append(t["tx_packets"] / secs if unit == "pps" else t["tx_bytes"] * 8 / secs)
        med = statistics.median(got)
        shown = f"{med:.0f} fps" if unit == "pps" else f"{med / 1e6:.2f} Mbit/s"
        rs = [g / value for g in got]
        lines.append(f"| {key} = {value:,} | {size} B | {shown} | {statistics.median(rs):.3f} ({min(rs):.3f}..{max(rs):.3f}) | {len(got)} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--part", default="vm2vm,cycles,caps")
    ap.add_argument("--out")
    a = ap.parse_args()
    parts = a.part.split(",")
    out = []
    if "vm2vm" in parts:
        out.append(vm2vm(a))
    if "cycles" in parts:
        out.append(cycles(a))
    if "caps" in parts:
        out.append(caps(a))
    emit("\n\n".join(out), a.out)


if __name__ == "__main__":
    sys.exit(main())
