#!/usr/bin/env bash
# Builds the Debian package from an already built binary, with dpkg-deb only
# (no cargo-deb to compile, nothing to download):
#   packaging/deb.sh <amd64|arm64> <path/to/seatboard> [outdir]   -> prints the .deb path
# Release: cargo build --release && packaging/deb.sh amd64 target/release/seatboard
# arm64:   tests/arm64.sh builds it from the cross-built binary.
# DEB_COMPRESS=gzip|xz|none (default xz); STRIP=<strip tool> (default per arch).
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:?usage: packaging/deb.sh <amd64|arm64> <binary> [outdir]}
binary=${2:?usage: packaging/deb.sh <amd64|arm64> <binary> [outdir]}
outdir=${3:-target/pkg}
case "$arch" in
  amd64) elf="X86-64";  strip=${STRIP:-strip} ;;
  arm64) elf="AArch64"; strip=${STRIP:-aarch64-linux-gnu-strip} ;;
  *) echo "deb.sh: unknown architecture $arch (amd64 or arm64)" >&2; exit 2 ;;
esac
readelf -h "$binary" | grep -q "Machine:.*$elf" || { echo "deb.sh: $binary is not an $arch binary" >&2; exit 2; }

# DEB_VERSION overrides the version (a test's newer package to upgrade to).
version=${DEB_VERSION:-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)}
# The newest glibc symbol version the binary needs is the libc6 it depends on.
glibc=$(readelf --version-info -W "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/root"
doc="$root/usr/share/doc/seatboard"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/seatboard" \
  "$root/etc/sysctl.d" "$doc/monitoring" "$doc/instances"
install -m 0755 "$binary" "$root/usr/bin/seatboard"
"$strip" "$root/usr/bin/seatboard"
install -m 0644 systemd/seatboard.service systemd/seatboard-analytics.service \
  systemd/seatboard@.service systemd/seatboard-analytics@.service systemd/seatboard-relay.service \
  systemd/seatboard-reconcile.service "$root/lib/systemd/system/"
install -m 0600 systemd/seatboard.env.example "$root/etc/seatboard/seatboard.env"
install -m 0644 systemd/99-seatboard.conf "$root/etc/sysctl.d/99-seatboard.conf"
install -m 0644 systemd/README.md "$doc/README.md"
install -m 0644 README.md "$doc/OVERVIEW.md"
install -m 0644 systemd/seatboard.env.example "$doc/seatboard.env.example"
install -m 0644 systemd/monitoring/* "$doc/monitoring/"
install -m 0644 systemd/instances/* "$doc/instances/"
install -m 0644 packaging/copyright "$doc/copyright"
if [ -d systemd/haproxy ]; then
  install -d "$doc/haproxy"
  install -m 0644 systemd/haproxy/* "$doc/haproxy/"
fi

installed=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: seatboard
Version: $version
Architecture: $arch
Maintainer: ${DEB_MAINTAINER:-seatboard maintainers <seatboard@localhost>}
Installed-Size: $installed
Depends: libc6 (>= $glibc)
Section: net
Priority: optional
Homepage: file:///usr/share/doc/seatboard/OVERVIEW.md
Description: realtime seat board hub for university section selection
 seatboard subscribes to the selection API's seat snapshots in Redis and
 renders them over WebSocket to tens of thousands of browsers, thread per
 core. Ships the hub, analytics, publish relay and reconciler units, their environment file, a sysctl
 drop-in, a Grafana dashboard and Prometheus alert rules.
CONTROL
printf '%s\n' /etc/seatboard/seatboard.env /etc/sysctl.d/99-seatboard.conf > "$root/DEBIAN/conffiles"
install -m 0755 packaging/debian/postinst packaging/debian/prerm packaging/debian/postrm "$root/DEBIAN/"

mkdir -p "$outdir"
deb="$outdir/seatboard_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"${DEB_COMPRESS:-xz}" --build "$root" "$deb" >/dev/null
echo "$deb"
