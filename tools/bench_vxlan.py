#!/usr/bin/env python3
"""VXLAN against the same path without a tunnel, both ways: what encapsulation and
decapsulation cost on the poll thread.

encap (VM -> VXLAN -> NIC): one testpmd VM (txonly on CPU 0, frames of one size to a MAC nobody has, so NORMAL floods them
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

decap (NIC -> VXLAN -> VM): the NIC is DPDK's net_pcap replaying a capture written here
(infinite_rx: 64 frames read again and again from memory, at about 100 Mpps into testpmd's
rxonly here, so the switch is the bottleneck). plain: the capture holds the VM's frames
themselves (one size, to the VM's MAC from a remote one); vxlan: the same frames behind outer
Ethernet/IPv4/UDP/VXLAN headers from 10.99.0.2 to the VTEP's 10.99.0.1, VNI 100. The VM is a
testpmd in rxonly on CPU 0; the rate is what it received per second (its port
statistics: OVS has no counters for a vhost-user port). OVS's decapsulating bridge: br-phy sends the NIC's frames to its LOCAL
port, which pops the tunnel; br-int outputs the vxlan port's frames to the VM.

Usage: tools/bench_vxlan.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--kinds plain,vxlan,ovs-plain,ovs-vxlan]
                            [--directions encap,decap] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), a release build of pvswitchd, and for
the OVS kinds OVS-DPDK (scripts/install-bench-peer.sh).
"""

