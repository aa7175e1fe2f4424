#!/usr/bin/env bash
# Runs pvswitch's whole test suite: unit tests, and integration tests with real frontends
# (DPDK testpmd virtio-user "VMs", QEMU Linux guests) against a real pvswitchd.
# Needs root (hugepages, DPDK); installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prepare.sh
# Integration tests share two CPUs and the hugepage pool; each test binary serialises its
# own tests, and cargo runs the binaries one after another.
# The profiling builds still compile (benchmarks build them; nothing here runs them).
cargo check --release -p pvswitch --lib --features stage-profile,no-counters
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --no-fail-fast -- --test-threads=1 "$@" 2>&1 | tee "$log" || status=$?
# One closing line for the whole suite (cargo prints one per test binary).
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
# Tests stop everything they start: any process still naming a test directory is a failure.
if left=$(pgrep -af /tmp/pvs-test/); then
  echo "test.sh: processes the tests left running:"; echo "$left"
  pkill -9 -f /tmp/pvs-test/ || true
  status=1
fi
exit $status
