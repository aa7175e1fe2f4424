#!/usr/bin/env python3
"""Live rebalancing: two poll threads, queues placed badly on purpose (both heavy senders'
queues on thread 0), then `pvswitchctl rebalance` while traffic flows.

pvsgen drives 4 VMs (a->b and c->d at full speed, 64 B) with a generator thread on each CPU
(this machine has two), so poll threads run in adaptive mode: a thread with nothing to do
sleeps and leaves its CPU to the generator.
Forwarded rate is read from pvswitchd's own per-thread counters (`stats` last-second rates),
before and after the rebalance; the move's duration comes from the rebalance reply, and drops
from the ports' counters. Repeated --reps times.

Usage: tools/bench_placement.py [--reps 3]
Needs root and release builds of pvswitchd and pvsgen (cargo build --release --workspace).
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import PVSGEN, PVSWITCHD, ctl, emit, wait_socket  # noqa: E402

def rate(d):
    """Frames per second the switch took from guests over the last full second."""
    time.sleep(2.2)  # two fresh samples
    return sum(t["last_interval"]["rx_pps"] for t in ctl(d, "stats")["threads"])


def once():
    d = tempfile.mkdtemp(prefix="pvs-place-")
    conf = os.path.join(d, "pvswitch.toml")
    with open(conf, "w") as f:
        f.write(f'[switch]\npoll_cores = [0, 1]\nsocket_dir = "{d}"\ncontrol_socket = "ctl.sock"\nrxq_assign = "group"\npoll_mode = "adaptive"\n')
        for n in "abcd":
            f.write(f'[[port]]\nname = "{n}"\ntype = "vhost-user"\nsocket = "{n}.sock"\n')
    log = open(os.path.join(d, "pvswitchd.log"), "w")
    p = subprocess.Popen([PVSWITCHD, "--config", conf], stdout=log, stderr=log)
    try:
        wait_socket(os.path.join(d, "ctl.sock"))
        gen = subprocess.Popen(
            [PVSGEN, "--cpus", "0,1", "--seconds", "14", "--qsize", "1024", "--quiet",
             "--vm", f"name=a,socket={d}/a.sock,dst=b,size=64", "--vm", f"name=b,socket={d}/b.sock",
             "--vm", f"name=c,socket={d}/c.sock,dst=d,size=64", "--vm", f"name=d,socket={d}/d.sock"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Bad placement: both heavy queues (a:0, c:0) on thread 0, the idle ones on thread 1.
        for q, t in (("a:0", "0"), ("c:0", "0"), ("b:0", "1"), ("d:0", "1")):
            ctl(d, "move", q, t)
        time.sleep(3)  # hellos, then traffic
        before = rate(d)
        r = ctl(d, "rebalance")
        after = rate(d)
        gen.wait(timeout=60)
        drops = sum(sum(p["drops"].values()) for p in ctl(d, "ports"))
        return before, after, r["took_us"], len(r["moved"]), drops
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = []
    for i in range(a.reps):
        r = once()
        rows.append(r)
        print(f"rep {i + 1}: before {r[0] / 1e6:.3f} Mpps  after {r[1] / 1e6:.3f} Mpps  move {r[2]} us "
              f"({r[3]} queues)  drops {r[4]}", flush=True)
    med = statistics.median
    table = "\n".join([
        f"Rebalance under load, 2 poll threads, heavy queues first both on thread 0 ({a.reps} runs)",
        "",
        "| before (median) | after rebalance (median) | ratio (median) | move took (median) | queues moved | drops |",
        "|---|---|---|---|---|---|",
        f"| {med(r[0] for r in rows) / 1e6:.3f} Mpps | {med(r[1] for r in rows) / 1e6:.3f} Mpps | "
        f"{med(r[1] / r[0] for r in rows):.2f} | {med(r[2] for r in rows):.0f} us | {med(r[3] for r in rows):.0f} | "
        f"{sum(r[4] for r in rows)} |",
    ])
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
