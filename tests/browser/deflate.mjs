// permessage-deflate in a real browser: node deflate.mjs <baseUrl> <screenshotPath>
//
// Opens <baseUrl>/?course=ART150 in headless Chromium (which offers
// permessage-deflate on every WebSocket), and through the DevTools protocol
// checks that the server's 101 answered the offer with
// `permessage-deflate; server_no_context_takeover; client_no_context_takeover`,
// that course frames of 256 B or more arrived (Chromium inflated them), and
// that the page's board shows them. The Rust side checks the server's byte
// counters: what went on the wire is less than the payload (so frames were
// compressed). Prints `frames=N big=M` and exits 0 when all holds.
import { run, baseAndShot, requireCsp } from './lib.mjs';
import { failOnCsp } from './csp.mjs';

const STEP_TIMEOUT_MS = 20_000;
const { base, shot: shotPath } = baseAndShot('deflate');
const course = 'ART150';

run('deflate', 60_000, async (t) => {
  const context = await t.browser.newContext({ viewport: { width: 1200, height: 800 } });
  const page = await context.newPage();
  await failOnCsp(page, 'deflate', t.fail);
  const cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  let offered = null;
  let answered = null;
  const frames = [];
  cdp.on('Network.webSocketWillSendHandshakeRequest', (e) => {
    const h = e.request.headers || {};
    offered = h['Sec-WebSocket-Extensions'] ?? h['sec-websocket-extensions'] ?? null;
  });
  cdp.on('Network.webSocketHandshakeResponseReceived', (e) => {
    const h = e.response.headers || {};
    answered = h['Sec-WebSocket-Extensions'] ?? h['sec-websocket-extensions'] ?? null;
  });
  cdp.on('Network.webSocketFrameReceived', (e) => {
    if (e.response.opcode !== 1) return;
    try { frames.push(JSON.parse(e.response.payloadData)); } catch { frames.push({ type: 'unparsable' }); }
  });

  t.step = `open /?course=${course}`;
  const resp = await page.goto(`${base}/?course=${course}`, { waitUntil: 'domcontentloaded', timeout: STEP_TIMEOUT_MS });
  if (!resp || !resp.ok()) throw new Error(`GET /?course=${course} answered ${resp ? resp.status() : 'nothing'}`);
  requireCsp(resp, `GET /?course=${course}`);
  await page.waitForFunction(() => {
    const s = document.getElementById('conn-state');
    return s && s.textContent.trim() === 'live' && document.querySelectorAll('.section[data-section]').length > 0;
  }, null, { timeout: STEP_TIMEOUT_MS, polling: 100 });

  t.step = 'the 101 answers the deflate offer';
  if (!offered || !/permessage-deflate/i.test(offered)) throw new Error(`Chromium offered ${JSON.stringify(offered)}`);
  const want = 'permessage-deflate; server_no_context_takeover; client_no_context_takeover';
  if (answered !== want) throw new Error(`server answered ${JSON.stringify(answered)}, want ${JSON.stringify(want)}`);

  // Live frames for a while: every one parses, and the board follows them.
  t.step = 'live frames';
  const t0 = Date.now();
  while (Date.now() - t0 < STEP_TIMEOUT_MS && frames.filter((f) => f.type === 'frame' && !f.full).length < 3) {
    await page.waitForTimeout(200);
  }
  if (frames.some((f) => f.type === 'unparsable')) throw new Error('a received message was not JSON');
  const courseFrames = frames.filter((f) => f.type === 'frame' && f.course === course);
  const full = courseFrames.find((f) => f.full);
  if (!full || full.sections.length === 0) throw new Error('no full frame with sections');
  const big = courseFrames.filter((f) => JSON.stringify(f).length >= 256).length;
  if (big === 0) throw new Error('no frame of 256 B or more (nothing to compress)');
  if (courseFrames.filter((f) => !f.full).length < 3) throw new Error(`only ${courseFrames.length} course frames`);

  // The DOM shows the latest state the frames carried, section by section.
  // Frames keep arriving while we look (and seats are sometimes released), so
  // compare the board with the frames received so far until both agree.
  const latestOf = () => {
    const latest = {};
    for (const f of frames) {
      if (f.type !== 'frame' || f.course !== course) continue;
      if (f.full) for (const k of Object.keys(latest)) delete latest[k];
      for (const s of f.sections) latest[s.section] = s.seats_taken;
    }
    return latest;
  };
  t.step = 'the board shows what the frames carried';
  let mismatch = 'never compared';
  const until = Date.now() + STEP_TIMEOUT_MS;
  while (mismatch && Date.now() < until) {
    const shown = await page.evaluate(() => {
      const out = {};
      for (const el of document.querySelectorAll('.section[data-section]')) {
        out[el.dataset.section] = Number(el.querySelector('.seats-taken')?.textContent.trim());
      }
      return out;
    });
    mismatch = null;
    for (const [k, v] of Object.entries(latestOf())) {
      if (shown[k] !== v) mismatch = `section ${k}: board shows ${shown[k]}, frames said ${v}`;
    }
    if (mismatch) await page.waitForTimeout(50);
  }
  if (mismatch) throw new Error(mismatch);
  await page.screenshot({ path: shotPath, fullPage: true });
  console.log(`frames=${courseFrames.length} big=${big}`);
});
