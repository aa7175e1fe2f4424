#!/usr/bin/env bash
# Runs pvswitch's whole test suite: unit tests, and integration tests with real frontends
# (DPDK testpmd virtio-user "VMs", QEMU Linux guests) against a real pvswitchd.
# Needs root (hugepages, DPDK); installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_if() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
sudo_if bash scripts/install-deps.sh
bash scripts/build-guest.sh
cargo build --release --bins
# Integration tests share two CPUs and the hugepage pool; each test binary serialises its
# own tests, and cargo runs the binaries one after another.
cargo test --release -- --test-threads=1 "$@"
