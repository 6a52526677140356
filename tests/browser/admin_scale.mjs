// The admin page at a real university's size: a hub on Redis with 10,000
// courses (3 sections each) and a publisher changing a few of them every
// tick. The page is opened with `?token=` in its address: the token must move
// into the `seatboard_token` cookie and out of the address bar, and the
// WebSocket must go without it in its URL. Then: the Courses card reads
// 10,000 and Full sections "N / 30,000", only the rows on screen are in the
// DOM, a search by code narrows the table, sorting by course and scrolling to
// the bottom show U00000 then U09999, and the Viewers card counts the student
// the test connected.
//
// Measured (Chrome DevTools Protocol, Performance.getMetrics): the
// main-thread time (TaskDuration: scripts, style, layout, paint) from
// navigation to the first full table, and per admin message over a steady
// window (TaskDuration over the window / admin messages received in it; the
// 1 s chart clock counts in too, so this is an upper bound). Printed as one
// line `admin-scale: {json}`. Also timed in the page itself: the message
// handler plus the animation-frame callbacks (the table's redraw), per
// message (`page_ms_per_message`).
//
// Usage: node admin_scale.mjs http://127.0.0.1:PORT TOKEN SCREENSHOT [COURSES]
// (COURSES: how many the hub was seeded with, U00000..; default 10000).
import { run, openPage, requireCsp } from './lib.mjs';

const [base, token, shot, count] = process.argv.slice(2);
const N = Number(count || 10_000);
const fmt = (n) => new Intl.NumberFormat('en-US').format(n);
const code = (i) => 'U' + String(i).padStart(5, '0');
const STEP_MS = 30_000;
const WINDOW_MS = 15_000;

async function taskMs(cdp) {
  const { metrics } = await cdp.send('Performance.getMetrics');
  const get = (name) => (metrics.find((m) => m.name === name) || { value: 0 }).value;
  return { task: get('TaskDuration') * 1000, script: get('ScriptDuration') * 1000, layout: get('LayoutDuration') * 1000, style: get('RecalcStyleDuration') * 1000 };
}

