// Rolling restart as a browser lives it: node drain.mjs <baseUrl> <screenshotPath>
//
// Opens /?course=ART150, waits until live, prints "LIVE <node id>" on stdout
// and then watches: the test harness starts a second seatboard on the same
// port and drains the first. The page must show the reconnect hint (state
// "draining"), then come back "live" on the other node with the board filled.
import { run, baseAndShot, nodeShown, requireCsp } from './lib.mjs';
import { failOnCsp } from './csp.mjs';

const { base, shot } = baseAndShot('drain');

run('drain', 150_000, async (t) => {
  t.step = 'open the board';
  const page = await t.browser.newPage();
  await failOnCsp(page, 'drain', t.fail);
  requireCsp(await page.goto(`${base}/?course=ART150`), 'GET /?course=ART150');
  const nodeOf = () => nodeShown(page);
  const snapshot = () => page.evaluate(() => ({
    state: document.getElementById('conn-state')?.textContent?.trim(),
    sections: document.querySelectorAll('.section').length,
  }));
  t.step = 'live on the first node';
  let first = null;
  for (let i = 0; i < 300 && !first; i++) {
    const s = await snapshot();
    if (s.state === 'live' && s.sections > 0) first = await nodeOf();
    else await page.waitForTimeout(100);
  }
  if (!first) throw new Error('never live on the first node');
  // Every state the badge takes from now on, so a short "draining" (a hint's
  // after_ms can be a few ms) is seen even between two polls.
  await page.evaluate(() => {
    const el = document.getElementById('conn-state');
    window.seenStates = [];
    new MutationObserver(() => window.seenStates.push(el.dataset.state))
      .observe(el, { attributes: true, attributeFilter: ['data-state'] });
  });
  console.log(`LIVE ${first}`);

  t.step = 'the hint, then live on another node';
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
    throw new Error(`not back live on another node (saw draining: ${sawDraining}; now ${s.state} on ${await nodeOf()}, first ${first}; states since live: ${states})`);
  }
  await page.screenshot({ path: shot, fullPage: true });
});
