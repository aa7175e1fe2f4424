#!/usr/bin/env bash
# Builds a tiny Linux guest for the vhost-user VM tests:
#   OUTDIR/vmlinuz     Debian 6.1 cloud kernel
#   OUTDIR/initrd.img  busybox-static initramfs with the virtio-net and 802.1Q modules, iperf3
#                      and an /init that configures eth0 from the kernel command line,
#                      runs /job.sh and powers off.
#
# Usage: scripts/build-guest.sh [OUTDIR]     (default: target/guest under the repo root)
#
# Idempotent and cached: if both outputs exist and were built by this exact version of
# the script, nothing is done (no apt access). Set PVS_GUEST_REBUILD=1 to force a rebuild
# (the downloaded kernel .deb is kept in OUTDIR/cache and reused when still current).
#
# Guest /init contract (see the heredoc below):
#   kernel args  pvs.ip=A.B.C.D/NN  address for eth0 (eth0 and lo are brought up)
#                pvs.mtu=N          MTU for eth0 (optional)
#                pvs.name=NAME      hostname (optional)
#   /job.sh      if present, sourced in a subshell (variables PVS_IP, PVS_MTU, PVS_NAME
#                are set); its output goes to the console (ttyS0)
#   marker       "PVS-JOB-EXIT <status>" is printed last, then `poweroff -f`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${1:-$ROOT/target/guest}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
CACHE=$OUTDIR/cache
STAMP=$OUTDIR/.build-stamp
BUSYBOX=/bin/busybox          # from busybox-static: a static binary, needs no libraries
IPERF3=/usr/bin/iperf3

log() { echo "build-guest: $*" >&2; }
die() { log "error: $*"; exit 1; }

# --- cache check ------------------------------------------------------------------------
# The stamp records the hash of this script; any edit to it (e.g. to /init) rebuilds.
script_hash=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)
if [ "${PVS_GUEST_REBUILD:-0}" != 1 ] && [ -s "$OUTDIR/vmlinuz" ] && [ -s "$OUTDIR/initrd.img" ] \
   && [ -f "$STAMP" ] && grep -qx "script=$script_hash" "$STAMP"; then
  log "up to date: $OUTDIR ($(grep '^kernel=' "$STAMP" | cut -d= -f2))"
  exit 0
fi

for f in "$BUSYBOX" "$IPERF3"; do
  [ -x "$f" ] || die "$f missing (run scripts/install-deps.sh)"
done
command -v apt-cache >/dev/null || die "apt-cache not found (Debian host required)"

# --- pick the newest linux-image-6.1.*-cloud-amd64 ------------------------------------
# apt-cache pkgnames also lists names that merely appear in dependencies, so keep only
# those with an installable candidate version.
newest_kernel_pkg() {
  local p cand
  apt-cache pkgnames linux-image-6.1. 2>/dev/null \
    | grep -E '^linux-image-6\.1\.[0-9]+-[0-9]+-cloud-amd64$' | sort -V -r \
    | while read -r p; do
        cand=$(apt-cache policy "$p" | awk '/Candidate:/ {print $2}')
        if [ -n "$cand" ] && [ "$cand" != "(none)" ]; then echo "$p"; break; fi
      done
}
kpkg=$(newest_kernel_pkg)
if [ -z "$kpkg" ]; then
  log "no linux-image-6.1.*-cloud-amd64 known to apt; running apt-get update"
  apt-get update -q >&2
  kpkg=$(newest_kernel_pkg)
