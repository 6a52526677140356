#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need
# (redis-server, HAProxy, openssl, Chromium, Go, Java, PHP, PostgreSQL, MariaDB, Node packages), then runs every
# test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v chromium >/dev/null 2>&1 || need+=(chromium chromium-driver)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v strace >/dev/null 2>&1 || need+=(strace)
# The fleet tests and bench run HAProxy in front of several nodes; the browser
# test makes a self-signed certificate with openssl.
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v rpmbuild >/dev/null 2>&1 || need+=(rpm)
# tests/redis_freeze.rs partitions a Redis in a network namespace (ip netns, veth).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# tests/it/relay_docs.rs runs docs/publishing.md's relay senders in Go, Java and PHP.
command -v go >/dev/null 2>&1 || need+=(golang-go)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
command -v php >/dev/null 2>&1 || need+=(php-cli)
# tests/it/reconcile.rs starts its own PostgreSQL and MariaDB on free ports.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
# tests/it/systemd_boot.rs boots a Debian root (tests/boot_root.sh, cached under
# /var/cache/seatboard-test) under its own systemd with systemd-nspawn.
command -v systemd-nspawn >/dev/null 2>&1 || need+=(systemd-container)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# On a host run by systemd, nspawn asks it for the container's scope over D-Bus.
if [ -d /run/systemd/system ] && ! command -v dbus-daemon >/dev/null 2>&1; then need+=(dbus); fi
# tests/it/image.rs builds the OCI image with buildah and runs it with podman
# (crun on a unified cgroup hierarchy, runc on a hybrid one).
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v podman >/dev/null 2>&1 || need+=(podman crun)
command -v runc >/dev/null 2>&1 || need+=(runc)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The packages' own database services are not the tests': stopped and kept off.
for svc in postgresql mariadb; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled "$svc" >/dev/null 2>&1; then
    as_root systemctl disable --now "$svc" >/dev/null 2>&1 || true
  fi
  as_root service "$svc" stop >/dev/null 2>&1 || true
done
# promtool (tests/it/monitoring.rs) ships in Debian's prometheus package: take just
# that binary out of it, so no Prometheus server gets installed and started.
if ! command -v promtool >/dev/null 2>&1; then
  echo "installing: promtool (from Debian's prometheus package)"
  [ ${#need[@]} -gt 0 ] || as_root apt-get update -qq
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq prometheus)
  dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -x -C "$tmp" ./usr/bin/promtool
  as_root install -m 0755 "$tmp/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$tmp"
fi

# The metrics test parses /metrics with the reference Python parser.
python3 -c 'import prometheus_client' 2>/dev/null || python3 -m pip install -q prometheus-client
# redis-py and node-redis run docs/publishing.md's examples (tests/it/publishing_docs.rs).
python3 -c 'import redis' 2>/dev/null || python3 -m pip install -q redis
(cd docs/publishing && npm ci --no-audit --no-fund --loglevel=error)

# playwright-core drives the system Chromium (it downloads no browser); axe-core
# is the accessibility checker the browser tests inject. npm ci again whenever a
# package of package.json is missing from node_modules.
if ! (cd tests/browser && node -e 'const fs = require("fs");
  for (const k in require("./package.json").dependencies)
    if (!fs.existsSync("node_modules/" + k + "/package.json")) process.exit(1);') 2>/dev/null; then
  (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi

# Four tests at a time: the integration tests mostly wait on the servers they
# start (their timers, Redis, HAProxy, Chromium), about one core busy over the
# run at four, so on two cores four at a time take half the wall time of two.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"
cargo test --workspace --all-targets "$@"
# The simulator's planted bugs, each of which it must catch (feature
# `planted-bugs`: never in a normal build).
cargo test -p sim --features planted-bugs --test planted
# The shell's tests again on the other runtimes: epoll, and the tokio shell
# (`--driver tokio`, feature `tokio-shell`). `SEATBOARD_DRIVER` is the
# `--driver` of every node a test starts without one of its own.
shell_tests=(front_door:: close_codes:: conformance:: security:: slow_consumer:: write_path::
  page_delivery:: drain:: compression:: demo_board:: storm:: sse:: ws_courses::)
SEATBOARD_DRIVER=epoll cargo test --test it -- "${shell_tests[@]}"
SEATBOARD_DRIVER=tokio cargo test --features tokio-shell --test it -- "${shell_tests[@]}"