import argparse
import json
import os
import statistics
import struct
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
local_ip = "10.99.0.1/24"
next_hop_mac = "02:00:00:00:00:fe"
mtu = 1500
[[vtep.vni]]
vni = 100
vlan = 10
remotes = ["10.99.0.2"]
"""
VM_MAC = "02:00:00:00:0b:99"
REMOTE_VM_MAC = "02:00:00:00:0a:01"
UNDERLAY_MAC = "02:00:00:00:00:01"  # OVS's br-phy (pvswitchd's VTEP does not look at it)
NEXT_HOP_MAC = "02:00:00:00:00:fe"


def _mac(m):
    return bytes.fromhex(m.replace(":", ""))


def _ip_checksum(h):
    s = sum(struct.unpack(f"!{len(h) // 2}H", h))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def vm_frame(size, i):
    """A `size`-byte frame (FCS included, as testpmd's --txpkts counts it minus 4) from the remote
    VM to ours: IPv4/UDP, the source port varied by `i`."""
    payload = size - 4 - 14 - 20 - 8
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 28 + payload, 0, 0x4000, 64, 17, 0,
                     bytes([192, 168, 10, 1]), bytes([192, 168, 10, 2]))
    ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
    udp = struct.pack("!HHHH", 1024 + i, 5001, 8 + payload, 0)
    return _mac(VM_MAC) + _mac(REMOTE_VM_MAC) + b"\x08\x00" + ip + udp + bytes(payload)


def vxlan_frame(inner, i):
    """`inner` behind outer headers from the remote VTEP 10.99.0.2 to ours, 10.99.0.1, VNI 100."""
    vx = struct.pack("!II", 0x08000000, 100 << 8)
    udp_len = 8 + len(vx) + len(inner)
    udp = struct.pack("!HHHH", 49152 + i, 4789, udp_len, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, 0, 0x4000, 64, 17, 0,
                     bytes([10, 99, 0, 2]), bytes([10, 99, 0, 1]))
    ip = ip[:10] + struct.pack("!H", _ip_checksum(ip)) + ip[12:]
    return _mac(UNDERLAY_MAC) + _mac(NEXT_HOP_MAC) + b"\x08\x00" + ip + udp + vx + inner


def write_pcap(path, size, tunnel, n=64):
    """A classic pcap of `n` frames for net_pcap to replay: the VM's, or the same encapsulated."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for i in range(n):
            fr = vm_frame(size, i)
            if tunnel:
                fr = vxlan_frame(fr, i)
            f.write(struct.pack("<IIII", 0, i, len(fr), len(fr)))
            f.write(fr)


def tx_of(d, port):
    out = subprocess.run([PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "--json", "ports", port],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["tx_packets"]


def start_ovs_vx(d, tunnel, devargs, decap):
    """OVS-DPDK (one PMD on CPU 1, as tools/bench_peer.py runs it) with the VM on br-int and the
    NIC (DPDK `devargs`): on br-int itself (`tunnel` false), or on br-phy, the underlay bridge of a
    userspace VXLAN port on br-int (VNI 100 to 10.99.0.2, the next hop's MAC set with
    tnl/arp/set). Encapsulating, br-int sends the VM's frames to the vxlan port (or the NIC) and
    br-phy everything to the NIC; decapsulating (`decap`), br-phy sends the NIC's frames to its
    LOCAL port, where OVS pops the tunnel, and br-int the vxlan port's (or the NIC's) to the VM.
    Returns (stop, the NIC's tx count)."""
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
                f"other_config:hwaddr={UNDERLAY_MAC}")
            nic_br = "br-phy"
        # Room for a 1518-byte frame behind 50 bytes of headers, as pvswitchd's vtep has (mtu).
        run(*vsctl, "add-port", nic_br, "nic", "--", "set", "Interface", "nic", "type=dpdk",
            f"options:dpdk-devargs={devargs}", "mtu_request=9000")
        if tunnel:
            run(*vsctl, "set", "Interface", "br-phy", "mtu_request=9000")
        # Explicit outputs, not NORMAL: a flood would also reach the bridge's own port, a kernel
        # tap, which pvswitchd does not have.
        run("ovs-ofctl", "del-flows", "br-int")
        if decap:
            run("ovs-ofctl", "add-flow", "br-int", f"in_port={'vx' if tunnel else 'nic'},actions=output:vm")
        else:
            run("ovs-ofctl", "add-flow", "br-int", f"in_port=vm,actions=output:{'vx' if tunnel else 'nic'}")
        if tunnel:
            run("ip", "addr", "replace", "10.99.0.1/24", "dev", "br-phy")
            run("ip", "link", "set", "br-phy", "up")
            # The route comes from the kernel's (br-phy's address); added here in case it did not yet.
            try:
                run(*appctl, "ovs/route/add", "10.99.0.0/24", "br-phy")
            except RuntimeError:
                pass
            run(*appctl, "tnl/arp/set", "br-phy", "10.99.0.2", NEXT_HOP_MAC)
            run("ovs-ofctl", "del-flows", "br-phy")
            run("ovs-ofctl", "add-flow", "br-phy", "in_port=nic,actions=LOCAL" if decap else "actions=output:nic")
    except Exception:
        stop()
        raise

    def tx():
        # Live counters (the database's are refreshed only every few seconds).
        out = run("ovs-ofctl", "dump-ports", nic_br, "nic")
        return int(out.split("tx pkts=")[1].split(",")[0])
    return stop, tx


def measure(kind, size, seconds, direction, warmup=1.5):
    d = tempfile.mkdtemp(prefix=f"pvs-bench-vx-{direction}-{kind}-")
    tunnel = kind.endswith("vxlan")
    decap = direction == "decap"
    if decap:
        pcap = os.path.join(d, "underlay.pcap")
        write_pcap(pcap, size, tunnel)
        devargs = f"net_pcap0,rx_pcap={pcap},infinite_rx=1"
    else:
        devargs = "net_null0,no-rx=1"
    if kind.startswith("ovs"):
        stop, count = start_ovs_vx(d, tunnel, devargs, decap)
    else:
        conf = write_config(d, [("vm", "tag = 10")], (1,))
        with open(conf, "a") as f:
            f.write(f'[[port]]\nname = "nic"\ntype = "dpdk"\ndevice = "{devargs}"\n')
            f.write(VTEP if tunnel else "tag = 10\n")
        stop = start_pvswitchd(d, conf)

        def count():
            return tx_of(d, "nic")
    try:
        wait_socket(f"{d}/vm.sock")
        if decap:
            app = ["--forward-mode=rxonly"]
        else:
            app = ["--forward-mode=txonly", f"--txpkts={size - 4}", f"--eth-peer=0,{VM_MAC}"]
        vm = Testpmd(
            "benchvxvm",
            ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
             "--vdev", f"net_virtio_user0,path={d}/vm.sock,queues=1,mac={REMOTE_VM_MAC if not decap else VM_MAC}"],
            ["--nb-cores=1", "--total-num-mbufs=32768"] + app,
        )
        try:
            vm.cmd("start")
            if decap:
                # OVS reports no counters for a vhost-user port: what the VM received, for both.
                def count():
                    return vm.rx_packets(1)
            time.sleep(warmup)
            t0, n0 = time.time(), count()
            time.sleep(seconds)
            t1, n1 = time.time(), count()
            return (n1 - n0) / (t1 - t0)
        finally:
            vm.close()
    finally:
        stop()


