// The board's first boards ride in the upgrade: node first_board.mjs <baseUrl> <screenshotPath>
//
// Against a demo node: the board page opened on /?course=CS101&course=MATH101
// opens one WebSocket whose URL names both courses, and both boards arrive
// (full frames after the hello) with no message sent by the page; a course
// added afterwards goes as a watch message and its board arrives too; after
// the connection breaks, the next upgrade names all three and again nothing
// is sent.
import { run, openPage, waitLive, requireCsp } from './lib.mjs';

const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const STEP_MS = 15_000;

await run('first_board', 90_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1000, height: 800 } });
  const page = await openPage(t, context, base, 'board');
  const sockets = [];
  page.on('websocket', (ws) => {
    const s = { url: ws.url(), sent: [], got: [] };
    sockets.push(s);
    ws.on('framesent', (f) => { try { s.sent.push(JSON.parse(f.payload)); } catch (_) { s.sent.push(f.payload); } });
    ws.on('framereceived', (f) => { try { s.got.push(JSON.parse(f.payload)); } catch (_) { /* binary */ } });
  });

  t.step = 'open /?course=CS101&course=MATH101';
  requireCsp(await page.goto(`${base}/?course=CS101&course=MATH101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), base);
  await waitLive(page, ['CS101', 'MATH101']);
  if (sockets.length !== 1) throw new Error(`${sockets.length} WebSockets opened`);
  const first = sockets[0];
  const named = new URL(first.url).searchParams.getAll('course');
  if (named.join(',') !== 'CS101,MATH101') throw new Error(`the upgrade names ${named.join(',')}: ${first.url}`);
  if (first.sent.length) throw new Error(`the page sent ${JSON.stringify(first.sent)} before its first boards`);
  const types = first.got.map((m) => m.type);
  if (types[0] !== 'hello') throw new Error(`first message ${types[0]}`);
  for (const c of ['CS101', 'MATH101']) {
    if (!first.got.some((m) => m.type === 'frame' && m.course === c && m.full === true)) throw new Error(`no full frame of ${c}`);
  }
  t.say(`one upgrade ${new URL(first.url).search}: hello and both boards, nothing sent`);

  t.step = 'a course added later goes as a watch message';
  await page.fill('#course-input', 'BIO101');
  await page.press('#course-input', 'Enter');
  await waitLive(page, ['CS101', 'MATH101', 'BIO101']);
  const watches = first.sent.filter((m) => m && m.op === 'watch').map((m) => m.course);
  if (watches.join(',') !== 'BIO101') throw new Error(`watch messages sent: ${JSON.stringify(first.sent)}`);

  t.step = 'after a break the next upgrade names all three';
  const before = sockets.length;
  await page.evaluate(() => window.dispatchEvent(new Event('pagehide')));
  await page.evaluate(() => window.dispatchEvent(new PageTransitionEvent('pageshow', { persisted: true })));
  await waitLive(page, ['CS101', 'MATH101', 'BIO101']);
  const deadline = Date.now() + STEP_MS;
  while (sockets.length === before && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  const again = sockets.at(-1);
  if (sockets.length === before) throw new Error('no new WebSocket after pageshow');
  const renamed = new URL(again.url).searchParams.getAll('course').sort();
  if (renamed.join(',') !== 'BIO101,CS101,MATH101') throw new Error(`the new upgrade names ${renamed}`);
  while (!['CS101', 'MATH101', 'BIO101'].every((c) => again.got.some((m) => m.type === 'frame' && m.course === c && m.full)) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
  }
  for (const c of ['CS101', 'MATH101', 'BIO101']) {
    if (!again.got.some((m) => m.type === 'frame' && m.course === c && m.full)) throw new Error(`no full frame of ${c} after the reconnect`);
  }
  if (again.sent.length) throw new Error(`sent after the reconnect: ${JSON.stringify(again.sent)}`);
  if (page.offHost.length) throw new Error(`requests off the host: ${page.offHost.join(' ')}`);
  await page.screenshot({ path: shot });
});
