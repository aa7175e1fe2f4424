#!/usr/bin/env python3
"""How long the control thread takes to answer a new frontend while others attack it.

pvswitchd runs with a "probe" port, eight "evil" ports, a client-mode port whose VMM never
accepts, and the control and metrics sockets. During each attack (and once without any), a
probe connects to the probe port every 20 ms, sends SET_OWNER and GET_FEATURES and times the
reply (the first thing a new VM's setup waits for), and `pvswitchctl version`'s round trip is timed the same way.
The table gives the median, p99 and worst of each; the floor is 100 ms worst case.

Attacks, each kept up for the whole window (an attacker the switch disconnects comes back):
  partial-header    on every evil port, 5 bytes of a header, then nothing
  short-payload     a header promising 8 bytes, 4 sent
  unread-replies    GET_FEATURES in a loop, replies never read
  too-many-fds      SET_VRING_CALL with 12 file descriptors, over and over
  refused-seconds   20 more connections per evil port (refused: one frontend per port)
  idle-ctl          300 idle control-socket clients, replaced as they are closed
  idle-metrics      300 half-sent metrics requests, likewise
  all               everything above at once

Usage: tools/bench_isolation.py [--seconds 5] [--binary PVSWITCHD] [--out FILE]
(a probe that gets no answer within 10 s counts as 10 s)
"""

import argparse
import array
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pvsbench import ROOT, emit, start_pvswitchd, write_config  # noqa: E402

PVSWITCHCTL = os.path.join(ROOT, "target", "release", "pvswitchctl")
EVIL = [f"evil{i}" for i in range(8)]
METRICS_PORT = 19477


def msg(request, payload=b"", flags=0):
    return struct.pack("<III", request, 1 | flags, len(payload)) + payload


class Attack:
    """Runs `step` (one attacker's go) in a loop on `threads` threads until stopped."""

    def __init__(self, step, threads=1):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.loop, args=(step, i), daemon=True) for i in range(threads)]
        for t in self.threads:
            t.start()

    def loop(self, step, i):
        while not self.stop.is_set():
            try:
                step(i, self.stop)
            except OSError:
                time.sleep(0.01)

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


def vhost(d, port):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(f"{d}/{port}.sock")
    return s


def hold(s, stop):
    """Keeps `s` open until the switch closes it or the attack ends."""
    s.settimeout(0.2)
    try:
        while not stop.is_set():
            try:
                if not s.recv(65536):
                    return
            except socket.timeout:
                continue
    finally:
        s.close()


def attacks(d):
    def partial(i, stop):
        s = vhost(d, EVIL[i])
        s.sendall(msg(2, b"\0" * 8)[:5])
        hold(s, stop)

    def short(i, stop):
        s = vhost(d, EVIL[i])
        s.sendall(msg(2, b"\0" * 8)[:16])
        hold(s, stop)

    def unread(i, stop):
        with vhost(d, EVIL[i]) as s:
            many = msg(1) * 4096
            while not stop.is_set():
                s.sendall(many)

    def fds(i, stop):
        s = vhost(d, EVIL[i])
        flat = [fd for _ in range(6) for fd in os.pipe()]
        try:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", flat))]
            s.sendmsg([msg(13, struct.pack("<Q", 0))], rights)
        finally:
            for fd in flat:
                os.close(fd)
        hold(s, stop)

    def refused(i, stop):
        socks = [vhost(d, EVIL[i % len(EVIL)]) for _ in range(20)]
        for s in socks:
            s.settimeout(1)
            try:
                s.recv(1)
            except OSError:
                pass
            s.close()

    def idle_ctl(i, stop):
        socks = []
        for _ in range(30):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(f"{d}/ctl.sock")
            socks.append(s)
        for s in socks:
            hold(s, stop)

    def idle_metrics(i, stop):
        socks = []
        for _ in range(30):
            s = socket.create_connection(("127.0.0.1", METRICS_PORT))
            s.sendall(b"GET /metr")
            socks.append(s)
        for s in socks:
            hold(s, stop)

    return {
        "partial-header": [(partial, len(EVIL))],
        "short-payload": [(short, len(EVIL))],
        "unread-replies": [(unread, 4)],
        "too-many-fds": [(fds, len(EVIL))],
        "refused-seconds": [(refused, 4)],
        "idle-ctl": [(idle_ctl, 10)],
        "idle-metrics": [(idle_metrics, 10)],
    }


