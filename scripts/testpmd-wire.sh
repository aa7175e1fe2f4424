#!/usr/bin/env bash
# Reference vhost-user "switch": DPDK testpmd with two vhost PMD ports forwarding to each
# other (io forward mode, a 2-port wire). Used to validate the VM test scripts against a
# known-good backend. Runs in the foreground until killed (SIGINT/SIGTERM); testpmd's
# port statistics are printed on exit, and its hugepage map files are removed.
#
# Usage: scripts/testpmd-wire.sh SOCK_A SOCK_B [--client] [--queues N] [--prefix NAME]
#   --client     the vhost PMD connects to sockets created by QEMU (run-vm.sh
#                --vhost-server); default: testpmd creates the sockets (QEMU is client)
#   --queues N   queue pairs per port (default 1)
#   --prefix P   DPDK --file-prefix (default vhref)
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
client=0 queues=1 prefix=vhref socks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --client) client=1; shift ;;
    --queues) queues=${2:?}; shift 2 ;;
    --prefix) prefix=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "testpmd-wire: unknown option: $1" >&2; usage ;;
    *) socks+=("$1"); shift ;;
  esac
done
[ ${#socks[@]} -eq 2 ] || usage

vdev_opts=",queues=$queues"
[ $client = 0 ] || vdev_opts+=",client=1"

pmd=
cleanup() {
  if [ -n "$pmd" ] && kill -0 "$pmd" 2>/dev/null; then
    kill -INT "$pmd" 2>/dev/null || true       # SIGINT: testpmd prints stats and exits
    for _ in $(seq 50); do kill -0 "$pmd" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pmd" 2>/dev/null || true
  fi
  wait 2>/dev/null || true
  rm -f /dev/hugepages/"$prefix"*      # hugepage map files (e.g. vhrefmap_0)
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# testpmd -i reads commands from stdin and quits at EOF, so feed it a pipe that stays
# open: a FIFO held open by this script (no helper process to clean up).
fifo=$(mktemp -u); mkfifo "$fifo"; exec 4<>"$fifo"; rm -f "$fifo"
dpdk-testpmd -l 0,1 --no-pci --file-prefix="$prefix" -m 512 \
  --vdev "net_vhost0,iface=${socks[0]}$vdev_opts" \
  --vdev "net_vhost1,iface=${socks[1]}$vdev_opts" \
  -- --forward-mode=io --auto-start --nb-cores=1 --rxq="$queues" --txq="$queues" -i <&4 &
pmd=$!
wait "$pmd"
