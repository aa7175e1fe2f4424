#!/usr/bin/env bash
# One closing summary of a `cargo test` run (cargo prints one line per test binary): the tests
# that passed and failed, and those skipped for want of something they need (root, huge pages,
# dpdk-testpmd, QEMU, ...: tests/common/require.rs), counted by what they needed; the 10
# slowest test binaries, and the 10 slowest files of the suite binary (tests/suite.rs).
#
#   cargo test --release 2>&1 | bash scripts/test-summary.sh   # passes the output on, then sums up
#   bash scripts/test-summary.sh LOG                           # sums up a saved run
#
# Exits 1 if a test failed or none ran.
set -euo pipefail
if [ $# -eq 0 ]; then
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  tee "$log"
else
  log=$1
fi
# A skipped test passes as far as the harness is concerned; its SKIPPED line (on standard error)
# may share a line with the harness's "test name ... ".
awk '
  /^ *Running / { bin = ($2 == "unittests") ? $3 : $2 }
  /^test result:/ {
    t = $0; sub(/.*finished in /, "", t); sub(/s$/, "", t)
    if (bin != "") secs[bin] += t
  }
  /^test result:/ { ran++; passed += $4; failed += $6 }
  # The suite is one binary: its files (modules) are timed by the tests that hold the machine.
  match($0, /TOOK [a-z0-9_]+::[^ ]+ [0-9.]+/) {
    split(substr($0, RSTART + 5, RLENGTH - 5), took, " "); split(took[1], part, "::"); mods[part[1]] += took[2]
  }
  match($0, /SKIPPED [^ ]+: needs /) { skipped++; why[substr($0, RSTART + RLENGTH)]++ }
  END {
    printf "%d passed, %d failed, %d skipped\n", passed - skipped, failed, skipped
    for (w in why) printf "%6d skipped: needs %s\n", why[w], w | "sort -rn"
    close("sort -rn")
    if (length(secs) > 0) print "the 10 slowest test binaries (seconds):"
    for (b in secs) printf "%8.1f  %s\n", secs[b], b | "sort -rn | head -n 10"
    close("sort -rn | head -n 10")
    if (length(mods) > 0) print "the 10 slowest files of tests/ (seconds, tests that hold the machine):"
    for (f in mods) printf "%8.1f  tests/%s.rs\n", mods[f], f | "sort -rn | head -n 10"
    close("sort -rn | head -n 10")
    exit (failed > 0 || ran == 0)
  }' "$log"
