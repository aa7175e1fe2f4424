#!/usr/bin/env python3
"""VM-to-VM forwarding benchmark: pvswitchd against DPDK testpmd's vhost PMD (the no-switching
ceiling), measured alternately in the same run.

One testpmd "VM" with two virtio-user ports in flowgen mode (it generates on both ports at full
speed and drains what it receives) runs on CPU 0; the switch under test runs on CPU 1:
  - pvswitch: pvswitchd with one poll thread on CPU 1, two vhost-user ports, MAC learning;
  - ceiling:  dpdk-testpmd with two net_vhost ports in io-forward mode on CPU 1.
The forwarded rate is what the generator receives on both ports over a timed window. Around
each run, lineprobe (tools/pvsgen) times a cache line's trip between the two CPUs, which tells
the machine's fast phase from its slow one; the summary also gives same-phase pairs apart.

Usage: tools/bench_vm2vm.py [--reps 5] [--seconds 5] [--sizes 64,1518] [--out FILE]
Needs root, hugepages and DPDK (scripts/install-deps.sh) and a release build of pvswitchd.
"""

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PVSWITCHD = os.path.join(ROOT, "target", "release", "pvswitchd")
LINEPROBE = os.path.join(ROOT, "target", "release", "lineprobe")
# One-way cache-line transfer time between CPU 0 and CPU 1 (tools/pvsgen's lineprobe) above
# which the host is running our two vCPUs far apart: the machine's "slow phase".
SLOW_LINE_NS = 60
MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"


