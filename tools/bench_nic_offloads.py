#!/usr/bin/env python3
"""Guest -> NIC TCP: the NIC's own offloads against pvswitchd's software segmentation.

A QEMU guest (TCG, every offload negotiated) runs iperf3 to the Linux stack of a network
namespace through pvswitchd and a net_tap port, whose interface is moved into the namespace
(MTU 1480 there, so that TCP's segments fit what net_tap segments: it counts the Ethernet
header against its MTU of 1500). Each rep runs once with the dpdk port's `offloads = true`
(the guest's 64 KiB TSO frames go to the device whole, one mbuf chain each, and its driver
segments and checksums them) and once with `offloads = false` (pvswitchd cuts and checksums
every segment itself), order alternating. Prints Mbit/s guest -> namespace and back, the
frames pvswitchd handed the NIC, the poll thread's busy cycles per MB, and the ratio on/off of
guest -> namespace throughput.

Usage: tools/bench_nic_offloads.py [--reps 3] [--iperf-time 5] [--out FILE]
Needs a release build and the guest image (bash scripts/prepare.sh does both); run as root.
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
from pvsbench import ROOT, ctl, emit, start_pvswitchd, write_config  # noqa: E402

NS, IFACE = "pvsbenchtap", "pvsbtap0"

JOB = """P=10.77.0.1
until ping -c 1 -W 1 $P >/dev/null 2>&1; do :; done
for dir in up down; do
  a=""; [ $dir = down ] && a="-R"
  n=0
  until out=$(timeout 60 iperf3 -c $P -t {t} -f m $a 2>&1); do n=$((n+1)); [ $n -lt 10 ] || break; sleep 0.5; done
  echo "$out" | awk -v d=$dir '/receiver/ {{print "PVS-IPERF " d " mbps=" $7}}'
done
echo PVS-READY
sleep 1000
"""


def sh(*args):
    subprocess.run(args, check=True, capture_output=True)


def run(offloads, iperf_time):
    """(Mbit/s up, Mbit/s down, frames to the NIC, busy kcycles per MB) for one run."""
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    with tempfile.TemporaryDirectory(prefix="pvs-nicoffl-") as d:
        extra = (f'[[port]]\nname = "eth"\ntype = "dpdk"\ndevice = "net_tap0,iface={IFACE}"\n'
                 f"offloads = {'true' if offloads else 'false'}\n")
        conf = write_config(d, [("vm", "")], (1,), 'poll_mode = "adaptive"')
        with open(conf, "a") as f:
            f.write(extra)
        stop = start_pvswitchd(d, conf)
        iperf = qemu = None
        try:
            # The control socket answers before the dpdk port is open: wait for its interface.
            for _ in range(300):
                if os.path.exists(f"/sys/class/net/{IFACE}"):
                    break
                time.sleep(0.1)
            sh("ip", "netns", "add", NS)
            sh("ip", "netns", "exec", NS, "ip", "link", "set", "lo", "up")
            sh("ip", "link", "set", IFACE, "netns", NS)
            ex = ["ip", "netns", "exec", NS]
            sh(*ex, "sysctl", "-q", "-w", f"net.ipv6.conf.{IFACE}.disable_ipv6=1")
            sh(*ex, "ip", "link", "set", IFACE, "mtu", "1480")
            sh(*ex, "ip", "addr", "add", "10.77.0.1/24", "dev", IFACE)
            sh(*ex, "ip", "link", "set", IFACE, "up")
            iperf = subprocess.Popen([*ex, "iperf3", "-s", "-B", "10.77.0.1"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
            job, log = os.path.join(d, "job.sh"), os.path.join(d, "guest.log")
            with open(job, "w") as f:
                f.write(JOB.format(t=iperf_time))
            qemu = subprocess.Popen([os.path.join(ROOT, "scripts", "run-vm.sh"), "--socket", os.path.join(d, "vm.sock"),
                                     "--ip", "10.77.0.2/24", "--name", "pvsbnic", "--job", job, "--log", log],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = time.time()
            text = ""
            while "PVS-READY" not in text:
                if time.time() - start > 300 or qemu.poll() is not None:
                    raise RuntimeError(f"guest did not finish (offloads {offloads}):\n{text}")
                time.sleep(0.5)
                text = open(log, errors="replace").read() if os.path.exists(log) else ""
            ports, stats = {p["name"]: p for p in ctl(d, "ports")}, ctl(d, "stats")
        finally:
            for p in (qemu, iperf):
                if p:
                    p.kill()
                    p.wait()
            stop()
            subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        got = dict(re.findall(r"PVS-IPERF (up|down) mbps=([0-9.]+)", text))
        if len(got) != 2:
            raise RuntimeError(f"iperf3 did not report both ways (offloads {offloads}):\n{text}")
        eth = ports["eth"]
        mbytes = (eth["tx_bytes"] + ports["vm"]["tx_bytes"]) / 1e6
        cycles = sum(t["busy_cycles"] for t in stats["threads"])
        return float(got["up"]), float(got["down"]), eth["tx_packets"], eth["hw_offloaded"], cycles / mbytes / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iperf-time", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows, ratios = [], []
    for rep in range(a.reps):
        order = [True, False] if rep % 2 == 0 else [False, True]
        res = {}
        for on in order:
            res[on] = run(on, a.iperf_time)
            up, down, frames, hw, kc = res[on]
            print(f"rep {rep}: device offloads {'on ' if on else 'off'}: guest->ns {up:.0f} Mbit/s, ns->guest "
                  f"{down:.0f} Mbit/s, {frames} frames to the NIC ({hw} whole), switch {kc:.0f} kcycles/MB", flush=True)
        (on_up, on_down, on_fr, _, on_kc), (off_up, off_down, off_fr, _, off_kc) = res[True], res[False]
        ratio = on_up / off_up
        ratios.append(ratio)
        rows.append(f"| {rep} | {'on, off' if rep % 2 == 0 else 'off, on'} | {on_up:.0f} / {on_down:.0f} | "
                    f"{off_up:.0f} / {off_down:.0f} | {on_fr} / {off_fr} | {on_kc:.0f} / {off_kc:.0f} | {ratio:.2f} |")
    table = "\n".join([
        f"iperf3 TCP, a QEMU guest (TCG) <-> pvswitchd <-> net_tap <-> a namespace, {a.iperf_time} s each way, "
        f"{a.reps} reps; device offloads on the dpdk port on against off",
        "",
        "| rep | order | on: guest->ns / ns->guest (Mbit/s) | off | frames to the NIC (on / off) "
        "| poll thread busy kcycles per MB (on / off) | guest->ns on / off |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"guest->ns on / off: median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})",
    ])
    emit(table, a.out)


if __name__ == "__main__":
    main()
