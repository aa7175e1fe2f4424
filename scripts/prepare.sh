#!/usr/bin/env bash
# What the demo and the tests need first: system packages and hugepages (as root), the test
# guest image, and a release build. Defines sudo_if for the caller when sourced.
sudo_if() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
sudo_if bash scripts/install-deps.sh
bash scripts/build-guest.sh
cargo build --release --bins
