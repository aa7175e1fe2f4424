#!/usr/bin/env bash
# What the demo and the tests need first: system packages and hugepages (as root), the test
# guest image, and a release build. Defines sudo_if for the caller when sourced.
sudo_if() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
# The same as a command prefix, for a process started in the background: "${as_root[@]}" cmd &
# leaves $! the process itself (or sudo, which passes signals on), not a subshell.
as_root=(); [ "$(id -u)" = 0 ] || as_root=(sudo)
sudo_if bash scripts/install-deps.sh
bash scripts/build-guest.sh
cargo build --release --bins
