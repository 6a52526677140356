// Student board check: node board.mjs <baseUrl> <screenshotPath>
//
// Opens <baseUrl>/ in headless Chromium, adds the first known course through
// the "Add a course" field, waits for live updates, checks the course's viewer
// count, saves a full-page screenshot, then checks that the shareable link
// /?course=C opens the board without any click. Exits 0 when all holds, 1 (with the reason) otherwise.
import { chromium } from 'playwright-core';
import { failOnCsp, requireCsp } from './csp.mjs';

const OVERALL_TIMEOUT_MS = 60_000;
const CHANGE_TIMEOUT_MS = 20_000;
const STEP_TIMEOUT_MS = 15_000;
const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

const [rawBase, shotPath] = process.argv.slice(2);
if (!rawBase || !shotPath) {
  console.error('usage: node board.mjs <baseUrl> <screenshotPath>');
  process.exit(2);
}
const base = rawBase.replace(/\/+$/, '');

let browser = null;
let step = 'start';
const pageLog = [];

function log(msg) { console.log(`board: ${msg}`); }

async function finish(code, reason) {
  if (code !== 0) {
    console.error(`board: FAIL during "${step}": ${reason}`);
    if (pageLog.length) console.error('board: page log (last 20):\n  ' + pageLog.slice(-20).join('\n  '));
  }
  const closing = browser ? browser.close().catch(() => {}) : Promise.resolve();
  await Promise.race([closing, new Promise((r) => setTimeout(r, 3000))]);
  process.exit(code);
}

const overall = setTimeout(() => { finish(1, `overall timeout of ${OVERALL_TIMEOUT_MS / 1000} s`); }, OVERALL_TIMEOUT_MS);

function watchPage(page, name) {
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') pageLog.push(`[${name} console.${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => pageLog.push(`[${name} pageerror] ${e.message}`));
  page.on('requestfailed', (r) => pageLog.push(`[${name} requestfailed] ${r.url()} ${r.failure()?.errorText ?? ''}`));
}

async function readBoard(page) {
  return page.evaluate(() => {
    const out = {};
    for (const el of document.querySelectorAll('[data-course] [data-section]')) {
      const t = el.querySelector('.seats-taken');
      const l = el.querySelector('.seats-left');
      out[el.dataset.section] = {
        taken: t ? t.textContent.trim() : null,
        left: l ? l.textContent.trim() : null,
      };
    }
    return out;
  });
}

function checkBoardShape(board) {
  const keys = Object.keys(board);
  if (keys.length === 0) throw new Error('no .section elements');
  for (const k of keys) {
    if (!/^\d+$/.test(k)) throw new Error(`data-section="${k}" is not an integer`);
    const { taken, left } = board[k];
    if (taken === null || !/^\d+$/.test(taken)) throw new Error(`section ${k}: .seats-taken text ${JSON.stringify(taken)} is not an integer`);
    if (left === null || !/^\d+/.test(left)) throw new Error(`section ${k}: .seats-left text ${JSON.stringify(left)} does not start with an integer`);
  }
  const nums = keys.map(Number);
  return nums;
}

async function sectionOrder(page) {
  return page.$$eval('.section[data-section]', (els) => els.map((e) => Number(e.dataset.section)));
}

async function waitLiveWithSections(page) {
  await page.waitForFunction(() => {
    const s = document.getElementById('conn-state');
    return s && s.textContent.trim() === 'live' && document.querySelectorAll('.section[data-section]').length > 0;
  }, null, { timeout: STEP_TIMEOUT_MS, polling: 100 }).catch(async () => {
    const state = await page.$eval('#conn-state', (e) => e.textContent.trim()).catch(() => '(missing #conn-state)');
    const n = await page.$$eval('.section', (e) => e.length).catch(() => 0);
    throw new Error(`#conn-state is "${state}" and ${n} .section elements after ${STEP_TIMEOUT_MS / 1000} s (want "live" and >= 1)`);
  });
}