def probe_vhost(d):
    t0 = time.perf_counter()
    s = vhost(d, "probe")
    s.settimeout(10)
    s.sendall(msg(3) + msg(1))  # SET_OWNER, GET_FEATURES: how a VM's setup starts
    got = b""
    while len(got) < 20:
        b = s.recv(20 - len(got))
        if not b:
            raise RuntimeError("probe connection closed")
        got += b
    s.close()
    return time.perf_counter() - t0


def probe_ctl(d):
    t0 = time.perf_counter()
    subprocess.run([PVSWITCHCTL, "--control", f"{d}/ctl.sock", "version"], check=True, capture_output=True, timeout=10)
    return time.perf_counter() - t0


def timed(probe, d):
    """A probe's time, or its 10 s timeout if it never got an answer."""
    try:
        return probe(d)
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return 10.0


def measure(d, seconds):
    v, c = [], []
    end = time.time() + seconds
    while time.time() < end:
        v.append(timed(probe_vhost, d))
        c.append(timed(probe_ctl, d))
        time.sleep(0.02)
    return v, c


def ms(x):
    return f"{x * 1000:.2f}"


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--binary", help="another pvswitchd to measure (default: target/release/pvswitchd)")
    ap.add_argument("--out")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="pvs-iso-")
    vmm = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    vmm.bind(f"{d}/vmm-side.sock")
    vmm.listen(1)
    fillers = []
    for _ in range(3):
        f = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        f.setblocking(False)
        try:
            f.connect(f"{d}/vmm-side.sock")
        except OSError:
            pass
        fillers.append(f)
    ports = [("probe", "")] + [(e, "") for e in EVIL] + [("vmm", f'mode = "client"\nsocket = "{d}/vmm-side.sock"')]
    conf = write_config(d, [], (1,), f'metrics_listen = "127.0.0.1:{METRICS_PORT}"')
    with open(conf, "a") as f:
        for name, extra in ports:
            sock = "" if "socket" in extra else f'socket = "{name}.sock"\n'
            f.write(f'[[port]]\nname = "{name}"\ntype = "vhost-user"\n{sock}{extra}\n')
    stop = start_pvswitchd(d, conf, a.binary)
    rows = []
    try:
        table = attacks(d)
        runs = [("none", [])] + [(k, v) for k, v in table.items()] + [("all", [x for v in table.values() for x in v])]
        for name, steps in runs:
            running = [Attack(step, n) for step, n in steps]
            time.sleep(0.5)  # let the attackers get going
            v, c = measure(d, a.seconds)
            for r in running:
                r.end()
            rows.append((name, v, c))
            print(f"{name:16} new VM: p50 {ms(statistics.median(v))} max {ms(max(v))} ms;"
                  f" pvswitchctl: p50 {ms(statistics.median(c))} max {ms(max(c))} ms", flush=True)
    finally:
        stop()
    lines = [f"Control-thread response during attacks, {a.seconds:g} s each (probe every 20 ms)", "",
             "| attack | new VM's first reply p50 | p99 | worst | pvswitchctl p50 | p99 | worst |",
             "|---|---|---|---|---|---|---|"]
    for name, v, c in rows:
        q = lambda xs: statistics.quantiles(xs, n=100, method="inclusive")[98] if len(xs) > 1 else xs[0]  # noqa: E731
        lines.append(f"| {name} | {ms(statistics.median(v))} ms | {ms(q(v))} ms | {ms(max(v))} ms | "
                     f"{ms(statistics.median(c))} ms | {ms(q(c))} ms | {ms(max(c))} ms |")
    emit("\n".join(lines), a.out)


if __name__ == "__main__":
    sys.exit(main())
