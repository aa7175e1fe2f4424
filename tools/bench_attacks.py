#!/usr/bin/env python3
"""What a hostile VM takes from the VMs that share its poll thread.

Four VMs (pvsgen, on CPU 0) on one pvswitchd poll thread (CPU 1): the bystander pair by1 <-> by2
forwards 64 B frames both ways at full speed; beside it, a1 sends to a2 at full speed, once as an
honest neighbour and once with an attack, alternating, --reps times. The bystanders' rate with
the attack over their rate beside the honest neighbour is what the attack costs them beyond a
neighbour's fair share (floor: 0.9); their rate alone, with no a1/a2, is shown for scale.

Attacks (the honest neighbour is the same traffic without the hostile knob):
  long-chains      a1's every frame is an indirect table of 256 descriptors (253 of them
                   empty): the longest chain the switch accepts, charged by descriptors walked
  tiny-rx-buffers  a1 sends 1500 B frames; a2 negotiates MRG_RXBUF and posts 64 B buffers (24
                   buffers per frame)
  zero-rx          a2 posts zero-length receive buffers (its RX queue is stopped at once)
  block-call       a2 saturates its RX call eventfd and clears O_NONBLOCK, then asks for
                   interrupts (the write would block; the watchdog interrupts it, the queue stops)
  mac-flood        a1's frames come from 1,000,000 source MACs (learning refused past mac_limit)

Usage: tools/bench_attacks.py [--reps 3] [--seconds 4] [--only long-chains,...] [--out FILE]
Needs a release build of pvswitchd and pvsgen (cargo build --release --workspace).
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import emit, run_pvsgen  # noqa: E402

BYSTANDERS = ["name=by1,dst=by2,size=64", "name=by2,dst=by1,size=64"]

# name: (a1's and a2's specs honest, the same with the attack)
ATTACKS = {
    "long-chains": (["name=a1,dst=a2,features=indirect", "name=a2"],
                    ["name=a1,dst=a2,features=indirect,pad=253", "name=a2"]),
    "tiny-rx-buffers": (["name=a1,dst=a2,size=1500", "name=a2,features=mrg"],
                        ["name=a1,dst=a2,size=1500", "name=a2,features=mrg,rxbuf=64"]),
    "zero-rx": (["name=a1,dst=a2", "name=a2,features=mrg"],
                ["name=a1,dst=a2", "name=a2,features=mrg,rxbuf=0"]),
    "block-call": (["name=a1,dst=a2", "name=a2"],
                   ["name=a1,dst=a2", "name=a2,hostile=block-call"]),
    "mac-flood": (["name=a1,dst=a2", "name=a2"],
                  ["name=a1,dst=a2,srcmacs=1000000", "name=a2"]),
}


def run(a_vms, seconds):
    """The bystanders' forwarded rate (Mpps, both directions) and, if there, a1->a2's."""
    names = ["by1", "by2"] + [v.split(",")[0].split("=")[1] for v in a_vms]
    r = run_pvsgen([(n, "") for n in names], BYSTANDERS + a_vms, seconds)
    vms = {v["name"]: v for v in r["vms"]}
    by = vms["by1"]["rx_mpps"] + vms["by2"]["rx_mpps"]
    return by, vms["a2"]["rx_mpps"] if "a2" in vms else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--only", default=",".join(ATTACKS))
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for name in a.only.split(","):
        honest, attack = ATTACKS[name]
        ratios, alone_ratios, got = [], [], []
        for rep in range(a.reps):
            # Alternate which runs first.
            order = [("honest", honest), ("attack", attack), ("alone", [])]
            if rep % 2:
                order = order[1::-1] + order[2:]
            res = {}
            for kind, vms in order:
                res[kind] = run(vms, a.seconds)
            (h, h_a2), (x, x_a2), (alone, _) = res["honest"], res["attack"], res["alone"]
            ratios.append(x / h)
            alone_ratios.append(x / alone)
            got.append((x_a2, h_a2))
            print(f"{name} rep {rep}: bystanders {x:.3f} Mpps under attack, {h:.3f} beside the honest "
                  f"neighbour, {alone:.3f} alone; a2 received {x_a2:.3f} vs {h_a2:.3f} Mpps", flush=True)
        rows.append((name, ratios, alone_ratios, got))
    lines = [
        f"Bystander pair (64 B both ways) on the attacker's poll thread, {a.reps} reps of {a.seconds:g} s",
        "",
        "| attack | bystanders: attack / honest neighbour (median, min..max) | attack / alone | a2 receives, attack vs honest (Mpps, median) |",
        "|---|---|---|---|",
    ]
    for name, ratios, alone_ratios, got in rows:
        med = statistics.median(ratios)
        lines.append(
            f"| {name} | **{med:.3f}** ({min(ratios):.3f}..{max(ratios):.3f}){'' if med >= 0.9 else ' BELOW 0.9'} "
            f"| {statistics.median(alone_ratios):.3f} "
            f"| {statistics.median(g[0] for g in got):.3f} vs {statistics.median(g[1] for g in got):.3f} |"
        )
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
