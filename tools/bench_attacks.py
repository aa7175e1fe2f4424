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
  rx-walk          a1 sends 1500 B frames; a2 negotiates MRG_RXBUF and posts 8 buffers, each a
                   chain of 256 descriptors (the longest accepted) holding 64 bytes in its
                   first, the others empty: a frame needs 24 such buffers, so a delivery walks
                   6 of them, 1536 descriptors (past the 1024 a frame may take), and drops it
                   (issue 29; the honest a2 posts normal buffers in a ring of the same size)
  tso-segments     a1 sends 64 KiB TCP/IPv4 frames asking for TSO with MSS 88 (745 segments
                   each) to a2, which has no GUEST_TSO4: the switch segments them in software
                   (issue 29; the honest a1 sends the same frames with MSS 1448, 46 segments)
  log-huge         a2 is migrating (dirty logging on) and posts receive chains of 4
                   descriptors that each claim 4 GiB - 1 bytes of its memory (issue 48's F1);
                   the honest a2 logs too, with normal buffers

Each pair of VMs runs on a generator thread of its own, the two threads sharing CPU 0 (pvsgen
--cpus 0,0): as on a real host, where every VM's vCPUs pay for its own driver's work, what a2's
driver does to refill 24 buffers a frame (tiny-rx-buffers) or a1's to build 256-descriptor
tables is paid by their thread, not by the bystanders' (with all four VMs on one thread, the
generator's time on a2's buffers slowed the bystanders while the switch had time to spare:
stop 37's note). The switch's poll thread, which all four share, is what is measured.

Besides the bystanders' ratio the table shows a1's send rate (the issue's sender fell to
0.27x under rx-walk) and what a2 received, in frames and in bits (segments' bytes for
tso-segments).

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
    "rx-walk": (["name=a1,dst=a2,size=1500", "name=a2,features=mrg,qsize=2048"],
                ["name=a1,dst=a2,size=1500", "name=a2,features=mrg,qsize=2048,rxbuf=64,rxchain=256"]),
    # a2 migrating (dirty log on) posts receive chains of 4 descriptors that each claim
    # 4 GiB - 1 bytes (issue 48's F1, where 64 such descriptors made every frame mark every
    # page they span, and the bystanders fell to 0.0002x); the honest a2 logs too.
    "log-huge": (["name=a1,dst=a2", "name=a2,log=1"],
                 ["name=a1,dst=a2", "name=a2,log=1,rxchain=4,rxclaim=4294967295"]),
    # a1's ring at 256 entries: its buffer slots hold 64 KiB frames. a2 sends nothing; its
    # size=1500 keeps every VM's buffer slots as large with either MSS (they are sized by the
    # largest frame any VM may receive: here a 1448-byte MSS segment, or an 88-byte one).
    "tso-segments": (["name=a1,dst=a2,size=65535,tso=1448,qsize=256", "name=a2,size=1500"],
                     ["name=a1,dst=a2,size=65535,tso=88,qsize=256", "name=a2,size=1500"]),
}


def run(a_vms, seconds):
    """The bystanders' forwarded rate (Mpps, both directions) and, if there, a1's send rate
    (Mpps) and a2's receive rate (Mpps, Gbps)."""
    names = ["by1", "by2"] + [v.split(",")[0].split("=")[1] for v in a_vms]
    # pvsgen puts VM i on thread i mod 2: the bystanders on one, a1 and a2 on the other.
    vms = [v for pair in zip(BYSTANDERS, a_vms) for v in pair] if a_vms else BYSTANDERS
    r = run_pvsgen([(n, "") for n in names], vms, seconds, gen_cpus="0,0" if a_vms else "0")
    vms = {v["name"]: v for v in r["vms"]}
    by = vms["by1"]["rx_mpps"] + vms["by2"]["rx_mpps"]
    a1, a2 = vms.get("a1", {}), vms.get("a2", {})
    # The switch's poll thread: the share of its time spent on iterations that moved frames
    # (below 100%, the generator, not the switch, set the pace).
    threads = (r.get("switch") or {}).get("threads") or [{}]
    busy = threads[0].get("busy_pct", 0.0)
    return by, (a1.get("tx_mpps", 0.0), a2.get("rx_mpps", 0.0), a2.get("rx_gbps", 0.0), busy)


def med_of(got, kind, field):
    """The median over reps of field `field` (0 a1's Mpps sent, 1 a2's Mpps received, 2 a2's
    Gbps, 3 the switch thread's busy %) of run `kind` (0 attack, 1 honest)."""
    return statistics.median(g[kind][field] for g in got)


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
            (h, h_a), (x, x_a), (alone, _) = res["honest"], res["attack"], res["alone"]
            ratios.append(x / h)
            alone_ratios.append(x / alone)
            got.append((x_a, h_a))
            print(f"{name} rep {rep}: bystanders {x:.3f} Mpps under attack, {h:.3f} beside the honest "
                  f"neighbour, {alone:.3f} alone; a1 sent {x_a[0]:.3f} vs {h_a[0]:.3f} Mpps; "
                  f"a2 received {x_a[1]:.3f} vs {h_a[1]:.3f} Mpps, {x_a[2]:.2f} vs {h_a[2]:.2f} Gbps; "
                  f"switch busy {x_a[3]:.0f}% vs {h_a[3]:.0f}%",
                  flush=True)
        rows.append((name, ratios, alone_ratios, got))
    lines = [
        f"Bystander pair (64 B both ways) on the attacker's poll thread, {a.reps} reps of {a.seconds:g} s",
        "",
        "| attack | bystanders: attack / honest neighbour (median, min..max) | attack / alone "
        "| a1 sends, attack vs honest (Mpps, median) | a2 receives, attack vs honest (Mpps; Gbps, median) "
        "| switch thread busy, attack vs honest (%, median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, ratios, alone_ratios, got in rows:
        med = statistics.median(ratios)
        lines.append(
            f"| {name} | **{med:.3f}** ({min(ratios):.3f}..{max(ratios):.3f}){'' if med >= 0.9 else ' BELOW 0.9'} "
            f"| {statistics.median(alone_ratios):.3f} "
            f"| {med_of(got, 0, 0):.3f} vs {med_of(got, 1, 0):.3f} "
            f"| {med_of(got, 0, 1):.3f} vs {med_of(got, 1, 1):.3f}; "
            f"{med_of(got, 0, 2):.2f} vs {med_of(got, 1, 2):.2f} "
            f"| {med_of(got, 0, 3):.0f} vs {med_of(got, 1, 3):.0f} |"
        )
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
