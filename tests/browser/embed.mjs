// The client module on the university's own page, on another origin:
//   node embed.mjs <seatboardBaseUrl> <hostPort> <screenshotPath>
// with the HS256 secret in SEATBOARD_JWT_SECRET.
//
// This script serves the host page itself on http://127.0.0.1:<hostPort> (a
// different origin from seatboard's): a course table with <seat-count> cells,
// a <seat-board> of two courses, the host's own strict CSP allowing the
// seatboard origin, and a /token endpoint minting a token the way the
// university's backend would. The Rust test that runs it has published
// CS101 (section 1: 4/10 taken, section 3: 2/2, full) and MATH101 (section 1:
// 10/30); it answers "PUBLISH <course> <section> <total> <taken>" and
// "RESTART" (kill seatboard, start it again on the same port) with "OK".
//
// Checks: "…" before the first frame; numbers live after a publish; one
// WebSocket for every element, one watch per course; the seat-opening alert
// and the `seatopen` event when the full section frees a seat; axe clean on the
// host page; removing elements unwatches what no element needs any more; after
// the server is killed and started again the page reconnects by itself with a
// fresh token and its numbers are live again; a page that only loads the
// module and gives its element a `token` attribute is live too, and the module
// sets no global; no console error; no request to a third host.
import { createServer } from 'node:http';
import { createHmac } from 'node:crypto';
import { run, openPage, axe, requireCsp, ask } from './lib.mjs';

const [rawSb, hostPort, shot] = process.argv.slice(2);
const sb = (rawSb || '').replace(/\/+$/, '');
const secret = process.env.SEATBOARD_JWT_SECRET || '';
const host = `http://127.0.0.1:${hostPort}`;
const sbWs = sb.replace(/^http/, 'ws');
const STEP_MS = 20_000;

const b64 = (v) => Buffer.from(typeof v === 'string' ? v : JSON.stringify(v)).toString('base64url');
let tokensMinted = 0;
function mint() {
  tokensMinted += 1;
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub: 'student-42', role: 'student', exp: Math.floor(Date.now() / 1000) + 600 })}`;
  return `${body}.${createHmac('sha256', secret).update(body).digest('base64url')}`;
}

const CSP = [
  "default-src 'none'",
  `script-src 'self' ${sb}`,
  `connect-src 'self' ${sb} ${sbWs}`,
  "style-src 'self'",
  "img-src 'self' data:",
  "base-uri 'none'",
  "frame-ancestors 'none'",
].join('; ');

const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Course selection · Example University</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/site.css">
<script type="module" src="/site.js"></script>
</head>
<body>
<main>
<h1>Course selection</h1>
<table>
<caption>Your sections</caption>
<thead><tr><th scope="col">Course</th><th scope="col">Section</th><th scope="col">Seats</th></tr></thead>
<tbody>
<tr id="r1"><td>CS101</td><td>1</td><td><seat-count course="CS101" section="1"></seat-count></td></tr>
<tr id="r3"><td>CS101</td><td>3</td><td><seat-count course="CS101" section="3"></seat-count></td></tr>
<tr id="m1"><td>MATH101</td><td>1</td><td><seat-count course="MATH101" section="1"></seat-count></td></tr>
</tbody>
</table>
<seat-board id="board" course="CS101 MATH101"></seat-board>
</main>
</body>
</html>`;

// The host page's own module: configures the shared client before any await.
const SITE_JS = `import { connect } from "${sb}/client.js";
const client = connect({ url: "${sb}", token: async () => (await fetch("/token", { cache: "no-store" })).text() });
const test = { before: document.querySelector("seat-count").shadowRoot.textContent, opened: [], statuses: [], client };
client.addEventListener("seatopen", (e) => test.opened.push(e.detail));
client.addEventListener("status", (e) => test.statuses.push(e.detail.status));
window.__embedTest = test;
`;

// A page that only loads the module and gives its element a token attribute.
const PLAIN_PAGE = () => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sections</title><link rel="icon" href="data:,">
<script type="module" src="${sb}/client.js"></script></head>
<body><main><h1>MATH101</h1><p>Section 1: <seat-count id="m" course="MATH101" section="1" token="${mint()}"></seat-count></p></main></body></html>`;

const SITE_CSS = `body { font: 16px/1.4 system-ui, sans-serif; margin: 16px; color: #1d2127; background: #fff; }
seat-board { --seat-gap: 12px; margin-top: 16px; }
seat-count::part(count) { font-weight: 600; }`;

const server = createServer((req, res) => {
  const path = new URL(req.url, host).pathname;
  const send = (type, body, extra = {}) => { res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-store', ...extra }); res.end(body); };
  if (path === '/') send('text/html; charset=utf-8', PAGE, { 'Content-Security-Policy': CSP });
  else if (path === '/site.js') send('text/javascript', SITE_JS);
  else if (path === '/site.css') send('text/css', SITE_CSS);
  else if (path === '/token') send('text/plain', mint());
  else if (path === '/blank') send('text/html; charset=utf-8', '<!doctype html><title>blank</title>');
  else if (path === '/plain') send('text/html; charset=utf-8', PLAIN_PAGE(), { 'Content-Security-Policy': CSP });
  else { res.writeHead(404); res.end(); }
});
await new Promise((resolve) => server.listen(Number(hostPort), '127.0.0.1', resolve));

const count = (page, row) => page.evaluate((id) => {
  const e = document.querySelector(`#${id} seat-count`);
  return e ? { text: e.shadowRoot.textContent.trim(), left: e.dataset.seatsLeft ?? null } : null;
}, row);
const boardSection = (page, course, n) => page.evaluate(([c, n]) => {
  const root = document.getElementById('board')?.shadowRoot;
  const e = root?.querySelector(`[data-course="${c}"] [data-section="${n}"]`);
  return e ? e.textContent.replace(/\s+/g, ' ').trim() : null;
}, [course, n]);
const waitFor = (page, what, fn, arg) => page.waitForFunction(fn, arg, { timeout: STEP_MS, polling: 50 })
  .catch((e) => { throw new Error(`${what}: ${e.message.split('\n')[0]}`); });
