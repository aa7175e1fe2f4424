#!/usr/bin/env bash
# Installs everything pvswitch needs on Debian 12 (run as root). Idempotent.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then echo "install-deps.sh: run as root" >&2; exit 1; fi
export DEBIAN_FRONTEND=noninteractive

# QEMU 10 comes from bookworm-backports (the image's qemu-utils is from there; 7.2 also
# crashes under TCG in its vhost-user MSI-X setup).
if ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
  cat > /etc/apt/sources.list.d/pvswitch-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

need=()
for p in libdpdk-dev dpdk dpdk-dev libhwloc-dev libnuma-dev libudev-dev libclang-14-dev clang-14 pkg-config \
         busybox-static ethtool iperf3 iproute2 iputils-ping socat systemd frr libpcap-dev tcpdump tshark \
         libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
qemu_missing=0
dpkg -s qemu-system-x86 >/dev/null 2>&1 || qemu_missing=1
if [ ${#need[@]} -gt 0 ] || [ $qemu_missing = 1 ]; then
  apt-get update -q
  [ ${#need[@]} -eq 0 ] || apt-get install -y -q --no-install-recommends "${need[@]}"
  [ $qemu_missing = 0 ] || apt-get install -y -q --no-install-recommends -t bookworm-backports qemu-system-x86
fi

# libvirt (tests/libvirt.rs: domains with vhost-user interfaces): bookworm's 9.0, not the
# backports one (that would upgrade systemd). The project's qemu hook goes in first (README
# "libvirt"; tests/libvirt.rs refreshes its content): libvirtd looks for hooks when it starts,
# so one that ran without it is started again. Without systemd as PID 1 nobody starts the
# daemons: start them directly.
hook=/etc/libvirt/hooks/qemu.d/pvswitch
if [ ! -e "$hook" ]; then
  install -D -m 755 "$(cd "$(dirname "$0")/.." && pwd)/dist/libvirt-qemu-hook" "$hook"
  if pkill -x libvirtd; then
    for _ in $(seq 1 100); do pgrep -x libvirtd >/dev/null || break; sleep 0.1; done
  fi
fi
pgrep -x virtlogd >/dev/null || virtlogd -d
pgrep -x libvirtd >/dev/null || libvirtd -d
for _ in $(seq 1 100); do virsh -q -c qemu:///system version >/dev/null 2>&1 && break; sleep 0.2; done
virsh -q -c qemu:///system version >/dev/null || { echo "install-deps.sh: libvirtd does not answer" >&2; exit 1; }

# Hugepages for DPDK testpmd "VMs".
if [ "$(cat /proc/sys/vm/nr_hugepages)" -lt 1024 ]; then
  echo 1024 > /proc/sys/vm/nr_hugepages
fi
mkdir -p /dev/hugepages
mountpoint -q /dev/hugepages || mount -t hugetlbfs nodev /dev/hugepages
# One 1 GiB page for tests/hostile_memory.rs's 1 GiB hugetlb truncation case (best effort: the kernel
# may not find 1 GiB of contiguous memory once the host has run a while; the test then says it
# did not run, and scripts/test.sh fails on it).
g1=/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages
if [ -w "$g1" ] && [ "$(cat "$g1")" -lt 1 ]; then
  echo 1 > "$g1" 2>/dev/null || true
  [ "$(cat "$g1")" -ge 1 ] || echo "note: no 1 GiB huge page could be reserved (the 1 GiB hugetlb test cannot run: scripts/test.sh will fail on it)"
fi
grep -E 'HugePages_(Total|Free)' /proc/meminfo
