#!/usr/bin/env python3
"""What pvswitch's benchmarks share: paths of the binaries, pvswitchd configuration files,
DPDK testpmd driven over stdin (its hugepage files kept from run to run, removed at exit), the
VM-to-VM measurement against testpmd's vhost PMD (and against Open vSwitch with DPDK, the
established peer), pvsgen runs, the machine-phase probe, and printing a result table.
The bench_*.py scripts import this module and nothing of each other.
"""

import atexit
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
PVSWITCHD = os.environ.get("PVS_BENCH_PVSWITCHD") or os.path.join(ROOT, "target", "release", "pvswitchd")
PVSGEN = os.path.join(ROOT, "target", "release", "pvsgen")
PVSWITCHCTL = os.path.join(ROOT, "target", "release", "pvswitchctl")
LINEPROBE = os.path.join(ROOT, "target", "release", "lineprobe")
# One-way cache-line transfer time between CPU 0 and CPU 1 (tools/pvsgen's lineprobe) above
# which the host is running our two vCPUs far apart: the machine's "slow phase".
SLOW_LINE_NS = 60
MAC_A, MAC_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"


KEPT_HUGE = set()
# Kept files hold their pages while the other kinds of testpmd run: the matrix's four prefixes
# at 512 MiB each, pvswitchd's own EAL and a margin.
HUGEPAGES_WANTED = 1792
# Open vSwitch with DPDK: Debian's openvswitch-switch-dpdk (scripts/install-bench-peer.sh).
OVS_VSWITCHD = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk"
OVS_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"


def _ensure_hugepages():
    try:
        with open("/proc/sys/vm/nr_hugepages") as f:
            have = int(f.read())
        if have < HUGEPAGES_WANTED:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(HUGEPAGES_WANTED))
    except OSError:
        pass  # not root, or no hugetlbfs: testpmd will say what is missing


@atexit.register
def _unlink_kept_huge():
    for prefix in KEPT_HUGE:
        for f in glob.glob(f"/dev/hugepages/{prefix}*"):
            os.unlink(f)


