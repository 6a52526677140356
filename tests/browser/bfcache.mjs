// Back/forward cache check: node bfcache.mjs <baseUrl> <screenshotPath>
//
// Chromium with the back/forward cache on (and without the flag
// playwright-core adds to turn it off): the board goes live, the tab goes to
// another page and back, the board comes from the cache (pageshow persisted,
// no reasons it was not restored) and is live again within 2 s.
import { run, baseAndShot } from './lib.mjs';
import { failOnCsp } from './csp.mjs';

const STEP_MS = 15_000;
const LIVE_AGAIN_MS = 2_000;
const { base, shot: shotPath } = baseAndShot('bfcache');

const badge = (page) => page.$eval('#conn-state', (el) => el.dataset.state);

run('bfcache', 60_000, async (t) => {
  const context = await t.browser.newContext();
  const page = await context.newPage();
  await failOnCsp(page, 'board', t.fail);
  page.on('pageerror', (e) => t.log.push(`[pageerror] ${e.message}`));
  await page.addInitScript(() => {
    window.__shows = [];
    addEventListener('pageshow', (ev) => window.__shows.push(ev.persisted));
  });
  t.step = 'open the board';
  await page.goto(`${base}/?course=CS101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS });
  // Live and drawn: the badge goes live on the server's hello, the sections
  // with the first frame a tick later.
  await page.waitForFunction(() => document.querySelector('#conn-state')?.dataset.state === 'live'
    && document.querySelectorAll('[data-course] [data-section]').length > 0, null, { timeout: STEP_MS });
  t.step = 'go to another page';
  await page.goto(`${base}/healthz`, { waitUntil: 'load', timeout: STEP_MS });
  t.step = 'come back';
  const back = Date.now();
  await page.goBack({ waitUntil: 'commit', timeout: STEP_MS });
  const shows = await page.evaluate(() => window.__shows);
  if (shows.at(-1) !== true) {
    const why = await page.evaluate(() => JSON.stringify(performance.getEntriesByType('navigation')[0]?.notRestoredReasons ?? null));
    throw new Error(`not restored from the back/forward cache (pageshow persisted: ${JSON.stringify(shows)}; reasons: ${why})`);
  }
  t.step = 'live again within 2 s';
  await page.waitForFunction(() => document.querySelector('#conn-state')?.dataset.state === 'live', null, { timeout: LIVE_AGAIN_MS })
    .catch(async () => { throw new Error(`badge ${await badge(page)} ${Date.now() - back} ms after coming back`); });
  const seats = await page.$$eval('[data-course] [data-section]', (els) => els.length);
  if (seats === 0) throw new Error('the board lost its sections');
  console.log(`bfcache: restored from the cache, live again ${Date.now() - back} ms after coming back`);
  await page.screenshot({ path: shotPath, fullPage: true });
}, {
  // The cache on, and without the flag playwright-core adds to turn it off.
  args: ['--enable-features=BackForwardCache'],
  ignoreDefaultArgs: ['--disable-back-forward-cache'],
});
