"""Publish seat snapshots straight to Redis the way seatboard expects (redis-py),
without a relay: a bounded queue, one background worker, timeouts, counters.

Usage: python3 publish.py REDIS_URL standalone|cluster COURSE SECTION TOTAL TAKEN VERSION SCRIPT_FILE
The script text is what `seatboard publish-script` prints.
"""
import json
import queue
import sys
import threading
import time

import redis
from redis.cluster import RedisCluster


class Publisher:
    """publish() never blocks and never raises: a full queue drops the
    snapshot (counted); the worker counts a failed write and goes on."""

    def __init__(self, url, cluster, script, size=10000):
        timeouts = {"socket_connect_timeout": 1.0, "socket_timeout": 2.0}
        self.r = (RedisCluster.from_url(url, **timeouts) if cluster
                  else redis.Redis.from_url(url, **timeouts))
        self.cas = self.r.register_script(script)  # EVALSHA, loads it again on NOSCRIPT
        self.cluster = cluster
        self.queue = queue.Queue(maxsize=size)
        self.published = self.dropped = self.failed = 0
        threading.Thread(target=self._worker, daemon=True).start()

    def publish(self, snapshot):
        try:
            self.queue.put_nowait(snapshot)
        except queue.Full:
            self.dropped += 1  # the next change of the section sends it all again

    def flush(self, timeout):
        """Waits (at shutdown only) until the queue is written or `timeout` passes."""
        end = time.monotonic() + timeout
        while self.queue.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.01)

    def _worker(self):
        while True:
            s = self.queue.get()
            try:
                self._write(s)
                self.published += 1
            except Exception:  # Redis down, slow or refusing: count it, go on
                self.failed += 1
            finally:
                self.queue.task_done()

    def _write(self, s):
        payload = json.dumps(s, separators=(",", ":"))
        version = s.get("version")
        # Hash first (compare-and-set), then the channel.
        self.cas(keys=["seatstate:" + s["course"]],
                 args=[str(s["section"]), payload, "" if version is None else str(version)])
        if self.cluster:
            self.r.execute_command("SPUBLISH", "seats:" + s["course"], payload)
        else:
            self.r.publish("seats:" + s["course"], payload)


if __name__ == "__main__":
    url, mode, course = sys.argv[1], sys.argv[2], sys.argv[3]
    section, total, taken, version = (int(a) for a in sys.argv[4:8])
    p = Publisher(url, mode == "cluster", open(sys.argv[8]).read())
    p.publish({"course": course, "section": section, "total_seats": total,
               "seats_taken": taken, "version": version, "ts": int(time.time() * 1000)})
    p.flush(5)
    print(f"published {p.published} dropped {p.dropped} failed {p.failed}", file=sys.stderr)
    sys.exit(0 if p.published == 1 else 1)
