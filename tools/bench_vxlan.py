#!/usr/bin/env python3
"""VM -> VXLAN -> NIC against VM -> NIC: what encapsulation costs on the poll thread.

One testpmd VM (txonly on CPU 0, frames of one size to a MAC nobody has, so NORMAL floods them
in the VM's VLAN 10) sends through pvswitchd (one busy poll thread on CPU 1) to a net_null0 DPDK
port (no-rx=1: it receives nothing), which frees what it is given. Four configurations, rotated within each rep (OVS-DPDK's only with --kinds including them):
  - plain:  the NIC is an access port of VLAN 10: each frame is copied into an mbuf, untagged;
  - vxlan:  the NIC is the underlay of a [[vtep]] whose VNI 100 is VLAN 10, with one remote (a
            static next-hop MAC: net_null answers no ARP): each frame is copied into an mbuf
            behind 50 bytes of outer headers filled for it (overlay MTU 1500: the underlay's
            frames are up to 1568 bytes, which net_null and the mbufs take).
  - ovs-plain, ovs-vxlan: OVS-DPDK the same two ways (its userspace VXLAN: a vxlan port on
            br-int, br-phy with the NIC as its underlay bridge, the next hop set by tnl/arp/set).
The rate is what the NIC port sent (its tx_packets) per second over a window.
The decapsulating direction is measured by tests/evpn.rs's traffic only (correctness); see
BENCHMARKS.md for why it has no rate here yet.

Usage: tools/bench_vxlan.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--kinds plain,vxlan,ovs-plain,ovs-vxlan]
                            [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), a release build of pvswitchd, and for
the OVS kinds OVS-DPDK (scripts/install-bench-peer.sh).
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
from pvsbench import (  # noqa: E402
    OVS_VSWITCHD, PVSWITCHCTL, Testpmd, emit, ovs_daemons, start_pvswitchd, wait_socket, write_config,
)

KINDS = ["plain", "vxlan", "ovs-plain", "ovs-vxlan"]

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


def start_ovs_vx(d, tunnel):
    """OVS-DPDK (one PMD on CPU 1, as tools/bench_peer.py runs it) with the VM on br-int and the
    net_null NIC: on br-int itself (`tunnel` false), or on br-phy, the underlay bridge of a
    userspace VXLAN port on br-int (VNI 100 to 10.99.0.2, the next hop's MAC set with
    tnl/arp/set, br-phy's own flow sending everything to the NIC). Returns (stop, tx count of the
    NIC)."""
    run, vsctl, stop_daemons = ovs_daemons(d)
    appctl = ["ovs-appctl", "-t", f"{d}/ovs-vswitchd.ctl"]

    def stop():
        stop_daemons()
        subprocess.run(["ip", "link", "del", "br-phy"], capture_output=True)
    try:
        run(*vsctl, "add-br", "br-int", "--", "set", "bridge", "br-int", "datapath_type=netdev")
        run(*vsctl, "add-port", "br-int", "vm", "--", "set", "Interface", "vm", "type=dpdkvhostuser")
        os.symlink(f"{d}/vm", f"{d}/vm.sock")
        nic_br = "br-int"
        if tunnel:
            run(*vsctl, "add-port", "br-int", "vx", "--", "set", "Interface", "vx", "type=vxlan",
                "options:remote_ip=10.99.0.2", "options:key=100")
            run(*vsctl, "add-br", "br-phy", "--", "set", "bridge", "br-phy", "datapath_type=netdev",
                "other_config:hwaddr=02:00:00:00:00:01")
            nic_br = "br-phy"
        # Room for a 1518-byte frame behind 50 bytes of headers, as pvswitchd's vtep has (mtu).
        run(*vsctl, "add-port", nic_br, "nic", "--", "set", "Interface", "nic", "type=dpdk",
            "options:dpdk-devargs=net_null0,no-rx=1", "mtu_request=9000")
        if tunnel:
            run(*vsctl, "set", "Interface", "br-phy", "mtu_request=9000")
        # An explicit output, not NORMAL: a flood would also reach the bridge's own port, a
        # kernel tap, which pvswitchd does not have.
        run("ovs-ofctl", "del-flows", "br-int")
        run("ovs-ofctl", "add-flow", "br-int", f"in_port=vm,actions=output:{'vx' if tunnel else 'nic'}")
        if tunnel:
            run("ip", "addr", "replace", "10.99.0.1/24", "dev", "br-phy")
            run("ip", "link", "set", "br-phy", "up")
            # The route comes from the kernel's (br-phy's address); added here in case it did not yet.
            try:
                run(*appctl, "ovs/route/add", "10.99.0.0/24", "br-phy")
            except RuntimeError:
                pass
            run(*appctl, "tnl/arp/set", "br-phy", "10.99.0.2", "02:00:00:00:00:fe")
            run("ovs-ofctl", "del-flows", "br-phy")
            run("ovs-ofctl", "add-flow", "br-phy", "actions=output:nic")
    except Exception:
        stop()
        raise

    def tx():
        # Live counters (the database's are refreshed only every few seconds).
        out = run("ovs-ofctl", "dump-ports", nic_br, "nic")
        return int(out.split("tx pkts=")[1].split(",")[0])
    return stop, tx


def measure(kind, size, seconds, warmup=1.5):
    d = tempfile.mkdtemp(prefix=f"pvs-bench-vx-{kind}-")
    if kind.startswith("ovs"):
        stop, tx = start_ovs_vx(d, kind == "ovs-vxlan")
    else:
        conf = write_config(d, [("vm", "tag = 10")], (1,))
        with open(conf, "a") as f:
            f.write('[[port]]\nname = "nic"\ntype = "dpdk"\ndevice = "net_null0,no-rx=1"\n')
            f.write("tag = 10\n" if kind == "plain" else VTEP)
        stop = start_pvswitchd(d, conf)

        def tx():
            return tx_of(d, "nic")
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
            t0, n0 = time.time(), tx()
            time.sleep(seconds)
            t1, n1 = time.time(), tx()
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
    ap.add_argument("--kinds", default=",".join(KINDS), help="plain,vxlan (pvswitchd), ovs-plain,ovs-vxlan (OVS-DPDK)")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    kinds = a.kinds.split(",")
    if any(k.startswith("ovs") for k in kinds) and not os.path.exists(OVS_VSWITCHD):
        sys.exit(f"no {OVS_VSWITCHD}: run scripts/install-bench-peer.sh (or --kinds plain,vxlan)")
    rows = {s: [] for s in sizes}
    for rep in range(a.reps):
        for s in sizes:
            # Each kind goes first in turn.
            order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
            r = {k: measure(k, s, a.seconds) for k in order}
            rows[s].append(r)
            print(f"rep {rep + 1} {s:>4} B: " + "  ".join(f"{k} {r[k] / 1e6:6.3f}" for k in kinds) + " Mpps", flush=True)
    pairs = [("vxlan", "plain", "pvswitchd vxlan/plain"), ("ovs-vxlan", "ovs-plain", "OVS vxlan/plain"),
             ("vxlan", "ovs-vxlan", "pvswitchd/OVS, vxlan"), ("plain", "ovs-plain", "pvswitchd/OVS, plain")]
    pairs = [p for p in pairs if p[0] in kinds and p[1] in kinds]
    lines = [
        f"VM -> VXLAN -> NIC (net_null, no rx) against VM -> NIC, {a.reps} reps of {a.seconds:g} s, kinds rotated, "
        "testpmd txonly VM on CPU 0, the switch on CPU 1",
        "",
        "| frame | " + " | ".join(f"{k} (median)" for k in kinds) + " | "
        + " | ".join(f"{name} median (min..max)" for _, _, name in pairs) + " |",
        "|---|" + "---|" * (len(kinds) + len(pairs)),
    ]
    for s in sizes:
        rs = rows[s]
        cells = [f"{statistics.median(r[k] for r in rs) / 1e6:.3f} Mpps" for k in kinds]
        for x, y, _ in pairs:
            v = [r[x] / r[y] for r in rs]
            cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}..{max(v):.3f})")
        lines.append(f"| {s} B | " + " | ".join(cells) + " |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
