// Publish seat snapshots straight to Redis the way seatboard expects (node-redis),
// without a relay: a bounded queue, one background worker, timeouts, counters.
// Usage: node publish.mjs REDIS_URL standalone|cluster COURSE SECTION TOTAL TAKEN VERSION SCRIPT_FILE
// The script text is what `seatboard publish-script` prints.
import { readFileSync } from 'node:fs';
import { createClient, createCluster, defineScript } from 'redis';

export class Publisher {
  // publish() never waits and never throws: a full queue drops the snapshot
  // (counted); the worker counts a failed write and goes on.
  constructor(url, cluster, script, size = 10000) {
    const cas = defineScript({
      NUMBER_OF_KEYS: 1,
      SCRIPT: script, // EVALSHA, then EVAL on NOSCRIPT
      transformArguments: (key, field, payload, v) => [key, field, payload, v],
      transformReply: (reply) => reply,
    });
    const socket = { connectTimeout: 1000, reconnectStrategy: (n) => Math.min(50 * 2 ** n, 2000) };
    const options = { scripts: { cas }, disableOfflineQueue: true };
    this.r = cluster
      ? createCluster({ rootNodes: [{ url }], defaults: { socket }, ...options })
      : createClient({ url, socket, ...options });
    this.r.on('error', () => {}); // reconnects on its own; errors are counted per write
    this.cluster = cluster;
    this.size = size;
    this.queue = [];
    this.published = this.dropped = this.failed = 0;
    this.ready = this.r.connect().catch(() => {});
    this.working = false;
  }

  publish(snapshot) {
    if (this.queue.length >= this.size) {
      this.dropped += 1; // the next change of the section sends it all again
      return;
    }
    this.queue.push(snapshot);
    if (!this.working) this.work();
  }

  async work() {
    this.working = true;
    await this.ready;
    while (this.queue.length > 0) {
      const s = this.queue.shift();
      try {
        await withTimeout(this.write(s), 2000); // a read timeout node-redis lacks
        this.published += 1;
      } catch {
        this.failed += 1; // Redis down, slow or refusing: count it, go on
      }
    }
    this.working = false;
  }

  async write(s) {
    const payload = JSON.stringify(s);
    // Hash first (compare-and-set), then the channel.
    await this.r.cas(`seatstate:${s.course}`, String(s.section), payload, String(s.version ?? ''));
    if (this.cluster) await this.r.sPublish(`seats:${s.course}`, payload);
    else await this.r.publish(`seats:${s.course}`, payload);
  }

  async close() {
    while (this.working) await new Promise((r) => setTimeout(r, 10));
    await this.r.quit().catch(() => {});
  }
}

function withTimeout(promise, ms) {
  let timer;
  const late = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error('timeout')), ms); });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

const [url, mode, course, section, total, taken, version, scriptFile] = process.argv.slice(2);
const p = new Publisher(url, mode === 'cluster', readFileSync(scriptFile, 'utf8'));
p.publish({
  course, section: Number(section), total_seats: Number(total),
  seats_taken: Number(taken), version: Number(version), ts: Date.now(),
});
await p.close();
console.error(`published ${p.published} dropped ${p.dropped} failed ${p.failed}`);
process.exitCode = p.published === 1 ? 0 : 1;
