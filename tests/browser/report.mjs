// The rehearsal's HTML report in Chromium:
//   node report.mjs <file:///path/report.html> <screenshotPath>
// Checks: every plot is drawn with data (a polyline with a point per second,
// some of them above the axis), the nodes' CPU and RSS plots among them, and
// the page makes no request but itself.
import { run } from './lib.mjs';

const [url, shot] = process.argv.slice(2);

run('report', 60_000, async (t) => {
  t.step = 'open the report';
  const page = await t.browser.newPage({ viewport: { width: 800, height: 1000 } });
  const requests = [];
  page.on('request', (r) => requests.push(r.url()));
  await page.goto(url, { waitUntil: 'load', timeout: 15_000 });
  t.step = 'every plot drawn with data';
  const plots = await page.$$eval('svg.plot', (svgs) => svgs.map((s) => ({
    title: s.getAttribute('aria-label'),
    points: Number(s.dataset.points),
    lines: [...s.querySelectorAll('polyline')].map((p) => ({
      n: p.points.numberOfItems,
      raised: [...Array(p.points.numberOfItems).keys()].some((i) => p.points.getItem(i).y < 160),
      width: p.getBBox().width,
    })),
  })));
  if (plots.length !== 6) throw new Error(`${plots.length} plots, want 6`);
  for (const want of ['Node CPU (% of a core)', 'Node RSS (MiB)']) {
    const p = plots.find((x) => x.title === want);
    if (!p) throw new Error(`no plot "${want}"`);
    if (p.lines.length < 1) throw new Error(`"${want}": no node's line`);
  }
  for (const [i, p] of plots.entries()) {
    if (!(p.points >= 2)) throw new Error(`plot ${i} (${p.title}): ${p.points} points`);
    for (const l of p.lines) if (!(l.n >= 2) || !(l.width > 100)) throw new Error(`plot ${i} (${p.title}): a line not drawn: ${JSON.stringify(l)}`);
    if (!p.lines.some((l) => l.n === p.points)) throw new Error(`plot ${i} (${p.title}): no line has all ${p.points} points`);
    if (!p.lines.some((l) => l.raised)) throw new Error(`plot ${i} (${p.title}): no data above the axis`);
  }
  const elsewhere = requests.filter((r) => r !== url);
  if (elsewhere.length) throw new Error(`requests elsewhere: ${elsewhere.join(', ')}`);
  await page.screenshot({ path: shot, fullPage: true });
  t.say(`${plots.length} plots (${plots.map((p) => p.points).join(', ')} points)`);
});
