// The shortlist and seat-opening alerts, on a hub fed through Redis:
//   node shortlist.mjs <baseUrl> <screenshotPath>
// The Rust test that runs this has published CS101 (section 1: 4/10 taken,
// section 3: 2/2 taken, i.e. full) and MATH101 (section 1: 10/30). When this
// script prints "PUBLISH <course> <section> <total> <taken>", the test runs
// `seatboard publish` with those numbers and answers "OK" on stdin.
//
// Checks: the shortlist comes from the URL (?course= repeated), one course
// element per code with its sections and viewer count, kept in localStorage
// and restored on the next visit; the notification permission is never asked
// for until the button is pressed; freeing a seat in the full section raises a
// role="alert" naming course and section, a system notification and a visual
// cue (none under prefers-reduced-motion); numbers carry no aria-live; axe
// finds nothing with the alert on screen; removing a course updates URL and
// storage; a link in lower case takes the course list's spelling.
import { run, openPage, axe, waitLive, requireCsp, ask } from './lib.mjs';

const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const STEP_MS = 15_000;

// Counts permission requests and records notifications, before any page script runs.
const SPY = () => {
  window.__asked = 0;
  window.__notes = [];
  const Real = window.Notification;
  if (typeof Real !== 'function') return;
  class Spy extends Real {
    constructor(title, opts) { super(title, opts); window.__notes.push(title); }
  }
  Spy.requestPermission = (...a) => { window.__asked++; return Real.requestPermission(...a); };
  Object.defineProperty(Spy, 'permission', { get: () => Real.permission });
  window.Notification = Spy;
};

const section = (page, course, n) => page.evaluate(([c, n]) => {
  const e = document.querySelector(`[data-course="${c}"] [data-section="${n}"]`);
  if (!e) return null;
  return {
    left: e.querySelector('.seats-left')?.textContent.trim(),
    taken: e.querySelector('.seats-taken')?.textContent.trim(),
    total: e.querySelector('.seats-total')?.textContent.trim(),
    classes: [...e.classList],
    animation: getComputedStyle(e).animationName,
  };
}, [course, n]);

async function publish(t, course, sec, total, taken) {
  const answer = await ask(`PUBLISH ${course} ${sec} ${total} ${taken}`);
  if (answer !== 'OK') throw new Error(`publish ${course} ${sec} ${taken}/${total}: test answered ${answer}`);
}

