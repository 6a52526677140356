#!/usr/bin/env python3
"""What the load generator itself costs per viewer: CPU per delivered frame
and resident memory per viewer of the viewer processes, measured from /proc
while the server fans a hot course out to them.

Two loads, alternated in rounds on the same box:

- `fanout`: the bench suite's `fanout` scenario (one course, every viewer
  watching it, one update per tick) with this build's suite binary and, with
  `--before SUITE`, another build's (say, the bench before its load generator
  moved into the product); the viewer processes are the suite's `__loadgen`
  children.
- `rehearse`: `seatboard rehearse` against one local node and redis-server,
  set up as the same load (`--courses 1`, five publishes a second, so every
  viewer gets the fan-out's frames); the viewer processes are the rehearse
  process and its children.

Prints a table and writes the figures as JSON (target/bench/loadgen_cost.json).

    benches/loadgen_cost.py [--before SUITE] [--clients 10000] [--seconds 10] [--rounds 2]
    env: SUITE (this build's suite binary: the newest target/release/deps/suite-*),
         BIN (target/release/seatboard)
"""
import argparse
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TCK = os.sysconf("SC_CLK_TCK")


def children_of(root):
    """Every live descendant pid of `root`, and `root`."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    parent[int(d)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = {root}, [root]
    while todo:
        p = todo.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                out.add(c)
                todo.append(c)
    return out


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def cpu_s(pids):
    """Summed user+system CPU seconds of `pids` (those still alive)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / TCK