const countIs = (page, row, text) => waitFor(page, `#${row} shows ${text}`,
  ([id, want]) => document.querySelector(`#${id} seat-count`)?.shadowRoot.textContent.trim() === want, [row, text]);

async function publish(course, sec, total, taken) {
  const answer = await ask(`PUBLISH ${course} ${sec} ${total} ${taken}`);
  if (answer !== 'OK') throw new Error(`publish ${course} ${sec}: test answered ${answer}`);
}

await run('embed', 120_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1000, height: 900 } });
  const page = await openPage(t, context, host, 'host');
  const errors = [];
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') errors.push(m.text()); });
  page.on('pageerror', (e) => errors.push(e.message));
  const sockets = [];
  page.on('websocket', (ws) => {
    const s = { url: ws.url(), sent: [] };
    sockets.push(s);
    ws.on('framesent', (f) => { try { s.sent.push(JSON.parse(f.payload)); } catch (_) { s.sent.push(f.payload); } });
  });
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));

  t.step = 'open the host page on another origin';
  requireCsp(await page.goto(`${host}/`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${host}/`);
  await waitFor(page, 'the host module ran', () => !!window.__embedTest);
  const before = await page.evaluate(() => window.__embedTest.before);
  if (before !== '\u2026') throw new Error(`before the first frame a cell shows ${JSON.stringify(before)}, want "…"`);

  t.step = 'cells and board show the published numbers';
  await countIs(page, 'r1', '6 seats left');
  await countIs(page, 'r3', 'Full');
  await countIs(page, 'm1', '20 seats left');
  const r3 = await count(page, 'r3');
  if (r3.left !== '0') throw new Error(`data-seats-left of a full section: ${r3.left}`);
  await waitFor(page, 'the board shows both courses with viewers', () => {
    const root = document.getElementById('board').shadowRoot;
    return ['CS101', 'MATH101'].every((c) => root.querySelector(`[data-course="${c}"] [data-section="1"]`)
      && /^\d+ viewing$/.test(root.querySelector(`[data-course="${c}"] [part~="viewers"]`).textContent));
  });
  const s1 = await boardSection(page, 'CS101', 1);
  if (!/6 seats left/.test(s1) || !/4 \/ 10 taken/.test(s1)) throw new Error(`board CS101 section 1: ${s1}`);
  const live = await page.evaluate(() => [...document.querySelectorAll('*')].map((e) => e.shadowRoot).filter(Boolean)
    .flatMap((r) => [...r.querySelectorAll('[aria-live], [role="status"], [role="log"]')]).length);
  if (live) throw new Error(`${live} live regions in the elements; only seat-opening alerts may announce`);
  t.say(`cells: 6 seats left / Full / 20 seats left; board live (token endpoint asked ${tokensMinted}x)`);

  // Watched: named in the upgrade, or sent as a watch message.
  const watched = (s) => [...new URL(s.url).searchParams.getAll('course'), ...s.sent.filter((m) => m.op === 'watch').map((m) => m.course)].sort();
  t.step = 'one WebSocket for every element, one watch per course';
  if (sockets.length !== 1) throw new Error(`${sockets.length} WebSockets, want 1`);
  const wsUrl = new URL(sockets[0].url);
  if (wsUrl.origin.replace(/^ws/, 'http') !== sb || !wsUrl.searchParams.get('token')) throw new Error(`socket ${sockets[0].url}`);
  const watches = watched(sockets[0]);
  if (watches.join(',') !== 'CS101,MATH101') throw new Error(`watched: ${watches}`);

  t.step = 'numbers live after seatboard publish';
  await publish('CS101', 1, 10, 5);
  await countIs(page, 'r1', '5 seats left');
  await waitFor(page, 'the board follows', () => /5 seats left/.test(document.getElementById('board').shadowRoot
    .querySelector('[data-course="CS101"] [data-section="1"]').textContent));

  t.step = 'a full section frees a seat: the alert and the seatopen event';
  await publish('CS101', 3, 2, 1);
  await countIs(page, 'r3', '1 seat left');
  await waitFor(page, 'role=alert naming course and section', () => [...document.getElementById('board').shadowRoot
    .querySelectorAll('[role="alert"]')].some((a) => a.textContent.includes('CS101 \u00b7 Section 3: 1 seat open')));
  const opened = await page.evaluate(() => window.__embedTest.opened);
  if (JSON.stringify(opened) !== JSON.stringify([{ course: 'CS101', section: 3, seats_left: 1 }])) throw new Error(`seatopen events: ${JSON.stringify(opened)}`);
  t.say('alert "CS101 · Section 3: 1 seat open" and one seatopen event');

  t.step = 'axe on the host page';
  const r = await axe(page, 'the host page');
  t.say(`axe: 0 violations, ${r.passes?.length ?? 'n/a'} rules passed`);
  await page.screenshot({ path: shot, fullPage: true });

  t.step = 'heading-level set by a script after course, then changed';
  const levels = await page.evaluate(() => {
    const b = document.createElement('seat-board');
    b.setAttribute('course', 'CS101');
    document.body.append(b);
    b.setAttribute('heading-level', '3');
    const first = b.shadowRoot.querySelector('[part~="title"]').localName;
    b.setAttribute('heading-level', '4');
    const then = b.shadowRoot.querySelector('[part~="title"]').localName;
    b.remove();
    return [first, then].join(',');
  });
  if (levels !== 'h3,h4') throw new Error(`headings after heading-level 3 then 4: ${levels}`);

  t.step = 'removing elements unwatches what no element needs any more';
  await page.evaluate(() => { document.getElementById('board').remove(); document.getElementById('m1').remove(); });
  for (let i = 0; i < 200 && !sockets[0].sent.some((m) => m.op === 'unwatch'); i++) await page.waitForTimeout(25);
  const unwatched = sockets[0].sent.filter((m) => m.op === 'unwatch').map((m) => m.course);
  if (unwatched.join(',') !== 'MATH101') throw new Error(`unwatch messages: ${unwatched} (CS101 is still shown by two cells)`);
  const courses = await page.evaluate(() => window.__embedTest.client.courses().sort());
  if (courses.join(',') !== 'CS101') throw new Error(`client watches ${courses}`);
  if (errors.length) throw new Error(`console: ${errors.join(' | ')}`);

  t.step = 'the server is killed and started again: the page comes back by itself';
  const minted = tokensMinted;
  const outageFrom = errors.length;
  const answer = await ask('RESTART');
  if (answer !== 'OK') throw new Error(`restart: ${answer}`);
  await waitFor(page, 'live again on a new WebSocket', () => window.__embedTest.client.status === 'live'
    && window.__embedTest.statuses.includes('reconnecting'), null);
  if (sockets.length < 2) throw new Error(`${sockets.length} WebSockets after the restart`);
  // While the node is down the browser itself logs each refused connection
  // (and, in auto mode, the refused SSE attempt); nothing else may be logged.
  const refused = /WebSocket connection to .* failed|Failed to load resource|^Access to resource at '[^']*\/sse\?/;
  const outage = errors.splice(outageFrom);
  const other = outage.filter((e) => !refused.test(e));
  if (other.length) throw new Error(`console while reconnecting: ${other.join(' | ')}`);
  const last = sockets.at(-1);
  const rewatched = watched(last);
  if (rewatched.join(',') !== 'CS101') throw new Error(`watches after the restart: ${rewatched}`);
  if (tokensMinted <= minted) throw new Error('the token function was not asked again on reconnect');
  await publish('CS101', 1, 10, 7);
  await countIs(page, 'r1', '3 seats left');
  t.say(`back live after the restart (${sockets.length} WebSockets over the run, ${tokensMinted - minted} new tokens), numbers live again`);

  t.step = 'a page that only sets a token attribute';
  const plain = await openPage(t, context, host, 'plain');
  plain.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') errors.push(`[plain] ${m.text()}`); });
  plain.on('pageerror', (e) => errors.push(`[plain] ${e.message}`));
  plain.on('request', (r) => requests.push(r.url()));
  requireCsp(await plain.goto(`${host}/plain`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${host}/plain`);
  await waitFor(plain, 'the cell shows MATH101 section 1', () => document.getElementById('m')?.shadowRoot.textContent.trim() === '20 seats left');
  const blank = await context.newPage();
  await blank.goto(`${host}/blank`);
  const builtin = new Set(await blank.evaluate(() => Object.getOwnPropertyNames(window)));
  await blank.close();
  const leaked = (await plain.evaluate(() => Object.getOwnPropertyNames(window))).filter((k) => !builtin.has(k));
  if (leaked.length) throw new Error(`globals set by the module: ${leaked}`);
  t.say('token attribute alone: cell live, no globals');

  t.step = 'no request to a third host';
  const allowed = new Set([new URL(host).host, new URL(sb).host]);
  const third = [...requests, ...sockets.map((s) => s.url)].filter((u) => !u.startsWith('data:') && !allowed.has(new URL(u).host));
  if (third.length) throw new Error(`requests to a third host: ${third.join(' ')}`);
  if (errors.length) throw new Error(`console: ${errors.join(' | ')}`);
  server.close();
});
