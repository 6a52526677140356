// Admin dashboard check: node admin.mjs <baseUrl> <screenshotPath>
//
// Opens <baseUrl>/admin in headless Chromium, waits for the #courses table to
// fill, checks the default order (updates/s, descending), clicks the
// "viewers" header and checks the rows are then sorted by viewers (and that a
// second click reverses it), clicks "course" and checks alphabetical order,
// checks the live throughput chart and the analytics history chart have drawn
// (data points and non-blank pixels in the line colour), opens the hottest
// course's board in a second tab and checks the roster drill-down of that
// course lists the viewer, saves a full-page screenshot. Exits 0 when all holds, 1 (with the reason)
// otherwise.
import { run, baseAndShot, openPage, requireCsp } from './lib.mjs';

const OVERALL_TIMEOUT_MS = 75_000;
const STEP_TIMEOUT_MS = 15_000;
const { base, shot: shotPath } = baseAndShot('admin');

// Reads the table in one go (inside the page, so a re-render cannot interleave).
// Column values come from the header's position, so this does not depend on
// how the page marks its cells; numbers are parsed from the cell text.
async function readTable(page, key) {
  return page.evaluate((key) => {
    const table = document.getElementById('courses');
    const ths = Array.from(table.querySelectorAll('thead th'));
    const norm = (s) => s.toLowerCase().replace(/[^a-z0-9]/g, '');
    const idx = ths.findIndex((th) => th.dataset.key === key || norm(th.textContent) === norm(key));
    const rows = Array.from(table.querySelectorAll('tbody tr[data-course]')).map((tr) => {
      const td = idx >= 0 ? tr.children[idx] : null;
      const raw = td ? (td.dataset.value ?? td.textContent) : null;
      return { course: tr.dataset.course, raw: raw === null ? null : String(raw).trim() };
    });
    const th = idx >= 0 ? ths[idx] : null;
    return { found: idx >= 0, ariaSort: th ? th.getAttribute('aria-sort') : null, rows };
  }, key);
}

function value(raw) {
  const n = Number(String(raw).replace(/[,\s\u00a0\u202f]/g, ''));
  return Number.isFinite(n) ? n : NaN;
}

function isSorted(rows, dir, numeric) {
  for (let i = 1; i < rows.length; i++) {
    const a = rows[i - 1].raw, b = rows[i].raw;
    const c = numeric ? value(a) - value(b) : a.localeCompare(b, undefined, { numeric: true });
    if (Number.isNaN(c)) return false;
    if (dir === 'descending' ? c < 0 : c > 0) return false;
  }
  return true;
}

function describe(rows) { return rows.map((r) => `${r.course}=${r.raw}`).join(' '); }

// The table keeps updating, so poll briefly for an order that satisfies the check.
async function expectSorted(page, key, dir, numeric) {
  const t0 = Date.now();
  let last;
  while (Date.now() - t0 < 3000) {
    last = await readTable(page, key);
    if (!last.found) throw new Error(`no "${key}" column header`);
    if (last.rows.length && isSorted(last.rows, dir, numeric)) return last;
    await page.waitForTimeout(100);
  }
  throw new Error(`rows not sorted by ${key} ${dir}: ${describe(last.rows)}`);
}

async function clickHeader(page, key) {
  const th = page.locator(`#courses thead th[data-key="${key}"]`);
  if (await th.count() === 0) {
    await page.locator('#courses thead th', { hasText: new RegExp(`^\\s*${key}\\s*$`, 'i') }).first().click();
  } else {
    await th.first().click();
  }
}

// Pixels of a canvas close to the page's --accent colour (the chart lines).
async function chartInk(page, id) {
  return page.evaluate((id) => {
    const c = document.getElementById(id);
    if (!c || !c.width || !c.height) return { points: 0, ink: 0 };
    const probe = document.createElement('span');
    probe.style.color = getComputedStyle(document.documentElement).getPropertyValue('--accent');
    document.body.appendChild(probe);
    const m = getComputedStyle(probe).color.match(/\d+(\.\d+)?/g) || ['0', '0', '0'];
    probe.remove();
    const [r, g, b] = m.map(Number);
    const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let ink = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] > 150 && Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) < 90) ink++;
    }
    return { points: Number(c.dataset.points || 0), max: Number(c.dataset.max || 0), ink };
  }, id);
}

async function waitChart(page, id, minPoints, timeoutMs) {
  const t0 = Date.now();
  let last = { points: 0, ink: 0 };
  while (Date.now() - t0 < timeoutMs) {
    last = await chartInk(page, id);
    // An undrawn canvas has no ink; a drawn line, even a flat one hugging the
    // axis, has a few dozen pixels of it (36 seen on a busy CI machine).
    if (last.points >= minPoints && last.ink >= 20) return last;
    await page.waitForTimeout(250);
  }
  throw new Error(`#${id} did not draw: ${JSON.stringify(last)}`);
}

