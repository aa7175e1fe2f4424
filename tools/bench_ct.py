#!/usr/bin/env python3
"""OVS's connection-tracking flows, the same text in pvswitchd and in Open vSwitch with DPDK
(issue 49's benchmark): frames per second VM to VM and the switch's cycles a frame, at 1, 10k
and more connections, against each switch's own rate over the same ports without `ct`.

The generator is tools/pvsbench.py's flowgen (testpmd, two virtio-user ports on CPU 0, UDP
to `--flowgen-flows` destination addresses: one connection each, per direction); the switch
runs on CPU 1. The flows are OVS's conntrack tutorial, a zone per port:

    table=0  ip,ct_state=-trk,in_port=a  ct(zone=1,table=1)   (b: zone 2)
    table=1  +trk+new  ct(commit,zone=Z),output:PEER
    table=1  +trk+est  output:PEER

One-way UDP stays +new, so every frame meets the tracker twice in OVS (the lookup, then the
commit of a stored connection); pvswitchd's walk asks its tracker once for a connection it has
just looked up in that zone. The plain kinds forward the same traffic by `in_port` flows.
pvswitchd's cycles a frame are its poll thread's busy cycles over the frames it received
(`pvswitchctl stats`); OVS's are its PMD's "avg processing cycles per packet"
(`dpif-netdev/pmd-stats-show`), both over the measured window. The four kinds are rotated
within each rep.

With `--base BINARY` it compares this build's `ct` flows with another pvswitchd's instead
(no OVS): rates and cycles a frame, this / base, alternated in each rep.

With `--new` it measures new connections a second instead: the same flows, 2^24 destination
addresses, so in a short window every frame is a connection neither switch has seen (a
lookup that misses, the rules of `+trk+new`, a commit); both tables are sized past what the
window can fill (pvswitchd's `ct_max_connections`, OVS's `dpctl/ct-set-maxconns`), and the
connections each table holds at the end are printed, so a switch that stopped committing
shows.

Usage: tools/bench_ct.py [--reps 5] [--seconds 3] [--sizes 64,1518] [--conns 1,10000,100000]
                         [--base PVSWITCHD] [--new] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh), OVS-DPDK
(scripts/install-bench-peer.sh) and a release build of the workspace.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import OVS_VSWITCHD, PVSWITCHCTL, emit, measure  # noqa: E402

KINDS = ["pvswitch-ct", "ovs-ct", "pvswitch", "ovs"]


def ct_flows():
    """The conntrack flows, ovs-ofctl syntax (which pvswitchd's configuration takes as is)."""
    out = []
    for port, peer, zone in (("a", "b", 1), ("b", "a", 2)):
        out += [
            f"table=0,priority=10,in_port={port},ip,ct_state=-trk,actions=ct(zone={zone},table=1)",
            f"table=1,priority=10,in_port={port},ip,ct_state=+trk+new,actions=ct(commit,zone={zone}),output:{peer}",
            f"table=1,priority=10,in_port={port},ip,ct_state=+trk+est,actions=output:{peer}",
        ]
    return out + ["table=0,priority=0,actions=drop", "table=1,priority=0,actions=drop"]


PLAIN = ["in_port=a,actions=output:b", "in_port=b,actions=output:a"]


def cycles_probe(kind, got):
    """A `during` hook for pvsbench.measure: clears the switch's cycle counters as the window
    opens and reads them as it closes, into got["cycles"], and the connections its tracker
    holds then into got["conns"]."""
    def during(d, done):
        if kind.startswith("pvswitch"):
            ctl = [PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "--json"]
            subprocess.run(ctl + ["stats", "--clear"], capture_output=True, timeout=30)
            done.wait()
            st = json.loads(subprocess.run(ctl + ["stats"], capture_output=True, text=True, timeout=30).stdout)
            t = st["threads"][0]
            got["cycles"] = t["busy_cycles"] / max(t["rx_packets"], 1)
            ct = subprocess.run(ctl + ["conntrack", "zone=1"], capture_output=True, text=True, timeout=30)
            got["conns"] = json.loads(ct.stdout).get("flow_total", 0) if ct.returncode == 0 else 0
        else:
            app = ovs_appctl(d)
            subprocess.run(app + ["dpif-netdev/pmd-stats-clear"], capture_output=True, timeout=30)
            done.wait()
            out = subprocess.run(app + ["dpif-netdev/pmd-stats-show"], capture_output=True, text=True,
                                 timeout=30).stdout
            m = re.search(r"avg processing cycles per packet:\s*([\d.]+)", out)
            got["cycles"] = float(m.group(1)) if m else float("nan")
            out = subprocess.run(app + ["dpctl/ct-stats-show"], capture_output=True, text=True, timeout=60).stdout
            m = re.search(r"Total:\s*(\d+)", out)
            got["conns"] = int(m.group(1)) if m else 0
    return during


def ovs_appctl(d):
    return ["ovs-appctl", "-t", os.path.join(d, "ovs-vswitchd.ctl")]


def ct_max(conns):
    """pvswitchd's table for this many connections in each of the two zones (and each zone's
    limit: `ct_max_per_port`, which bounds a flows' zone too)."""
    return max(262_144, 4 * conns)


# --new: destination addresses (no frame repeats a tuple in the window), each table's size.
NEW_FLOWS = 1 << 24
NEW_MAX = 16 << 20


def run(kind, size, conns, seconds, base=None, new=False):
    """One run of `kind` (pvswitch, ovs, base: pvswitchd `base`; with -ct, the ct flows);
    `new`: every frame a new connection (NEW_FLOWS addresses, half a second of warm-up)."""
    got = {}
    ct = kind.endswith("-ct")
    table = ct_flows() if ct else PLAIN
    switch = kind.split("-")[0]
    extra = ""
    if switch in ("pvswitch", "base"):
        extra = "flows = [\n" + "".join(f'  "{f}",\n' for f in table) + "]\n"
    cap = NEW_MAX if new else ct_max(conns)

    def setup(d):
        if switch == "ovs" and ct:
            subprocess.run(ovs_appctl(d) + ["dpctl/ct-set-maxconns", str(cap)], check=True,
                           capture_output=True, timeout=30)
    rate = measure("ovs" if switch == "ovs" else "pvswitch", size, seconds,
                   warmup=0.5 if new else 2.0 + conns / 500_000,
                   extra=extra, flows=NEW_FLOWS if new else max(conns, 1), ovs_flows=table, setup=setup,
                   during=cycles_probe("ovs" if switch == "ovs" else "pvswitch", got),
                   binary=base if switch == "base" else None,
                   switch_extra=f"ct_max_connections = {cap}\nct_max_per_port = {cap}\n" if ct else "")
    return rate, got.get("cycles", float("nan")), got.get("conns", 0)


def one_rep(kinds, rep, size, conns, a):
    """One rep of a cell: each kind run once, the order rotated by `rep`; printed, and
    returned as {kind: (rate, cycles a frame)}."""
    order = kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]
    r = {k: run(k, size, conns, a.seconds, a.base, a.new) for k in order}
    print(f"rep {rep + 1} {size:>4} B {'new' if a.new else conns:>7} conns: "
          + "  ".join(f"{k} {r[k][0] / 1e6:.3f} Mpps {r[k][1]:.0f} c/f {r[k][2]} held" for k in kinds),
          flush=True)
    return r