class Testpmd:
    """dpdk-testpmd in interactive mode, driven over stdin.

    Its hugepages stay in their hugetlbfs file from one run to the next (`--huge-unlink=never`;
    the files go when this process exits): a testpmd started again on the same prefix gets the
    same physical pages. Freed and allocated afresh, each run got the previous run's pages in
    reverse order (the kernel's free list is last-in first-out), and forwarding rates
    alternated by about 10% from run to run with that placement (docs/benchmark-history.md)."""

    def __init__(self, prefix, eal, app):
        _ensure_hugepages()
        if prefix not in KEPT_HUGE:
            # A file left by an earlier process: this one's runs start from fresh pages.
            for f in glob.glob(f"/dev/hugepages/{prefix}*"):
                os.unlink(f)
            KEPT_HUGE.add(prefix)
        eal = ["--huge-unlink=never"] + eal
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
        # Asked up to three times: once in a while (the nic cell, its forwarding lcore sharing
        # the main lcore's CPU) the prompt came back and the report never did.
        for _ in range(3):
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
            if len(rx) == nports:
                return sum(rx)
        raise RuntimeError(f"incomplete port stats, three times:\n{o}")

    def close(self):
        try:
            self.p.stdin.write(b"stop\nquit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=20)
        except Exception:
            self.p.kill()
            self.p.wait()


def ctl(d, *args, check=True):
    """`pvswitchctl --json ARGS` against the pvswitchd whose directory is `d` (its control socket
    `d`/ctl.sock): the reply's JSON. The benchmarks' one way to ask pvswitchd."""
    r = subprocess.run([PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "--json", *args],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        if check:
            raise RuntimeError(f"pvswitchctl {' '.join(args)}: {r.stderr.strip()}")
        return None
    return json.loads(r.stdout)


def wait_socket(path, timeout=20):
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path):
            return
        time.sleep(0.02)
    raise RuntimeError(f"no socket {path}")


def write_config(d, ports, cores=(1,), switch_extra="", top=""):
    """Writes `d`/pvswitch.toml: `top` (top-level keys such as flows, which must come before the
    first table), `[switch]` on `cores` with sockets in `d` and `switch_extra`, then one
    vhost-user port per (name, extra toml) in `ports`. Returns the file's path."""
    conf = os.path.join(d, "pvswitch.toml")
    with open(conf, "w") as f:
        f.write(top)
        f.write(f'[switch]\npoll_cores = {list(cores)}\nsocket_dir = "{d}"\ncontrol_socket = "ctl.sock"\n{switch_extra}\n')
        for name, extra in ports:
            f.write(f'[[port]]\nname = "{name}"\ntype = "vhost-user"\nsocket = "{name}.sock"\n{extra}\n')
    return conf


def start_pvswitchd(d, conf, binary=None):
    """Starts pvswitchd on `conf` (its log in `d`), waits for its control socket; returns a
    function that stops it."""
    log = open(os.path.join(d, "pvswitchd.log"), "w")
    p = subprocess.Popen([binary or PVSWITCHD, "--config", conf], stdout=log, stderr=log)
    wait_socket(os.path.join(d, "ctl.sock"))
    return lambda: (p.send_signal(signal.SIGTERM), p.wait())


def start_pvswitch(d, extra="", binary=None, switch_extra="", ports=None):
    """pvswitchd with ports a and b on CPU 1, as the VM-to-VM benchmark uses it (`ports`: their
    (name, extra toml), e.g. VLAN keys)."""
    ports = ports or [("a", ""), ("b", "")]
    stop = start_pvswitchd(d, write_config(d, ports, (1,), switch_extra, extra), binary)
    # The control socket can answer before every port's socket is bound.
    for name, _ in ports:
        wait_socket(f"{d}/{name}.sock")
    return stop


def start_ceiling(d):
    t = Testpmd(
        "benchvh",
        ["--lcores", "0@1,1@1", "-m", "512", "--vdev", f"net_vhost0,iface={d}/a.sock,queues=1",
         "--vdev", f"net_vhost1,iface={d}/b.sock,queues=1"],
        ["--forward-mode=io", "--nb-cores=1", "--auto-start"],
    )
    wait_socket(f"{d}/a.sock")
    return t.close


def start_ovs(d, flows=None, nic=False, ports=("a", "b")):
    """Open vSwitch with DPDK as the switch: its database and daemon in `d` (`ovs_daemons`), one
    bridge of the netdev datapath with a dpdkvhostuser port per name in `ports` (sockets
    `d`/NAME.sock, OVS the server as pvswitchd is), and with `nic` a net_null0 port named nic.
    `flows` (ovs-ofctl lines) replace the bridge's NORMAL flow. OVS's defaults otherwise, as a
    new user has them (EMC on, insertion probability 1%, SMC off). Returns a function that
    stops it."""
    run, vsctl, stop = ovs_daemons(d)
    try:
        _setup_ovs(d, run, vsctl, flows, nic, ports)
    except Exception:
        stop()
        raise
    return stop


def ovs_daemons(d):
    """ovsdb-server and ovs-vswitchd-dpdk with their files in `d`: one PMD thread on CPU 1, and
    every other OVS thread started there too (taskset), so none runs on the generator's CPU;
    DPDK in 512 MiB. Returns (run: a command in OVS's environment, ovs-vsctl's argv, stop)."""
    env = dict(os.environ, OVS_RUNDIR=d, OVS_DBDIR=d, OVS_LOGDIR=d)
    # OVS runs DPDK --in-memory (no hugepage files to keep between runs, unlike testpmd's).
    _ensure_hugepages()

    def run(*cmd):
        r = subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr[-2000:]}")
        return r.stdout

    def stop():
        for ctl in ("ovs-vswitchd", "ovsdb-server"):
            subprocess.run(["ovs-appctl", "-t", f"{d}/{ctl}.ctl", "exit"], env=env, capture_output=True,
                           timeout=60)

    db = f"unix:{d}/db.sock"
    run("ovsdb-tool", "create", f"{d}/conf.db", OVS_SCHEMA)
    run("ovsdb-server", f"{d}/conf.db", f"--remote=punix:{d}/db.sock", f"--pidfile={d}/ovsdb-server.pid",
        f"--unixctl={d}/ovsdb-server.ctl", f"--log-file={d}/ovsdb-server.log", "--detach")
    vsctl = ["ovs-vsctl", f"--db={db}"]
    try:
        run(*vsctl, "--no-wait", "init")
        run(*vsctl, "--no-wait", "set", "Open_vSwitch", ".", "other_config:dpdk-init=true",
            "other_config:pmd-cpu-mask=0x2", "other_config:dpdk-socket-mem=512",
            "other_config:dpdk-extra=--no-pci")
        run("taskset", "-c", "1", OVS_VSWITCHD, db, f"--pidfile={d}/ovs-vswitchd.pid",
            f"--unixctl={d}/ovs-vswitchd.ctl", f"--log-file={d}/ovs-vswitchd.log", "--detach")
    except Exception:
        stop()
        raise
    return run, vsctl, stop


