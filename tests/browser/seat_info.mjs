// Any seat_info a publisher sends is drawn as text, on a hub fed through Redis:
//   node seat_info.mjs <baseUrl> <screenshotPath>
// The Rust test that runs this has published ODD101 sections 1-5 whose rooms
// are {"toString":"B12"}, ["A","B"], 42, "C3" and null (a missing room).
// Checks: every section is drawn with its seats and its room as text, and the
// page throws nothing (a room whose toString is not a function used to throw
// on every frame and stop the course from drawing).
import { run, openPage, waitLive, requireCsp } from './lib.mjs';

const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const WANT = { 1: 'Room {"toString":"B12"}', 2: 'Room ["A","B"]', 3: 'Room 42', 4: 'Room C3', 5: '' };

await run('seat_info', 60_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 900, height: 700 } });
  const page = await openPage(t, context, base, 'board');
  const thrown = [];
  page.on('pageerror', (e) => thrown.push(e.message));

  t.step = 'open /?course=ODD101';
  requireCsp(await page.goto(`${base}/?course=ODD101`, { waitUntil: 'domcontentloaded', timeout: 15_000 }), `${base}/?course=ODD101`);
  await waitLive(page, ['ODD101']);

  t.step = 'every section drawn, each room as text';
  await page.waitForFunction(() => document.querySelectorAll('[data-course="ODD101"] [data-section]').length === 5,
    null, { timeout: 15_000, polling: 100 });
  const shown = await page.$$eval('[data-course="ODD101"] [data-section]', (els) => Object.fromEntries(els.map((e) => [
    e.dataset.section, { room: e.querySelector('.room')?.textContent ?? null, left: e.querySelector('.seats-left')?.textContent.trim() },
  ])));
  for (const [n, room] of Object.entries(WANT)) {
    const s = shown[n];
    if (!s) throw new Error(`section ${n} not drawn: ${JSON.stringify(shown)}`);
    if (s.room !== room) throw new Error(`section ${n}: room ${JSON.stringify(s.room)}, want ${JSON.stringify(room)}`);
    if (s.left !== `${n} seats left` && !(n === '1' && s.left === '1 seat left')) throw new Error(`section ${n}: ${s.left}`);
  }
  if (thrown.length) throw new Error(`the page threw: ${thrown.join('; ')}`);
  if (page.offHost.length) throw new Error(`requests to another host: ${page.offHost.join(', ')}`);
  await page.screenshot({ path: shot, fullPage: true });
});
