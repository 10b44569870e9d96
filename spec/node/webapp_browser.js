'use strict';
// Headless Chromium (playwright-core, Debian's /usr/bin/chromium) against
// spec/fixtures/browser_app.lua, for spec/e2e/webapp_browser_spec.lua:
//   node webapp_browser.js API_PORT PAGE_PORT
// Prints one JSON line a step:
//   {"step":"set", doc_cookie}              document.cookie after /set
//   {"step":"same-origin", cookies}         what /cookies saw from the API's origin
//   {"step":"cross-fetch", cookies}         a credentialed fetch from localhost (cross-site)
//   {"step":"cors-post", status, body, id}  a POST with X-Token from localhost (preflighted)
//   {"step":"cors-denied", error}           the same from 127.0.0.2 (not allowed)
//   {"step":"cross-nav", cookies}           a navigation started by the localhost page
// Ends with {"done":true}; an error prints {"error": ...} and exits 1.
const { chromium } = require('playwright-core');

const [apiPort, pagePort] = process.argv.slice(2);
const api = `http://127.0.0.1:${apiPort}`;
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const T = 5000 * Number(process.env.SPEC_SCALE || 1);

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox',
      '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE 127.0.0.2, EXCLUDE localhost'],
    timeout: 15000,
  });
  try {
    const page = await (await browser.newContext()).newPage();
    await page.goto(`${api}/set`, { timeout: T });
    out({ step: 'set', doc_cookie: await page.evaluate(() => document.cookie) });
    await page.goto(`${api}/cookies`, { timeout: T });
    out({ step: 'same-origin', cookies: JSON.parse(await page.textContent('body')) });

    await page.goto(`http://localhost:${pagePort}/`, { timeout: T });
    out({ step: 'cross-fetch', cookies: await page.evaluate(async (u) => {
      const r = await fetch(u, { credentials: 'include' });
      return r.json();
    }, `${api}/cookies`) });
    out(Object.assign({ step: 'cors-post' }, await page.evaluate(async (u) => {
      const r = await fetch(u, { method: 'POST', credentials: 'include',
        headers: { 'Content-Type': 'application/json', 'X-Token': 'tok' }, body: '{"x":1}' });
      return { status: r.status, body: await r.json(), id: r.headers.get('x-request-id') };
    }, `${api}/api/data`)));

    await page.goto(`http://127.0.0.2:${pagePort}/`, { timeout: T });
    out({ step: 'cors-denied', error: await page.evaluate(async (u) => {
      try {
        await fetch(u, { method: 'POST', headers: { 'X-Token': 'tok' }, body: 'x' });
        return null;
      } catch (e) { return String(e); }
    }, `${api}/api/data`) });

    await page.goto(`http://localhost:${pagePort}/`, { timeout: T });
    await Promise.all([
      page.waitForURL(`${api}/cookies`, { timeout: T }),
      page.evaluate((u) => { window.location.href = u; }, `${api}/cookies`),
    ]);
    out({ step: 'cross-nav', cookies: JSON.parse(await page.textContent('body')) });
    out({ done: true });
  } catch (e) {
    out({ error: String(e && e.stack || e) });
    process.exitCode = 1;
  } finally {
    await browser.close();
  }
})();