def _setup_ovs(d, run, vsctl, flows, nic, ports):
    run(*vsctl, "add-br", "br0", "--", "set", "bridge", "br0", "datapath_type=netdev")
    for name in ports:
        run(*vsctl, "add-port", "br0", name, "--", "set", "Interface", name, "type=dpdkvhostuser")
        os.symlink(f"{d}/{name}", f"{d}/{name}.sock")
    if nic:
        run(*vsctl, "add-port", "br0", "nic", "--", "set", "Interface", "nic", "type=dpdk",
            "options:dpdk-devargs=net_null0")
    if flows:
        path = os.path.join(d, "flows.txt")
        with open(path, "w") as f:
            f.write("".join(fl + "\n" for fl in flows))
        run("ovs-ofctl", "del-flows", "br0")
        run("ovs-ofctl", "add-flows", "br0", path)


def flowgen(d, size, ring=None, flows=None):
    """The testpmd "VM" of the VM-to-VM benchmarks: two virtio-user ports on CPU 0 in flowgen
    mode. DPDK 22.11's flowgen sends every frame from 00:01:02:03:04:00 to 00:01:02:03:04:01
    whatever the ports' MACs, to `flows` destination IPs (10.253.0.0 up; testpmd's default
    1024). `ring` sets the virtio-user queue_size and --txd/--rxd (None: the defaults, 256)."""
    q = f",queue_size={ring}" if ring else ""
    app = ["--forward-mode=flowgen", f"--txpkts={size}", "--nb-cores=1", "--total-num-mbufs=32768",
           f"--eth-peer=0,{MAC_B}", f"--eth-peer=1,{MAC_A}"]
    if ring:
        app += [f"--txd={ring}", f"--rxd={ring}"]
    if flows:
        app += [f"--flowgen-flows={flows}"]
    return Testpmd(
        "benchgen",
        ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
         "--vdev", f"net_virtio_user0,path={d}/a.sock,queues=1,mac={MAC_A}{q}",
         "--vdev", f"net_virtio_user1,path={d}/b.sock,queues=1,mac={MAC_B}{q}"],
        app,
    )


def start_switch(kind, d, extra="", binary=None, switch_extra="", ovs_flows=None, ports=None):
    """Ports a and b (sockets in `d`) through `kind`: "pvswitch" (`extra` at the top of its
    configuration), "ovs" (`ovs_flows`, or NORMAL) or "ceiling". Returns a function that stops
    it."""
    if kind == "pvswitch":
        return start_pvswitch(d, extra, binary, switch_extra, ports)
    if kind == "ovs":
        return start_ovs(d, ovs_flows)
    return start_ceiling(d)


