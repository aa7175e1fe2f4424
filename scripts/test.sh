#!/usr/bin/env bash
# Runs pvswitch's whole test suite: unit tests, and integration tests with real frontends
# (DPDK testpmd virtio-user "VMs", QEMU Linux guests) against a real pvswitchd; and the build
# without DPDK. Needs root (hugepages, DPDK, network namespaces); installs what it needs first.
# Every test runs: one whose needs are not met fails here, where plain `cargo test` would skip
# it (PVS_REQUIRE_ALL, tests/common/require.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prepare.sh
export PVS_REQUIRE_ALL=1
# The profiling builds still compile (benchmarks build them; nothing here runs them).
cargo check --release -p pvswitch --lib --features stage-profile,no-counters
log=$(mktemp)
trap 'rm -f "$log" "$log.plain"' EXIT
status=0
# Without DPDK (`--no-default-features`): the binaries type-check (a check, not a build: the
# build without DPDK differs only in what `cfg(feature = "dpdk")` leaves out, which checking
# covers; a second codegen of the crate cost the suite a minute and a half) and the unit tests
# pass; the fuzz targets only briefly (their code is the same in both builds). Before the
# suite, which leaves the default binaries in target/release.
cargo check --release -p pvswitch --no-default-features --bins || status=1
PVS_FUZZ_SECS=1 cargo test --release -p pvswitch --no-default-features --lib -- "$@" 2>&1 | tee "$log" || status=$?
# Integration tests share two CPUs and the hugepage pool: they are one binary (tests/suite.rs)
# whose tests hold the machine one at a time (`run_alone`), and cargo runs the binaries one
# after another.
cargo test --release --workspace --no-fail-fast -- --test-threads=1 "$@" 2>&1 | tee -a "$log" || status=$?
# The tests a contributor's first `cargo test` runs, again as one would: an unprivileged user
# with the usual soft limit of 1024 open files, PVS_REQUIRE_ALL unset (what needs root says
# SKIPPED). The suite binary just built, its files that need no root, as user nobody.
suite=$(ls -t target/release/deps/suite-* 2>/dev/null | grep -v '\.d$' | head -n 1)
plain=(scale:: portcmds:: hostile::)
echo "test.sh: as nobody, soft limit 1024 open files: $suite ${plain[*]}"
env -u PVS_REQUIRE_ALL setpriv --reuid=65534 --regid=65534 --clear-groups \
  bash -c 'ulimit -S -n 1024; "$@" --test-threads=1' _ "$suite" "${plain[@]}" 2>&1 \
  | tee "$log.plain" || status=1
echo "test.sh: as nobody:"
bash scripts/test-summary.sh "$log.plain" || status=1
rm -f "$log.plain"
# One closing line for the whole suite (cargo prints one per test binary); "0 skipped" here.
bash scripts/test-summary.sh "$log" || status=1
# Tests stop everything they start: any process still naming a test directory is a failure.
if left=$(pgrep -af /tmp/pvs-test/); then
  echo "test.sh: processes the tests left running:"; echo "$left"
  pkill -9 -f /tmp/pvs-test/ || true
  status=1
fi
exit $status
