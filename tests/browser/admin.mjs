// Admin dashboard check: node admin.mjs <baseUrl> <screenshotPath>
//
// Opens <baseUrl>/admin in headless Chromium, waits for the #courses table to
// fill, checks the default order (updates/s, descending), clicks the
// "viewers" header and checks the rows are then sorted by viewers (and that a
// second click reverses it), clicks "course" and checks alphabetical order,
// saves a full-page screenshot. Exits 0 when all holds, 1 (with the reason)
// otherwise.
import { chromium } from 'playwright-core';

const OVERALL_TIMEOUT_MS = 60_000;
const STEP_TIMEOUT_MS = 15_000;
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

const [rawBase, shotPath] = process.argv.slice(2);
if (!rawBase || !shotPath) {
  console.error('usage: node admin.mjs <baseUrl> <screenshotPath>');
  process.exit(2);
}
const base = rawBase.replace(/\/+$/, '');

let browser = null;
let step = 'start';
const pageLog = [];

function log(msg) { console.log(`admin: ${msg}`); }

async function finish(code, reason) {
  if (code !== 0) {
    console.error(`admin: FAIL during "${step}": ${reason}`);
    if (pageLog.length) console.error('admin: page log (last 20):\n  ' + pageLog.slice(-20).join('\n  '));
  }
  const closing = browser ? browser.close().catch(() => {}) : Promise.resolve();
  await Promise.race([closing, new Promise((r) => setTimeout(r, 3000))]);
  process.exit(code);
}

const overall = setTimeout(() => { finish(1, `overall timeout of ${OVERALL_TIMEOUT_MS / 1000} s`); }, OVERALL_TIMEOUT_MS);

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

async function main() {
  step = 'launch chromium';
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') pageLog.push(`[console.${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => pageLog.push(`[pageerror] ${e.message}`));

  step = `open ${base}/admin`;
  const resp = await page.goto(`${base}/admin`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp || !resp.ok()) throw new Error(`GET /admin answered ${resp ? resp.status() : 'nothing'}`);

  step = 'wait for live state and table rows';
  await page.waitForFunction(() => {
    const s = document.getElementById('conn-state');
    return s && s.textContent.trim() === 'live' && document.querySelectorAll('#courses tbody tr[data-course]').length > 0;
  }, null, { timeout: STEP_TIMEOUT_MS, polling: 100 }).catch(async () => {
    const state = await page.$eval('#conn-state', (e) => e.textContent.trim()).catch(() => '(missing #conn-state)');
    const n = await page.$$eval('#courses tbody tr[data-course]', (e) => e.length).catch(() => 0);
    throw new Error(`#conn-state is "${state}" and #courses has ${n} rows after ${STEP_TIMEOUT_MS / 1000} s (want "live" and >= 1)`);
  });

  step = 'check the default order (updates_per_s descending)';
  const initial = await expectSorted(page, 'updates_per_s', 'descending', true);
  log(`${initial.rows.length} courses; by updates/s: ${describe(initial.rows)}`);
  const initialOrder = initial.rows.map((r) => r.course).join(',');

  step = 'click the viewers header';
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
  log(`by viewers (${dir}): ${describe(byViewers.rows)}${viewersOrder === initialOrder ? ' (same order as before: the data was already in viewer order)' : ''}`);

  step = 'click the viewers header again (reverse)';
  await clickHeader(page, 'viewers');
  const rev = dir === 'descending' ? 'ascending' : 'descending';
  await expectSorted(page, 'viewers', rev, true);
  log(`second click sorts ${rev}`);

  step = 'click the course header';
  await clickHeader(page, 'course');
  const byCourse = await readTable(page, 'course');
  const cdir = byCourse.ariaSort === 'descending' ? 'descending' : 'ascending';
  await expectSorted(page, 'course', cdir, false);
  log(`by course (${cdir}) ok`);

  step = 'restore viewers order for the screenshot';
  await clickHeader(page, 'viewers');
  const last = await readTable(page, 'viewers');
  if (last.ariaSort === 'ascending') await clickHeader(page, 'viewers');

  step = `screenshot to ${shotPath}`;
  await page.screenshot({ path: shotPath, fullPage: true });

  clearTimeout(overall);
  log(`OK (screenshot: ${shotPath})`);
  await finish(0);
}

main().catch((e) => finish(1, e && e.message ? e.message.split('\n')[0] : String(e)));