def measure(kind, size, seconds, warmup=2.0, extra="", binary=None, during=None, switch_extra="", ring=None,
            flows=None, ovs_flows=None, ports=None, setup=None):
    """Forwarded packets per second through `kind` ("pvswitch", "ovs" or "ceiling") of the
    flowgen generator's traffic; `extra` goes at the top of pvswitchd's configuration file,
    `ovs_flows` to OVS, `binary` replaces target/release/pvswitchd, `ring` and `flows` go to
    flowgen(), `ports` to start_pvswitch, `setup(dir)` runs once the switch is up, before the
    generator starts, and `during(dir)` runs (in a thread) while the window is measured."""
    d = tempfile.mkdtemp(prefix="pvs-bench-")
    stop = start_switch(kind, d, extra, binary, switch_extra, ovs_flows, ports)
    try:
        if setup:
            setup(d)
        gen = flowgen(d, size, ring, flows)
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


def measure_unicast(kind, size, seconds, ring=256, extra="", binary=None):
    """Forwarded packets per second through `kind` of pvsgen's learned unicast: VM a sends to
    b and b to a, each from its own MAC (announced first), on CPU 0."""
    d = tempfile.mkdtemp(prefix="pvs-bench-uc-")
    stop = start_switch(kind, d, extra, binary)
    try:
        out = os.path.join(d, "gen.json")
        cmd = [PVSGEN, "--cpus", "0", "--seconds", str(seconds), "--qsize", str(ring), "--quiet", "--json", out,
               "--vm", f"name=a,socket={d}/a.sock,dst=b,size={size}",
               "--vm", f"name=b,socket={d}/b.sock,dst=a,size={size}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
        if r.returncode != 0:
            raise RuntimeError(f"pvsgen failed: {r.stderr[-2000:]}")
        with open(out) as f:
            return sum(v["rx_mpps"] for v in json.load(f)["vms"]) * 1e6
    finally:
        stop()


NIC_FLOW_LIST = ["in_port=nic,actions=output:vm", "in_port=vm,actions=output:nic"]
NIC_FLOWS = "flows = [" + ", ".join(f'"{f}"' for f in NIC_FLOW_LIST) + "]\n"


def measure_nic(kind, seconds, warmup=2.0, binary=None, switch_extra=""):
    """NIC -> VM -> NIC: frames per second the VM (one testpmd virtio-user port in io-forward
    mode on CPU 0, sending every frame back) receives from a net_null0 DPDK port through
    `kind`: pvswitchd with two in_port flows, or testpmd with net_null0 and a net_vhost port."""
    d = tempfile.mkdtemp(prefix="pvs-bench-nic-")
    if kind == "pvswitch":
        conf = write_config(d, [("vm", "")], (1,), switch_extra=switch_extra, top=NIC_FLOWS)
        with open(conf, "a") as f:
            f.write('[[port]]\nname = "nic"\ntype = "dpdk"\ndevice = "net_null0"\n')
        stop = start_pvswitchd(d, conf, binary)
        # The control socket can be up before the port's socket listens: a VM started then has
        # no port, and testpmd's stats list none.
        wait_socket(f"{d}/vm.sock")
    elif kind == "ovs":
        stop = start_ovs(d, NIC_FLOW_LIST, nic=True, ports=("vm",))
    else:
        t = Testpmd(
            "benchnicvh",
            ["--lcores", "0@1,1@1", "-m", "512", "--vdev", f"net_vhost0,iface={d}/vm.sock,queues=1",
             "--vdev", "net_null0"],
            ["--forward-mode=io", "--nb-cores=1", "--auto-start"],
        )
        wait_socket(f"{d}/vm.sock")
        stop = t.close
    try:
        vm = Testpmd(
            "benchnicvm",
            ["--lcores", "0@0,1@0", "-m", "512", "--single-file-segments",
             "--vdev", f"net_virtio_user0,path={d}/vm.sock,queues=1"],
            ["--forward-mode=io", "--nb-cores=1", "--total-num-mbufs=32768"],
        )
        try:
            vm.cmd("start")
            time.sleep(warmup)
            r0, t0 = vm.rx_packets(1), time.time()
            time.sleep(seconds)
            r1, t1 = vm.rx_packets(1), time.time()
            return (r1 - r0) / (t1 - t0)
        finally:
            vm.close()
    finally:
        stop()


FLOWGEN_FLOWS = 500  # destination IPs per port in the flows cells of tools/bench_matrix.py

# The cells of tools/bench_matrix.py and tools/bench_peer.py (see bench_matrix's docstring).
CELLS = ["learned", "flood", "in_port", "flows1k", "flows10k", "nic"]


def cell_keys(cells, sizes, rings):
    """The (cell, frame size, ring) runs the comma-separated `cells`, `sizes` and `rings` ask
    for, in the order they run: every VM-to-VM cell at each size and ring, then nic once (64 B;
    its ring is the VM's default). Exits with the list of cells on an unknown one."""
    cells = cells.split(",")
    for c in cells:
        if c not in CELLS:
            sys.exit(f"unknown cell {c!r}; cells: {', '.join(CELLS)}")
    keys = []
    for s in (int(x) for x in sizes.split(",")):
        for ring in (int(x) for x in rings.split(",")):
            keys += [(c, s, ring) for c in cells if c != "nic"]
    if "nic" in cells:
        keys.append(("nic", 64, 256))
    return keys


def _ip(i, base):
    return f"10.{base}.{i // 256}.{i % 256}"


def exact_flows(n_extra):
    """1,000 flows that carry the traffic, `n_extra` that never match, and the drop default, as
    pvswitchd's configuration has them."""
    return "flows = [\n" + "".join(f'  "{f}",\n' for f in exact_flow_list(n_extra)) + "]\n"


def exact_flow_list(n_extra):
    """The flows of `exact_flows`, one string each (ovs-ofctl syntax, which pvswitchd's is)."""
    out = []
    for port, peer in (("a", "b"), ("b", "a")):
        out += [f"priority=10,in_port={port},ip,nw_dst={_ip(i, 253)},actions=output:{peer}"
                for i in range(FLOWGEN_FLOWS)]
    for i in range(n_extra):
        port, peer = ("a", "b") if i % 2 == 0 else ("b", "a")
        out.append(f"priority=10,in_port={port},ip,nw_dst={_ip(i // 2, 252)},actions=output:{peer}")
    out.append("priority=0,actions=drop")
    return out


def measure_cell(cell, kind, size, ring, seconds, binary=None):
    """One run of a tools/bench_matrix.py cell through `kind` ("pvswitch", "ovs" or "ceiling"):
    its forwarded frames per second (`binary`: another pvswitchd, for A/B runs). Both switches
    get the same flows."""
    if cell == "nic":
        return measure_nic(kind, seconds, binary=binary)
    if cell == "learned":
        return measure_unicast(kind, size, seconds, ring=ring, binary=binary)
    table, flows = [], None
    if cell == "in_port":
        table = ["in_port=a,actions=output:b", "in_port=b,actions=output:a"]
    elif cell == "flows1k":
        table, flows = exact_flow_list(0), FLOWGEN_FLOWS
    elif cell == "flows10k":
        table, flows = exact_flow_list(9000), FLOWGEN_FLOWS
    extra = ("flows = [\n" + "".join(f'  "{f}",\n' for f in table) + "]\n") if table and kind == "pvswitch" else ""
    return measure(kind, size, seconds, extra=extra, ring=ring, flows=flows, binary=binary, ovs_flows=table or None)


def emit(table, out=None):
    """Prints a benchmark's result table and, with `out`, writes it to that file too."""
    print("\n" + table)
    if out:
        with open(out, "w") as f:
            f.write(table + "\n")


def alternated(names, run, reps):
    """`run(name)` for each case of `names`, `reps` times, the order rotated in each rep (so no
    case always runs first or last); prints each rep and returns its results, a dict a rep."""
    rows = []
    for rep in range(reps):
        order = names[rep % len(names):] + names[:rep % len(names)]
        r = {c: run(c) for c in order}
        rows.append(r)
        print(f"rep {rep + 1}: " + "  ".join(f"{c} {r[c] / 1e6:.3f}" for c in names), flush=True)
    return rows


def ratio_table(names, rows, base):
    """A markdown table of each case's median Mpps and its ratio to case `base` (median, min..max
    over the reps of `alternated`)."""
    lines = [f"| case | Mpps (median) | / {base} (median) | min..max |", "|---|---|---|---|"]
    for c in names:
        ratios = [x[c] / x[base] for x in rows]
        lines.append(f"| {c} | {statistics.median(x[c] for x in rows) / 1e6:.3f} | {statistics.median(ratios):.3f} | "
                     f"{min(ratios):.3f}..{max(ratios):.3f} |")
    return "\n".join(lines)


def line_ns():
    """One-way cache-line transfer time between CPUs 0 and 1 right now."""
    out = subprocess.run([LINEPROBE, "--cpus", "0,1", "--rounds", "100000"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["one_way_ns"]


def phase_of(before, after):
    fast = [ns < SLOW_LINE_NS for ns in (before, after)]
    return "fast" if all(fast) else "slow" if not any(fast) else "mixed"


def alternating_pair(rep, measure_one):
    """One pvswitchd/ceiling pair: `measure_one(kind)` for both kinds, pvswitchd first in even
    reps and the ceiling first in odd ones (so drift hits both alike), each run's phase from
    lineprobe before and after it. Returns {kind: rate, "phases": (pvswitchd's, ceiling's)}."""
    order = ["pvswitch", "ceiling"] if rep % 2 == 0 else ["ceiling", "pvswitch"]
    r, phase = {}, {}
    for kind in order:
        before = line_ns()
        r[kind] = measure_one(kind)
        phase[kind] = phase_of(before, line_ns())
    r["phases"] = (phase["pvswitch"], phase["ceiling"])
    return r


def run_pvsgen(ports, gen_vms, seconds, cores=(1,), switch_extra="", gen_args=(), gen_cpus="0", qsize=1024,
               binary=None):
    """Starts pvswitchd (this tree's, or `binary`) with `ports` [(name, extra toml)], runs
    pvsgen with `gen_vms` (the --vm specs without socket=), returns the generator's JSON
    report, with the switch's `pvswitchctl stats` after the run under "switch" (where the poll
    threads' cycles went)."""
    d = tempfile.mkdtemp(prefix="pvs-fair-")
    stop = start_pvswitchd(d, write_config(d, ports, cores, switch_extra), binary)
    try:
        # The control socket can come up before the ports' sockets listen (seen on a loaded host).
        for name, _ in ports:
            wait_socket(os.path.join(d, f"{name}.sock"))
        out = os.path.join(d, "gen.json")
        cmd = [PVSGEN, "--cpus", gen_cpus, "--seconds", str(seconds), "--qsize", str(qsize), "--quiet", "--json", out]
        for vm in gen_vms:
            name = vm.split(",")[0].split("=")[1]
            cmd += ["--vm", f"{vm},socket={d}/{name}.sock"]
        cmd += list(gen_args)
        gen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # The switch's stats over a window inside the run: pvsgen starts its traffic once every
        # VM is up (well within half a second of a few VMs), and the window ends a third of the
        # run before it does (once one that reached past the traffic's end counted idle
        # iterations as busy: cycles a frame read high).
        ctl = [PVSWITCHCTL, "--control", os.path.join(d, "ctl.sock"), "--json", "stats"]
        time.sleep(max(seconds / 3, 0.5) + 0.5)
        subprocess.run(ctl + ["--clear"], capture_output=True, timeout=30)
        time.sleep(min(1.0, seconds / 3))
        st = subprocess.run(ctl, capture_output=True, text=True, timeout=30)
        _, err = gen.communicate(timeout=seconds + 120)
        if gen.returncode != 0:
            raise RuntimeError(f"pvsgen failed: {err[-2000:]}")
        with open(out) as f:
            report = json.load(f)
        report["switch"] = json.loads(st.stdout) if st.returncode == 0 else None
        return report
    finally:
        stop()
