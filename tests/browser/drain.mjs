// Rolling restart as a browser lives it: node drain.mjs <baseUrl> <screenshotPath>
//
// Opens /?course=ART150, waits until live, prints "LIVE <node id>" on stdout
// and then watches: the test harness starts a second seatboard on the same
// port and drains the first. The page must show the reconnect hint (state
// "draining"), then come back "live" on the other node with the board filled.
import { chromium } from 'playwright-core';
import { failOnCsp, requireCsp } from './csp.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const fail = async (browser, why) => {
  console.error(`drain: FAIL: ${why}`);
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
};
setTimeout(() => { console.error('drain: FAIL: overall timeout'); process.exit(1); }, 150_000).unref();

const browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
const page = await browser.newPage();
await failOnCsp(page, 'drain', (why) => fail(browser, why));
try {
  requireCsp(await page.goto(`${base}/?course=ART150`), 'GET /?course=ART150');
} catch (e) {
  await fail(browser, e.message);
}
const nodeOf = () => page.evaluate(() => {
  const m = /node (\S+)/.exec(document.querySelector('footer')?.textContent || document.body.innerText);
  return m ? m[1] : null;
});
const snapshot = () => page.evaluate(() => ({
  state: document.getElementById('conn-state')?.textContent?.trim(),
  sections: document.querySelectorAll('.section').length,
}));
let first = null;
for (let i = 0; i < 300 && !first; i++) {
  const s = await snapshot();
  if (s.state === 'live' && s.sections > 0) first = await nodeOf();
  else await page.waitForTimeout(100);
}
if (!first) await fail(browser, 'never live on the first node');
// Every state the badge takes from now on, so a short "draining" (a hint's
// after_ms can be a few ms) is seen even between two polls.
await page.evaluate(() => {
  const el = document.getElementById('conn-state');
  window.seenStates = [];
  new MutationObserver(() => window.seenStates.push(el.dataset.state))
    .observe(el, { attributes: true, attributeFilter: ['data-state'] });
});
console.log(`LIVE ${first}`);

let sawDraining = false;
let done = false;
for (let i = 0; i < 900 && !done; i++) {
  const s = await snapshot();
  if (s.state === 'draining' || await page.evaluate(() => window.seenStates.includes('draining'))) {
    sawDraining = true;
  }
  const node = await nodeOf();
  if (sawDraining && s.state === 'live' && s.sections > 0 && node && node !== first) {
    console.log(`drain: back live on ${node} after the hint`);
    done = true;
  } else {
    await page.waitForTimeout(100);
  }
}
if (!done) {
  const s = await snapshot();
  const states = await page.evaluate(() => window.seenStates.join(' → '));
  await fail(browser, `not back live on another node (saw draining: ${sawDraining}; now ${s.state} on ${await nodeOf()}, first ${first}; states since live: ${states})`);
}
await page.screenshot({ path: shot, fullPage: true });
await browser.close();
console.log('drain: OK');
process.exit(0);