class Testpmd:
    """dpdk-testpmd in interactive mode, driven over stdin."""

    def __init__(self, prefix, eal, app):
        for f in glob.glob(f"/dev/hugepages/{prefix}*"):
            os.unlink(f)
        self.prefix = prefix
        cmd = ["stdbuf", "-o0", "-e0", "dpdk-testpmd", "--no-pci", f"--file-prefix={prefix}"] + eal
        cmd += ["--", "-i", "--disable-link-check"] + app
        # stderr apart from stdout: a stderr line can land in the middle of the prompt.
        self.err = tempfile.TemporaryFile()
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.out = ""
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()
        self._wait_prompts(1)

    def _read(self):
        while True:
            b = self.p.stdout.read1(4096)
            if not b:
                return
            with self.lock:
                self.out += b.decode(errors="replace")

    def _wait_prompts(self, n, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                if self.out.count("testpmd> ") >= n:
                    return
            if self.p.poll() is not None:
                break
            time.sleep(0.01)
        raise RuntimeError(f"testpmd {self.prefix}: no prompt\n{self.out[-3000:]}")

    def cmd(self, c):
        with self.lock:
            start, n = len(self.out), self.out.count("testpmd> ")
        self.p.stdin.write((c + "\n").encode())
        self.p.stdin.flush()
        self._wait_prompts(n + 1)
        with self.lock:
            return self.out[start:]

    def rx_packets(self, nports=2):
        with self.lock:
            start = len(self.out)
        self.cmd("show port stats all")
        # The prompt can overtake the tail of the report: wait for every port's last line.
        end = time.time() + 10
        while True:
            with self.lock:
                o = self.out[start:]
            if o.count("Tx-bps:") >= nports or time.time() > end:
                break
            time.sleep(0.005)
        rx = [int(l.split("RX-packets:")[1].split()[0]) for l in o.splitlines() if "RX-packets:" in l]
        if len(rx) != nports:
            raise RuntimeError(f"incomplete port stats:\n{o}")
        return sum(rx)

    def close(self):
        try:
            self.p.stdin.write(b"stop\nquit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=20)
        except Exception:
            self.p.kill()
            self.p.wait()
        for f in glob.glob(f"/dev/hugepages/{self.prefix}*"):
            os.unlink(f)


def wait_socket(path, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path):
            return
        time.sleep(0.02)
    raise RuntimeError(f"no socket {path}")


def start_pvswitch(d, extra="", binary=None, switch_extra=""):
    conf = os.path.join(d, "pvswitch.toml")
    with open(conf, "w") as f:
        f.write(extra)  # top-level keys (flows) come before the first table
        f.write(f'[switch]\npoll_cores = [1]\nsocket_dir = "{d}"\ncontrol_socket = "ctl.sock"\n{switch_extra}')
        for n in "ab":
            f.write(f'[[port]]\nname = "{n}"\ntype = "vhost-user"\nsocket = "{n}.sock"\n')
    log = open(os.path.join(d, "pvswitchd.log"), "w")
    p = subprocess.Popen([binary or PVSWITCHD, "--config", conf], stdout=log, stderr=log)
    wait_socket(os.path.join(d, "ctl.sock"))
    return lambda: (p.send_signal(signal.SIGTERM), p.wait())


def start_ceiling(d):
    t = Testpmd(
        "benchvh",
        ["--lcores", "0@1,1@1", "-m", "512", "--vdev", f"net_vhost0,iface={d}/a.sock,queues=1",
         "--vdev", f"net_vhost1,iface={d}/b.sock,queues=1"],
        ["--forward-mode=io", "--nb-cores=1", "--auto-start"],
    )
    wait_socket(f"{d}/a.sock")
    return t.close


def measure(kind, size, seconds, warmup=2.0, extra="", binary=None, during=None, switch_extra=""):
    """Forwarded packets per second through `kind` ("pvswitch" or "ceiling"); `extra` goes at
    the top of pvswitchd's configuration file, `binary` replaces target/release/pvswitchd, and
    `during(dir)` runs (in a thread) while the window is measured."""
    d = tempfile.mkdtemp(prefix="pvs-bench-")
    stop = (lambda d: start_pvswitch(d, extra, binary, switch_extra)) if kind == "pvswitch" else start_ceiling
    stop = stop(d)
    try:
        gen = Testpmd(
            "benchgen",
            ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
             "--vdev", f"net_virtio_user0,path={d}/a.sock,queues=1,mac={MAC_A}",
             "--vdev", f"net_virtio_user1,path={d}/b.sock,queues=1,mac={MAC_B}"],
            ["--forward-mode=flowgen", f"--txpkts={size}", "--nb-cores=1", "--total-num-mbufs=32768",
             f"--eth-peer=0,{MAC_B}", f"--eth-peer=1,{MAC_A}"],
        )
        try:
            gen.cmd("start")
            time.sleep(warmup)
            done = threading.Event()
            side = threading.Thread(target=during, args=(d, done)) if during else None
            if side:
                side.start()
            r0, t0 = gen.rx_packets(), time.time()
            time.sleep(seconds)
            r1, t1 = gen.rx_packets(), time.time()
            done.set()
            if side:
                side.join()
            return (r1 - r0) / (t1 - t0)
        finally:
            gen.close()
    finally:
        stop()


def emit(table, out=None):
    """Prints a benchmark's result table and, with `out`, writes it to that file too."""
    print("\n" + table)
    if out:
        with open(out, "w") as f:
            f.write(table + "\n")


def line_ns():
    """One-way cache-line transfer time between CPUs 0 and 1 right now."""
    out = subprocess.run([LINEPROBE, "--cpus", "0,1", "--rounds", "100000"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["one_way_ns"]


def phase_of(before, after):
    fast = [ns < SLOW_LINE_NS for ns in (before, after)]
    return "fast" if all(fast) else "slow" if not any(fast) else "mixed"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    rows = {s: [] for s in sizes}
    for rep in range(a.reps):
        for s in sizes:
            # Alternate which system goes first, so drift hits both alike.
            order = ["pvswitch", "ceiling"] if rep % 2 == 0 else ["ceiling", "pvswitch"]
            r, phase = {}, {}
            for k in order:
                before = line_ns()
                r[k] = measure(k, s, a.seconds)
                phase[k] = phase_of(before, line_ns())
            r["phases"] = (phase["pvswitch"], phase["ceiling"])
            rows[s].append(r)
            print(f"rep {rep + 1} {s:>5} B: pvswitch {r['pvswitch'] / 1e6:6.3f} Mpps ({phase['pvswitch']})  "
                  f"ceiling {r['ceiling'] / 1e6:6.3f} Mpps ({phase['ceiling']})  "
                  f"ratio {r['pvswitch'] / r['ceiling']:.3f}", flush=True)
    lines = [
        f"VM-to-VM forwarding, {a.reps} alternating pairs of {a.seconds:g} s, generator on CPU 0, switch on CPU 1",
        "",
        "| frame | pvswitchd (median) | testpmd vhost io-fwd ceiling (median) | median ratio | ratio min..max |",
        "|---|---|---|---|---|",
    ]
    for s in sizes:
        pv = statistics.median(r["pvswitch"] for r in rows[s])
        ce = statistics.median(r["ceiling"] for r in rows[s])
        ratios = [r["pvswitch"] / r["ceiling"] for r in rows[s]]
        unit = lambda pps: f"{pps / 1e6:.3f} Mpps" + (f" = {pps * s * 8 / 1e9:.2f} Gbit/s" if s > 64 else "")
        lines.append(f"| {s} B | {unit(pv)} | {unit(ce)} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}..{max(ratios):.3f} |")
    lines += ["", f"Phases (lineprobe before and after each run; slow: a cache line takes over {SLOW_LINE_NS} ns "
              "between the two CPUs), pairs whose two runs saw the same phase throughout:", ""]
    for s in sizes:
        for ph in ("fast", "slow"):
            same = [r["pvswitch"] / r["ceiling"] for r in rows[s] if r["phases"] == (ph, ph)]
            lines.append(f"- {s} B, both {ph}: " + (f"median ratio {statistics.median(same):.3f} over {len(same)} "
                         f"pairs ({min(same):.3f}..{max(same):.3f})" if same else "no pair"))
    table = "\n".join(lines)
    emit(table, a.out)


if __name__ == "__main__":
    sys.exit(main())
