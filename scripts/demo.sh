#!/usr/bin/env bash
# The main job on the defaults in conf/: pvswitchd plus two real Linux VMs (QEMU) pinging
# each other (and running iperf3) through it; then prints `pvswitchctl ports`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prepare.sh
conf=conf/pvswitch.toml
ctl=/run/pvswitch/pvswitchd.sock
./target/release/pvswitchd --check "$conf"
# Started directly (not through a shell function, whose subshell $! would name), so the EXIT
# trap stops pvswitchd itself: the demo leaves nothing running.
"${as_root[@]}" ./target/release/pvswitchd --config "$conf" > target/pvswitchd.log 2>&1 &
pid=$!
trap '"${as_root[@]}" kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S $ctl ] && break; sleep 0.1; done
sudo_if bash scripts/vm-pair.sh /run/pvswitch/vm1.sock /run/pvswitch/vm2.sock --logdir target/vm-pair &
vms=$!
# Show the ports once both guests' drivers run their queues (2 ports x 2 queues).
for _ in $(seq 600); do
  [ "$(sudo_if ./target/release/pvswitchctl --control $ctl ports | grep -c ' running')" -ge 4 ] && break
  sleep 0.2
done
echo "=== pvswitchctl ports (VMs running) ==="
sudo_if ./target/release/pvswitchctl --control $ctl ports
status=0
wait $vms || status=$?
echo "=== pvswitchctl ports (after the VMs powered off) ==="
sudo_if ./target/release/pvswitchctl --control $ctl ports
echo "=== pvswitchctl stats ==="
sudo_if ./target/release/pvswitchctl --control $ctl stats
exit $status
