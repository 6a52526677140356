// The pages run with their Content-Security-Policy on (contract §3). Shared by
// every browser check: a page whose inline script, style or connection the
// policy blocks must fail the check with the violation, not half-work.
//
// Test-only scripts (axe-core, probes) go in with page.evaluate(source), which
// the page's policy does not govern; page.addScriptTag adds an inline script
// the policy blocks (and this guard reports).

const CSP_TEXT = /Content[- ]Security[- ]Policy/i;

// Calls fail(reason) on the first CSP violation `page` reports: in the console
// (Chromium logs "Refused to ... violates the following Content Security Policy
// directive"), as a page error, or as a `securitypolicyviolation` DOM event.
export async function failOnCsp(page, name, fail) {
  let failed = false;
  const report = (text) => {
    if (!failed && CSP_TEXT.test(text)) {
      failed = true;
      fail(`[${name}] CSP violation: ${text}`);
    }
  };
  page.on('console', (m) => report(m.text()));
  page.on('pageerror', (e) => report(e.message));
  // Init scripts are injected by the browser's debugging protocol, so the page's
  // policy does not block this listener itself.
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      console.error(`Content Security Policy violation: ${e.violatedDirective} blocked ${e.blockedURI || 'inline code'} at ${e.sourceFile}:${e.lineNumber}`);
    });
  });
}

// Throws unless a page answer carries a policy that allows no inline code by
// blanket permission and forbids framing: proof the check ran with the policy on.
export function requireCsp(resp, what) {
  const csp = resp ? resp.headers()['content-security-policy'] : undefined;
  if (!csp) throw new Error(`${what}: no Content-Security-Policy header`);
  if (/unsafe-inline|unsafe-eval/.test(csp)) throw new Error(`${what}: policy allows unsafe code: ${csp}`);
  if (!/frame-ancestors 'none'/.test(csp)) throw new Error(`${what}: policy allows framing: ${csp}`);
  return csp;
}
