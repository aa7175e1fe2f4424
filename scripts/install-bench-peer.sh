#!/usr/bin/env bash
# Installs the benchmark peer, Open vSwitch with DPDK (Debian's openvswitch-switch-dpdk, on the
# same DPDK 22.11 as pvswitchd), for tools/bench_peer.py; run as root after install-deps.sh.
# Only the benchmark needs it, so the test suite does not install it. Idempotent.
#
# The package's service is not started: policy-rc.d refuses it for the length of the install
# (a system ovs-vswitchd would take CPU from the benchmarks), and its units are disabled. tools/bench_peer.py runs its own
# ovsdb-server and ovs-vswitchd-dpdk in a scratch directory per run and stops them after.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then echo "install-bench-peer.sh: run as root" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive
if ! dpkg -s openvswitch-switch-dpdk >/dev/null 2>&1; then
  policy=/usr/sbin/policy-rc.d
  if [ -e "$policy" ] && ! grep -qx 'exit 101' "$policy"; then
    echo "install-bench-peer.sh: $policy exists and may start services; not replacing it" >&2; exit 1
  fi
  if [ ! -e "$policy" ]; then
    # (A policy that already refuses every start, as container images ship, is kept.)
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -q
  apt-get install -y -q --no-install-recommends openvswitch-switch-dpdk
  # Nor at the next boot, on a host where systemd runs (the units were enabled by the install).
  systemctl disable openvswitch-switch.service ovs-vswitchd.service ovsdb-server.service >/dev/null 2>&1 || true
fi
test -x /usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk
/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk --version | head -2
