#!/usr/bin/env python3
"""Adaptive polling on a host with a NIC (issue 54), against busy polling in the same run:

- idle: an af_packet NIC on a veth into a network namespace (no receive interrupts: the
  thread backs off on its timer), or with `--nic tap` a net_tap NIC whose interface is moved
  into the namespace (receive interrupts: the thread sleeps until one), and 100 connected,
  silent pvsgen VMs, 2 poll threads: CPU
  use of each poll thread from /proc over a window, and its wake-ups from `stats`;
- first frame after an idle spell: a ping from the namespace to a testpmd VM (icmpecho) after
  `--idle` seconds of silence, its RTT against the pings right after it (the NIC's queue is
  polled again at once after the first frame);
- saturated NIC: NIC -> VM -> NIC through a net_null0 port (always full), the VM's receive rate,
  adaptive against busy, alternating (`pvsbench.measure_nic`, a new pvswitchd and VM each time);
  and with `--live-pairs N`, one pvswitchd and one VM whose polling mode a reload flips between
  N pairs of short windows (no start-up in between, so the pairs sit closer in time than the
  machine's speed changes).

Usage: tools/bench_nic_idle.py [--nic af_packet|tap] [--live-pairs 0] [--reps 5] [--seconds 4] [--idle 60] [--skip-idle] [--skip-first] [--skip-rate]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of the workspace.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import (NIC_FLOWS, PVSGEN, Testpmd, ctl, emit, measure_nic, start_pvswitchd, wait_socket,  # noqa: E402
                      write_config)

MODES = {"busy": 'poll_mode = "busy"\n', "adaptive": 'poll_mode = "adaptive"\n'}
HZ = os.sysconf("SC_CLK_TCK")
NS = "pvsbenchidle"
TAP = "pvbt0"
NIC = {"af_packet": "net_af_packet0,iface=pvbi0", "tap": f"net_tap0,iface={TAP}"}
nic = "af_packet"


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True).stdout


def netns():
    """A namespace behind a veth (10.77.0.1/24 inside, the host's end `pvbi0` bare); for a
    tap NIC only the namespace (`adopt_tap` moves the tap's interface in once it exists)."""
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "link", "del", "pvbi0", check=False)
    sh("ip", "netns", "add", NS)
    sh("ip", "netns", "exec", NS, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1")
    sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
    if nic == "tap":
        return
    sh("ip", "link", "add", "pvbi0", "type", "veth", "peer", "name", "pvsns0")
    sh("ip", "link", "set", "pvsns0", "netns", NS)
    for args in (["ip", "addr", "add", "10.77.0.1/24", "dev", "pvsns0"], ["ip", "link", "set", "pvsns0", "up"]):
        sh("ip", "netns", "exec", NS, *args)
    sh("sysctl", "-q", "-w", "net.ipv6.conf.pvbi0.disable_ipv6=1")
    sh("ip", "link", "set", "pvbi0", "up")


def adopt_tap(d):
    """Moves the tap NIC's interface (made by pvswitchd) into the namespace, 10.77.0.1/24, once
    the port is open (moved before, the driver's own set-up of it by name fails)."""
    deadline = time.time() + 30
    while time.time() < deadline:
        if any(p["name"] == "eth" and p["state"] == "running" for p in ctl(d, "ports")):
            break
        time.sleep(0.05)
    sh("ip", "link", "set", TAP, "netns", NS)
    for args in (["ip", "addr", "add", "10.77.0.1/24", "dev", TAP], ["ip", "link", "set", TAP, "up"]):
        sh("ip", "netns", "exec", NS, *args)


def cleanup_netns():
    sh("ip", "netns", "del", NS, check=False)
    sh("ip", "link", "del", "pvbi0", check=False)


def switch(d, mode, vms):
    conf = os.path.join(d, "pvswitch.toml")
    with open(conf, "w") as f:
        f.write(f'[switch]\npoll_cores = [0, 1]\nsocket_dir = "{d}"\ncontrol_socket = "ctl.sock"\n{MODES[mode]}')
        for v in vms:
            f.write(f'[[port]]\nname = "{v}"\ntype = "vhost-user"\nsocket = "{v}.sock"\n')
        f.write(f'[[port]]\nname = "eth"\ntype = "dpdk"\ndevice = "{NIC[nic]}"\n')
    stop = start_pvswitchd(d, conf)
    if nic == "tap":
        try:
            adopt_tap(d)
        except Exception:
            stop()
            raise
    for v in vms:
        wait_socket(f"{d}/{v}.sock")
    return stop


def pmd_ticks(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if name.startswith("pmd"):
            out[name] = int(fields[11]) + int(fields[12])
    return out


def pvswitchd_pid(d):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if d in open(f"/proc/{p}/cmdline").read() and "pvswitchd" in open(f"/proc/{p}/comm").read():
                    return int(p)
            except OSError:
                pass
    raise RuntimeError("pvswitchd not found")


def idle(mode, window):
    """CPU of each poll thread (% of a core) and wake-ups a second, 100 silent VMs and a NIC."""
    d = tempfile.mkdtemp(prefix="pvs-bench-nicidle-")
    vms = [f"v{i}" for i in range(100)]
    stop = switch(d, mode, vms)
    gen = subprocess.Popen(
        [PVSGEN, "--cpus", "0", "--seconds", str(window + 30), "--quiet"]
        + sum([["--vm", f"name={v},socket={d}/{v}.sock,dst=none"] for v in vms], []),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            if sum(p["state"] == "connected" for p in ctl(d, "ports")) == len(vms):
                break
            time.sleep(0.5)
        time.sleep(3)  # the queues park, the backoff reaches its ceiling
        pid = pvswitchd_pid(d)
        s0, t0, w0 = pmd_ticks(pid), time.time(), ctl(d, "stats")["threads"]
        time.sleep(window)
        s1, t1, w1 = pmd_ticks(pid), time.time(), ctl(d, "stats")["threads"]
        cpu = {k: 100.0 * (s1[k] - s0[k]) / HZ / (t1 - t0) for k in s1}
        wakes = [(a["sleeps"] - b["sleeps"]) / (t1 - t0) for a, b in zip(w1, w0)]
        return cpu, wakes, [t["running"].get("nic_sleep_us") for t in w1]
    finally:
        gen.kill()
        gen.wait()
        stop()


def first_frame(mode, idle_s):
    """RTT (ms) of the first ping after `idle_s` quiet seconds, and the median of the 20 after."""
    d = tempfile.mkdtemp(prefix="pvs-bench-nicfirst-")
    stop = switch(d, mode, ["vm"])
    vm = Testpmd("benchidlevm", ["--lcores", "0@0,1@0", "-m", "256", "--single-file-segments",
                                 "--vdev", f"net_virtio_user0,path={d}/vm.sock,queues=1,mac=02:00:00:00:77:02"],
                 ["--forward-mode=icmpecho", "--nb-cores=1"])
    try:
        vm.cmd("start")
        sh("ip", "netns", "exec", NS, "ping", "-c", "3", "-W", "2", "10.77.0.2", check=False)
        # The VM's address fixed in the namespace: after a minute its ARP entry would be stale,
        # and the first RTT would hold an ARP exchange too.
        dev = TAP if nic == "tap" else "pvsns0"
        sh("ip", "netns", "exec", NS, "ip", "neigh", "replace", "10.77.0.2", "lladdr", "02:00:00:00:77:02",
           "nud", "permanent", "dev", dev)
        time.sleep(idle_s)
        out = sh("ip", "netns", "exec", NS, "ping", "-c", "21", "-i", "0.2", "-W", "2", "10.77.0.2", check=False)
        rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]
        if len(rtts) < 21:
            raise RuntimeError(f"pings lost:\n{out}")
        return rtts[0], statistics.median(rtts[1:])
    finally:
        vm.close()
        stop()


def saturated_live(pairs, seconds):
    """NIC -> VM -> NIC through one pvswitchd whose `poll_mode` a reload flips: the VM's receive
    rate in each mode over `pairs` alternating pairs of `seconds`, and the adaptive thread's
    sleeps meanwhile (none: a saturated thread never sleeps)."""
    d = tempfile.mkdtemp(prefix="pvs-bench-nicrate-")
    def conf(mode):
        c = write_config(d, [("vm", "")], (1,), switch_extra=MODES[mode], top=NIC_FLOWS)
        with open(c, "a") as f:
            f.write('[[port]]\nname = "nic"\ntype = "dpdk"\ndevice = "net_null0"\n')
        return c
    stop = start_pvswitchd(d, conf("busy"))
    wait_socket(f"{d}/vm.sock")
    rates, ratios, sleeps = {"busy": [], "adaptive": []}, [], 0
    try:
        vm = Testpmd("benchnicvm", ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
                                    "--vdev", f"net_virtio_user0,path={d}/vm.sock,queues=1"],
                     ["--forward-mode=io", "--nb-cores=1", "--total-num-mbufs=32768"])
        try:
            vm.cmd("start")
            time.sleep(2)
            for rep in range(pairs):
                got = {}
                for mode in (("busy", "adaptive") if rep % 2 == 0 else ("adaptive", "busy")):
                    conf(mode)
                    ctl(d, "reload")
                    time.sleep(0.3)
                    s0, r0, t0 = ctl(d, "stats")["threads"][0]["sleeps"], vm.rx_packets(1), time.time()
                    time.sleep(seconds)
                    s1, r1, t1 = ctl(d, "stats")["threads"][0]["sleeps"], vm.rx_packets(1), time.time()
                    got[mode] = (r1 - r0) / (t1 - t0)
                    rates[mode].append(got[mode])
                    if mode == "adaptive":
                        sleeps += s1 - s0
                ratios.append(got["adaptive"] / got["busy"])
        finally:
            vm.close()
    finally:
        stop()
    return rates, ratios, sleeps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nic", choices=sorted(NIC), default="af_packet")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--idle", type=float, default=60)
    ap.add_argument("--skip-idle", action="store_true")
    ap.add_argument("--skip-first", action="store_true")
    ap.add_argument("--skip-rate", action="store_true")
    ap.add_argument("--live-pairs", type=int, default=0)
    a = ap.parse_args()
    global nic
    nic = a.nic
    out = []
    netns()
    try:
        if not a.skip_idle:
            out.append(f"Idle: 100 connected silent pvsgen VMs and a {nic} NIC, 2 poll threads, a 10 s window\n")
            out.append("| mode | pmd0 (% of a core) | pmd1 | wake-ups a second (pmd0, pmd1) | nic_sleep_us |")
            out.append("|---|---|---|---|---|")
            for mode in ("adaptive", "busy"):
                cpu, wakes, sl = idle(mode, 10)
                out.append(f"| {mode} | {cpu.get('pmd0', 0):.2f} | {cpu.get('pmd1', 0):.2f} | "
                           f"{', '.join(f'{w:.0f}' for w in wakes)} | {sl} |")
            out.append("")
        if not a.skip_first:
            out.append(f"First frame after {a.idle:.0f} s of silence: a ping from the namespace to a testpmd VM "
                       f"through a {nic} NIC\n")
            out.append("| mode | first ping RTT (ms) | the next 20, median (ms) |")
            out.append("|---|---|---|")
            for mode in ("adaptive", "busy"):
                first, rest = first_frame(mode, a.idle)
                out.append(f"| {mode} | {first:.3f} | {rest:.3f} |")
            out.append("")
        if not a.skip_rate:
            ratios, rates = [], {"busy": [], "adaptive": []}
            for rep in range(a.reps):
                order = ("busy", "adaptive") if rep % 2 == 0 else ("adaptive", "busy")
                got = {m: measure_nic("pvswitch", a.seconds, switch_extra=MODES[m]) for m in order}
                for m in got:
                    rates[m].append(got[m])
                ratios.append(got["adaptive"] / got["busy"])
            out.append(f"Saturated NIC (net_null0 -> VM -> NIC), {a.reps} alternating pairs of {a.seconds:.0f} s\n")
            out.append("| busy (median Mpps) | adaptive (median Mpps) | adaptive / busy, median | min..max |")
            out.append("|---|---|---|---|")
            out.append(f"| {statistics.median(rates['busy']) / 1e6:.3f} | {statistics.median(rates['adaptive']) / 1e6:.3f} | "
                       f"{statistics.median(ratios):.3f} | {min(ratios):.3f}..{max(ratios):.3f} |")
        if a.live_pairs:
            rates, ratios, sleeps = saturated_live(a.live_pairs, a.seconds)
            out.append(f"\nSaturated NIC, one pvswitchd whose poll_mode a reload flips, {a.live_pairs} alternating "
                       f"pairs of {a.seconds:.0f} s (adaptive thread's sleeps meanwhile: {sleeps})\n")
            out.append("| busy (median Mpps) | adaptive (median Mpps) | adaptive / busy, median | min..max |")
            out.append("|---|---|---|---|")
            out.append(f"| {statistics.median(rates['busy']) / 1e6:.3f} | {statistics.median(rates['adaptive']) / 1e6:.3f} | "
                       f"{statistics.median(ratios):.3f} | {min(ratios):.3f}..{max(ratios):.3f} |")
    finally:
        cleanup_netns()
    emit("\n".join(out))


if __name__ == "__main__":
    main()
