#!/usr/bin/env bash
# Boots two test guests on two vhost-user sockets and checks that they can talk through
# whatever switch sits behind the sockets (pvswitch, or DPDK testpmd's vhost PMD):
#   guest A 10.10.0.1/24 on SOCK_A (client role), guest B 10.10.0.2/24 on SOCK_B (server)
#   - ping A->B and B->A (PINGS each, 0% loss required; with --mtu also full-size pings)
#   - iperf3 TCP A->B and B->A (-R), Mbit/s reported
#
# Usage: scripts/vm-pair.sh SOCK_A SOCK_B [options]
#   --vhost-server     QEMU owns the sockets (the switch connects as vhost-user client);
#                      default: the switch owns them and QEMU connects/reconnects
#   --mtu N            host_mtu / guest MTU on both NICs
#   --queues N         vhost-user queue pairs per NIC (default 1). The guest driver uses
#                      min(N, vCPUs) pairs, so combine with --smp to really use them
#   --smp N            vCPUs per guest (default 1)
#   --logdir DIR       logs and generated job scripts (default target/vm-pair)
#   --timeout SEC      overall time bound (default 300)
#   --pings N          pings per direction (default 20)
#   --iperf-time SEC   iperf3 duration per direction (default 5)
#   --iperf-args ARGS  more iperf3 client options, e.g. "-Z" (zero copy: sendfile)
# Environment: PVS_ACCEL etc. are passed through to scripts/run-vm.sh.
#
# Guest coordination (no sleeps as synchronisation): A retries a 1-packet ping until B
# answers (bounded), pings B, then tells B over TCP (busybox nc, port 5001) to ping back
# and waits for B's "pinged" message on its own port 5002; then A runs iperf3 against
# B's iperf3 server (retrying only while the server is not listening yet) and finally
# sends "done" to B's port 5001, after which both guests power off. The host waits for
# A to exit, gives B a grace period, and kills whatever is left (also on any exit).
# Exit status: 0 only if every check passed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

server_opt=() mtu= queues=1 smp=1 logdir=$ROOT/target/vm-pair timeout=300 pings=20 iperf_time=5 iperf_args=
socks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --vhost-server) server_opt=(--vhost-server); shift ;;
    --mtu)          mtu=${2:?}; shift 2 ;;
    --queues)       queues=${2:?}; shift 2 ;;
    --smp)          smp=${2:?}; shift 2 ;;
    --logdir)       logdir=${2:?}; shift 2 ;;
    --timeout)      timeout=${2:?}; shift 2 ;;
    --pings)        pings=${2:?}; shift 2 ;;
    --iperf-time)   iperf_time=${2:?}; shift 2 ;;
    --iperf-args)   iperf_args=${2?}; shift 2 ;;
    -h|--help)      usage ;;
    -*)             echo "vm-pair: unknown option: $1" >&2; usage ;;
    *)              socks+=("$1"); shift ;;
  esac
