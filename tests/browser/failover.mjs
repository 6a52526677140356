// A node dies under the page: node failover.mjs <https baseUrl> <screenshotPath>
//
// Opens /?course=LIVE1 through HAProxy over https (a self-signed certificate:
// this test alone tells Chromium to accept it), waits until the board is live
// with numbers changing, prints "LIVE <node id>" on stdout and waits. The test
// harness SIGKILLs that node. The page must come back live on the other node
// by itself (no reload: a marker set in the page survives) and its numbers
// must keep changing there.
import { chromium } from 'playwright-core';
import { failOnCsp, requireCsp } from './csp.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--ignore-certificate-errors',
];
const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const fail = async (browser, why) => {
  console.error(`failover: FAIL: ${why}`);
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
};
setTimeout(() => { console.error('failover: FAIL: overall timeout'); process.exit(1); }, 150_000).unref();

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
const context = await browser.newContext({ ignoreHTTPSErrors: true });
const page = await context.newPage();
let loads = 0;
page.on('load', () => { loads += 1; });
await failOnCsp(page, 'failover', (why) => fail(browser, why));
try {
  requireCsp(await page.goto(`${base}/?course=LIVE1`), 'GET /?course=LIVE1 over https');
} catch (e) {
  await fail(browser, e.message);
}
if (!page.url().startsWith('https://')) await fail(browser, `not served over https: ${page.url()}`);
await page.evaluate(() => { window.__failoverMarker = 'same-document'; });

const nodeOf = () => page.evaluate(() => {
  const m = /node (\S+)/.exec(document.querySelector('footer')?.textContent || document.body.innerText);
  return m ? m[1] : null;
});
const snapshot = () => page.evaluate(() => ({
  state: document.getElementById('conn-state')?.textContent?.trim(),
  sections: document.querySelectorAll('[data-section]').length,
  text: Array.from(document.querySelectorAll('[data-section]')).map((e) => e.textContent.replace(/\s+/g, ' ').trim()).join(' | '),
  marker: window.__failoverMarker || null,
}));

// Live, with numbers that change, on the first node.
let first = null;
let seen = new Set();
let last = null;
for (let i = 0; i < 600 && !first; i++) {
  const s = await snapshot();
  last = s;
  if (s.state === 'live' && s.sections > 0) {
    seen.add(s.text);
    if (seen.size >= 3) first = await nodeOf();
  }
  if (!first) await page.waitForTimeout(100);
}
if (!first) await fail(browser, `never live with changing numbers on the first node (last: ${JSON.stringify(last)}, ${seen.size} distinct boards)`);
console.log(`LIVE ${first}`);

// The harness kills that node now. Wait until the page is live elsewhere.
let second = null;
let sawDown = false;
for (let i = 0; i < 900 && !second; i++) {
  const s = await snapshot();
  if (s.state !== 'live') sawDown = true;
  const node = await nodeOf();
  if (s.state === 'live' && s.sections > 0 && node && node !== first) second = node;
  else await page.waitForTimeout(100);
}
if (!second) await fail(browser, 'never live on another node after the kill');
console.log(`failover: live again on ${second} (saw it go down: ${sawDown})`);

// Numbers keep changing on the new node.
seen = new Set();
for (let i = 0; i < 300 && seen.size < 3; i++) {
  const s = await snapshot();
  if (s.state === 'live') seen.add(s.text);
  await page.waitForTimeout(100);
}
if (seen.size < 3) await fail(browser, `numbers stopped changing after the failover (${seen.size} distinct boards)`);
const end = await snapshot();
if (end.marker !== 'same-document' || loads !== 1) await fail(browser, `the page reloaded (loads ${loads}, marker ${end.marker})`);
await page.screenshot({ path: shot, fullPage: true });
await browser.close();
console.log('failover: OK');
process.exit(0);
