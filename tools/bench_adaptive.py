#!/usr/bin/env python3
"""Adaptive polling against busy polling, in the same run:

- idle: 64 connected but silent VMs (two testpmd processes of 32 virtio-user ports each, not
  forwarding), 2 poll threads: CPU use of each poll thread, read from /proc over a window;
- saturation: VM-to-VM 64 B forwarding Mpps (as tools/bench_vm2vm.py), alternating modes;
- sparse: a ping-pong (pvsgen --pingpong) through an otherwise idle switch: round-trip p50/p99,
  beside the machine's own wake-up latency (tools/pvsgen's wakeprobe: an eventfd write waking a
  thread asleep in epoll on the other CPU, the kernel path an adaptive poll thread sleeps on).

Usage: tools/bench_adaptive.py [--reps 5] [--seconds 4] [--skip-idle] [--skip-saturation] [--skip-sparse]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import PVSWITCHD, Testpmd, emit, measure, wait_socket  # noqa: E402
from pvsbench import run_pvsgen as gen_run  # noqa: E402

MODES = {
    "busy": 'poll_mode = "busy"\n',
    "adaptive": 'poll_mode = "adaptive"\n',
}
# Sparse: one ping every 5 ms, so an adaptive thread (1 ms threshold) sleeps before every ping
# and each ping wakes it through the guest's kick.
# The sparse case also runs adaptive with a threshold longer than the gap between pings: the
# thread then never sleeps while the pings last, and sleeps once they stop.
SPARSE_MODES = MODES | {"adaptive, idle_before_sleep_us = 10000": 'poll_mode = "adaptive"\nidle_before_sleep_us = 10000\n'}
SPARSE = {"back-to-back pings": "name=p", "one ping every 5 ms": "name=p,rate=200"}
# Small rings, so the few hundred spaced pings of a run cycle through every buffer many times:
# the switch's first touch of each guest page is a page fault (several us here), which a VM in
# steady state has long paid. With 1024-entry rings every spaced ping landed on a fresh page.
SPARSE_QSIZE = 32
HZ = os.sysconf("SC_CLK_TCK")
WAKEPROBE = os.path.join(os.path.dirname(PVSWITCHD), "wakeprobe")
WAKE_ROW = "platform: eventfd wake-up of a thread asleep in epoll, no switch, 5 ms apart"


def pmd_cpu_ticks(pid):
    """utime+stime ticks of each poll thread (threads named pmdN)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if name.startswith("pmd"):
            out[name] = int(fields[11]) + int(fields[12])
    return out


