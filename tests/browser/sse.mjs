// A plain EventSource on the university's own page, on another origin:
//   node sse.mjs <seatboardBaseUrl> <hostPort> <screenshotPath> [quietMs]
// with the HS256 secret in SEATBOARD_JWT_SECRET.
//
// This script serves the host page on http://127.0.0.1:<hostPort> (another
// origin than seatboard's) with a /token endpoint, as the university's
// backend would. The page opens `new EventSource(<sb>/sse?course=CS101&token=…,
// { withCredentials: true })`, which Chromium allows only when the answer
// carries the CORS headers for that origin. The Rust test that runs it has
// published CS101 section 1 at 4/10 taken, and answers
// "PUBLISH <course> <section> <total> <taken>" with "OK".
//
// Checks: hello, then a full frame of CS101 with section 1 at 4 taken, and
// its presence; a publish arrives as a live frame; with quietMs, the stream
// stays open through that long a quiet spell (keepalive comments, a proxy's
// timeouts) and still delivers the next publish without reconnecting. Then
// the client module with `transport: "auto"` on a page whose WebSockets are
// all closed before they reach the server (as a proxy that breaks upgrades
// would): it falls back to /sse and its <seat-count> follows a publish.
import { createServer } from 'node:http';
import { createHmac } from 'node:crypto';
import { run, openPage, ask } from './lib.mjs';

const [rawSb, hostPort, shot, quiet] = process.argv.slice(2);
const sb = (rawSb || '').replace(/\/+$/, '');
const quietMs = Number(quiet || 0);
const secret = process.env.SEATBOARD_JWT_SECRET || '';
const host = `http://127.0.0.1:${hostPort}`;
const STEP_MS = 20_000;

const b64 = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');
function mint() {
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub: 'sse-student', role: 'student', exp: Math.floor(Date.now() / 1000) + 600 })}`;
  return `${body}.${createHmac('sha256', secret).update(body).digest('base64url')}`;
}

const PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Seats over SSE</title><link rel="icon" href="data:,">
<script type="module" src="/site.js"></script></head>
<body><main><h1>CS101</h1><pre id="log"></pre></main></body></html>`;

const SITE_JS = `const token = await (await fetch("/token", { cache: "no-store" })).text();
const test = { events: [], opens: 0, errors: 0 };
window.__sse = test;
const es = new EventSource("${sb}/sse?course=CS101&token=" + encodeURIComponent(token), { withCredentials: true });
es.addEventListener("open", () => { test.opens += 1; });
es.addEventListener("error", () => { test.errors += 1; });
for (const type of ["hello", "frame", "presence", "reconnect"]) {
  es.addEventListener(type, (e) => {
    test.events.push({ type, data: JSON.parse(e.data) });
    document.getElementById("log").textContent += type + " " + e.data + "\\n";
  });
}
`;

const CLIENT_PAGE = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Seats, auto transport</title><link rel="icon" href="data:,">
<script type="module">
import { connect } from "${sb}/client.js";
const client = connect({ url: "${sb}", transport: "auto", token: async () => (await fetch("/token", { cache: "no-store" })).text() });
window.__client = client;
</script></head>
<body><main><h1>CS101</h1><p>Section 1: <seat-count id="c" course="CS101" section="1"></seat-count></p></main></body></html>`;

const server = createServer((req, res) => {
  const path = new URL(req.url, host).pathname;
  const send = (type, body) => { res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-store' }); res.end(body); };
  if (path === '/') send('text/html; charset=utf-8', PAGE);
  else if (path === '/site.js') send('text/javascript', SITE_JS);
  else if (path === '/token') send('text/plain', mint());
  else if (path === '/client') send('text/html; charset=utf-8', CLIENT_PAGE);
  else { res.writeHead(404); res.end(); }
});
await new Promise((resolve) => server.listen(Number(hostPort), '127.0.0.1', resolve));

const waitFor = (page, what, fn, arg) => page.waitForFunction(fn, arg, { timeout: STEP_MS, polling: 50 })
  .catch((e) => { throw new Error(`${what}: ${e.message.split('\n')[0]}`); });
const liveFrame = (taken) => waitFor(pageRef, `a live frame with section 1 at ${taken} taken`, (n) =>
  window.__sse.events.some((e) => e.type === 'frame' && !e.data.full
    && e.data.sections.some((s) => s.section === 1 && s.seats_taken === n)), taken);
let pageRef = null;

await run('sse', 120_000 + quietMs, async (t) => {
  const context = await t.browser.newContext({ ignoreHTTPSErrors: true });
  t.step = 'open the host page';
  const page = await openPage(t, context, `${host}/`, 'host');
  pageRef = page;
  // The page's own origin and seatboard's: nothing else.
  page.offHost.length = 0;
  await page.goto(`${host}/`);
  t.step = 'hello, the full frame and presence';
  await waitFor(page, 'hello, full frame and presence', () => {
    const ev = window.__sse.events;
    const full = ev.findIndex((e) => e.type === 'frame' && e.data.full && e.data.course === 'CS101');
    return ev[0]?.type === 'hello' && ev[0].data.user === 'sse-student' && full > 0
      && ev[full].data.sections.some((s) => s.section === 1 && s.seats_taken === 4)
      && ev.slice(full + 1).some((e) => e.type === 'presence' && e.data.viewers >= 1);
  });
  t.step = 'a live frame';
  if ((await ask('PUBLISH CS101 1 10 5')) !== 'OK') throw new Error('publish failed');
  await liveFrame(5);
  if (quietMs > 0) {
    t.step = `a quiet spell of ${quietMs} ms`;
    await page.waitForTimeout(quietMs);
    if ((await ask('PUBLISH CS101 1 10 6')) !== 'OK') throw new Error('publish failed');
    await liveFrame(6);
  }
  const s = await page.evaluate(() => ({ opens: window.__sse.opens, errors: window.__sse.errors }));
  if (s.opens !== 1 || s.errors !== 0) throw new Error(`the stream reconnected: ${JSON.stringify(s)}`);
  const foreign = page.offHost.filter((u) => !u.startsWith(sb) && !u.startsWith(host));
  if (foreign.length) throw new Error(`requests to a third host: ${foreign.join(' ')}`);
  if (t.log.some((l) => l.includes('console.error'))) throw new Error(`console errors: ${t.log.join(' | ')}`);
  t.say(`events: ${(await page.evaluate(() => window.__sse.events.map((e) => e.type).join(' ')))}`);

  t.step = 'the client module falls back to SSE';
  const cp = await openPage(t, context, `${host}/`, 'client');
  let wsTries = 0;
  const streams = [];
  await cp.routeWebSocket(/\/ws/, (ws) => { wsTries += 1; ws.close({ code: 1006 }); });
  cp.on('request', (r) => { if (new URL(r.url()).pathname === '/sse') streams.push(r.url()); });
  await cp.goto(`${host}/client`);
  const left = (n) => waitFor(cp, `<seat-count> shows ${n} seats left`, (want) =>
    document.getElementById('c')?.dataset.seatsLeft === String(want), n);
  await left(quietMs > 0 ? 4 : 5);
  if (wsTries < 2) throw new Error(`SSE before two failed WebSocket attempts (${wsTries})`);
  if (!streams.some((u) => u.includes('course=CS101'))) throw new Error(`no /sse stream: ${streams.join(' ')}`);
  if ((await ask('PUBLISH CS101 1 10 8')) !== 'OK') throw new Error('publish failed');
  await left(2);
  t.say(`client on SSE after ${wsTries} WebSocket attempts`);
  t.step = 'screenshot';
  await cp.screenshot({ path: shot });
});
