#!/usr/bin/env bash
# Builds an RPM for Amazon Linux 2023 from an already built binary, with
# rpmbuild only (no spec sources to fetch, no cargo tool to compile):
#   packaging/rpm.sh <x86_64|aarch64> <path/to/seatboard> [outdir]   -> prints the .rpm path
# The binary needs glibc <= 2.34 (AL2023's); this script refuses a newer one.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:?usage: packaging/rpm.sh <x86_64|aarch64> <binary> [outdir]}
binary=${2:?usage: packaging/rpm.sh <x86_64|aarch64> <binary> [outdir]}
outdir=${3:-target/pkg}
case "$arch" in
  x86_64)  elf="X86-64";  strip=${STRIP:-strip} ;;
  aarch64) elf="AArch64"; strip=${STRIP:-aarch64-linux-gnu-strip} ;;
  *) echo "rpm.sh: unknown architecture $arch (x86_64 or aarch64)" >&2; exit 2 ;;
esac
readelf -h "$binary" | grep -q "Machine:.*$elf" || { echo "rpm.sh: $binary is not an $arch binary" >&2; exit 2; }
glibc=$(readelf --version-info -W "$binary" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -Vu | tail -1)
if [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | tail -1)" != 2.34 ]; then
  echo "rpm.sh: $binary needs glibc $glibc; Amazon Linux 2023 has 2.34" >&2
  exit 2
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
src="$stage/src"
install -d "$src"
install -m 0755 "$binary" "$src/seatboard"
"$strip" "$src/seatboard"
cp systemd/seatboard.service systemd/seatboard-analytics.service systemd/seatboard.env.example \
  systemd/seatboard@.service systemd/seatboard-analytics@.service systemd/seatboard-relay.service \
  systemd/seatboard-reconcile.service systemd/99-seatboard.conf systemd/monitoring/* packaging/copyright "$src/"
cp systemd/README.md "$src/README.md"
cp README.md "$src/OVERVIEW.md"
mkdir -p "$src/haproxy" "$src/instances"
cp systemd/instances/* "$src/instances/"
[ ! -d systemd/haproxy ] || cp systemd/haproxy/* "$src/haproxy/"

cat > "$stage/seatboard.spec" <<SPEC
Name:           seatboard
Version:        $version
Release:        1.amzn2023
Summary:        Realtime seat board hub for university section selection
License:        MIT or Apache-2.0
Requires:       glibc >= $glibc
AutoReqProv:    no
%global debug_package %{nil}
%global __os_install_post %{nil}

%description
seatboard subscribes to the selection API's seat snapshots in Redis and renders
them over WebSocket to tens of thousands of browsers, thread per core. Ships the
hub, analytics, publish relay and reconciler units, their environment file, a sysctl drop-in, a Grafana
dashboard and Prometheus alert rules.

%install
install -D -m 0755 %{_sourcedir}/seatboard %{buildroot}/usr/bin/seatboard
install -D -m 0644 %{_sourcedir}/seatboard.service %{buildroot}/usr/lib/systemd/system/seatboard.service
install -D -m 0644 %{_sourcedir}/seatboard-analytics.service %{buildroot}/usr/lib/systemd/system/seatboard-analytics.service
install -D -m 0644 %{_sourcedir}/seatboard@.service %{buildroot}/usr/lib/systemd/system/seatboard@.service
install -D -m 0644 %{_sourcedir}/seatboard-analytics@.service %{buildroot}/usr/lib/systemd/system/seatboard-analytics@.service
install -D -m 0644 %{_sourcedir}/seatboard-relay.service %{buildroot}/usr/lib/systemd/system/seatboard-relay.service
install -D -m 0644 %{_sourcedir}/seatboard-reconcile.service %{buildroot}/usr/lib/systemd/system/seatboard-reconcile.service
install -D -m 0600 %{_sourcedir}/seatboard.env.example %{buildroot}/etc/seatboard/seatboard.env
install -D -m 0644 %{_sourcedir}/99-seatboard.conf %{buildroot}/etc/sysctl.d/99-seatboard.conf
install -d %{buildroot}/usr/share/doc/seatboard/monitoring
install -m 0644 %{_sourcedir}/README.md %{_sourcedir}/OVERVIEW.md %{_sourcedir}/copyright %{_sourcedir}/seatboard.env.example %{buildroot}/usr/share/doc/seatboard/
cp -r %{_sourcedir}/haproxy %{_sourcedir}/instances %{buildroot}/usr/share/doc/seatboard/
install -m 0644 %{_sourcedir}/seatboard-alerts.yml %{_sourcedir}/seatboard-alerts.test.yml %{_sourcedir}/seatboard-dashboard.json %{buildroot}/usr/share/doc/seatboard/monitoring/

%pre
# The group whose members may send to the relay's socket.
getent group seatboard-publish >/dev/null 2>&1 || groupadd -r seatboard-publish >/dev/null 2>&1 || :

%post
systemctl daemon-reload >/dev/null 2>&1 || :
sysctl -q -p /etc/sysctl.d/99-seatboard.conf >/dev/null 2>&1 || :

%preun
if [ \$1 -eq 0 ]; then
  systemctl stop seatboard.service seatboard-analytics.service seatboard-relay.service seatboard-reconcile.service 'seatboard@*.service' 'seatboard-analytics@*.service' >/dev/null 2>&1 || :
  systemctl disable seatboard.service seatboard-analytics.service seatboard-relay.service seatboard-reconcile.service >/dev/null 2>&1 || :
fi

%postun
systemctl daemon-reload >/dev/null 2>&1 || :

%files
/usr/bin/seatboard
/usr/lib/systemd/system/seatboard.service
/usr/lib/systemd/system/seatboard-analytics.service
/usr/lib/systemd/system/seatboard@.service
/usr/lib/systemd/system/seatboard-analytics@.service
/usr/lib/systemd/system/seatboard-relay.service
/usr/lib/systemd/system/seatboard-reconcile.service
%dir /etc/seatboard
%config(noreplace) /etc/seatboard/seatboard.env
%config(noreplace) /etc/sysctl.d/99-seatboard.conf
/usr/share/doc/seatboard
SPEC

mkdir -p "$outdir"
rpmbuild -bb --quiet --target "$arch" \
  --define "_topdir $stage/top" --define "_sourcedir $src" --define "_rpmdir $stage/out" \
  --define "_build_id_links none" --define "_binary_payload w9.gzdio" \
  "$stage/seatboard.spec" >/dev/null
rpm="$outdir/seatboard-$version-1.amzn2023.$arch.rpm"
mv "$stage/out/$arch/"*.rpm "$rpm"
echo "$rpm"
