#!/usr/bin/env python3
"""VM -> VXLAN -> NIC against VM -> NIC: what encapsulation costs on the poll thread.

One testpmd VM (txonly on CPU 0, frames of one size to a MAC nobody has, so NORMAL floods them
in the VM's VLAN 10) sends through pvswitchd (one busy poll thread on CPU 1) to a net_null0 DPDK
port (no-rx=1: it receives nothing), which frees what it is given. Two configurations, alternated within each rep:
  - plain:  the NIC is an access port of VLAN 10: each frame is copied into an mbuf, untagged;
  - vxlan:  the NIC is the underlay of a [[vtep]] whose VNI 100 is VLAN 10, with one remote (a
            static next-hop MAC: net_null answers no ARP): each frame is copied into an mbuf
            behind 50 bytes of outer headers filled for it (overlay MTU 1500: the underlay's
            frames are up to 1568 bytes, which net_null and the mbufs take).
The rate is what the NIC port sent (pvswitchd's tx_packets on it) per second over a window.
The decapsulating direction is measured by tests/evpn.rs's traffic only (correctness); see
BENCHMARKS.md for why it has no rate here yet.

Usage: tools/bench_vxlan.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import PVSWITCHCTL, Testpmd, emit, start_pvswitchd, wait_socket, write_config  # noqa: E402

VTEP = """[[vtep]]
name = "vt"
underlay = "nic"
local_ip = "10.0.0.1/24"
next_hop_mac = "02:00:00:00:00:fe"
mtu = 1500
[[vtep.vni]]
vni = 100
vlan = 10
remotes = ["10.0.0.2"]
"""


def tx_of(d, port):
    out = subprocess.run([PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "--json", "ports", port],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["tx_packets"]


def measure(kind, size, seconds, warmup=1.5):
    d = tempfile.mkdtemp(prefix=f"pvs-bench-vx-{kind}-")
    conf = write_config(d, [("vm", "tag = 10")], (1,))
    with open(conf, "a") as f:
        f.write('[[port]]\nname = "nic"\ntype = "dpdk"\ndevice = "net_null0,no-rx=1"\n')
        f.write("tag = 10\n" if kind == "plain" else VTEP)
    stop = start_pvswitchd(d, conf)
    try:
        wait_socket(f"{d}/vm.sock")
        vm = Testpmd(
            "benchvxvm",
            ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
             "--vdev", f"net_virtio_user0,path={d}/vm.sock,queues=1,mac=02:00:00:00:0a:01"],
            ["--forward-mode=txonly", "--nb-cores=1", "--total-num-mbufs=32768", f"--txpkts={size - 4}",
             "--eth-peer=0,02:00:00:00:0b:99"],
        )
        try:
            vm.cmd("start")
            time.sleep(warmup)
            t0, n0 = time.time(), tx_of(d, "nic")
            time.sleep(seconds)
            t1, n1 = time.time(), tx_of(d, "nic")
            return (n1 - n0) / (t1 - t0)
        finally:
            vm.close()
    finally:
        stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = {s: [] for s in sizes}
    for rep in range(a.reps):
        for s in sizes:
            order = ["plain", "vxlan"] if rep % 2 == 0 else ["vxlan", "plain"]
            r = {k: measure(k, s, a.seconds) for k in order}
            rows[s].append(r)
            print(f"rep {rep + 1} {s:>4} B: plain {r['plain'] / 1e6:6.3f} Mpps  vxlan {r['vxlan'] / 1e6:6.3f} Mpps  "
                  f"ratio {r['vxlan'] / r['plain']:.3f}", flush=True)
    lines = [
        f"VM -> VXLAN -> NIC (net_null) against VM -> NIC, {a.reps} alternating pairs of {a.seconds:g} s, "
        "testpmd txonly VM on CPU 0, pvswitchd on CPU 1",
        "",
        "| frame | plain (median) | vxlan (median) | median ratio | ratio min..max |",
        "|---|---|---|---|---|",
    ]
    for s in sizes:
        rs = rows[s]
        ratios = [r["vxlan"] / r["plain"] for r in rs]
        lines.append(f"| {s} B | {statistics.median(r['plain'] for r in rs) / 1e6:.3f} Mpps | "
                     f"{statistics.median(r['vxlan'] for r in rs) / 1e6:.3f} Mpps | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}..{max(ratios):.3f} |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