done
[ ${#socks[@]} -eq 2 ] || usage
sock_a=${socks[0]} sock_b=${socks[1]}

IP_A=10.10.0.1 IP_B=10.10.0.2
MAC_A=52:54:00:0a:0a:01 MAC_B=52:54:00:0a:0a:02
# In-guest bound for the peer to become reachable (both guests boot under TCG).
PEER_WAIT=120

start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
say() { echo "vm-pair: [$(elapsed)s] $*"; }

"$ROOT/scripts/build-guest.sh"
mkdir -p "$logdir"
logdir=$(cd "$logdir" && pwd)
rm -f "$logdir"/vm-a.log "$logdir"/vm-b.log "$logdir"/qemu-a.log "$logdir"/qemu-b.log

# --- guest jobs -------------------------------------------------------------------------
# Shared helpers (busybox ash). Results are printed as "PVS-RESULT ..." lines that the
# host parses from the serial logs.
common() {
  cat <<EOF
IP_A=$IP_A IP_B=$IP_B PINGS=$pings IPERF_TIME=$iperf_time MTU=$mtu PEER_WAIT=$PEER_WAIT
IPERF_ARGS="$iperf_args"
EOF
  cat <<'EOF'
now() { cut -d. -f1 /proc/uptime; }

# wait_reachable PEER: retry a single ping until the first reply (bounded by PEER_WAIT).
wait_reachable() {
  echo "waiting for $1 to answer pings"
  t0=$(now)
  until ping -c 1 -W 1 "$1" >/dev/null 2>&1; do
    if [ $(( $(now) - t0 )) -ge "$PEER_WAIT" ]; then
      echo "PVS-RESULT reach $1 FAIL after ${PEER_WAIT}s"; return 1
    fi
  done
  echo "PVS-RESULT reach $1 ok after $(( $(now) - t0 ))s (uptime $(now)s)"
}

# ping_check LABEL PEER COUNT [SIZE]: 0% loss required.
ping_check() {
  out=$(ping -c "$3" -i 0.2 -W 2 ${4:+-s "$4"} "$2" 2>&1) || true
  echo "$out" | tail -n 3
  loss=$(echo "$out" | sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')
  rtt=$(echo "$out" | sed -n 's|.*min/avg/max = \([^ ]*\) ms.*|\1|p')
  echo "PVS-RESULT ping $1 loss=${loss:-100}% rtt_min/avg/max=${rtt:-none}ms${4:+ size=$4}"
  [ "$loss" = 0 ]
}

# send PEER PORT MSG: deliver one line over TCP, retrying until the peer listens (60 s).
send() {
  i=0
  until echo "$3" | nc "$1" "$2" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 120 ] || { echo "send $3 to $1:$2 failed"; return 1; }
    sleep 0.5
  done
}

# recv PORT SECS: wait for one message on PORT (bounded), print it.
recv() { timeout "$2" nc -l -p "$1" </dev/null; }
EOF
}

{
  common
  cat <<'EOF'
# ---- guest A: client ----
rc=0
wait_reachable "$IP_B" || exit 1
ping_check a-b "$IP_B" "$PINGS" || rc=1
if [ -n "$MTU" ]; then ping_check a-b-full "$IP_B" 5 $((MTU - 28)) || rc=1; fi

# Let B ping us; listen for its answer before asking, so it cannot be missed.
recv 5002 90 > /tmp/b-said &
listener=$!
send "$IP_B" 5001 ping-me || exit 1
wait $listener || true
echo "B says: $(cat /tmp/b-said)"
grep -q '^pinged 0$' /tmp/b-said || rc=1

# iperf_check LABEL [ARGS]: retry only while B's iperf3 server is not yet listening.
iperf_check() {
  label=$1; shift
  n=0
  while :; do
    # shellcheck disable=SC2086 # IPERF_ARGS is a list of options
    out=$(iperf3 -c "$IP_B" -t "$IPERF_TIME" -f m $IPERF_ARGS "$@" 2>&1) && break
    echo "$out" | tail -n 3
    case "$out" in *"Connection refused"*) ;; *) n=99 ;; esac
    n=$((n + 1))
    if [ $n -ge 20 ]; then echo "PVS-RESULT iperf $label mbps=FAIL"; return 1; fi
    sleep 0.5
  done
  echo "$out" | grep -E 'sender|receiver'
  mbps=$(echo "$out" | awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") v = $(i-1) } END { print v }')
  echo "PVS-RESULT iperf $label mbps=${mbps:-FAIL}"
  [ -n "$mbps" ]
}
iperf_check a-b || rc=1
iperf_check b-a -R || rc=1

send "$IP_B" 5001 done || rc=1
exit $rc
EOF
} > "$logdir/job-a.sh"

{
  common
  cat <<'EOF'
# ---- guest B: server ----
iperf3 -s >/tmp/iperf3-s.log 2>&1 &
iperf=$!
rc=0
# Wait for A's "ping-me" (A only sends it once it has reached us).
echo "waiting for A's ping-me on port 5001"
msg=$(recv 5001 "$PEER_WAIT") || { echo "no ping-me from A"; exit 1; }
echo "A says: $msg"
ping_check b-a "$IP_A" "$PINGS" || rc=1
if [ -n "$MTU" ]; then ping_check b-a-full "$IP_A" 5 $((MTU - 28)) || rc=1; fi
send "$IP_A" 5002 "pinged $rc" || rc=1
# Serve iperf3 until A says it is done (the host kills us if A never does).
msg=$(recv 5001 600) || rc=1
echo "A says: $msg"
kill $iperf 2>/dev/null || true
exit $rc
EOF
} > "$logdir/job-b.sh"

# --- run the VMs --------------------------------------------------------------------------
pid_a= pid_b=
cleanup() {
  local p
  for p in $pid_a $pid_b; do kill "$p" 2>/dev/null || true; done
  for p in $pid_a $pid_b; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'echo "vm-pair: interrupted" >&2; exit 130' INT TERM

common_args=(${server_opt[@]+"${server_opt[@]}"} --queues "$queues" --smp "$smp" ${mtu:+--mtu "$mtu"})
"$ROOT/scripts/run-vm.sh" --name pvs-b --socket "$sock_b" --mac $MAC_B --ip $IP_B/24 \
  "${common_args[@]}" --job "$logdir/job-b.sh" --log "$logdir/vm-b.log" </dev/null >"$logdir/qemu-b.log" 2>&1 &
pid_b=$!
"$ROOT/scripts/run-vm.sh" --name pvs-a --socket "$sock_a" --mac $MAC_A --ip $IP_A/24 \
  "${common_args[@]}" --job "$logdir/job-a.sh" --log "$logdir/vm-a.log" </dev/null >"$logdir/qemu-a.log" 2>&1 &
pid_a=$!
say "started guests A (pid $pid_a, $sock_a) and B (pid $pid_b, $sock_b)${server_opt:+, QEMU is vhost-user server}; logs in $logdir"

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
timed_out=0
# A decides when the test is over; then give B a short grace period to power off.
while alive "$pid_a"; do
  if [ "$(elapsed)" -ge "$timeout" ]; then timed_out=1; break; fi
  sleep 0.5
done
if [ $timed_out = 1 ]; then
  say "time limit of ${timeout}s exceeded; killing the guests"
else
  grace=$(( $(elapsed) + 20 ))
  while alive "$pid_b" && [ "$(elapsed)" -lt "$grace" ]; do sleep 0.5; done
  if alive "$pid_b"; then say "guest B did not power off; killing it"; fi
fi
cleanup

# --- report -------------------------------------------------------------------------------
clean_log() { [ -f "$1" ] && tr -d '\r' < "$1" || true; }
job_exit() { clean_log "$1" | sed -n 's/^PVS-JOB-EXIT \([0-9]*\).*/\1/p' | tail -n1; }
exit_a=$(job_exit "$logdir/vm-a.log") exit_b=$(job_exit "$logdir/vm-b.log")
results=$( (clean_log "$logdir/vm-a.log"; clean_log "$logdir/vm-b.log") | grep '^PVS-RESULT' | sed 's/^PVS-RESULT //' || true)

echo "=== vm-pair summary ($(elapsed)s, sockets $sock_a $sock_b${server_opt:+, vhost-server}${mtu:+, mtu $mtu}, queues $queues, smp $smp) ==="
ok=1
failures=()
fail() { failures+=("$*"); ok=0; }
[ $timed_out = 0 ] || fail "timed out after ${timeout}s"
[ "$exit_a" = 0 ] || fail "guest A job exit status ${exit_a:-missing}"
[ "$exit_b" = 0 ] || fail "guest B job exit status ${exit_b:-missing}"
echo "$results" | grep '^reach ' | sed 's/^/  /' || true
expect=("ping a-b" "ping b-a")
[ -z "$mtu" ] || expect+=("ping a-b-full" "ping b-a-full")
expect+=("iperf a-b" "iperf b-a")
for e in "${expect[@]}"; do
  line=$(echo "$results" | grep "^$e " | tail -n1 || true)
  [ -z "$line" ] || echo "  $line"
  case "$line" in
    "")                          fail "no result for $e" ;;
    ping*loss=0%*)               ;;
    iperf*mbps=[0-9]*)           ;;
    *)                           fail "$line" ;;
  esac
done
echo "  guest A job exit: ${exit_a:-none}   guest B job exit: ${exit_b:-none}"
for f in ${failures[@]+"${failures[@]}"}; do echo "FAIL: $f"; done
if [ $ok = 0 ]; then
  for g in a b; do
    echo "--- last lines of $logdir/vm-$g.log ---"
    clean_log "$logdir/vm-$g.log" | tail -n 15
    [ ! -s "$logdir/qemu-$g.log" ] || { echo "--- $logdir/qemu-$g.log ---"; tail -n 5 "$logdir/qemu-$g.log"; }
  done
  echo "vm-pair: FAILED"
  exit 1
fi
echo "vm-pair: PASSED"
