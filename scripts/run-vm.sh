#!/usr/bin/env bash
# Boots one test guest (scripts/build-guest.sh) under QEMU with a single virtio-net-pci
# NIC backed by a vhost-user socket (or, with --tap, by a kernel tap device). QEMU runs in the foreground (exec), so a caller can
# background this script and `wait` for it; it exits when the guest powers off (after its
# job, see --job).
#
# Usage: scripts/run-vm.sh --socket PATH [options]
#   --socket PATH     vhost-user unix socket (required unless --tap)
#   --tap IFNAME      back the NIC by the existing tap device IFNAME instead (a guest on a
#                     kernel bridge: the "physical network" side of a test); run this
#                     script in the tap's network namespace
#   --vhost-server    QEMU listens on PATH (server=on,wait=off) and the switch connects;
#                     default: QEMU is the client of a socket owned by the switch and
#                     keeps retrying until it can connect
#   --mac MAC         NIC MAC address (default derived from --name)
#   --ip CIDR         guest eth0 address, e.g. 10.10.0.1/24 (kernel arg pvs.ip=)
#   --mtu N           host_mtu=N on the device and pvs.mtu=N in the guest
#   --queues N        multi-queue: N queue pairs (guest keeps its default channel count)
#   --smp N           guest vCPUs (default 1)
#   --job FILE        shell script run in the guest as /job.sh (then the guest powers off)
#   --log FILE        serial console output (default: console on stdio)
#   --console-in PATH with --log: the serial console also listens on unix socket PATH, and
#                     what a client writes there is the guest's console input (a job reads
#                     it from /dev/console: how a test tells a running job to stop)
#   --name NAME       VM name / guest hostname (default pvs-vm)
#   --reboot          a guest reboot resets the machine (default: it ends QEMU)
#   --mem MIB         guest RAM (default 256)
#   --qmp PATH        a QMP monitor on unix socket PATH (live migration tests drive it)
#   --paused          start with the CPUs stopped (-S): with --incoming, the migrated guest
#                     waits for QMP `cont` (a test compares its memory with the source's first)
#   --incoming URI    start as a migration destination (e.g. unix:/tmp/mig.sock): the guest
#                     runs once the source's state arrived (give it the source's --mac/--name)
#   --guest-dir DIR   where vmlinuz and initrd.img live (default target/guest; built if
#                     missing)
#   --net-opts OPTS   extra virtio-net-pci properties, e.g. offloads off for this guest:
#                     guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off
# Environment:
#   PVS_NET_OPTS      default for --net-opts
#   PVS_ACCEL         QEMU accelerator (default tcg; e.g. PVS_ACCEL=kvm)
#   PVS_CPU           -cpu model (default max; host with kvm)
#   PVS_APPEND        extra kernel command line arguments
#   PVS_QEMU          QEMU binary (default qemu-system-x86_64)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
die() { echo "run-vm: error: $*" >&2; exit 1; }

socket= tap= qmp= incoming= paused=0 mem=256 server=0 mac= ip= mtu= queues=1 smp=1 job= logfile= console_in= name=pvs-vm reboot=0 net_opts=${PVS_NET_OPTS:-}
guest_dir=$ROOT/target/guest
while [ $# -gt 0 ]; do
  case "$1" in
    --socket)       socket=${2:?}; shift 2 ;;
    --tap)          tap=${2:?}; shift 2 ;;
    --mem)          mem=${2:?}; shift 2 ;;
    --qmp)          qmp=${2:?}; shift 2 ;;
    --incoming)     incoming=${2:?}; shift 2 ;;
    --paused)       paused=1; shift ;;
    --vhost-server) server=1; shift ;;
    --mac)          mac=${2:?}; shift 2 ;;
    --ip)           ip=${2:?}; shift 2 ;;
    --mtu)          mtu=${2:?}; shift 2 ;;
    --queues)       queues=${2:?}; shift 2 ;;
    --smp)          smp=${2:?}; shift 2 ;;
    --job)          job=${2:?}; shift 2 ;;
    --log)          logfile=${2:?}; shift 2 ;;
    --console-in)   console_in=${2:?}; shift 2 ;;
    --name)         name=${2:?}; shift 2 ;;
    --reboot)       reboot=1; shift ;;
    --guest-dir)    guest_dir=${2:?}; shift 2 ;;
    --net-opts)     net_opts=${2:?}; shift 2 ;;
    -h|--help)      usage ;;
    *)              echo "run-vm: unknown argument: $1" >&2; usage ;;
  esac