def new_connections(a):
    """Every frame a new connection, pvswitchd's ct flows against OVS-DPDK's, alternated:
    the table."""
    kinds = ["pvswitch-ct", "ovs-ct"]
    started = time.strftime("%Y-%m-%d %H:%M")
    lines = [
        f"New connections a second, one poll thread: `ct` flows (a zone per port, one-way UDP, every "
        f"frame a new tuple), pvswitchd and OVS-DPDK, {a.reps} reps of {a.seconds:g} s from {started}",
        "",
        "| frame | pvswitchd (new/s) | OVS (new/s) | pvswitchd / OVS (min..max) "
        "| cycles a new connection, pvswitchd, OVS | pvswitchd / OVS cycles (min..max) "
        "| connections held at the end (both zones), pvswitchd, OVS |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in map(int, a.sizes.split(",")):
        rs = [one_rep(kinds, rep, size, 0, a) for rep in range(a.reps)]
        rate = [r["pvswitch-ct"][0] / r["ovs-ct"][0] for r in rs]
        cyc = [r["pvswitch-ct"][1] / r["ovs-ct"][1] for r in rs]
        lines.append(
            f"| {size} B | {med([r['pvswitch-ct'][0] for r in rs]) / 1e6:.3f} M "
            f"| {med([r['ovs-ct'][0] for r in rs]) / 1e6:.3f} M | **{med(rate):.2f}x** ({spread(rate)}) "
            f"| {med([r['pvswitch-ct'][1] for r in rs]):.0f}, {med([r['ovs-ct'][1] for r in rs]):.0f} "
            f"| {med(cyc):.3f} ({spread(cyc)}) "
            f"| {med([r['pvswitch-ct'][2] for r in rs]):.0f}, {med([r['ovs-ct'][2] for r in rs]):.0f} |"
        )
    emit("\n".join(lines), a.out)


def against_base(a, cells):
    """This build's ct flows against pvswitchd `a.base`'s, alternated: the table."""
    kinds = ["pvswitch-ct", "base-ct"]
    lines = [
        f"`ct` flows (a zone per port, one-way UDP), this pvswitchd / {a.base}, {a.reps} reps of "
        f"{a.seconds:g} s from {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        "| frame | connections a zone | this (Mpps) | base (Mpps) | this / base, rate (min..max) "
        "| cycles a frame, this / base (median, min..max) |",
        "|---|---|---|---|---|---|",
    ]
    for size, conns in cells:
        rs = []
        for rep in range(a.reps):
            rs.append(one_rep(kinds, rep, size, conns, a))
        rate = [r["pvswitch-ct"][0] / r["base-ct"][0] for r in rs]
        cyc = [r["pvswitch-ct"][1] / r["base-ct"][1] for r in rs]
        lines.append(
            f"| {size} B | {conns} | {med([r['pvswitch-ct'][0] for r in rs]) / 1e6:.3f} "
            f"| {med([r['base-ct'][0] for r in rs]) / 1e6:.3f} | **{med(rate):.3f}** ({spread(rate)}) "
            f"| {med(cyc):.3f} ({spread(cyc)}) |"
        )
    emit("\n".join(lines), a.out)


def med(v):
    return statistics.median(v)


def spread(v):
    return f"{min(v):.3f}..{max(v):.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--conns", default="1,10000,100000")
    ap.add_argument("--base", help="another pvswitchd to compare this build's ct flows with")
    ap.add_argument("--new", action="store_true", help="new connections a second instead")
    ap.add_argument("--out")
    a = ap.parse_args()
    cells = [(s, c) for s in map(int, a.sizes.split(",")) for c in map(int, a.conns.split(","))]
    if a.base:
        return against_base(a, cells)
    if not os.path.exists(OVS_VSWITCHD):
        sys.exit(f"no {OVS_VSWITCHD}: run scripts/install-bench-peer.sh")
    if a.new:
        return new_connections(a)
    started = time.strftime("%Y-%m-%d %H:%M")
    rows = {k: [] for k in cells}
    for rep in range(a.reps):
        for size, conns in cells:
            rows[(size, conns)].append(one_rep(KINDS, rep, size, conns, a))
    lines = [
        f"`ct` flows (a zone per port, one-way UDP) against `in_port` flows, pvswitchd and OVS-DPDK, "
        f"{a.reps} reps of {a.seconds:g} s from {started}; Mpps forwarded and the switch's cycles a frame, medians",
        "",
        "| frame | connections a zone | pvswitchd ct | OVS ct | pvswitchd / OVS, ct (min..max) "
        "| pvswitchd plain | OVS plain | pvswitchd ct / plain (min..max) | OVS ct / plain "
        "| cycles a frame: pvswitchd ct, plain, more | OVS ct, plain, more | pvswitchd / OVS cycles, ct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (size, conns), rs in rows.items():
        rate = {k: [r[k][0] for r in rs] for k in KINDS}
        cyc = {k: med([r[k][1] for r in rs]) for k in KINDS}
        vs_ovs = [r["pvswitch-ct"][0] / r["ovs-ct"][0] for r in rs]
        pvs_cost = [r["pvswitch-ct"][0] / r["pvswitch"][0] for r in rs]
        ovs_cost = [r["ovs-ct"][0] / r["ovs"][0] for r in rs]
        lines.append(
            f"| {size} B | {conns} | {med(rate['pvswitch-ct']) / 1e6:.3f} | {med(rate['ovs-ct']) / 1e6:.3f} "
            f"| **{med(vs_ovs):.2f}x** ({spread(vs_ovs)}) | {med(rate['pvswitch']) / 1e6:.3f} "
            f"| {med(rate['ovs']) / 1e6:.3f} | {med(pvs_cost):.3f} ({spread(pvs_cost)}) | {med(ovs_cost):.3f} "
            f"| {cyc['pvswitch-ct']:.0f}, {cyc['pvswitch']:.0f}, +{cyc['pvswitch-ct'] - cyc['pvswitch']:.0f} "
            f"| {cyc['ovs-ct']:.0f}, {cyc['ovs']:.0f}, +{cyc['ovs-ct'] - cyc['ovs']:.0f} "
            f"| {cyc['pvswitch-ct'] / cyc['ovs-ct']:.2f} |"
        )
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
