// A node dies under the page: node failover.mjs <https baseUrl> <screenshotPath>
//
// Opens /?course=LIVE1 through HAProxy over https (a self-signed certificate:
// this test alone tells Chromium to accept it), waits until the board is live
// with numbers changing, prints "LIVE <node id>" on stdout and waits. The test
// harness SIGKILLs that node. The page must come back live on the other node
// by itself (no reload: a marker set in the page survives) and its numbers
// must keep changing there.
import { run, baseAndShot, nodeShown, requireCsp } from './lib.mjs';
import { failOnCsp } from './csp.mjs';

const { base, shot } = baseAndShot('failover');

run('failover', 150_000, async (t) => {
  t.step = 'open the board over https';
  const context = await t.browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  let loads = 0;
  page.on('load', () => { loads += 1; });
  await failOnCsp(page, 'failover', t.fail);
  requireCsp(await page.goto(`${base}/?course=LIVE1`), 'GET /?course=LIVE1 over https');
  if (!page.url().startsWith('https://')) throw new Error(`not served over https: ${page.url()}`);
  await page.evaluate(() => { window.__failoverMarker = 'same-document'; });

  const nodeOf = () => nodeShown(page);
  const snapshot = () => page.evaluate(() => ({
    state: document.getElementById('conn-state')?.textContent?.trim(),
    sections: document.querySelectorAll('[data-section]').length,
    text: Array.from(document.querySelectorAll('[data-section]')).map((e) => e.textContent.replace(/\s+/g, ' ').trim()).join(' | '),
    marker: window.__failoverMarker || null,
  }));

  // Live, with numbers that change, on the first node.
  t.step = 'live with changing numbers on the first node';
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
  if (!first) throw new Error(`never live with changing numbers on the first node (last: ${JSON.stringify(last)}, ${seen.size} distinct boards)`);
  console.log(`LIVE ${first}`);

  // The harness kills that node now. Wait until the page is live elsewhere.
  t.step = 'live on another node after the kill';
  let second = null;
  let sawDown = false;
  for (let i = 0; i < 900 && !second; i++) {
    const s = await snapshot();
    if (s.state !== 'live') sawDown = true;
    const node = await nodeOf();
    if (s.state === 'live' && s.sections > 0 && node && node !== first) second = node;
    else await page.waitForTimeout(100);
  }
  if (!second) throw new Error('never live on another node after the kill');
  console.log(`failover: live again on ${second} (saw it go down: ${sawDown})`);

  // Numbers keep changing on the new node.
  t.step = 'numbers keep changing on the new node';
  seen = new Set();
  for (let i = 0; i < 300 && seen.size < 3; i++) {
    const s = await snapshot();
    if (s.state === 'live') seen.add(s.text);
    await page.waitForTimeout(100);
  }
  if (seen.size < 3) throw new Error(`numbers stopped changing after the failover (${seen.size} distinct boards)`);
  const end = await snapshot();
  if (end.marker !== 'same-document' || loads !== 1) throw new Error(`the page reloaded (loads ${loads}, marker ${end.marker})`);
  await page.screenshot({ path: shot, fullPage: true });
}, { args: ['--ignore-certificate-errors'] });