async function main() {
  step = 'launch chromium';
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS });
  const context = await browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  watchPage(page, 'board');
  await failOnCsp(page, 'board', (why) => finish(1, why));

  step = `open ${base}/`;
  const resp = await page.goto(`${base}/`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp || !resp.ok()) throw new Error(`GET / answered ${resp ? resp.status() : 'nothing'}`);
  requireCsp(resp, 'GET /');
  const title = await page.title();
  if (title !== 'seatboard') throw new Error(`page title is ${JSON.stringify(title)}, want "seatboard"`);

  step = 'wait for the course list';
  await page.waitForFunction(() => document.querySelectorAll('#course-list option').length > 0,
    null, { timeout: STEP_TIMEOUT_MS, polling: 100 }).catch(() => {
    throw new Error(`no course appeared in #course-list within ${STEP_TIMEOUT_MS / 1000} s (is /api/courses empty?)`);
  });
  const course = await page.$eval('#course-list option', (o) => o.value);
  log(`first course is ${course}`);

  step = `add ${course} through the course field`;
  await page.fill('#course-input', course);
  await page.click('#add-form button[type="submit"]');
  await page.waitForFunction((c) => new URL(location.href).searchParams.get('course') === c, course, { timeout: 5000 })
    .catch(() => { throw new Error(`URL was not updated to ?course=${course} (got ${page.url()})`); });

  step = 'wait for live state and sections';
  await waitLiveWithSections(page);

  step = 'read the board';
  const before = await readBoard(page);
  const nums = checkBoardShape(before);
  const order = await sectionOrder(page);
  const sorted = [...order].sort((a, b) => a - b);
  if (order.join(',') !== sorted.join(',')) throw new Error(`sections not sorted by number: ${order.join(',')}`);
  log(`${nums.length} sections: ${Object.entries(before).map(([k, v]) => `${k}=${v.taken}`).join(' ')}`);

  step = 'wait for a live seat change';
  const t0 = Date.now();
  let changed = null;
  while (Date.now() - t0 < CHANGE_TIMEOUT_MS) {
    await page.waitForTimeout(250);
    const now = await readBoard(page);
    for (const k of Object.keys(before)) {
      if (now[k] && now[k].taken !== before[k].taken) { changed = `section ${k}: ${before[k].taken} -> ${now[k].taken}`; break; }
    }
    if (changed) break;
  }
  if (!changed) throw new Error(`no .seats-taken value changed within ${CHANGE_TIMEOUT_MS / 1000} s`);
  log(`update seen after ${Date.now() - t0} ms (${changed})`);
  checkBoardShape(await readBoard(page));

  step = 'check the viewer count';
  const viewers = await page.waitForFunction(() => {
    const v = document.querySelector('[data-course] .viewers');
    const m = v && /^\s*(\d+)/.exec(v.textContent);
    return m && Number(m[1]) >= 1 ? Number(m[1]) : false;
  }, null, { timeout: 10_000, polling: 100 }).then((h) => h.jsonValue()).catch(async () => {
    const text = await page.$eval('[data-course] .viewers', (e) => e.textContent).catch(() => '(missing .viewers)');
    throw new Error(`.viewers text is ${JSON.stringify(text)}, want an integer >= 1`);
  });
  log(`${viewers} viewing`);

  step = `screenshot to ${shotPath}`;
  await page.screenshot({ path: shotPath, fullPage: true });

  step = `shareable link ${base}/?course=${course}`;
  const page2 = await context.newPage();
  watchPage(page2, 'link');
  await failOnCsp(page2, 'link', (why) => finish(1, why));
  const resp2 = await page2.goto(`${base}/?course=${encodeURIComponent(course)}`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp2 || !resp2.ok()) throw new Error(`GET /?course=${course} answered ${resp2 ? resp2.status() : 'nothing'}`);
  await waitLiveWithSections(page2);
  checkBoardShape(await readBoard(page2));
  const shown = await page2.$$eval('[data-course]', (els) => els.map((e) => e.dataset.course));
  if (shown.join(',') !== course) throw new Error(`the shared link shows ${JSON.stringify(shown)}, want [${course}]`);
  log('shareable link opens the board without a click');

  clearTimeout(overall);
  log(`OK (screenshot: ${shotPath})`);
  await finish(0);
}

main().catch((e) => finish(1, e && e.message ? e.message.split('\n')[0] : String(e)));
