#!/usr/bin/env python3
"""Fairness between VMs sharing poll threads, measured with the pvsgen traffic generator.

Scenarios (each repeated --reps times; medians reported):
  weights   4 VMs (1500 B frames, each to its own sink VM) saturate one poll thread; packet
            weights 1:1:2:4 (byte weights out of the way): shares of forwarded frames vs
            1/8, 1/8, 2/8, 4/8.
  sizes     equal (default) weights, one VM sending 64 B frames and one 1500 B: the shares in
            packets and bytes that two-dimensional deficit round robin predicts vs measured.
  flood     one VM floods 64 B frames while two others ping-pong through the same poll thread:
            ping-pong RTT p99 against the same ping-pong on an idle switch, with the default
            budgets and with budgets effectively unlimited.
  many      64 VMs in 32 pairs, equal weights, 2 poll threads: Jain's fairness index of their
            forwarded rates. This machine has two CPUs, so the generator runs a thread on each,
            beside each poll thread (time-sliced: the absolute rate means little here).

pvswitchd's poll thread runs on CPU 1, the generator on CPU 0.
Usage: tools/bench_fairness.py [--reps 3] [--seconds 4] [--only weights,sizes,flood,many]
Needs root and a release build of pvswitchd and pvsgen (cargo build --release --workspace).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, run_pvsgen as run  # noqa: E402


def by_name(report):
    return {v["name"]: v for v in report["vms"]}


def weights(seconds):
    w = {"a": 32, "b": 32, "c": 64, "d": 128}
    ports = [(n, f"weight_packets = {w[n]}\nweight_bytes = 1073741824") for n in w]
    ports += [(f"s{n}", "") for n in w]
    vms = [f"name={n},dst=s{n},size=1500" for n in w] + [f"name=s{n},dst=none" for n in w]
    r = by_name(run(ports, vms, seconds))
    total = sum(r[n]["sent"] for n in w)
    return {n: r[n]["sent"] / total for n in w}


def sizes(seconds):
    ports = [("small", ""), ("big", ""), ("ssink", ""), ("bsink", "")]
    vms = ["name=small,dst=ssink,size=64", "name=big,dst=bsink,size=1500", "name=ssink,dst=none", "name=bsink,dst=none"]
    r = by_name(run(ports, vms, seconds))
    pk = r["small"]["sent"] + r["big"]["sent"]
    by = r["small"]["sent_bytes"] + r["big"]["sent_bytes"]
    return {"small_pk": r["small"]["sent"] / pk, "big_pk": r["big"]["sent"] / pk,
            "small_by": r["small"]["sent_bytes"] / by, "big_by": r["big"]["sent_bytes"] / by}


def flood(seconds, unlimited, idle):
    extra = "weight_packets = 1048576\nweight_bytes = 1073741824\n" if unlimited else ""
    ports = [("p", ""), ("q", ""), ("f", ""), ("fsink", "")]
    vms = ["name=p", "name=q"]
    if not idle:
        vms += ["name=f,dst=fsink,size=64", "name=fsink,dst=none"]
    r = by_name(run(ports if not idle else ports[:2], vms, seconds, switch_extra=extra, gen_args=["--pingpong", "p,q"]))
    rtt = r["p"]["pingpong"]["rtt"]
    return rtt["p50_ns"] / 1000, rtt["p99_ns"] / 1000


def many(seconds):
    names = [f"v{i}" for i in range(64)]
    ports = [(n, "") for n in names]
    vms = [f"name={n},dst={names[i ^ 1]},size=64" for i, n in enumerate(names)]
    # Two cores: a generator thread beside each poll thread, so both CPUs carry the same mix.
    r = by_name(run(ports, vms, seconds, cores=(0, 1), gen_cpus="0,1"))
    rates = [r[n]["tx_mpps"] for n in names]
    jain = sum(rates) ** 2 / (len(rates) * sum(x * x for x in rates))
    return jain, sum(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--only", default="weights,sizes,flood,many")
    ap.add_argument("--out")
    a = ap.parse_args()
    only = a.only.split(",")
    lines = []
    med = statistics.median
    if "weights" in only:
        rows = [weights(a.seconds) for _ in range(a.reps)]
        for r in rows:
            print("weights:", {k: round(v, 4) for k, v in r.items()}, flush=True)
        want = {"a": 1 / 8, "b": 1 / 8, "c": 2 / 8, "d": 4 / 8}
        lines += [f"Packet weights 1:1:2:4, 4 VMs, 1500 B, one poll thread ({a.reps} runs of {a.seconds:g} s)", "",
                  "| VM | weight | expected share | measured share (median) | relative error |", "|---|---|---|---|---|"]
        for n, w in zip("abcd", (32, 32, 64, 128)):
            m = med(r[n] for r in rows)
            lines.append(f"| {n} | {w} | {want[n]:.4f} | {m:.4f} | {100 * (m - want[n]) / want[n]:+.1f}% |")
        lines.append("")
    if "sizes" in only:
        rows = [sizes(a.seconds) for _ in range(a.reps)]
        for r in rows:
            print("sizes:", {k: round(v, 4) for k, v in r.items()}, flush=True)
        # Default quanta 256 frames / 512 KiB: 256 x 1500 B = 375 KiB < 512 KiB, so both visits
        # are packet-limited: 256 frames each per round.
        p_small = 0.5
        b_small = 64 / (64 + 1500)
        lines += [f"Equal weights, 64 B vs 1500 B ({a.reps} runs of {a.seconds:g} s). Both visits end on the "
                  "packet quantum (256 x 1500 B < 512 KiB), so DRR predicts equal packet shares.", "",
                  "| share | predicted | measured (median) |", "|---|---|---|",
                  f"| 64 B VM, packets | {p_small:.4f} | {med(r['small_pk'] for r in rows):.4f} |",
                  f"| 1500 B VM, packets | {1 - p_small:.4f} | {med(r['big_pk'] for r in rows):.4f} |",
                  f"| 64 B VM, bytes | {b_small:.4f} | {med(r['small_by'] for r in rows):.4f} |",
                  f"| 1500 B VM, bytes | {1 - b_small:.4f} | {med(r['big_by'] for r in rows):.4f} |", ""]
    if "flood" in only:
        res = {}
        for case, (unl, idle) in {"idle": (False, True), "flood": (False, False), "flood, budgets unlimited": (True, False)}.items():
            rows = [flood(a.seconds, unl, idle) for _ in range(a.reps)]
            print(f"flood {case}:", rows, flush=True)
            res[case] = (med(r[0] for r in rows), med(r[1] for r in rows))
        lines += [f"Ping-pong RTT through one poll thread while another VM floods 64 B frames ({a.reps} runs of {a.seconds:g} s)", "",
                  "| case | RTT p50 (us) | RTT p99 (us) | p99 minus idle p99 (us) |", "|---|---|---|---|"]
        for case, (p50, p99) in res.items():
            lines.append(f"| {case} | {p50:.1f} | {p99:.1f} | {p99 - res['idle'][1]:+.1f} |")
        lines.append("")
    if "many" in only:
        rows = [many(a.seconds) for _ in range(a.reps)]
        for r in rows:
            print("many: jain %.4f total %.2f Mpps" % r, flush=True)
        lines += [f"64 VMs (32 pairs, 64 B), equal weights, 2 poll threads ({a.reps} runs of {a.seconds:g} s)", "",
                  "| Jain's index (median) | min | total Mpps (median) |", "|---|---|---|",
                  f"| {med(r[0] for r in rows):.4f} | {min(r[0] for r in rows):.4f} | {med(r[1] for r in rows):.2f} |", ""]
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