def idle_cpu(mode, seconds):
    d = tempfile.mkdtemp(prefix="pvs-idle-")
    conf = os.path.join(d, "pvswitch.toml")
    with open(conf, "w") as f:
        f.write(f'[switch]\npoll_cores = [0, 1]\nsocket_dir = "{d}"\ncontrol_socket = "ctl.sock"\n{MODES[mode]}')
        for i in range(64):
            f.write(f'[[port]]\nname = "vm{i}"\ntype = "vhost-user"\nsocket = "vm{i}.sock"\n')
    log = open(os.path.join(d, "pvswitchd.log"), "w")
    p = subprocess.Popen([PVSWITCHD, "--config", conf], stdout=log, stderr=log)
    vms = []
    try:
        wait_socket(os.path.join(d, "ctl.sock"))
        for h in range(2):
            vdevs = []
            for i in range(32):
                n = h * 32 + i
                vdevs += ["--vdev", f"net_virtio_user{i},path={d}/vm{n}.sock,queues=1,mac=02:00:00:00:{h:02x}:{i:02x}"]
            vms.append(Testpmd(f"pvsidle{h}", ["--lcores", "0@0,1@0", "-m", "1024", "--single-file-segments"] + vdevs,
                               ["--forward-mode=io", "--nb-cores=1", "--total-num-mbufs=65536"]))
        time.sleep(2)  # let rings start and the threads settle
        t0, c0 = time.time(), pmd_cpu_ticks(p.pid)
        time.sleep(seconds)
        t1, c1 = time.time(), pmd_cpu_ticks(p.pid)
        return {k: 100.0 * (c1[k] - c0[k]) / HZ / (t1 - t0) for k in sorted(c0)}
    finally:
        for vm in vms:
            vm.close()
        p.send_signal(signal.SIGTERM)
        p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--skip-idle", action="store_true")
    ap.add_argument("--skip-saturation", action="store_true")
    ap.add_argument("--skip-sparse", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    lines = []
    if not a.skip_idle:
        idle = {m: idle_cpu(m, a.seconds) for m in ("adaptive", "busy")}
        for m, v in idle.items():
            print(f"idle, {m}: " + "  ".join(f"{k} {pct:.2f}% CPU" for k, pct in v.items()), flush=True)
        lines += [
            f"Idle: 64 connected silent VMs, 2 poll threads, CPU of each poll thread over {a.seconds:g} s (/proc)",
            "",
            "| mode | pmd0 | pmd1 |",
            "|---|---|---|",
        ]
        for m, v in idle.items():
            lines.append(f"| {m} | " + " | ".join(f"{v[k]:.2f}% of a core" for k in sorted(v)) + " |")
        lines.append("")
    if not a.skip_saturation:
        rows = []
        for rep in range(a.reps):
            order = ["busy", "adaptive"] if rep % 2 == 0 else ["adaptive", "busy"]
            r = {m: measure("pvswitch", 64, a.seconds, switch_extra=MODES[m]) for m in order}
            rows.append(r)
            print(f"rep {rep + 1}: busy {r['busy'] / 1e6:6.3f} Mpps  adaptive {r['adaptive'] / 1e6:6.3f} Mpps"
                  f"  ratio {r['adaptive'] / r['busy']:.3f}", flush=True)
        ratios = [r["adaptive"] / r["busy"] for r in rows]
        lines += [
            f"Saturation: 64 B VM-to-VM, {a.reps} alternating pairs of {a.seconds:g} s",
            "",
            "| busy (median) | adaptive (median) | median ratio | ratio min..max |",
            "|---|---|---|---|",
            f"| {statistics.median(r['busy'] for r in rows) / 1e6:.3f} Mpps | "
            f"{statistics.median(r['adaptive'] for r in rows) / 1e6:.3f} Mpps | {statistics.median(ratios):.3f} | "
            f"{min(ratios):.3f}..{max(ratios):.3f} |",
        ]
    if not a.skip_sparse:
        rows = []
        for rep in range(a.reps):
            order = [(s, m) for s in SPARSE for m in SPARSE_MODES]
            if rep % 2:
                order.reverse()
            r = {}
            for s, m in order:
                rep_ = gen_run([("p", ""), ("q", "")], [SPARSE[s], "name=q"], a.seconds, switch_extra=SPARSE_MODES[m],
                               gen_args=["--pingpong", "p,q"], qsize=SPARSE_QSIZE)
                rtt = next(v for v in rep_["vms"] if v["name"] == "p")["pingpong"]["rtt"]
                r[f"{s}, {m}"] = (rtt["p50_ns"] / 1000, rtt["p99_ns"] / 1000)
            # The peer for the wake-up: the kernel path alone (eventfd write on CPU 0 waking a
            # thread blocked in epoll on CPU 1), no switch, at the same spacing.
            probe = json.loads(subprocess.run([WAKEPROBE, "--gap-us", "5000", "--samples", "400"], check=True,
                                              capture_output=True, text=True).stdout)
            r[WAKE_ROW] = (probe["wake_p50_ns"] / 1000, probe["wake_p99_ns"] / 1000)
            rows.append(r)
            print(f"rep {rep + 1}: ping-pong RTT p50/p99 " + "  ".join(f"{m} {v[0]:.2f}/{v[1]:.2f} us" for m, v in r.items()),
                  flush=True)
        med = statistics.median
        lines += [
            "",
            f"Sparse: ping-pong through an otherwise idle switch (pvsgen), {a.reps} alternating pairs of {a.seconds:g} s",
            "",
            "| traffic, mode | RTT p50 (median, us) | RTT p99 (median, us) |",
            "|---|---|---|",
        ] + [f"| {k} | {med(r[k][0] for r in rows):.2f} | {med(r[k][1] for r in rows):.2f} |" for k in rows[0]]
        sparse = list(SPARSE)[1]
        extra = [r[f"{sparse}, adaptive"][0] - r[f"{sparse}, busy"][0] for r in rows]
        lines += ["", f"{sparse}: adaptive minus busy, p50: median {med(extra):.2f} us "
                  f"({min(extra):.2f}..{max(extra):.2f}); the platform's own wake-up, p50: median "
                  f"{med(r[WAKE_ROW][0] for r in rows):.2f} us"]
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