await run('shortlist', 120_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1100, height: 800 } });
  await context.grantPermissions(['notifications'], { origin: base });
  await context.addInitScript(SPY);
  const page = await openPage(t, context, base, 'board');

  t.step = 'open the shared link /?course=CS101&course=MATH101';
  requireCsp(await page.goto(`${base}/?course=CS101&course=MATH101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/?course=CS101&course=MATH101`);
  await waitLive(page, ['CS101', 'MATH101']);
  const shown = await page.$$eval('[data-course]', (els) => els.map((e) => e.dataset.course));
  if (shown.join(',') !== 'CS101,MATH101') throw new Error(`courses on screen: ${shown}`);
  const full = await section(page, 'CS101', 3);
  if (!full || full.taken !== '2' || full.total !== '2' || !/^0 seats left$/.test(full.left)) {
    throw new Error(`CS101 section 3 should show 0 seats left, 2/2: ${JSON.stringify(full)}`);
  }
  const m1 = await section(page, 'MATH101', 1);
  if (!m1 || m1.left !== '20 seats left' || m1.taken !== '10' || m1.total !== '30') throw new Error(`MATH101 section 1: ${JSON.stringify(m1)}`);
  t.say(`shortlist from the URL: ${shown.join(', ')}; CS101 section 3 full`);

  t.step = 'viewer count of each course';
  await page.waitForFunction(() => [...document.querySelectorAll('[data-course]')]
    .every((c) => /^[1-9]\d* viewing$/.test(c.querySelector('.viewers')?.textContent.trim() || '')), null, { timeout: STEP_MS, polling: 100 });

  t.step = 'kept in localStorage';
  const stored = await page.evaluate(() => localStorage.getItem('seatboard_shortlist'));
  if (stored !== '["CS101","MATH101"]') throw new Error(`localStorage seatboard_shortlist = ${stored}`);

  t.step = 'routine numbers are not live regions';
  const live = await page.evaluate(() => [...document.querySelectorAll('[aria-live], [role="status"], [role="alert"], [role="log"]')]
    .filter((e) => e.closest('#courses') || e.querySelector('[data-section]')).map((e) => e.outerHTML.slice(0, 80)));
  if (live.length) throw new Error(`live regions around the numbers: ${live.join(' | ')}`);

  t.step = 'never asks for notifications unprompted';
  const before = await page.evaluate(() => ({ asked: window.__asked, notes: window.__notes.length }));
  if (before.asked !== 0) throw new Error(`Notification.requestPermission called ${before.asked} times before the button`);
  const btn = page.locator('#notify');
  if (await btn.getAttribute('aria-pressed') !== 'false') throw new Error('notifications on before the button was pressed');
  await btn.click();
  await page.waitForFunction(() => document.getElementById('notify').getAttribute('aria-pressed') === 'true', null, { timeout: 5000 });
  t.say('notifications switched on with the button');

  t.step = 'free a seat in the full section';
  await publish(t, 'CS101', 3, 2, 1);
  const alert = await page.waitForFunction(() => {
    const a = [...document.querySelectorAll('[role="alert"]')].find((e) => /CS101/.test(e.textContent));
    return a ? a.textContent.trim() : false;
  }, null, { timeout: STEP_MS, polling: 50 }).then((h) => h.jsonValue());
  if (alert !== 'CS101 \u00b7 Section 3: 1 seat open') throw new Error(`alert text ${JSON.stringify(alert)}`);
  const opened = await section(page, 'CS101', 3);
  if (opened.left !== '1 seat left' || opened.taken !== '1') throw new Error(`section after publish: ${JSON.stringify(opened)}`);
  if (!opened.classes.includes('opened') || !opened.classes.includes('bump')) throw new Error(`no visual cue on the section: ${opened.classes}`);
  if (opened.animation !== 'bump') throw new Error(`changed section animates "${opened.animation}", want "bump"`);
  const notes = await page.evaluate(() => window.__notes);
  if (!notes.some((n) => n === alert)) throw new Error(`system notifications: ${JSON.stringify(notes)}`);
  t.say(`alert "${alert}", notification "${notes[0]}"`);

  t.step = 'a routine change raises no alert';
  await publish(t, 'MATH101', 1, 30, 12);
  await page.waitForFunction(() => document.querySelector('[data-course="MATH101"] [data-section="1"] .seats-taken')?.textContent === '12', null, { timeout: STEP_MS });
  const alerts = await page.$$eval('[role="alert"]', (els) => els.map((e) => e.textContent.trim()));
  if (alerts.length !== 1) throw new Error(`alerts after a routine change: ${JSON.stringify(alerts)}`);

  t.step = 'axe with the alert on screen';
  await axe(page, '/ with an alert');

  t.step = `screenshot to ${shot}`;
  await page.screenshot({ path: shot, fullPage: true });

  t.step = 'the section fills again: its alert goes';
  await publish(t, 'CS101', 3, 2, 2);
  await page.waitForFunction(() => document.querySelectorAll('[role="alert"]').length === 0, null, { timeout: STEP_MS });

  t.step = 'the next visit restores the shortlist';
  const again = await openPage(t, context, base, 'revisit');
  requireCsp(await again.goto(`${base}/`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/`);
  await waitLive(again, ['CS101', 'MATH101']);
  const url = new URL(again.url());
  if (url.searchParams.getAll('course').join(',') !== 'CS101,MATH101') throw new Error(`restored URL ${again.url()}`);

  t.step = 'remove MATH101';
  await again.click('[data-course="MATH101"] button.remove');
  await again.waitForFunction(() => !document.querySelector('[data-course="MATH101"]'), null, { timeout: 5000 });
  const after = await again.evaluate(() => [location.search, localStorage.getItem('seatboard_shortlist')]);
  if (after[0] !== '?course=CS101' || after[1] !== '["CS101"]') throw new Error(`after removing: ${JSON.stringify(after)}`);

  t.step = 'no visual cue under prefers-reduced-motion';
  const calm = await t.browser.newContext({ reducedMotion: 'reduce' });
  const still = await openPage(t, calm, base, 'reduced');
  requireCsp(await still.goto(`${base}/?course=MATH101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/?course=MATH101`);
  await waitLive(still, ['MATH101']);
  await publish(t, 'MATH101', 1, 30, 13);
  await still.waitForFunction(() => document.querySelector('[data-course="MATH101"] [data-section="1"]')?.classList.contains('bump'), null, { timeout: STEP_MS });
  const quiet = await section(still, 'MATH101', 1);
  if (quiet.animation !== 'none') throw new Error(`reduced motion still animates "${quiet.animation}"`);

  t.step = 'a link in lower case shows the course as /api/courses spells it';
  const lower = await openPage(t, await t.browser.newContext(), base, 'lower');
  requireCsp(await lower.goto(`${base}/?course=math101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/?course=math101`);
  await waitLive(lower, ['MATH101']);
  const spelled = await lower.evaluate(() => [
    [...document.querySelectorAll('[data-course]')].map((e) => e.dataset.course).join(','),
    location.search,
  ]);
  if (spelled[0] !== 'MATH101' || spelled[1] !== '?course=MATH101') throw new Error(`lower-case link: ${JSON.stringify(spelled)}`);

  t.step = 'no request to another host';
  for (const p of [page, again, still, lower]) if (p.offHost.length) throw new Error(`requests to other hosts: ${p.offHost.join(' ')}`);
});
