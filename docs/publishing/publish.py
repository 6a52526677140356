"""Publish one seat snapshot the way seatboard expects (redis-py).

Usage: python3 publish.py REDIS_URL standalone|cluster COURSE SECTION TOTAL TAKEN VERSION
The script text is what `seatboard publish-script` prints.
"""
import json
import sys
import time

import redis
from redis.cluster import RedisCluster

SCRIPT = open(sys.argv[8] if len(sys.argv) > 8 else "script.lua").read()


def publish(r, cluster, course, section, total, taken, version):
    payload = json.dumps({
        "course": course, "section": section, "total_seats": total,
        "seats_taken": taken, "version": version, "ts": int(time.time() * 1000),
    })
    cas = r.register_script(SCRIPT)  # EVALSHA, loads it again on NOSCRIPT
    # Hash first (compare-and-set), then the channel.
    cas(keys=["seatstate:" + course],
        args=[str(section), payload, "" if version is None else str(version)])
    if cluster:
        r.execute_command("SPUBLISH", "seats:" + course, payload)
    else:
        r.publish("seats:" + course, payload)


if __name__ == "__main__":
    url, mode, course = sys.argv[1], sys.argv[2], sys.argv[3]
    section, total, taken, version = (int(a) for a in sys.argv[4:8])
    cluster = mode == "cluster"
    r = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    try:
        publish(r, cluster, course, section, total, taken, version)
    except redis.RedisError as e:
        # In the selection API: count it and go on; never fail the seat request.
        print("publish failed:", e, file=sys.stderr)
        sys.exit(1)
