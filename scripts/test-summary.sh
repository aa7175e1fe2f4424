#!/usr/bin/env bash
# One closing summary of a `cargo test` run (cargo prints one line per test binary): the tests
# that passed and failed, and those skipped for want of something they need (root, huge pages,
# dpdk-testpmd, QEMU, ...: tests/common/require.rs), counted by what they needed.
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
  /^test result:/ { ran++; passed += $4; failed += $6 }
  match($0, /SKIPPED [^ ]+: needs /) { skipped++; why[substr($0, RSTART + RLENGTH)]++ }
  END {
    printf "%d passed, %d failed, %d skipped\n", passed - skipped, failed, skipped
    for (w in why) printf "%6d skipped: needs %s\n", why[w], w | "sort -rn"
    close("sort -rn")
    exit (failed > 0 || ran == 0)
  }' "$log"
