#!/usr/bin/env bash
# Installs pvswitchd as a host service (and pvs-evpn, EVPN's companion, as one not enabled), or
# removes them.
#
# Usage: scripts/install.sh [--prefix DIR] [--sysconfdir DIR] [--destdir DIR] [--no-build]
#        scripts/install.sh --uninstall [--purge] [same options]
#   --prefix DIR      binaries in DIR/sbin (pvswitchd, pvs-evpn) and DIR/bin (pvswitchctl), docs in
#                     DIR/share/doc/pvswitch (default /usr/local)
#   --sysconfdir DIR  the configuration in DIR/pvswitch/pvswitch.toml (default /etc); an
#                     existing file is never overwritten
#   --unitdir DIR     where the systemd units go (default /etc/systemd/system)
#   --destdir DIR     stage everything under DIR (packaging); systemctl is not called
#   --no-build        install target/release as it is (default: cargo build --release first)
#   --uninstall       stop and disable the service, remove what install put there; the
#                     configuration stays unless --purge
# When systemd runs (PID 1), with no --destdir and the default --unitdir, systemctl
# daemon-reload is run; enable and start the service with `systemctl enable --now pvswitchd`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

prefix=/usr/local sysconfdir=/etc unitdir=/etc/systemd/system destdir= build=1 uninstall=0 purge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix)     prefix=${2:?}; shift 2 ;;
    --sysconfdir) sysconfdir=${2:?}; shift 2 ;;
    --unitdir)    unitdir=${2:?}; shift 2 ;;
    --destdir)    destdir=${2:?}; shift 2 ;;
    --no-build)   build=0; shift ;;
    --uninstall)  uninstall=1; shift ;;
    --purge)      purge=1; shift ;;
    -h|--help)    usage ;;
    *)            echo "install: unknown option: $1" >&2; usage ;;
  esac
done

sbindir=$prefix/sbin bindir=$prefix/bin docdir=$prefix/share/doc/pvswitch
confdir=$sysconfdir/pvswitch
unit=$unitdir/pvswitchd.service evpn_unit=$unitdir/pvs-evpn.service
systemd_runs() { [ -z "$destdir" ] && [ "$unitdir" = /etc/systemd/system ] && [ -d /run/systemd/system ]; }
say() { echo "install: $*"; }

if [ $uninstall = 1 ]; then
  if systemd_runs; then
    systemctl disable --now pvs-evpn.service pvswitchd.service 2>/dev/null || true
  fi
  for f in "$sbindir/pvswitchd" "$sbindir/pvs-evpn" "$bindir/pvswitchctl" "$unit" "$evpn_unit" "$docdir/README.md" \
           "$docdir/DESIGN.md" "$docdir/pvswitch.example.toml" "$docdir/libvirt-qemu-hook"; do
    if [ -e "$destdir$f" ]; then rm -f "$destdir$f"; say "removed $f"; fi
  done
  rmdir "$destdir$docdir" 2>/dev/null || true
  if [ $purge = 1 ]; then
    rm -f "$destdir$confdir/pvswitch.toml" && rmdir "$destdir$confdir" 2>/dev/null || true
    say "removed $confdir"
  elif [ -e "$destdir$confdir/pvswitch.toml" ]; then
    say "kept $confdir/pvswitch.toml (--purge removes it)"
  fi
  if systemd_runs; then systemctl daemon-reload; fi
  exit 0
fi

if [ $build = 1 ]; then
  (cd "$ROOT" && cargo build --release --bins)
fi
for b in pvswitchd pvswitchctl pvs-evpn; do
  [ -x "$ROOT/target/release/$b" ] || { echo "install: $ROOT/target/release/$b not built" >&2; exit 1; }
done
install -D -m 755 "$ROOT/target/release/pvswitchd" "$destdir$sbindir/pvswitchd"
install -D -m 755 "$ROOT/target/release/pvswitchctl" "$destdir$bindir/pvswitchctl"
install -D -m 755 "$ROOT/target/release/pvs-evpn" "$destdir$sbindir/pvs-evpn"
install -D -m 644 "$ROOT/README.md" "$destdir$docdir/README.md"
install -D -m 644 "$ROOT/DESIGN.md" "$destdir$docdir/DESIGN.md"
install -D -m 644 "$ROOT/conf/pvswitch.example.toml" "$destdir$docdir/pvswitch.example.toml"
# libvirt's qemu hook (README "libvirt"): installed where an operator finds it, not enabled.
install -D -m 755 "$ROOT/dist/libvirt-qemu-hook" "$destdir$docdir/libvirt-qemu-hook"
say "installed $sbindir/pvswitchd, $sbindir/pvs-evpn, $bindir/pvswitchctl, $docdir"
if [ -e "$destdir$confdir/pvswitch.toml" ]; then
  say "kept the existing $confdir/pvswitch.toml"
else
  install -D -m 644 "$ROOT/conf/pvswitch.toml" "$destdir$confdir/pvswitch.toml"
  say "installed $confdir/pvswitch.toml (every option: $docdir/pvswitch.example.toml)"
fi
mkdir -p "$destdir$unitdir"
for u in "pvswitchd.service:$unit" "pvs-evpn.service:$evpn_unit"; do
  src=$ROOT/dist/${u%%:*}.in dst=$destdir${u#*:}
  sed -e "s,@SBINDIR@,$sbindir,g" -e "s,@BINDIR@,$bindir,g" -e "s,@SYSCONFDIR@,$sysconfdir,g" "$src" > "$dst.tmp"
  chmod 644 "$dst.tmp"
  mv "$dst.tmp" "$dst"
done
say "installed $unit and $evpn_unit (EVPN's companion: enable it where FRR runs EVPN)"
if systemd_runs; then
  systemctl daemon-reload
  say "start it with: systemctl enable --now pvswitchd"
fi
