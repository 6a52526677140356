// Student board check: node board.mjs <baseUrl> <screenshotPath>
//
// Opens <baseUrl>/ in headless Chromium, adds the first known course through
// the "Add a course" field, waits for live updates, checks the course's viewer
// count, saves a full-page screenshot, then checks that the shareable link
// /?course=C opens the board without any click. Exits 0 when all holds, 1 (with the reason) otherwise.
import { run, baseAndShot, openPage, requireCsp } from './lib.mjs';

const CHANGE_TIMEOUT_MS = 20_000;
const STEP_TIMEOUT_MS = 15_000;
const { base, shot: shotPath } = baseAndShot('board');

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

run('board', 60_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await openPage(t, context, base, 'board');

  t.step = `open ${base}/`;
  const resp = await page.goto(`${base}/`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp || !resp.ok()) throw new Error(`GET / answered ${resp ? resp.status() : 'nothing'}`);
  requireCsp(resp, 'GET /');
  const title = await page.title();
  if (title !== 'seatboard') throw new Error(`page title is ${JSON.stringify(title)}, want "seatboard"`);

  t.step = 'wait for the course list';
  await page.waitForFunction(() => document.querySelectorAll('#course-list option').length > 0,
    null, { timeout: STEP_TIMEOUT_MS, polling: 100 }).catch(() => {
    throw new Error(`no course appeared in #course-list within ${STEP_TIMEOUT_MS / 1000} s (is /api/courses empty?)`);
  });
  const course = await page.$eval('#course-list option', (o) => o.value);
  t.say(`first course is ${course}`);

  t.step = `add ${course} through the course field`;
  await page.fill('#course-input', course);
  await page.click('#add-form button[type="submit"]');
  await page.waitForFunction((c) => new URL(location.href).searchParams.get('course') === c, course, { timeout: 5000 })
    .catch(() => { throw new Error(`URL was not updated to ?course=${course} (got ${page.url()})`); });

  t.step = 'wait for live state and sections';
  await waitLiveWithSections(page);

  t.step = 'read the board';
  const before = await readBoard(page);
  const nums = checkBoardShape(before);
  const order = await sectionOrder(page);
  const sorted = [...order].sort((a, b) => a - b);
  if (order.join(',') !== sorted.join(',')) throw new Error(`sections not sorted by number: ${order.join(',')}`);
  t.say(`${nums.length} sections: ${Object.entries(before).map(([k, v]) => `${k}=${v.taken}`).join(' ')}`);

  t.step = 'wait for a live seat change';
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
  t.say(`update seen after ${Date.now() - t0} ms (${changed})`);
  checkBoardShape(await readBoard(page));

  t.step = 'check the viewer count';
  const viewers = await page.waitForFunction(() => {
    const v = document.querySelector('[data-course] .viewers');
    const m = v && /^\s*(\d+)/.exec(v.textContent);
    return m && Number(m[1]) >= 1 ? Number(m[1]) : false;
  }, null, { timeout: 10_000, polling: 100 }).then((h) => h.jsonValue()).catch(async () => {
    const text = await page.$eval('[data-course] .viewers', (e) => e.textContent).catch(() => '(missing .viewers)');
    throw new Error(`.viewers text is ${JSON.stringify(text)}, want an integer >= 1`);
  });
  t.say(`${viewers} viewing`);

  t.step = `screenshot to ${shotPath}`;
  await page.screenshot({ path: shotPath, fullPage: true });

  t.step = `shareable link ${base}/?course=${course}`;
  const page2 = await openPage(t, context, base, 'link');
  const resp2 = await page2.goto(`${base}/?course=${encodeURIComponent(course)}`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp2 || !resp2.ok()) throw new Error(`GET /?course=${course} answered ${resp2 ? resp2.status() : 'nothing'}`);
  await waitLiveWithSections(page2);
  checkBoardShape(await readBoard(page2));
  const shown = await page2.$$eval('[data-course]', (els) => els.map((e) => e.dataset.course));
  if (shown.join(',') !== course) throw new Error(`the shared link shows ${JSON.stringify(shown)}, want [${course}]`);
  t.say('shareable link opens the board without a click');
});
