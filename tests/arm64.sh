#!/usr/bin/env bash
# Cross-builds the release binary for aarch64 (AWS Graviton) and runs an
# integration smoke of it under qemu-user: `serve` on Redis, a client watches,
# frames arrive. qemu does not emulate io_uring, so the epoll driver runs.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
if [ ${#need[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || rustup target add aarch64-unknown-linux-gnu

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
cargo build --release --target aarch64-unknown-linux-gnu --bin seatboard
bin=target/aarch64-unknown-linux-gnu/release/seatboard

export SEATBOARD_BIN="$PWD/$bin"
export SEATBOARD_BIN_WRAPPER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$SEATBOARD_BIN" --version
cargo test --test arm64_smoke