def rss_bytes(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
            total += int(m.group(1)) * 1024 if m else 0
        except OSError:
            pass
    return total


def window(pids, secs):
    """CPU seconds used by `pids` over `secs`, and their largest summed RSS
    (sampled every half second)."""
    c0 = cpu_s(pids)
    end = time.time() + secs
    rss = 0
    while time.time() < end:
        time.sleep(min(0.5, max(end - time.time(), 0)))
        rss = max(rss, rss_bytes(pids))
    return cpu_s(pids) - c0, rss


def wait_for(pred, secs, what):
    end = time.time() + secs
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    sys.exit(f"loadgen_cost: timed out waiting for {what}")


def fanout_round(suite, clients, secs):
    """One `fanout` run; returns (cpu s per frame, rss per viewer) of its viewers."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [suite, "--bench", "fanout", "--clients", str(clients), "--seconds", str(secs + 4), "--no-floor"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    def viewers():
        return [p for p in children_of(proc.pid) if "__loadgen" in cmdline(p)]

    def progress():
        log.seek(0)
        return re.search(rb"\[fanout\] 2/", log.read()) is not None

    wait_for(progress, 300, "the fan-out's steady window")
    pids = viewers()
    cpu, rss = window(pids, secs)
    proc.wait(timeout=600)
    log.seek(0)
    text = log.read().decode(errors="replace")
    m = re.search(r"frames_per_s\s+(\d+)", text)
    if not m or proc.returncode != 0:
        sys.exit(f"loadgen_cost: fanout with {suite} failed:\n{text[-2000:]}")
    frames = float(m.group(1)) * secs
    return cpu / frames, rss / clients, cpu / secs


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def http_ok(port, path):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def rehearse_round(binary, clients, secs):
    """One rehearsal against a fresh node; returns (cpu s per frame, rss per viewer)."""
    tmp = tempfile.mkdtemp(prefix="loadgen-cost-")
    rport, sport = free_port(), free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
    server = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{sport}", "--redis", f"redis://127.0.0.1:{rport}",
         "--auth", "none", "--accept-rate", "1000000", "--accept-burst", "1000000", "--max-connections", "1000000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: http_ok(sport, "/readyz"), 30, "the node's /readyz")
        ramp = clients / 2000
        out = os.path.join(tmp, "rehearse.json")
        proc = subprocess.Popen(
            [binary, "rehearse", "--target", f"http://127.0.0.1:{sport}", "--redis", f"redis://127.0.0.1:{rport}",
             "--viewers", str(clients), "--connect-rate", "2000", "--courses", "1", "--publish-rate", "5",
             "--duration", str(int(ramp) + secs + 10), "--p99-ms", "100000", "--json", out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: metric(sport, "seatboard_connections") >= clients, 120 + ramp, "every viewer connected")
        time.sleep(2)
        pids = children_of(proc.pid)
        m0 = metric(sport, "seatboard_frames_sent_total")
        cpu, rss = window(pids, secs)
        frames = metric(sport, "seatboard_frames_sent_total") - m0
        proc.wait(timeout=600)
        with open(out) as f:
            report = json.load(f)
        if report.get("viewers", 0) < clients:
            sys.exit(f"loadgen_cost: the rehearsal connected {report.get('viewers')} of {clients}")
        return cpu / max(frames, 1), rss / clients, cpu / secs
    finally:
        server.terminate()
        redis.terminate()
        server.wait(timeout=60)
        redis.wait(timeout=60)


def metric(port, name):
    """Metric `name` of the node's /metrics, summed over its labels (0 while
    the node does not answer)."""
    body = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while True:
                b = s.recv(65536)
                if not b:
                    break
                body += b
    except OSError:
        return 0.0
    total = 0.0
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="another build's bench suite binary, for its __loadgen")
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    suites = sorted(glob.glob(os.path.join(ROOT, "target/release/deps/suite-*[!.d]")), key=os.path.getmtime)
    suite = os.environ.get("SUITE") or (suites[-1] if suites else None)
    binary = os.environ.get("BIN", os.path.join(ROOT, "target/release/seatboard"))
    if not suite or not os.access(binary, os.X_OK):
        sys.exit("loadgen_cost: build first: cargo bench --bench suite --no-run && cargo build --release")
    loads = [("fanout, this build", lambda: fanout_round(suite, a.clients, a.seconds))]
    if a.before:
        loads.append(("fanout, --before", lambda: fanout_round(a.before, a.clients, a.seconds)))
    loads.append(("rehearse", lambda: rehearse_round(binary, a.clients, a.seconds)))
    runs = {name: [] for name, _ in loads}
    for r in range(a.rounds):
        for name, run in loads:
            per_frame, per_viewer, cores = run()
            runs[name].append({"cpu_us_per_frame": per_frame * 1e6, "rss_bytes_per_viewer": per_viewer, "cpu_cores": cores})
            print(f"  .. round {r + 1} {name}: {per_frame * 1e6:.2f} us/frame, {per_viewer:.0f} B/viewer", flush=True)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    summary = {
        name: {k: med([x[k] for x in xs]) for k in xs[0]} for name, xs in runs.items()
    }
    base = summary["fanout, --before" if a.before else "fanout, this build"]
    print(f"\n== loadgen_cost ({a.clients} viewers, {a.seconds} s windows, {a.rounds} rounds, median) ==")
    print(f"  {'viewers':22s} {'CPU per frame':>15s} {'RSS per viewer':>16s} {'cores':>6s}  against {'--before' if a.before else 'this build'}")
    for name, s in summary.items():
        ratio = s["cpu_us_per_frame"] / base["cpu_us_per_frame"]
        mem = s["rss_bytes_per_viewer"] / base["rss_bytes_per_viewer"]
        print(f"  {name:22s} {s['cpu_us_per_frame']:12.2f} us {s['rss_bytes_per_viewer']:13.0f} B {s['cpu_cores']:6.2f}  {ratio:.2f}x CPU, {mem:.2f}x memory")
    os.makedirs(os.path.join(ROOT, "target/bench"), exist_ok=True)
    path = os.path.join(ROOT, "target/bench/loadgen_cost.json")
    with open(path, "w") as f:
        json.dump({"clients": a.clients, "seconds": a.seconds, "runs": runs, "median": summary}, f, indent=1)
    print(f"  -> {path}")


if __name__ == "__main__":
    main()
