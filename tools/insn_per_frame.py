#!/usr/bin/env python3
"""Instructions a frame costs the in-process data path, per table mode and frame layout: a
cost measure that does not move with the machine's speed (the timed benchmarks swing 2x here).

Usage: tools/insn_per_frame.py [--binary TEST-BINARY] [--base OTHER-TEST-BINARY]
                               [--cells REGEX] [--repeat] [--out FILE]

Runs each cell of src/datapath/tests/insn.rs (ignored tests of the lib test binary, one per
table mode and frame layout: 40 warm-up bursts, then 100 bursts of 32 frames) under valgrind's
callgrind, counting only inside `insn::measured_step` (one poll-thread step:
`--collect-atstart=no --toggle-collect`), and prints the instructions counted over the frames
taken, as a markdown table. With --base, the same cells of another build's test binary beside
it, and new / base. The same binary gives the same counts every run (--repeat runs each cell
twice and says so, or fails).

TEST-BINARY defaults to this tree's, found with `cargo test --release --lib --no-run` (which
builds it if it is stale). For another commit, build its test binary in a worktree of its own:
    git worktree add /tmp/base OLD && cd /tmp/base && cargo test --release --lib --no-run
and pass the `Executable` cargo prints. A commit from before insn.rs needs the commit that
added it (src/datapath/tests/insn.rs, its `mod` line, harness.rs's `mac_buckets`) picked onto it.
Run the whole tool under the machine's lock: `flock /tmp/pvs-cargo.lock python3 tools/insn_per_frame.py`.
Needs valgrind (3.19 here); about 1 s a cell (20 cells: 15 s; twice with --repeat or --base).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

PREFIX = "datapath::tests::insn::"
MARKER = "*insn::measured_step*"
MODES = [("Normal", "NORMAL, learned unicast"), ("Flood", "NORMAL, flood (moving source MAC)"),
         ("InPort", "in_port flows"), ("Flows1k", "1k exact flows"), ("Access", "NORMAL, access VLAN both ends"),
         ("Routed", "NORMAL, routed between two VLANs of a VRF"),
         ("Trunk", "NORMAL, access to trunk (tag pushed)"), ("Capped", "NORMAL, ingress and egress caps"),
         ("Logged", "NORMAL, both VMs dirty logging"), ("FloodFull", "NORMAL, flood beside 14 full-ring VMs"),
         ("Secured", "NORMAL, to a port in a security group"), ("CtFlows", "OVS ct flows, two tables")]
LAYOUTS = [("64", "One", "64 B, 1 desc"), ("64", "Chain", "64 B, header + frame chained"),
           ("64", "Indirect", "64 B, indirect (header + frame)"), ("1518", "One", "1518 B, 1 desc"),
           ("1518", "Chain", "1518 B, header + frame chained")]


def tree_binary():
    """This tree's lib test binary, as cargo reports it (built if stale)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(["cargo", "test", "--release", "--lib", "--no-run", "--message-format=json"], cwd=root,
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "pvswitch" \
                and msg.get("profile", {}).get("test"):
            return msg["executable"]
    sys.exit("cargo built no lib test binary")


def cells_of(binary):
    """The insn cells a test binary has."""
    out = subprocess.run([binary, "--list", "--ignored"], check=True, stdout=subprocess.PIPE, text=True).stdout
    return [m.group(1) for m in re.finditer(r"^" + re.escape(PREFIX) + r"(\w+): test$", out, re.M)]


def count(binary, cell, tmp):
    """(instructions counted, frames, mode, size, layout) of one cell under callgrind."""
    cg = os.path.join(tmp, f"{cell}.cg")
    r = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--toggle-collect={MARKER}",
                        f"--callgrind-out-file={cg}", binary, "--exact", PREFIX + cell, "--ignored", "--nocapture",
                        "--test-threads=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    m = re.search(r"insn cell=(\w+) mode=(\w+) size=(\d+) layout=(\w+) frames=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"{cell}: the test failed under valgrind (exit {r.returncode}):\n{r.stdout}\n{r.stderr[-3000:]}")
    total = None
    with open(cg) as f:
        for line in f:
            if line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
    os.unlink(cg)
    if not total:
        sys.exit(f"{cell}: callgrind counted nothing inside {MARKER} (was the marker renamed or inlined?)")
    return total, int(m.group(5)), m.group(2), m.group(3), m.group(4)


