// Accessibility and the phone, on `seatboard demo`: node a11y.mjs <baseUrl> <screenshotPath>
//
// axe-core finds no violation on / (empty and with a shortlist) and on /admin,
// in the light and the dark colour scheme; the board is used with the keyboard
// alone (add two courses, remove them, focus always visible and kept; on
// /admin sort by a column and open a course's roster); a link with nine
// courses shows eight over one WebSocket, one watch each; at
// 320 px wide nothing scrolls sideways and every control is on screen; the
// first frame is on screen within 1 s of navigation (in one of up to 5 loads); the page
// is under 40 KB decoded and arrives compressed; no request leaves the host.
// Screenshots: <screenshotPath> (dark, shortlist) plus -light, -320 and
// -keyboard variants next to it.
import { run, openPage, axe, waitLive, requireCsp } from './lib.mjs';

const [rawBase, shot] = process.argv.slice(2);
const base = (rawBase || '').replace(/\/+$/, '');
const STEP_MS = 15_000;
const variant = (name) => shot.replace(/(\.png)?$/, `-${name}.png`);
const pages = [];

await run('a11y', 150_000, async (t) => {
  for (const colorScheme of ['light', 'dark']) {
    const context = await t.browser.newContext({ colorScheme, viewport: { width: 1200, height: 800 } });
    for (const path of ['/', '/?course=CS101&course=ART150&course=MATH101', '/admin']) {
      t.step = `axe on ${path} (${colorScheme})`;
      const page = await openPage(t, context, base, `${colorScheme} ${path}`);
      pages.push(page);
      requireCsp(await page.goto(`${base}${path}`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}${path}`);
      if (path === '/admin') {
        await page.waitForFunction(() => document.querySelectorAll('#courses tbody tr[data-course]').length > 0
          && getComputedStyle(document.querySelector('.table-wrap')).opacity === '1', null, { timeout: STEP_MS, polling: 100 });
      } else if (path === '/') {
        await page.waitForFunction(() => document.querySelectorAll('#suggest button').length > 0, null, { timeout: STEP_MS, polling: 100 });
      } else {
        await waitLive(page, ['CS101', 'ART150', 'MATH101']);
        // The boards fade in from their dimmed "not live" look over 0.3 s:
        // contrast is checked once the fade is over, not halfway through it.
        await page.waitForFunction(() => getComputedStyle(document.getElementById('courses')).opacity === '1', null, { timeout: STEP_MS, polling: 50 });
      }
      const r = await axe(page, `${path} (${colorScheme})`);
      t.say(`axe ${path} ${colorScheme}: 0 violations, ${r.passes?.length ?? 'n/a'} rules passed`);
      if (path.startsWith('/?')) await page.screenshot({ path: colorScheme === 'dark' ? shot : variant('light'), fullPage: true });
      await page.evaluate(() => localStorage.clear());
      await page.close();
    }
    await context.close();
  }

  t.step = 'keyboard only';
  {
    const context = await t.browser.newContext({ viewport: { width: 1000, height: 800 } });
    const page = await openPage(t, context, base, 'keyboard');
    pages.push(page);
    requireCsp(await page.goto(`${base}/`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/`);
    await page.waitForFunction(() => document.querySelectorAll('#course-list option').length > 0, null, { timeout: STEP_MS });
    const focused = () => page.evaluate(() => {
      const e = document.activeElement;
      const cs = getComputedStyle(e);
      return { id: e.id, label: e.getAttribute('aria-label') || e.textContent.trim(), outline: cs.outlineStyle, width: cs.outlineWidth };
    });
    const tabTo = async (pred, what, key = 'Tab') => {
      for (let i = 0; i < 15; i++) {
        await page.keyboard.press(key);
        const f = await focused();
        if (pred(f)) {
          if (f.outline === 'none' || f.width === '0px') throw new Error(`focus on ${what} is not visible`);
          return f;
        }
      }
      throw new Error(`${key} never reached ${what}`);
    };
    await tabTo((f) => f.id === 'course-input', 'the course field');
    for (const c of ['CS101', 'MATH101']) {
      await page.keyboard.type(c);
      await page.keyboard.press('Enter');
    }
    await waitLive(page, ['CS101', 'MATH101']);
    if ((await focused()).id !== 'course-input') throw new Error('focus left the course field after adding');
    await tabTo((f) => f.label === 'Remove CS101', 'Remove CS101');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => !document.querySelector('[data-course="CS101"]'), null, { timeout: 5000 });
    const next = await focused();
    if (next.label !== 'Remove MATH101') throw new Error(`after removing CS101 focus is on ${JSON.stringify(next)}, want Remove MATH101`);
    await page.screenshot({ path: variant('keyboard'), fullPage: true });
    await page.keyboard.press(' ');
    await page.waitForFunction(() => document.querySelectorAll('[data-course]').length === 0, null, { timeout: 5000 });
    if ((await focused()).id !== 'course-input') throw new Error('after removing the last course focus is not back on the course field');
    const q = await page.evaluate(() => location.search);
    if (q !== '') throw new Error(`URL after removing everything: ${q}`);
    t.say('keyboard: added CS101 and MATH101, removed both, focus visible and kept');

    t.step = 'keyboard on /admin: sort by a header';
    const admin = await openPage(t, context, base, 'admin keyboard');
    pages.push(admin);
    requireCsp(await admin.goto(`${base}/admin`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/admin`);
    await admin.waitForFunction(() => document.querySelectorAll('#courses tbody tr[data-course]').length > 0, null, { timeout: STEP_MS });
    let th = null;
    for (let i = 0; i < 20 && !th; i++) {
      await admin.keyboard.press('Tab');
      th = await admin.evaluate(() => document.activeElement.matches('th[data-key="course"]') ? 'course' : null);
    }
    if (!th) throw new Error('Tab never reached the "course" column header');
    await admin.keyboard.press('Enter');
    await admin.waitForFunction(() => document.querySelector('th[data-key="course"]').hasAttribute('aria-sort'), null, { timeout: 5000 });

    t.step = 'keyboard on /admin: open a roster';
    let who = null;
    for (let i = 0; i < 25 && !who; i++) {
      await admin.keyboard.press('Tab');
      who = await admin.evaluate(() => document.activeElement.matches('button.who') ? document.activeElement.closest('tr').dataset.course : null);
    }
    if (!who) throw new Error('Tab never reached a viewer-count (roster) button');
    await admin.keyboard.press('Enter');
    await admin.waitForFunction((c) => !document.getElementById('roster').hidden && document.getElementById('roster-course').textContent === c, who, { timeout: 5000 });
    await admin.keyboard.press('Escape');
    await admin.waitForFunction(() => document.getElementById('roster').hidden, null, { timeout: 5000 });
    t.say(`keyboard on /admin: sorted by course, opened and closed the roster of ${who}`);
    await context.close();
  }

  t.step = '320 px wide';
  {
    const context = await t.browser.newContext({ viewport: { width: 320, height: 640 }, isMobile: true, hasTouch: true, deviceScaleFactor: 2 });
    const page = await openPage(t, context, base, '320');
    pages.push(page);
    requireCsp(await page.goto(`${base}/?course=CS101&course=MATH101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/?course=CS101&course=MATH101`);
    await waitLive(page, ['CS101', 'MATH101']);
    const fit = await page.evaluate(() => {
      const out = [];
      for (const e of document.querySelectorAll('button:not([hidden]), input, [data-section], [data-course] h2, .viewers')) {
        const r = e.getBoundingClientRect();
        if (r.width === 0 && r.height === 0) continue;
        if (r.left < 0 || r.right > 320.5) out.push(`${e.tagName}.${e.className || e.id} ${Math.round(r.left)}..${Math.round(r.right)}`);
      }
      return { scroll: document.documentElement.scrollWidth, out };
    });
    if (fit.scroll > 320 || fit.out.length) throw new Error(`at 320 px: page ${fit.scroll} px wide; outside: ${fit.out.slice(0, 5).join(', ')}`);
    await page.screenshot({ path: variant('320'), fullPage: true });
    t.say('320 px: no sideways scroll, every control on screen');
    await context.close();
  }

  t.step = 'nine courses in the link: eight on screen, over one WebSocket, each watched once';
  {
    const codes = ['ART150', 'BIO101', 'BIO250', 'CHEM101', 'CHEM231', 'CS101', 'CS102', 'CS201', 'CS225'];
    const context = await t.browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await openPage(t, context, base, 'eight');
    pages.push(page);
    const sockets = [];
    page.on('websocket', (ws) => {
      const sent = [];
      sent.url = ws.url();
      sockets.push(sent);
      ws.on('framesent', (f) => { try { sent.push(JSON.parse(f.payload)); } catch (_) { sent.push(f.payload); } });
    });
    const q = codes.map((c) => `course=${c}`).join('&');
    requireCsp(await page.goto(`${base}/?${q}`, { waitUntil: 'domcontentloaded', timeout: STEP_MS }), `${base}/?${q}`);
    await waitLive(page, codes.slice(0, 8));
    const shown = await page.$$eval('[data-course]', (els) => els.map((e) => e.dataset.course));
    if (shown.join(',') !== codes.slice(0, 8).join(',')) throw new Error(`on screen: ${shown}`);
    const notice = await page.$eval('#notice', (e) => (e.hidden ? '' : e.textContent));
    if (!/up to 8/.test(notice)) throw new Error(`no notice about the limit: ${JSON.stringify(notice)}`);
    await page.waitForFunction(() => [...document.querySelectorAll('[data-course] .viewers')].every((v) => /^\d+ viewing$/.test(v.textContent)), null, { timeout: STEP_MS });
    if (sockets.length !== 1) throw new Error(`${sockets.length} WebSockets opened, want 1`);
    // Named in the upgrade (their boards come with the hello), or sent as watch messages.
    const named = new URL(sockets[0].url).searchParams.getAll('course');
    const watches = [...named, ...sockets[0].filter((m) => m && m.op === 'watch').map((m) => m.course)];
    if (watches.slice().sort().join(',') !== codes.slice(0, 8).sort().join(',')) throw new Error(`watched: ${watches}`);
    const url = await page.evaluate(() => new URL(location.href).searchParams.getAll('course'));
    if (url.join(',') !== codes.slice(0, 8).join(',')) throw new Error(`URL keeps ${url}`);
    t.say(`8 of 9 courses on screen over 1 WebSocket (${named.length} named in the upgrade, ${watches.length - named.length} watch messages), each with its viewer count`);
    await context.close();
  }

  t.step = 'first frame within 1 s, page size and compression';
  {
    const times = [];
    // Up to 5 loads, stopping at the first within 1 s: the box running the tests is
    // shared, so one slow load is the machine, five are the page.
    for (let i = 0; i < 5 && !times.some((ms) => ms <= 1000); i++) {
      const context = await t.browser.newContext();
      const page = await openPage(t, context, base, `load ${i}`);
      pages.push(page);
      const resp = await page.goto(`${base}/?course=CS101`, { waitUntil: 'domcontentloaded', timeout: STEP_MS });
      requireCsp(resp, `${base}/?course=CS101`);
      const enc = (await resp.allHeaders())['content-encoding'];
      if (enc !== 'gzip') throw new Error(`GET / Content-Encoding ${enc}, want gzip`);
      await page.waitForFunction(() => performance.getEntriesByName('seatboard-first-frame').length > 0, null, { timeout: STEP_MS, polling: 20 });
      const m = await page.evaluate(() => {
        const n = performance.getEntriesByType('navigation')[0];
        return { first: performance.getEntriesByName('seatboard-first-frame')[0].startTime, decoded: n.decodedBodySize, encoded: n.encodedBodySize };
      });
      if (m.decoded >= 40 * 1024) throw new Error(`page is ${m.decoded} B decoded, budget 40 KiB`);
      if (!(m.encoded > 0 && m.encoded < m.decoded)) throw new Error(`page not compressed on the wire: ${JSON.stringify(m)}`);
      times.push(Math.round(m.first));
      if (i === 0) t.say(`page ${m.decoded} B, ${m.encoded} B on the wire`);
      await context.close();
    }
    const best = Math.min(...times);
    t.say(`first frame after ${times.join(', ')} ms (best ${best} ms)`);
    if (best > 1000) throw new Error(`first frame after ${times.join(', ')} ms, want one load within 1000 ms`);
  }

  t.step = 'no request to another host';
  for (const p of pages) if (p.offHost.length) throw new Error(`requests to other hosts: ${p.offHost.join(' ')}`);
});