run('admin', OVERALL_TIMEOUT_MS, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await openPage(t, context, base, 'admin');

  t.step = `open ${base}/admin`;
  const resp = await page.goto(`${base}/admin`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp || !resp.ok()) throw new Error(`GET /admin answered ${resp ? resp.status() : 'nothing'}`);
  requireCsp(resp, 'GET /admin');

  t.step = 'wait for live state and table rows';
  await page.waitForFunction(() => {
    const s = document.getElementById('conn-state');
    return s && s.textContent.trim() === 'live' && document.querySelectorAll('#courses tbody tr[data-course]').length > 0;
  }, null, { timeout: STEP_TIMEOUT_MS, polling: 100 }).catch(async () => {
    const state = await page.$eval('#conn-state', (e) => e.textContent.trim()).catch(() => '(missing #conn-state)');
    const n = await page.$$eval('#courses tbody tr[data-course]', (e) => e.length).catch(() => 0);
    throw new Error(`#conn-state is "${state}" and #courses has ${n} rows after ${STEP_TIMEOUT_MS / 1000} s (want "live" and >= 1)`);
  });

  t.step = 'check the default order (updates_per_s descending)';
  const initial = await expectSorted(page, 'updates_per_s', 'descending', true);
  t.say(`${initial.rows.length} courses; by updates/s: ${describe(initial.rows)}`);
  const initialOrder = initial.rows.map((r) => r.course).join(',');

  t.step = 'click the viewers header';
  const preViewers = await readTable(page, 'viewers');
  const preSortedByViewers = isSorted(preViewers.rows, 'descending', true) || isSorted(preViewers.rows, 'ascending', true);
  await clickHeader(page, 'viewers');
  let byViewers = await readTable(page, 'viewers');
  const dir = byViewers.ariaSort === 'ascending' ? 'ascending' : 'descending';
  byViewers = await expectSorted(page, 'viewers', dir, true);
  const viewersOrder = byViewers.rows.map((r) => r.course).join(',');
  if (!preSortedByViewers && viewersOrder === initialOrder) {
    throw new Error(`row order did not change after clicking "viewers": ${viewersOrder}`);
  }
  t.say(`by viewers (${dir}): ${describe(byViewers.rows)}${viewersOrder === initialOrder ? ' (same order as before: the data was already in viewer order)' : ''}`);

  t.step = 'click the viewers header again (reverse)';
  await clickHeader(page, 'viewers');
  const rev = dir === 'descending' ? 'ascending' : 'descending';
  await expectSorted(page, 'viewers', rev, true);
  t.say(`second click sorts ${rev}`);

  t.step = 'click the course header';
  await clickHeader(page, 'course');
  const byCourse = await readTable(page, 'course');
  const cdir = byCourse.ariaSort === 'descending' ? 'descending' : 'ascending';
  await expectSorted(page, 'course', cdir, false);
  t.say(`by course (${cdir}) ok`);

  t.step = 'restore viewers order for the screenshot';
  await clickHeader(page, 'viewers');
  const last = await readTable(page, 'viewers');
  if (last.ariaSort === 'ascending') await clickHeader(page, 'viewers');

  t.step = 'live throughput chart draws';
  const rate = await waitChart(page, 'rate-chart', 2, 10_000);
  if (!(rate.max > 0)) throw new Error(`rate chart has no positive rate: ${JSON.stringify(rate)}`);
  t.say(`rate chart: ${rate.points} points, max ${rate.max}/s, ${rate.ink} line pixels`);

  t.step = 'analytics history chart draws';
  const hist = await waitChart(page, 'history-chart', 1, 25_000);
  const info = await page.$eval('#history-info', (e) => e.textContent.trim());
  t.say(`history chart: ${hist.points} buckets, ${hist.ink} line pixels (${info})`);

  t.step = 'open a viewer of the hottest course in a second tab';
  await clickHeader(page, 'updates_per_s');
  let top = await readTable(page, 'updates_per_s');
  if (top.ariaSort !== 'descending') { await clickHeader(page, 'updates_per_s'); top = await readTable(page, 'updates_per_s'); }
  const course = top.rows[0].course;
  const board = await openPage(t, context, base, 'board');
  await board.goto(`${base}/?course=${encodeURIComponent(course)}`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  const viewer = await board.evaluate(() => localStorage.getItem('seatboard_user'));
  if (!viewer) throw new Error('the board page stored no user id');

  t.step = `open the roster of ${course}`;
  // Rows sorted by updates/s move on every admin tick (750 ms), and a click
  // waits for its target to hold still: on a loaded machine a moving row can
  // outlast the click's deadline. Sorted by course the rows stay put.
  await page.bringToFront();
  await clickHeader(page, 'course');
  const cell = page.locator(`#courses tbody tr[data-course="${course}"] td[data-col="viewers"]`);
  await cell.scrollIntoViewIfNeeded({ timeout: STEP_TIMEOUT_MS });
  await cell.click({ timeout: STEP_TIMEOUT_MS });
  await page.waitForFunction(() => {
    const r = document.getElementById('roster');
    return r && !r.hidden && /^\d[\d,.\s\u00a0\u202f]*$/.test(document.getElementById('roster-total').textContent.trim());
  }, null, { timeout: STEP_TIMEOUT_MS, polling: 100 });
  const shown = await page.$eval('#roster-course', (e) => e.textContent.trim());
  if (shown !== course) throw new Error(`roster shows ${shown}, clicked ${course}`);

  t.step = `roster of ${course} lists the viewer ${viewer}`;
  const t0 = Date.now();
  let ids = [];
  while (Date.now() - t0 < 15_000) {
    ids = await page.$$eval('#roster-list li', (lis) => lis.map((li) => li.textContent.trim()));
    if (ids.includes(viewer)) break;
    await page.click('#roster-refresh');
    await page.waitForTimeout(500);
  }
  if (!ids.includes(viewer)) throw new Error(`roster ids ${JSON.stringify(ids)} lack ${viewer}`);
  const total = await page.$eval('#roster-total', (e) => e.textContent.trim());
  t.say(`roster of ${course}: total ${total}, ids ${ids.join(' ')}`);
  await board.close();
  await page.evaluate(() => window.scrollTo(0, 0));

  t.step = `screenshot to ${shotPath}`;
  await page.screenshot({ path: shotPath, fullPage: true });
});
