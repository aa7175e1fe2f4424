#!/usr/bin/env python3
"""A thousand VMs on two poll threads (issue 34): what many VMs cost a pvswitchd, and what idle
VMs cost the busy ones.

Parts (--part, comma-separated; default all):
  thousand  --vms N (1000) pvsgen VMs on one pvswitchd with two poll threads (adaptive polling,
            parking on): how long until every port is connected and every VM has heard its
            peer, the daemon's threads, its resident memory and open files per connected port
            (against the same daemon before any VM connected), a round of frames from each VM
            to the next (every one delivered?), and how long control commands take with N ports
            (pvswitchctl ports, ports NAME, stats, rxq, fdb, add-port + del-port, reload).
  idle      a busy pair (pvsgen a <-> b, 64 B, as fast as its rings allow) on one poll thread,
            beside 0, 100, 500 and 998 other VMs connected to the same thread (a second pvsgen
            process, whose thread sleeps when it has nothing to do), silent or each sending one
            64 B frame every 100 ms to a sink VM among them (as idle guests' timers, ARP, NTP
            do), with parking on and off, alternated: the poll thread's cycles a frame of the
            pair (so its capacity: what the other VMs cost the switch), and the pair's rate
            (its generator's too, which shares CPU 0 with theirs). Floor: 998 chatty VMs,
            parking on, >= 0.9x of 0 VMs.
  wake      ping-pong between two otherwise idle VMs, one ping every 20 ms (each finds its
            queue parked), parking on against off: what a parked queue's first frame waits.
  jain      --vms N VMs all sending at once, each to the next: Jain's fairness index of their
            send rates (1 = all equal).
  flood     a flooding pair (broadcast both ways, 64 B) alone, and beside 998 VMs whose receive
            rings are full (pvsgen drain=0). Floor: >= 0.5x of alone.

The generator shares CPU 0 with the idle VMs' generator; the switch's poll thread is on CPU 1
(two threads on CPUs 0 and 1 for `thousand` and `jain`). The idle VMs' pvsgen sleeps when a
pass over them moved nothing (--idle-sleep-us), but still takes some of CPU 0 from the busy
pair's generator: so besides the pair's rate, the table shows the poll thread's cycles a frame
(its busy cycles over the frames it switched), which is what idle VMs cost the switch.

Usage: tools/bench_scale.py [--part thousand,idle,wake,jain,flood] [--vms 1000] [--reps 3]
                            [--seconds 4] [--out FILE]
Needs root, a release build (cargo build --release --workspace).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import PVSGEN, PVSWITCHCTL, PVSWITCHD, emit, wait_socket, write_config  # noqa: E402


class Switch:
    """A pvswitchd in a directory of its own, with `ports` (names) on `cores`."""

    def __init__(self, names, cores, extra=""):
        self.d = tempfile.mkdtemp(prefix="pvs-scale-")
        conf = write_config(self.d, [(n, "") for n in names], cores, extra)
        self.log = open(os.path.join(self.d, "pvswitchd.log"), "w")
        self.p = subprocess.Popen([PVSWITCHD, "--config", conf], stdout=self.log, stderr=self.log)
        wait_socket(os.path.join(self.d, "ctl.sock"))
        for n in names:
            wait_socket(self.sock(n), timeout=60)

    def sock(self, name):
        return os.path.join(self.d, f"{name}.sock")

    def ctl(self, *args):
        out = subprocess.run([PVSWITCHCTL, "--control", os.path.join(self.d, "ctl.sock"), "--json", *args],
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"pvswitchctl {' '.join(args)}: {out.stderr}")
        return json.loads(out.stdout)

    def timed(self, *args):
        """Seconds pvswitchctl took for a command (the whole client: start, ask, read, print)."""
        t0 = time.perf_counter()
        out = subprocess.run([PVSWITCHCTL, "--control", os.path.join(self.d, "ctl.sock"), *args],
                             capture_output=True, text=True, timeout=60)
        t = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"pvswitchctl {' '.join(args)}: {out.stderr}")
        return t

    def proc(self, what):
        """Threads, open files, or resident KiB of the daemon (rss: all of it; anon: its own,
        not the guests' memory it touched, which is shared), from /proc."""
        base = f"/proc/{self.p.pid}"
        if what == "threads":
            return len(os.listdir(f"{base}/task"))
        if what == "fds":
            return len(os.listdir(f"{base}/fd"))
        key = {"rss": "VmRSS:", "anon": "RssAnon:"}[what]
        with open(f"{base}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key))

    def connected(self):
        return sum(1 for p in self.ctl("ports") if p["state"] == "connected")

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        self.p.wait()
        shutil.rmtree(self.d, ignore_errors=True)


def pvsgen(sw, vms, seconds, cpus="0", qsize=256, extra=(), idle_sleep_us=0):
    """Starts pvsgen with `vms` (specs without socket=) on `sw`; returns (process, json path)."""
    out = os.path.join(sw.d, f"gen-{time.monotonic_ns()}.json")
    cmd = [PVSGEN, "--cpus", cpus, "--seconds", str(seconds), "--qsize", str(qsize), "--quiet", "--json", out,
           "--idle-sleep-us", str(idle_sleep_us), *extra]
    for v in vms:
        name = v.split(",")[0].split("=")[1]
        cmd += ["--vm", f"{v},socket={sw.sock(name)}"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return p, out


def finish(p, out, timeout):
    _, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"pvsgen failed: {err[-2000:]}")
    with open(out) as f:
        return json.load(f)


def wait_until(what, cond, timeout):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def med_ms(xs):
    return f"{statistics.median(xs) * 1000:.1f} ms (max {max(xs) * 1000:.1f})"


def thousand(a):
    n = a.vms
    names = [f"vm{i}" for i in range(n)]
    sw = Switch(names, (0, 1), 'poll_mode = "adaptive"\n')
    lines = [f"{n} VMs (pvsgen, 64-entry rings, 10 frames/s each to the next VM) on one pvswitchd, two poll "
             "threads (CPUs 0 and 1, adaptive polling, parking on)", ""]
    try:
        before = {k: sw.proc(k) for k in ("threads", "fds", "rss", "anon")}
        vms = [f"name=vm{i},dst=vm{(i + 1) % n},rate=10" for i in range(n)]
        t0 = time.monotonic()
        gen, out = pvsgen(sw, vms, a.seconds + 2, qsize=64, idle_sleep_us=500)
        up = wait_until("every port connected", lambda: sw.connected() == n, 300)
        learned = wait_until("every MAC learned", lambda: len(sw.ctl("fdb")) >= n, 300) + up
        total_up = time.monotonic() - t0
        time.sleep(1.0)
        after = {k: sw.proc(k) for k in ("threads", "fds", "rss", "anon")}
        timings = {}
        for cmd in (["ports"], ["ports", "--json"], ["ports", f"vm{n // 2}"], ["stats"], ["stats", "--json"],
                    ["rxq"], ["fdb"]):
            timings[" ".join(cmd)] = [sw.timed(*cmd) for _ in range(5)]
        # A port added and removed among the N (the drop-in directory, through the reload path).
        extra_sock = sw.sock("extra")
        timings["add-port + del-port"] = []
        for _ in range(3):
            t1 = time.perf_counter()
            sw.timed("add-port", "extra", "type=vhost-user", f"socket={extra_sock}")
            sw.timed("del-port", "extra")
            timings["add-port + del-port"].append(time.perf_counter() - t1)
        timings["reload"] = [sw.timed("reload") for _ in range(3)]
        rep = finish(gen, out, a.seconds + 600)
        vms_r = {v["name"]: v for v in rep["vms"]}
        quiet = [v for v in vms_r.values() if v["received"] == 0]
        lost = sum(v.get("lost", 0) for v in vms_r.values())
        sent = sum(v["sent"] for v in vms_r.values())
        received = sum(v["received"] for v in vms_r.values())
        lines += ["| measure | value |", "|---|---|",
                  f"| every port connected after | {up:.2f} s |",
                  f"| every VM's MAC learned after | {learned:.2f} s ({total_up:.2f} s from pvsgen's start) |",
                  f"| threads | {after['threads']} ({before['threads']} before any VM) |",
                  f"| resident memory a connected port | {(after['rss'] - before['rss']) / n:.1f} KiB "
                  f"({before['rss']} KiB before, {after['rss']} KiB with {n}); of it, the daemon's own "
                  f"(not guest memory it touched) {(after['anon'] - before['anon']) / n:.1f} KiB |",
                  f"| open files a connected port | {(after['fds'] - before['fds']) / n:.2f} "
                  f"({before['fds']} before, {after['fds']} with {n}) |",
                  f"| frames sent / received (each VM to the next) | {sent} / {received}; "
                  f"VMs that received nothing: {len(quiet)}; lost {lost} |"]
        for k, ts in timings.items():
            lines.append(f"| pvswitchctl {k} | {med_ms(ts)} |")
    finally:
        sw.stop()
    return "\n".join(lines)


def idle_run(n_idle, chatty, park, seconds):
    """The busy pair's rate (Mpps, both ways) and the poll thread's cycles a frame, beside
    `n_idle` other VMs (one of them a sink when they chat)."""
    idle_names = [f"i{k}" for k in range(n_idle)]
    extra = f"park_after_us = {1000 if park else 0}\n"
    sw = Switch(["a", "b"] + idle_names, (1,), extra)
    try:
        idle_gen = None
        if n_idle:
            # Their generator looks at them every 5 ms (each sends on schedule: a rate is a
            # count due by now); the sink's ring holds 10 ms of their frames.
            specs = ["name=i0,size=64,qsize=1024"] + [
                f"name=i{k},size=64" + (",dst=i0,rate=10" if chatty else "") for k in range(1, n_idle)]
            idle_gen = pvsgen(sw, specs, seconds + 60, qsize=64, idle_sleep_us=5000)
            wait_until("the idle VMs connected", lambda: sw.connected() == n_idle, 300)
            if chatty:  # their hellos (silent VMs need no peer's, and send none)
                wait_until("the idle VMs' MACs learned", lambda: len(sw.ctl("fdb")) >= n_idle, 300)
            time.sleep(1.5)  # hellos over; parked, if parking is on
        # The pair runs 3 s longer than the window the switch's counters are read over, which
        # starts 2 s in (its hellos, flooded to every other VM, are over by then).
        gen, out = pvsgen(sw, ["name=a,dst=b,size=64", "name=b,dst=a,size=64"], seconds + 3, qsize=256)
        time.sleep(2.0)
        sw.ctl("stats", "--clear")
        time.sleep(seconds)
        st = sw.ctl("stats")["threads"][0]
        rep = finish(gen, out, seconds + 120)
        if idle_gen:
            idle_gen[0].send_signal(signal.SIGTERM)
            idle_gen[0].wait()
        vms = {v["name"]: v for v in rep["vms"]}
        return vms["a"]["rx_mpps"] + vms["b"]["rx_mpps"], st["cycles_per_packet"], st["parked"]
    finally:
        sw.stop()


def idle(a):
    lines = [f"Busy pair (pvsgen a <-> b, 64 B) on one poll thread beside other VMs, {a.reps} reps, the switch's "
             f"counters over {a.seconds:g} s inside each run, parking on and off alternated. Switch capacity: the "
             "frames a second the poll thread could forward at its cycles a frame (what the other VMs cost it); "
             "the pair's rate is also its generator's, which shares CPU 0 with theirs", "",
             "| other VMs | they send | parking | switch cycles a frame (median) | capacity / 0 others | "
             "pair Mpps (median) | / 0 others | queues parked |", "|---|---|---|---|---|---|---|---|"]
    base = {}
    for n_idle in (0, 100, 500, 998):
        for chatty in ((False,) if n_idle == 0 else (False, True)):
            got = {True: [], False: []}
            for rep in range(a.reps):
                for park in ((True, False) if rep % 2 == 0 else (False, True)):
                    got[park].append(idle_run(n_idle, chatty, park, a.seconds))
                    r = got[park][-1]
                    print(f"{n_idle} {'chatty' if chatty else 'silent'} park={park}: {r[0]:.3f} Mpps, "
                          f"{r[1]:.0f} cycles/frame, {r[2]} parked", flush=True)
            for park in (True, False):
                rate = statistics.median(x[0] for x in got[park])
                cyc = statistics.median(x[1] for x in got[park])
                if n_idle == 0:
                    base[park] = (rate, cyc)
                b = base[park]
                lines.append(f"| {n_idle} | {'1 frame/100 ms' if chatty else 'nothing'} | {'on' if park else 'off'} "
                             f"| {cyc:.0f} | {b[1] / cyc:.3f} | {rate:.3f} | {rate / b[0]:.3f} | "
                             f"{statistics.median(x[2] for x in got[park]):.0f} |")
    return "\n".join(lines)


def wake(a):
    lines = ["Ping-pong between two otherwise idle VMs, one ping every 20 ms, round trip (us)", "",
             "| parking | p50 | p99 | pings |", "|---|---|---|---|"]
    for park in (True, False):
        rtts = []
        for _ in range(a.reps):
            sw = Switch(["p", "q"], (1,), f"park_after_us = {1000 if park else 0}\n")
            try:
                gen, out = pvsgen(sw, ["name=p,dst=q,rate=50", "name=q"], a.seconds, extra=["--pingpong", "p,q"])
                rep = finish(gen, out, a.seconds + 120)
                rtts.append(next(v["pingpong"] for v in rep["vms"] if v["name"] == "p"))
            finally:
                sw.stop()
        p50 = statistics.median(r["rtt"]["p50_ns"] / 1e3 for r in rtts)
        p99 = statistics.median(r["rtt"]["p99_ns"] / 1e3 for r in rtts)
        lines.append(f"| {'on' if park else 'off'} | {p50:.1f} | {p99:.1f} | {sum(r['pongs'] for r in rtts)} |")
    return "\n".join(lines)


def jain(a):
    n = a.vms
    names = [f"vm{i}" for i in range(n)]
    sw = Switch(names, (0, 1), "")
    try:
        vms = [f"name=vm{i},dst=vm{(i + 1) % n},size=64" for i in range(n)]
        gen, out = pvsgen(sw, vms, a.seconds, qsize=64)
        rep = finish(gen, out, a.seconds + 600)
    finally:
        sw.stop()
    xs = [v["tx_mpps"] for v in rep["vms"]]
    j = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
    return (f"{n} VMs all sending at once (64 B, each to the next), two poll threads: Jain's index of their send "
            f"rates {j:.4f}; {sum(xs):.3f} Mpps in all, per VM min {min(xs) * 1e3:.2f} / median "
            f"{statistics.median(xs) * 1e3:.2f} / max {max(xs) * 1e3:.2f} kpps")


def flood_run(n_full, seconds):
    names = ["a", "b"] + [f"f{k}" for k in range(n_full)]
    sw = Switch(names, (1,), "")
    try:
        full_gen = None
        if n_full:
            full_gen = pvsgen(sw, [f"name=f{k},drain=0" for k in range(n_full)], seconds + 60, qsize=64,
                              idle_sleep_us=1000)
            wait_until("the full VMs connected", lambda: sw.connected() == n_full, 300)
            time.sleep(1.0)  # running (they send nothing; the pair's floods fill their rings)
        gen, out = pvsgen(sw, ["name=a,dst=bcast,size=64", "name=b,dst=bcast,size=64"], seconds)
        rep = finish(gen, out, seconds + 120)
        if full_gen:
            full_gen[0].send_signal(signal.SIGTERM)
            full_gen[0].wait()
        vms = {v["name"]: v for v in rep["vms"]}
        return vms["a"]["rx_mpps"] + vms["b"]["rx_mpps"]
    finally:
        sw.stop()


def flood(a):
    rows = []
    for rep in range(a.reps):
        r = {}
        for n in ((0, 998) if rep % 2 == 0 else (998, 0)):
            r[n] = flood_run(n, a.seconds)
        rows.append(r)
        print(f"flood rep {rep + 1}: alone {r[0]:.3f} Mpps, beside 998 full {r[998]:.3f} Mpps", flush=True)
    rs = [x[998] / x[0] for x in rows]
    return (f"Flooding pair (broadcast both ways, 64 B), {a.reps} reps: alone "
            f"{statistics.median(x[0] for x in rows):.3f} Mpps, beside 998 full-ring VMs "
            f"{statistics.median(x[998] for x in rows):.3f} Mpps: {statistics.median(rs):.3f} "
            f"({min(rs):.3f}..{max(rs):.3f}) of alone (floor 0.5)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", default="thousand,idle,wake,jain,flood")
    ap.add_argument("--vms", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    parts = {"thousand": thousand, "idle": idle, "wake": wake, "jain": jain, "flood": flood}
    out = []
    for p in a.part.split(","):
        out.append(parts[p](a))
        print(out[-1], flush=True)
    emit("\n\n".join(out), a.out)


if __name__ == "__main__":
    main()
