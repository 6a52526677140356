// Proves the CSP guard of the browser checks can fail: node csp_selftest.mjs
//
// Serves (by request interception, no server) a page whose policy forbids its
// own inline script, inline style attribute and a connection to another
// host, and exits 0 only when failOnCsp reported a violation and requireCsp
// refused an 'unsafe-inline' policy; 1 otherwise.
import { chromium } from 'playwright-core';
import { failOnCsp, requireCsp } from './csp.mjs';

const CHROMIUM = process.env.CHROMIUM_PATH || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const URL = 'http://csp-selftest.invalid/';
const POLICY = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; frame-ancestors 'none'";

setTimeout(() => { console.error('csp_selftest: FAIL: overall timeout'); process.exit(1); }, 30_000).unref();
const browser = await chromium.launch({ executablePath: CHROMIUM, args: ARGS });
const page = await browser.newPage();
const caught = new Promise((resolve) => { failOnCsp(page, 'selftest', resolve); });
await page.route('**/*', (route) => route.fulfill({
  status: 200,
  headers: { 'content-type': 'text/html; charset=utf-8', 'content-security-policy': POLICY },
  body: '<!doctype html><p style="color:red">x</p><script>document.title = "ran";</script>',
}));
const resp = await page.goto(URL);
requireCsp(resp, 'selftest');
const why = await Promise.race([caught, new Promise((r) => setTimeout(() => r(null), 10_000))]);
const title = await page.title();
await browser.close();
if (!why) { console.error('csp_selftest: FAIL: the violation was not reported'); process.exit(1); }
if (title === 'ran') { console.error('csp_selftest: FAIL: the blocked script ran'); process.exit(1); }
let refused = false;
try { requireCsp({ headers: () => ({ 'content-security-policy': "script-src 'unsafe-inline'; frame-ancestors 'none'" }) }, 'unsafe'); } catch { refused = true; }
if (!refused) { console.error("csp_selftest: FAIL: requireCsp accepted 'unsafe-inline'"); process.exit(1); }
console.log(`csp_selftest: OK (${why})`);
process.exit(0);
