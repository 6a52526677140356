#!/usr/bin/env bash
# What a Redis Cluster primary costs per published snapshot and per subscribed
# seatboard node (operator guide, systemd/README.md). Starts a three-primary
# cluster on free ports, K subscribers that shard-subscribe every course the
# way a seatboard node with an admin connected does (`seatboard analytics`:
# SCAN every primary, SSUBSCRIBE each course on its owner), then
# `seatboard simulate` at RATE snapshots/s for SECS seconds, and reports the
# primaries' summed CPU time (utime+stime from /proc) per published snapshot.
# With PUBSUB=classic the same with PUBLISH/PSUBSCRIBE (broadcast by the cluster).
#
#   benches/cluster_cost.sh [K...]      e.g. benches/cluster_cost.sh 0 1 2 4
#   env: RATE (5000) SECS (10) COURSES (500) PUBSUB (sharded|classic) BIN (target/release/seatboard)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-5000}; SECS=${SECS:-10}; COURSES=${COURSES:-500}; PUBSUB=${PUBSUB:-sharded}
BIN=${BIN:-target/release/seatboard}
[ -x "$BIN" ] || cargo build --release --bin seatboard
dir=$(mktemp -d); pids=(); subs=()
cleanup() { for p in "${subs[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket
while True:
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close()
    if p >= 55000: continue
    b=socket.socket()
    try:
        b.bind(("127.0.0.1",p+10000)); b.close(); print(p); break
    except OSError: pass'; }
ports=()
for _ in 1 2 3; do
  p=$(free_port); ports+=("$p")
  redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "nodes-$p.conf" \
    --dir "$dir" --save "" --appendonly no --client-output-buffer-limit pubsub 0 0 0 >/dev/null 2>&1 &
  pids+=($!)
done
for p in "${ports[@]}"; do until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.05; done; done
redis-cli --cluster create $(for p in "${ports[@]}"; do echo "127.0.0.1:$p"; done) --cluster-replicas 0 --cluster-yes >/dev/null
for p in "${ports[@]}"; do until redis-cli -p "$p" cluster info | grep -q cluster_state:ok; do sleep 0.1; done; done
uri=$(for p in "${ports[@]}"; do printf 'redis://127.0.0.1:%s,' "$p"; done); uri=${uri%,}
cpu_us() { local t=0; for pid in "${pids[@]}"; do
  read -r -a f < <(cut -d')' -f2 "/proc/$pid/stat"); t=$((t + f[11] + f[12])); done
  echo $((t * 1000000 / $(getconf CLK_TCK))); }
# Seed every course once so the subscribers' SCAN finds them all.
"$BIN" simulate --redis "$uri" --pubsub "$PUBSUB" --rate 20000 --courses "$COURSES" --duration 1 >/dev/null
printf '%-6s %-8s %12s %10s %16s\n' pubsub subs published seconds primary_us/snap
ks=("$@"); [ ${#ks[@]} -gt 0 ] || ks=(0 1 2 4)
for k in "${ks[@]}"; do
  for ((i = ${#subs[@]}; i < k; i++)); do
    "$BIN" analytics --redis "$uri" --pubsub "$PUBSUB" --session "cost$i" --log-level error &
    subs+=($!)
  done
  sleep 2
  c0=$(cpu_us)
  out=$("$BIN" simulate --redis "$uri" --pubsub "$PUBSUB" --rate "$RATE" --courses "$COURSES" --duration "$SECS")
  c1=$(cpu_us)
  n=$(sed -n 's/.* published \([0-9]*\), .*/\1/p' <<<"$out")
  printf '%-6s %-8s %12s %10s %16.1f\n' "$PUBSUB" "$k" "$n" "$SECS" "$(echo "($c1 - $c0) / $n" | bc -l)"
done
