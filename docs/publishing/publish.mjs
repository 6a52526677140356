// Publish one seat snapshot the way seatboard expects (node-redis).
// Usage: node publish.mjs REDIS_URL standalone|cluster COURSE SECTION TOTAL TAKEN VERSION SCRIPT_FILE
// The script text is what `seatboard publish-script` prints.
import { readFileSync } from 'node:fs';
import { createClient, createCluster, defineScript } from 'redis';

const [url, mode, course, section, total, taken, version, scriptFile] = process.argv.slice(2);
const cas = defineScript({
  NUMBER_OF_KEYS: 1,
  SCRIPT: readFileSync(scriptFile ?? 'script.lua', 'utf8'),
  transformArguments: (key, field, payload, v) => [key, field, payload, v],
  transformReply: (reply) => reply,
});
const options = { scripts: { cas } };
const cluster = mode === 'cluster';
const r = cluster
  ? createCluster({ rootNodes: [{ url }], ...options })
  : createClient({ url, ...options });
await r.connect();
const payload = JSON.stringify({
  course, section: Number(section), total_seats: Number(total),
  seats_taken: Number(taken), version: Number(version), ts: Date.now(),
});
try {
  // Hash first (compare-and-set by EVALSHA, EVAL on NOSCRIPT), then the channel.
  await r.cas(`seatstate:${course}`, section, payload, version ?? '');
  if (cluster) await r.sPublish(`seats:${course}`, payload);
  else await r.publish(`seats:${course}`, payload);
} catch (e) {
  // In the selection API: count it and go on; never fail the seat request.
  console.error('publish failed:', e.message);
  process.exitCode = 1;
}
await r.quit();
