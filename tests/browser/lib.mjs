// Shared by the page checks: launching the system Chromium, a step runner that
// reports where it failed, the `<baseUrl> <screenshotPath>` arguments,
// axe-core injection, a same-host guard.
import { chromium } from 'playwright-core';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { failOnCsp, requireCsp } from './csp.mjs';

export { requireCsp };

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const AXE = readFileSync(new URL('./node_modules/axe-core/axe.min.js', import.meta.url), 'utf8');

// The `<baseUrl> <screenshotPath>` a check is run with (the URL without a
// trailing slash); exits 2 with the usage when either is missing.
export function baseAndShot(name) {
  const [rawBase, shot] = process.argv.slice(2);
  if (!rawBase || !shot) {
    console.error(`usage: node ${name}.mjs <baseUrl> <screenshotPath>`);
    process.exit(2);
  }
  return { base: rawBase.replace(/\/+$/, ''), shot };
}

// Runs `body(t)` with a launched browser (`launch`: more Chromium flags in
// `args`, and other launch options); exits 0 when it returns, 1 with the
// failing step (and the pages' errors) when it throws or time runs out.
export async function run(name, timeoutMs, body, launch = {}) {
  const t = { step: 'launch chromium', log: [], browser: null };
  t.say = (msg) => console.log(`${name}: ${msg}`);
  const finish = async (code, why) => {
    if (code !== 0) {
      console.error(`${name}: FAIL during "${t.step}": ${why}`);
      if (t.log.length) console.error(`${name}: page log (last 20):\n  ` + t.log.slice(-20).join('\n  '));
    }
    const closing = t.browser ? t.browser.close().catch(() => {}) : Promise.resolve();
    await Promise.race([closing, new Promise((r) => setTimeout(r, 3000))]);
    process.exit(code);
  };
  t.fail = (why) => finish(1, why);
  setTimeout(() => finish(1, `overall timeout of ${timeoutMs / 1000} s`), timeoutMs).unref();
  try {
    t.browser = await chromium.launch({
      executablePath: CHROMIUM, headless: true, ...launch, args: [...ARGS, ...(launch.args ?? [])],
    });
    await body(t);
    t.say('OK');
    await finish(0);
  } catch (e) {
    await finish(1, e && e.message ? e.message.split('\n')[0] : String(e));
  }
}

// A page whose console errors, page errors and failed requests go to the log,
// whose every request (WebSockets included) must stay on `base`'s host, and
// which fails the run on any Content-Security-Policy violation.
export async function openPage(t, context, base, name) {
  const page = await context.newPage();
  await failOnCsp(page, name, t.fail);
  const origin = new URL(base);
  const offHost = [];
  const check = (url) => {
    const u = new URL(url);
    if (u.protocol === 'data:') return;
    if (u.host !== origin.host) offHost.push(url);
  };
  page.on('request', (r) => check(r.url()));
  page.on('websocket', (ws) => check(ws.url()));
  page.on('console', (m) => { if (m.type() === 'error' || m.type() === 'warning') t.log.push(`[${name} console.${m.type()}] ${m.text()}`); });
  page.on('pageerror', (e) => t.log.push(`[${name} pageerror] ${e.message}`));
  page.on('requestfailed', (r) => t.log.push(`[${name} requestfailed] ${r.url()} ${r.failure()?.errorText ?? ''}`));
  page.offHost = offHost;
  return page;
}

// axe-core, evaluated through the DevTools protocol (so the page's own
// Content-Security-Policy does not stand in the way); throws on any violation.
export async function axe(page, what) {
  await page.evaluate(AXE);
  const r = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  if (r.violations.length) {
    const lines = r.violations.map((v) => `${v.id} (${v.impact}): ${v.nodes.slice(0, 3).map((n) => n.target.join(' ')).join(', ')}`);
    throw new Error(`axe on ${what}: ${lines.join('; ')}`);
  }
  return r;
}

// Waits until the page is live and every course on it shows sections.
export async function waitLive(page, courses, timeoutMs = 15_000) {
  await page.waitForFunction((want) => {
    const s = document.getElementById('conn-state');
    if (!s || s.textContent.trim() !== 'live') return false;
    return want.every((c) => document.querySelector(`[data-course="${c}"] [data-section]`));
  }, courses, { timeout: timeoutMs, polling: 100 }).catch(async () => {
    const state = await page.$eval('#conn-state', (e) => e.textContent.trim()).catch(() => '?');
    const shown = await page.$$eval('[data-course]', (els) => els.map((e) => `${e.dataset.course}:${e.querySelectorAll('[data-section]').length}`));
    throw new Error(`not live with sections for ${courses.join(',')} within ${timeoutMs / 1000} s (state ${state}, shown ${shown.join(' ')})`);
  });
}

// The node id the page's footer names (the node serving it), or null.
export function nodeShown(page) {
  return page.evaluate(() => {
    const m = /node (\S+)/.exec(document.querySelector('footer')?.textContent || document.body.innerText);
    return m ? m[1] : null;
  });
}

// Line-based talk with the Rust test that runs this script: ask() prints a
// request on stdout and resolves with the next line on stdin.
let lines = null;
const waiting = [];
const queued = [];
export function ask(request) {
  if (!lines) {
    lines = createInterface({ input: process.stdin });
    lines.on('line', (l) => { const w = waiting.shift(); if (w) w(l); else queued.push(l); });
  }
  console.log(request);
  if (queued.length) return Promise.resolve(queued.shift());
  return new Promise((resolve) => waiting.push(resolve));
}
