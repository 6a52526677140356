// Back/forward cache check: node bfcache.mjs <baseUrl> <screenshotPath>
//
// Chromium with the back/forward cache on (and without the flag
// playwright-core adds to turn it off): the board goes live, the tab goes to
// another page and back, the board comes from the cache (pageshow persisted,
// no reasons it was not restored) and is live again within 2 s.
import { chromium } from 'playwright-core';
import { failOnCsp } from './csp.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--enable-features=BackForwardCache',
];
const STEP_MS = 15_000;
const LIVE_AGAIN_MS = 2_000;

const [rawBase, shotPath] = process.argv.slice(2);
if (!rawBase || !shotPath) {
  console.error('usage: node bfcache.mjs <baseUrl> <screenshotPath>');
  process.exit(2);
}
const base = rawBase.replace(/\/+$/, '');
let browser = null;
let step = 'launch chromium';
const pageLog = [];

async function finish(code, reason) {
  if (code !== 0) {
    console.error(`bfcache: FAIL during "${step}": ${reason}`);
    if (pageLog.length) console.error('bfcache: page log (last 20):\n  ' + pageLog.slice(-20).join('\n  '));
  }
  const closing = browser ? browser.close().catch(() => {}) : Promise.resolve();
  await Promise.race([closing, new Promise((r) => setTimeout(r, 3000))]);
  process.exit(code);
}
setTimeout(() => finish(1, 'overall timeout of 60 s'), 60_000).unref();

const badge = (page) => page.$eval('#conn-state', (el) => el.dataset.state);

try {
  browser = await chromium.launch({
    executablePath: CHROMIUM, headless: true, args: ARGS,
    ignoreDefaultArgs: ['--disable-back-forward-cache'],
  });
  const context = await browser.newContext();
  const page = await context.newPage();
  await failOnCsp(page, 'board', (why) => finish(1, why));
  page.on('pageerror', (e) => pageLog.push(`[pageerror] ${e.message}`));
  await page.addInitScript(() => {
    window.__shows = [];
    addEventListener('pageshow', (ev) => window.__shows.push(ev.persisted));
  });
  step = 'open the board';
  await page.goto(`${base}/?course=CS101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS });
  // Live and drawn: the badge goes live on the server's hello, the sections
  // with the first frame a tick later.
  await page.waitForFunction(() => document.querySelector('#conn-state')?.dataset.state === 'live'
    && document.querySelectorAll('[data-course] [data-section]').length > 0, null, { timeout: STEP_MS });
  step = 'go to another page';
  await page.goto(`${base}/healthz`, { waitUntil: 'load', timeout: STEP_MS });
  step = 'come back';
  const back = Date.now();
  await page.goBack({ waitUntil: 'commit', timeout: STEP_MS });
  const shows = await page.evaluate(() => window.__shows);
  if (shows.at(-1) !== true) {
    const why = await page.evaluate(() => JSON.stringify(performance.getEntriesByType('navigation')[0]?.notRestoredReasons ?? null));
    throw new Error(`not restored from the back/forward cache (pageshow persisted: ${JSON.stringify(shows)}; reasons: ${why})`);
  }
  step = 'live again within 2 s';
  await page.waitForFunction(() => document.querySelector('#conn-state')?.dataset.state === 'live', null, { timeout: LIVE_AGAIN_MS })
    .catch(async () => { throw new Error(`badge ${await badge(page)} ${Date.now() - back} ms after coming back`); });
  const seats = await page.$$eval('[data-course] [data-section]', (els) => els.length);
  if (seats === 0) throw new Error('the board lost its sections');
  console.log(`bfcache: restored from the cache, live again ${Date.now() - back} ms after coming back`);
  await page.screenshot({ path: shotPath, fullPage: true });
  await finish(0);
} catch (e) {
  await finish(1, e && e.message ? e.message.split('\n')[0] : String(e));
}