def measure(binary, cells, repeat, tmp, label):
    """{cell: (instructions a frame, mode, size, layout)}."""
    out = {}
    for cell in cells:
        t0 = time.time()
        total, frames, mode, size, lay = count(binary, cell, tmp)
        note = ""
        if repeat:
            again = count(binary, cell, tmp)[0]
            if again != total:
                sys.exit(f"{label} {cell}: {total} then {again} instructions: not repeatable")
            note = ", the same again"
        out[cell] = (total / frames, mode, size, lay)
        print(f"{label} {cell}: {total} instructions / {frames} frames = {total / frames:.1f}{note}"
              f" ({time.time() - t0:.1f} s)", file=sys.stderr, flush=True)
    return out


def order(cells, results):
    def key(c):
        _, mode, size, lay = results[c]
        mi = next((i for i, (m, _) in enumerate(MODES) if m == mode), len(MODES))
        li = next((i for i, (s, ly, _) in enumerate(LAYOUTS) if (s, ly) == (size, lay)), len(LAYOUTS))
        return mi, li, c
    return sorted(cells, key=key)


def label_of(mode, size, lay):
    m = dict(MODES).get(mode, mode)
    ly = next((t for s, ly, t in LAYOUTS if (s, ly) == (size, lay)), f"{size} B, {lay}")
    return m, ly


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", help="the lib test binary (default: this tree's, from cargo)")
    ap.add_argument("--base", help="another build's lib test binary, to compare with")
    ap.add_argument("--cells", default="", help="only cells whose name matches this regex")
    ap.add_argument("--repeat", action="store_true", help="run each cell twice; fail if the counts differ")
    ap.add_argument("--out", help="also write the table to this file")
    a = ap.parse_args()
    binary = a.binary or tree_binary()
    cells = [c for c in cells_of(binary) if re.search(a.cells, c)]
    if not cells:
        sys.exit(f"{binary} has no insn cells matching {a.cells!r} (built from a tree without insn.rs?)")
    base_cells = set(cells_of(a.base)) if a.base else set()
    with tempfile.TemporaryDirectory(prefix="pvs-insn-") as tmp:
        new = measure(binary, cells, a.repeat, tmp, "new" if a.base else "")
        base = measure(a.base, [c for c in cells if c in base_cells], a.repeat, tmp, "base") if a.base else {}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"Instructions a frame, in-process data path (callgrind, {when}; {binary}"
             + (f" against {a.base}" if a.base else "") + ")", ""]
    if a.base:
        lines += ["| table | frame layout | new | base | new / base |", "|---|---|---|---|---|"]
        ratios = []
        for c in order(cells, new):
            per, mode, size, lay = new[c]
            m, ly = label_of(mode, size, lay)
            if c in base:
                ratios.append(per / base[c][0])
                lines.append(f"| {m} | {ly} | {per:.1f} | {base[c][0]:.1f} | **{per / base[c][0]:.3f}** |")
            else:
                lines.append(f"| {m} | {ly} | {per:.1f} | - | - |")
        if ratios:
            gm = 1.0
            for r in ratios:
                gm *= r
            gm **= 1 / len(ratios)
            lines += ["", f"new / base over {len(ratios)} cells: geometric mean {gm:.3f}, "
                      f"{min(ratios):.3f}..{max(ratios):.3f}"]
    else:
        lays = []
        for c in order(cells, new):
            _, mode, size, lay = new[c]
            if (size, lay) not in lays:
                lays.append((size, lay))
        lines += ["| table | " + " | ".join(label_of("", s, ly)[1] for s, ly in lays) + " |",
                  "|---|" + "---|" * len(lays)]
        for mode, mlabel in MODES + [(m, m) for m in sorted({v[1] for v in new.values()} - dict(MODES).keys())]:
            row = {(v[2], v[3]): v[0] for v in new.values() if v[1] == mode}
            if row:
                lines.append(f"| {mlabel} | " + " | ".join(f"{row[k]:.1f}" if k in row else "-" for k in lays) + " |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
