'use strict';
// Two Chromium pages (playwright-core driving Debian's /usr/bin/chromium)
// chat through examples/chat; for spec/e2e/chat_browser_spec.lua.
//   node chat_browser.js CHAT_PORT GO_FILE [SSE_PORT]
// 1. Both pages load and connect; bob's page is reloaded until the two
//    are on different workers, as the server's welcome lines say
//    ({"step":"placed", a, b, rounds}). Then a message typed in each
//    shows up in the other ({"step":"a to b"|"b to a", ok, ...}).
// 2. It prints {"step":"drop me"} and waits for GO_FILE to exist (the spec
//    kills the workers meanwhile); both pages must reconnect by themselves
//    and chat again ({"step":"after reconnect", ...}).
// 3. With SSE_PORT: a third page's EventSource on ws_node_app.lua's /sse/page,
//    which reconnects after the server closes the stream; its title lists
//    what arrived ({"step":"sse", title}).
// Ends with {"done":true}; an error prints {"error": ...} and exits 1.
const fs = require('fs');
const { chromium } = require('playwright-core');

const [chatPort, goFile, ssePort] = process.argv.slice(2);
// CHAT_HTTPS=1: the chat is served over TLS (the page, then wss://); the
// browser trusts the spec's test CA through the NSS database under
// CHAT_HOME (its $HOME/.pki/nssdb), as a user's Chromium would, and says
// what it saw ({page, loaded, secure, protocol, subject, issuer}; each
// page's {websocket: url}). CHAT_PROBE=1: only tries to load the page
// ({"step":"probe", ok, error}).
const https = process.env.CHAT_HTTPS === '1';
const url = `${https ? 'https' : 'http'}://127.0.0.1:${chatPort}/`;
const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
// Deadlines stretch for sanitizer builds of the server (spec/js.lua sets it).
const T = 5000 * Number(process.env.SPEC_SCALE || 1);

async function openChat(browser, name) {
  const context = await browser.newContext();
  const page = await context.newPage();
  page.on('pageerror', (e) => out({ page: name, pageerror: e.message }));
  page.on('websocket', (ws) => out({ page: name, websocket: ws.url() }));
  // the extension the server answered in its 101, seen through CDP
  const cdp = await context.newCDPSession(page);
  await cdp.send('Network.enable');
  cdp.on('Network.webSocketHandshakeResponseReceived', (e) => {
    const h = e.response.headers || {};
    const k = Object.keys(h).find((n) => n.toLowerCase() === 'sec-websocket-extensions');
    out({ page: name, ws_extensions: k ? h[k] : null });
  });
  const res = await page.goto(url, { timeout: T });
  if (https) {
    const sec = await res.securityDetails();
    out({ page: name, loaded: page.url(), secure: await page.evaluate(() => window.isSecureContext),
      protocol: sec && sec.protocol, subject: sec && sec.subjectName, issuer: sec && sec.issuer });
  }
  await page.waitForSelector('body[data-connected="yes"]', { timeout: T });
  await page.fill('#name', name);
  return page;
}

// The worker a page's socket is on, from the server's welcome line.
async function worker(page) {
  const li = await page.waitForSelector('#messages li.system', { timeout: T });
  const m = /worker (\d+)/.exec(await li.textContent());
  return m ? Number(m[1]) : null;
}

async function waitFile(path) {
  const deadline = Date.now() + 2 * T;
  while (!fs.existsSync(path)) {
    if (Date.now() > deadline) throw new Error(`no ${path}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function messages(page) {
  return page.$$eval('#messages li', (lis) => lis.map((li) => li.textContent));
}

// `from` types `text`; waits until `to` shows "<name>: <text>".
async function say(step, from, fromName, to, text) {
  const t0 = Date.now();
  await from.fill('#text', text);
  await from.press('#text', 'Enter');
  const want = `${fromName}:${text}`;
  let ok = true;
  try {
    await to.waitForFunction((w) => [...document.querySelectorAll('#messages li')]
      .some((li) => li.textContent.startsWith(w)), want, { timeout: T });
  } catch (e) {
    ok = false;
  }
  // the sender's own copy comes back through the channel on its own time
  // (from its worker, while `to` may sit on the other): waited for, not
  // asserted here (the spec reads from_has)
  if (ok) {
    await from.waitForFunction((w) => [...document.querySelectorAll('#messages li')]
      .some((li) => li.textContent.startsWith(w)), want, { timeout: T }).catch(() => {});
  }
  out({ step, ok, ms: Date.now() - t0, want, to_has: await messages(to),
    from_has: await messages(from), input_left: await from.inputValue('#text') });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: '/usr/bin/chromium',
    // no name lookups: nothing but the loopback servers is reached
    args: ['--no-sandbox', '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'],
    timeout: 15000,
    env: process.env.CHAT_HOME ? { ...process.env, HOME: process.env.CHAT_HOME } : process.env,
  });
  try {
    if (process.env.CHAT_PROBE === '1') {
      // only: does the page load? (the spec's control without the CA)
      const page = await (await browser.newContext()).newPage();
      try {
        await page.goto(url, { timeout: T });
        out({ step: 'probe', ok: true });
      } catch (e) {
        out({ step: 'probe', ok: false, error: e.message.split('\n')[0] });
      }
      await browser.close();
      out({ done: true });
      process.exit(0);
    }
    let ssePage = null;
    if (ssePort) {
      ssePage = await (await browser.newContext()).newPage();
      await ssePage.goto(`http://127.0.0.1:${ssePort}/sse/page`, { timeout: T });
    }
    const a = await openChat(browser, 'alice');
    const b = await openChat(browser, 'bob');
    // The kernel picks a worker for each connection: reload bob's page
    // until the two pages are on different workers.
    const aWorker = await worker(a);
    let bWorker = await worker(b);
    let rounds = 1;
    while (bWorker === aWorker && rounds < 12) {
      await b.reload({ timeout: T });
      await b.waitForSelector('body[data-connected="yes"]', { timeout: T });
      await b.fill('#name', 'bob');
      bWorker = await worker(b);
      rounds++;
    }
    out({ step: 'placed', a: aWorker, b: bWorker, rounds });
    await say('a to b', a, 'alice', b, 'hello from alice ✓');
    await say('b to a', b, 'bob', a, 'hi alice, bob here <b>not bold</b>');

    out({ step: 'drop me' });
    await waitFile(goFile);
    for (const p of [a, b]) {
      await p.waitForSelector('body[data-connected="yes"]:not([data-opens="1"])', { timeout: 3 * T });
    }
    await say('after reconnect', a, 'alice', b, 'still here?');

    if (ssePage) {
      let title = '';
      try {
        await ssePage.waitForFunction(() => /last=id-/.test(document.title), null, { timeout: 3 * T });
      } finally {
        title = await ssePage.title();
      }
      out({ step: 'sse', title });
    }
  } finally {
    await browser.close();
  }
  out({ done: true });
  process.exit(0);
})().catch((e) => {
  out({ error: e.message });
  process.exit(1);
});
