'use strict';
// Headless Chromium (Debian's, through playwright-core) loads
// spec/fixtures/h2_app.lua's /page over HTTPS; the page's script checks
// performance.getEntries()[0].nextHopProtocol === "h2" for itself and for a
// fetch. The test certificate is accepted for this context only.
//   node h2_browser.js PORT
const { chromium } = require('playwright-core');

const port = process.argv[2];
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const T = 10000 * Number(process.env.SPEC_SCALE || 1);

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    args: ['--no-sandbox', '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'],
    timeout: 15000,
  });
  try {
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    page.on('pageerror', (e) => out({ pageerror: e.message }));
    await page.goto(`https://127.0.0.1:${port}/page`, { timeout: T });
    await page.waitForSelector('body[data-result]', { state: 'attached', timeout: T });
    const r = JSON.parse(await page.$eval('body', (b) => b.dataset.result));
    out({ case: 'browser', ...r });
  } finally {
    await browser.close();
  }
  out({ done: true });
})().catch((e) => {
  out({ error: String(e && e.stack || e) });
  process.exit(1);
});
