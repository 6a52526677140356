#!/usr/bin/env bash
# The Debian root the booted-systemd test (tests/it/systemd_boot.rs) boots with
# systemd-nspawn: bookworm made by debootstrap once and cached, keyed by a hash
# of its package list, suite, mirror and architecture, so a warm run reuses it.
#   tests/boot_root.sh            -> prints the root's path (building it if missing)
# SEATBOARD_BOOT_CACHE (default /var/cache/seatboard-test) is where roots are
# kept; DEBIAN_MIRROR (default http://deb.debian.org/debian) where they come from.
set -euo pipefail

suite=bookworm
packages=systemd,systemd-sysv,dbus,adduser,socat,procps
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${SEATBOARD_BOOT_CACHE:-/var/cache/seatboard-test}
arch=$(dpkg --print-architecture)
key=$(printf '%s\n' "$suite" "$packages" "$mirror" "$arch" | sha256sum | cut -c1-16)
root="$cache/$suite-$key"

if [ ! -x "$root/lib/systemd/systemd" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.build-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "boot_root: debootstrap $suite into $root (once; later runs reuse it)" >&2
  debootstrap --variant=minbase --include="$packages" "$suite" "$tmp/root" "$mirror" >&2
  # No login prompt on the container's console: the test reaches it with nsenter.
  ln -sf /dev/null "$tmp/root/etc/systemd/system/console-getty.service"
  # Another run may have finished first: keep the root already there.
  mv -T "$tmp/root" "$root" 2>/dev/null || true
fi
echo "$root"