TITLES = {
    "encap": "VM -> VXLAN -> NIC (net_null, no rx) against VM -> NIC; testpmd txonly VM on CPU 0, the switch on "
             "CPU 1; the rate is what the NIC sent",
    "decap": "NIC -> VXLAN -> VM (net_pcap replaying from memory) against NIC -> VM; testpmd rxonly VM on CPU 0, "
             "the switch on CPU 1; the rate is what the VM was given",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--kinds", default=",".join(KINDS), help="plain,vxlan (pvswitchd), ovs-plain,ovs-vxlan (OVS-DPDK)")
    ap.add_argument("--directions", default="encap,decap")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    kinds = a.kinds.split(",")
    directions = a.directions.split(",")
    if any(k.startswith("ovs") for k in kinds) and not os.path.exists(OVS_VSWITCHD):
        sys.exit(f"no {OVS_VSWITCHD}: run scripts/install-bench-peer.sh (or --kinds plain,vxlan)")
    rows = {(dr, s): [] for dr in directions for s in sizes}
    for rep in range(a.reps):
        for dr in directions:
            for s in sizes:
                # Each kind goes first in turn.
                order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
                r = {k: measure(k, s, a.seconds, dr) for k in order}
                rows[(dr, s)].append(r)
                print(f"rep {rep + 1} {dr} {s:>4} B: " + "  ".join(f"{k} {r[k] / 1e6:6.3f}" for k in kinds) + " Mpps",
                      flush=True)
    pairs = [("vxlan", "plain", "pvswitchd vxlan/plain"), ("ovs-vxlan", "ovs-plain", "OVS vxlan/plain"),
             ("vxlan", "ovs-vxlan", "pvswitchd/OVS, vxlan"), ("plain", "ovs-plain", "pvswitchd/OVS, plain")]
    pairs = [p for p in pairs if p[0] in kinds and p[1] in kinds]
    lines = [f"{a.reps} reps of {a.seconds:g} s, kinds rotated in each rep", ""]
    for dr in directions:
        lines += [
            TITLES[dr],
            "",
            "| frame | " + " | ".join(f"{k} (median)" for k in kinds) + " | "
            + " | ".join(f"{name} median (min..max)" for _, _, name in pairs) + " |",
            "|---|" + "---|" * (len(kinds) + len(pairs)),
        ]
        for s in sizes:
            rs = rows[(dr, s)]
            cells = [f"{statistics.median(r[k] for r in rs) / 1e6:.3f} Mpps" for k in kinds]
            for x, y, _ in pairs:
                v = [r[x] / r[y] for r in rs]
                cells.append(f"{statistics.median(v):.3f} ({min(v):.3f}..{max(v):.3f})")
            lines.append(f"| {s} B | " + " | ".join(cells) + " |")
        lines.append("")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
