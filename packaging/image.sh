#!/usr/bin/env bash
# Builds the OCI image of packaging/Containerfile from an already built binary
# of this machine's architecture, with buildah (nothing is pulled: the base is
# scratch plus the binary's own shared libraries, taken from this machine):
#   packaging/image.sh <path/to/seatboard> [name]     -> prints the image's name
# Release: cargo build --release && packaging/image.sh target/release/seatboard
# Then: buildah push <name> docker://registry.example.edu/seatboard:<v>
# BUILDAH_OPTS are passed before `build` (e.g. --root/--runroot/--storage-driver).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${1:?usage: packaging/image.sh <path/to/seatboard> [name]}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name=${2:-localhost/seatboard:$version}

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
install -d -m 0755 "$root/usr/bin" "$root/etc/ssl/certs" "$root/tmp"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/usr/bin/seatboard"
strip "$root/usr/bin/seatboard"
# The loader and every library the binary loads, at the paths ldd names.
ldd "$binary" | grep -o '/[^ ]*' | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
# The trust roots (rustls-native-certs reads the system bundle).
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nseatboard:x:65532:65532:seatboard:/nonexistent:/sbin/nologin\n' \
  > "$root/etc/passwd"
printf 'root:x:0:\nseatboard:x:65532:\n' > "$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"

cp packaging/Containerfile "$ctx/Containerfile"
# shellcheck disable=SC2086
buildah ${BUILDAH_OPTS:-} build --quiet --format oci --layers=false \
  -f "$ctx/Containerfile" -t "$name" "$ctx" >/dev/null
echo "$name"
