#!/usr/bin/env bash
# Cross-builds the release binary for aarch64 (AWS Graviton), packages it
# (.deb and Amazon Linux .rpm, checked by tests/it/package.rs), and runs an
# integration smoke of the packaged binary under qemu-user: `serve` on Redis, a
# client watches, frames arrive. qemu does not emulate io_uring, so the epoll
# driver runs.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
command -v rpmbuild >/dev/null 2>&1 || need+=(rpm)
if [ ${#need[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
cargo build --release --target aarch64-unknown-linux-gnu --bin seatboard
bin=target/aarch64-unknown-linux-gnu/release/seatboard

# The arm64 packages, from that same build; the smoke runs the packaged binary.
deb=$(packaging/deb.sh arm64 "$bin" target/pkg)
rpm=$(packaging/rpm.sh aarch64 "$bin" target/pkg)
dpkg-deb -c "$deb"
rpm -qlp "$rpm"
root=target/pkg/arm64-root
rm -rf "$root"
dpkg-deb -x "$deb" "$root"

export SEATBOARD_BIN="$PWD/$root/usr/bin/seatboard"
export SEATBOARD_BIN_WRAPPER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export SEATBOARD_DEB="$PWD/$deb" SEATBOARD_DEB_ARCH=arm64
export SEATBOARD_RPM="$PWD/$rpm" SEATBOARD_RPM_ARCH=aarch64
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$SEATBOARD_BIN" --version
cargo test --test it -- arm64_smoke:: package::