done
[ -n "$socket" ] || [ -n "$tap" ] || { echo "run-vm: --socket or --tap is required" >&2; usage; }
[[ $queues =~ ^[1-9][0-9]*$ ]] || die "--queues must be a positive integer"
[ -z "$mtu" ] || [[ $mtu =~ ^[0-9]+$ ]] || die "--mtu must be an integer"
[ -z "$job" ] || [ -f "$job" ] || die "job file not found: $job"
[[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "--name may only contain [A-Za-z0-9_.-]"

# Default MAC: locally administered 52:54:00 prefix + 3 bytes from a hash of the name.
if [ -z "$mac" ]; then
  h=$(printf '%s' "$name" | cksum | cut -d' ' -f1)
  mac=$(printf '52:54:00:%02x:%02x:%02x' $(( (h >> 16) & 255 )) $(( (h >> 8) & 255 )) $(( h & 255 )))
fi

# Guest kernel + initramfs (cached; a no-op when already built).
if [ ! -s "$guest_dir/vmlinuz" ] || [ ! -s "$guest_dir/initrd.img" ]; then
  "$ROOT/scripts/build-guest.sh" "$guest_dir"
fi
initrd=$guest_dir/initrd.img

# --job: append a second newc archive holding /job.sh to the base initrd (the kernel
# unpacks concatenated cpio archives in order). The combined file is opened on fd 3 and
# unlinked right away; QEMU reads it via /dev/fd/3, so nothing is left behind after exec.
if [ -n "$job" ]; then
  tmpd=$(mktemp -d)
  install -m 755 "$job" "$tmpd/job.sh"
  cat "$initrd" > "$tmpd/initrd"
  (cd "$tmpd" && echo job.sh | busybox cpio -o -H newc 2>/dev/null | gzip -n) >> "$tmpd/initrd"
  exec 3<"$tmpd/initrd"
  rm -rf "$tmpd"
  initrd=/dev/fd/3
fi

append="console=ttyS0 quiet panic=-1 pvs.name=$name"
[ -z "$ip" ]  || append+=" pvs.ip=$ip"
[ -z "$mtu" ] || append+=" pvs.mtu=$mtu"
[ -z "${PVS_APPEND:-}" ] || append+=" $PVS_APPEND"

# vhost-user chardev: server mode listens (QEMU still waits for the backend to connect
# before it starts the guest); client mode reconnects every second until the switch's
# socket accepts.
if [ $server = 1 ]; then
  chardev="socket,id=chr0,path=$socket,server=on,wait=off"
else
  chardev="socket,id=chr0,path=$socket,reconnect-ms=1000"
fi
netdev="vhost-user,id=net0,chardev=chr0"
# A tap NIC: no vhost-user chardev; no offloads between the guest and the tap, so frames
# crossing the kernel bridge to a veth are complete (checksummed, at most MTU-sized).
if [ -n "$tap" ]; then
  chardev=
  netdev="tap,id=net0,ifname=$tap,script=no,downscript=no"
fi
# romfile= : no iPXE option ROM (we boot with -kernel; saves boot time).
device="virtio-net-pci,netdev=net0,mac=$mac,mrg_rxbuf=on,romfile="
if [ "$queues" -gt 1 ]; then
  netdev+=",queues=$queues"
  device+=",mq=on,vectors=$((2 * queues + 2))"
fi
[ -z "$mtu" ] || device+=",host_mtu=$mtu"
# Device properties, e.g. offloads turned off: guest_tso4=off,guest_tso6=off,guest_csum=off
[ -z "$tap" ] || device+=",csum=off,gso=off,guest_csum=off,guest_tso4=off,guest_tso6=off,guest_ecn=off"
[ -z "$net_opts" ] || device+=",$net_opts"

accel=${PVS_ACCEL:-tcg}
cpu=max
[ "$accel" != kvm ] || cpu=host
cpu=${PVS_CPU:-$cpu}

args=(
  -name "$name"
  -machine "q35,accel=$accel" -cpu "$cpu" -smp "$smp" -m "$mem"
  # vhost-user needs guest RAM in a shareable fd the backend can mmap.
  -object "memory-backend-memfd,id=mem,size=${mem}M,share=on" -numa node,memdev=mem
  -nographic -nodefaults
  -kernel "$guest_dir/vmlinuz" -initrd "$initrd" -append "$append"
  -netdev "$netdev"
  -device "$device"
)
[ -z "$chardev" ] || args+=(-chardev "$chardev")
[ -z "$qmp" ] || args+=(-qmp "unix:$qmp,server=on,wait=off")
[ -z "$incoming" ] || args+=(-incoming "$incoming")
[ "$paused" = 0 ] || args+=(-S)
# A guest reboot ends QEMU unless --reboot (then it resets the machine: the driver re-creates
# its rings on the same vhost-user connection).
[ $reboot = 1 ] || args+=(-no-reboot)
if [ -n "$logfile" ]; then
  mkdir -p "$(dirname "$logfile")"
  # Serial console to the file; no monitor on stdio (safe to run in the background).
  if [ -n "$console_in" ]; then
    # A socket for its input, its output still logged to the file (connected or not).
    args+=(-chardev "socket,id=con0,path=$console_in,server=on,wait=off,logfile=$logfile,logappend=on")
    args+=(-serial chardev:con0 -monitor none)
  else
    args+=(-serial "file:$logfile" -monitor none)
  fi
else
  args+=(-serial mon:stdio)
fi

echo "run-vm: $name mac=$mac ip=${ip:-none} socket=${socket:-none}${tap:+ tap=$tap} ($([ $server = 1 ] && echo server || echo client))" \
     "queues=$queues mtu=${mtu:-default} accel=$accel${logfile:+ log=$logfile}" >&2
exec "${PVS_QEMU:-qemu-system-x86_64}" "${args[@]}"