run('admin-scale', 180_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1200, height: 900 } });
  const page = await openPage(t, context, base, 'admin');
  const cdp = await context.newCDPSession(page);
  await cdp.send('Performance.enable');
  await cdp.send('Network.enable');
  let adminFrames = 0;
  cdp.on('Network.webSocketFrameReceived', (e) => {
    if (e.response && typeof e.response.payloadData === 'string' && e.response.payloadData.startsWith('{"type":"admin"')) adminFrames++;
  });
  const sockets = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  // The page's own work per message, timed in the page: each WebSocket
  // message handler and each animation-frame callback (the table is drawn in
  // the frame after a message), summed.
  await page.addInitScript(() => {
    const perf = { messages: 0, handlerMs: 0, frameMs: 0 };
    window.__adminPerf = perf;
    const raf = window.requestAnimationFrame.bind(window);
    window.requestAnimationFrame = (cb) => raf((ts) => {
      const t = performance.now();
      try { cb(ts); } finally { perf.frameMs += performance.now() - t; }
    });
    const desc = Object.getOwnPropertyDescriptor(WebSocket.prototype, 'onmessage');
    Object.defineProperty(WebSocket.prototype, 'onmessage', {
      configurable: true,
      get() { return desc.get.call(this); },
      set(fn) {
        desc.set.call(this, fn && function (ev) {
          const t = performance.now();
          try { return fn.call(this, ev); } finally {
            if (typeof ev.data === 'string' && ev.data.startsWith('{"type":"admin"')) perf.messages++;
            perf.handlerMs += performance.now() - t;
          }
        });
      },
    });
  });

  t.step = 'open /admin?token=...';
  const before = await taskMs(cdp);
  const t0 = Date.now();
  const resp = await page.goto(`${base}/admin?token=${token}&session=default`, { waitUntil: 'domcontentloaded', timeout: STEP_MS });
  if (!resp || !resp.ok()) throw new Error(`GET /admin answered ${resp ? resp.status() : 'nothing'}`);
  requireCsp(resp, 'GET /admin');

  t.step = 'the token leaves the address bar for the cookie';
  const url = page.url();
  if (url.includes('token')) throw new Error(`the address still carries the token: ${url}`);
  if (!url.endsWith('/admin?session=default')) throw new Error(`the rest of the address changed: ${url}`);
  const cookies = await context.cookies(base);
  const c = cookies.find((k) => k.name === 'seatboard_token');
  if (!c || c.value !== token) throw new Error(`no seatboard_token cookie with the token: ${JSON.stringify(cookies)}`);
  if (c.sameSite !== 'Strict') throw new Error(`cookie SameSite ${c.sameSite}`);

  t.step = `live with ${fmt(N)} courses`;
  await page.waitForFunction((n) => {
    const s = document.getElementById('conn-state');
    return s && s.textContent.trim() === 'live' && document.getElementById('t-courses').textContent.replace(/\D/g, '') === String(n)
      && document.querySelectorAll('#courses tbody tr[data-course]').length > 0;
  }, N, { timeout: STEP_MS, polling: 50 }).catch(async (e) => {
    // What the page showed when the deadline passed, so a failure says which part lagged.
    const shown = await page.evaluate(() => ({
      state: document.getElementById('conn-state')?.textContent.trim(),
      courses: document.getElementById('t-courses')?.textContent.trim(),
      rows: document.querySelectorAll('#courses tbody tr[data-course]').length,
    })).catch(() => null);
    throw new Error(`${e.message}; the page showed ${JSON.stringify(shown)} after ${Date.now() - t0} ms`);
  });
  const firstMs = Date.now() - t0;
  const loaded = await taskMs(cdp);
  if (sockets.length !== 1 || sockets[0].includes('token')) throw new Error(`WebSocket URLs: ${sockets.join(' ')}`);
  if (!sockets[0].endsWith('/ws/admin')) throw new Error(`WebSocket URL ${sockets[0]}`);

  t.step = 'cards: sections, rows drawn';
  const full = await page.$eval('#t-full', (e) => e.textContent.trim());
  if (!full.endsWith('/ ' + fmt(3 * N))) throw new Error(`Full sections card "${full}" (want N / ${fmt(3 * N)})`);
  const drawn = await page.$$eval('#courses tbody tr[data-course]', (e) => e.length);
  if (drawn > 100) throw new Error(`${drawn} rows in the DOM for ${N} courses (only those on screen should be)`);

  t.step = 'the viewers card counts the student';
  await page.waitForFunction(() => Number(document.getElementById('t-viewers').textContent.replace(/\D/g, '')) >= 1, null, { timeout: STEP_MS, polling: 200 });

  t.step = `steady window of ${WINDOW_MS / 1000} s`;
  const w0 = await taskMs(cdp);
  const p0 = await page.evaluate(() => ({ ...window.__adminPerf }));
  const f0 = adminFrames;
  await page.waitForTimeout(WINDOW_MS);
  const w1 = await taskMs(cdp);
  const p1 = await page.evaluate(() => ({ ...window.__adminPerf }));
  const frames = adminFrames - f0;
  const pageMessages = p1.messages - p0.messages;
  if (frames < 5) throw new Error(`only ${frames} admin messages in ${WINDOW_MS / 1000} s`);
  const rowsNow = await page.$$eval('#courses tbody tr[data-course]', (e) => e.length);
  if (rowsNow > 100) throw new Error(`${rowsNow} rows in the DOM after the window`);

  t.step = 'search by code';
  await page.fill('#search', 'u0000');
  await page.waitForFunction((want) => {
    const rows = Array.from(document.querySelectorAll('#courses tbody tr[data-course]'));
    return rows.length === 10 && rows.every((r) => r.dataset.course.startsWith('U0000'))
      && document.getElementById('shown').textContent.trim() === want;
  }, `10 of ${fmt(N)} courses`, { timeout: 5000 });
  await page.fill('#search', 'NOPE');
  await page.waitForFunction(() => /No course matches/.test(document.querySelector('#courses tbody tr.empty')?.textContent || ''), null, { timeout: 5000 });
  await page.fill('#search', '');

  t.step = 'sort by course, scroll to the bottom';
  await page.click('#courses thead th[data-key="course"]');
  await page.waitForFunction(() => document.querySelector('#courses tbody tr[data-course]')?.dataset.course === 'U00000', null, { timeout: 5000 });
  await page.$eval('#table-wrap', (w) => { w.scrollTop = w.scrollHeight; });
  await page.waitForFunction((last) => {
    const rows = document.querySelectorAll('#courses tbody tr[data-course]');
    return rows.length > 0 && rows.length <= 100 && rows[rows.length - 1].dataset.course === last;
  }, code(N - 1), { timeout: 5000 });
  await page.screenshot({ path: shot, fullPage: false });

  const figures = {
    courses: N,
    first_full_table_ms: firstMs,
    first_full_table_main_thread_ms: Math.round(loaded.task - before.task),
    window_s: WINDOW_MS / 1000,
    admin_messages: frames,
    page_ms_per_message: +(((p1.handlerMs - p0.handlerMs) + (p1.frameMs - p0.frameMs)) / Math.max(1, pageMessages)).toFixed(2),
    main_thread_ms_per_message: +((w1.task - w0.task) / frames).toFixed(2),
    script_ms_per_message: +((w1.script - w0.script) / frames).toFixed(2),
    layout_style_ms_per_message: +(((w1.layout - w0.layout) + (w1.style - w0.style)) / frames).toFixed(2),
    rows_in_dom: rowsNow,
  };
  console.log('admin-scale: ' + JSON.stringify(figures));
});