fi
[ -n "$kpkg" ] || die "no linux-image-6.1.*-cloud-amd64 package available"
kver=${kpkg#linux-image-}                                   # e.g. 6.1.0-57-cloud-amd64
kpkgver=$(apt-cache policy "$kpkg" | awk '/Candidate:/ {print $2}')
log "kernel: $kpkg $kpkgver"

# --- download and unpack the kernel package -------------------------------------------
mkdir -p "$CACHE"
deb=$(ls "$CACHE/${kpkg}_${kpkgver//:/%3a}_"*.deb 2>/dev/null | head -n1 || true)
if [ -z "$deb" ]; then
  rm -f "$CACHE"/linux-image-*.deb
  # Sandbox user = root: the _apt user may not be able to write into OUTDIR.
  (cd "$CACHE" && apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2)
  deb=$(ls "$CACHE/${kpkg}_"*.deb | head -n1)
fi
kroot=$CACHE/kernel
rm -rf "$kroot"
dpkg-deb -x "$deb" "$kroot"
moddir=$kroot/lib/modules/$kver
[ -f "$kroot/boot/vmlinuz-$kver" ] || die "vmlinuz-$kver not found in $deb"

# --- resolve the modules virtio-net-pci needs ------------------------------------------
# The cloud kernel builds virtio, virtio_ring, virtio_pci and virtio_net as modules
# (CONFIG_VIRTIO_PCI=m, CONFIG_VIRTIO_NET=m, ...). There is no modules.dep in the package
# (depmod runs at install time) and no kmod on the host, so read the "depends=" field of
# each module's .modinfo section directly and order the list dependencies-first.
declare -A modpath=()
while IFS= read -r f; do
  n=$(basename "$f" .ko); modpath[${n//-/_}]=$f
done < <(find "$moddir/kernel" -name '*.ko')

load_order=()
declare -A seen=()
add_module() {                                   # depth-first: deps before the module
  local m=$1 deps d
  [ -n "${seen[$m]:-}" ] && return 0
  seen[$m]=1
  [ -n "${modpath[$m]:-}" ] || die "module $m not found in $kpkg"
  deps=$(tr '\0' '\n' < "${modpath[$m]}" | sed -n 's/^depends=//p' | head -n1)
  for d in ${deps//,/ }; do add_module "$d"; done
  load_order+=("$m")
}
# 8021q: VLAN interfaces, for a guest that plays the physical network behind a trunk.
for m in virtio_pci virtio_net 8021q; do       # pulls virtio, virtio_ring, net_failover, ...
  if grep -q "/$m.ko\$" "$moddir/modules.builtin"; then continue; fi
  add_module "$m"
done
log "modules: ${load_order[*]}"

# --- assemble the initramfs tree --------------------------------------------------------
stage=$(mktemp -d "$OUTDIR/.stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,lib/modules}
chmod 1777 "$stage/tmp"

cp "$BUSYBOX" "$stage/bin/busybox"
for a in $("$BUSYBOX" --list); do
  [ "$a" = busybox ] || ln -s busybox "$stage/bin/$a"
done

for m in "${load_order[@]}"; do
  cp "${modpath[$m]}" "$stage/lib/modules/$m.ko"
done
printf '%s\n' "${load_order[@]}" > "$stage/etc/modules-load"

# iperf3 plus every shared library it links (at the same paths), and the dynamic loader.
cp "$IPERF3" "$stage/usr/bin/iperf3"
ldd "$IPERF3" | grep -oE '/[^ ]+' | while read -r lib; do
  mkdir -p "$stage$(dirname "$lib")"
  cp -L "$lib" "$stage$lib"
done
[ -e "$stage/lib64/ld-linux-x86-64.so.2" ] || die "dynamic loader not copied"

echo "root:x:0:0:root:/root:/bin/sh" > "$stage/etc/passwd"
echo "root:x:0:"                     > "$stage/etc/group"
printf '127.0.0.1 localhost\n'      > "$stage/etc/hosts"

cat > "$stage/init" <<'INIT'
#!/bin/sh
# pvswitch test guest init (generated by scripts/build-guest.sh).
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp          # iperf3 creates its buffer files here
exec </dev/console >/dev/console 2>&1
echo "pvs-init: up after $(cut -d' ' -f1 /proc/uptime)s"

for m in $(cat /etc/modules-load); do
  insmod "/lib/modules/$m.ko" || echo "pvs-init: insmod $m failed"
done

PVS_IP= PVS_MTU= PVS_NAME=pvs-guest
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    pvs.ip=*)   PVS_IP=${arg#pvs.ip=} ;;
    pvs.mtu=*)  PVS_MTU=${arg#pvs.mtu=} ;;
    pvs.name=*) PVS_NAME=${arg#pvs.name=} ;;
  esac
done
export PVS_IP PVS_MTU PVS_NAME
hostname "$PVS_NAME"

ip link set lo up
# virtio_net probes synchronously, but allow a few seconds for the device to show up.
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
if [ -e /sys/class/net/eth0 ]; then
  [ -z "$PVS_MTU" ] || ip link set eth0 mtu "$PVS_MTU" || echo "pvs-init: cannot set mtu $PVS_MTU"
  [ -z "$PVS_IP" ]  || ip addr add "$PVS_IP" dev eth0
  ip link set eth0 up
  echo "pvs-init: eth0 $(cat /sys/class/net/eth0/address) ip=${PVS_IP:-none}" \
       "mtu=$(cat /sys/class/net/eth0/mtu) queues=$(ls -d /sys/class/net/eth0/queues/rx-* | wc -l)"
else
  echo "pvs-init: no eth0"
fi

status=0
if [ -f /job.sh ]; then
  echo "pvs-init: running /job.sh"
  # Subshell: the job can use `exit` without killing init (which would panic).
  ( . /job.sh ) || status=$?
fi
echo "PVS-JOB-EXIT $status"
sync
poweroff -f
INIT
chmod 755 "$stage/init"

# --- pack -------------------------------------------------------------------------------
# No cpio on the host: busybox has one. Sorted list for reproducible output.
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc 2>/dev/null) \
  | gzip -9n > "$OUTDIR/initrd.img.tmp"
cp "$kroot/boot/vmlinuz-$kver" "$OUTDIR/vmlinuz.tmp"
mv "$OUTDIR/vmlinuz.tmp" "$OUTDIR/vmlinuz"
mv "$OUTDIR/initrd.img.tmp" "$OUTDIR/initrd.img"
printf 'script=%s\nkernel=%s %s\nmodules=%s\n' "$script_hash" "$kpkg" "$kpkgver" "${load_order[*]}" > "$STAMP"
rm -rf "$kroot"                    # keep only the .deb in the cache
log "built $OUTDIR/vmlinuz and $OUTDIR/initrd.img ($(du -h "$OUTDIR/initrd.img" | cut -f1))"
