'use strict';
// HTTP/2 cases for spec/e2e/h2_spec.lua with Node's own http2 client,
// against spec/fixtures/h2_app.lua over TLS:
//   node h2_cases.js PORT CASE CA_PEM
// The client trusts only CA_PEM and checks the name "localhost". Prints
// JSON lines and ends with {"done":true} (case_common.js).
const fs = require('fs');
const http2 = require('http2');
const { port, args, out, withTimeout, run } = require('./case_common');

const ca = fs.readFileSync(args[0]);

// One request on session s: { status, headers, body (Buffer) }.
function request(s, headers, body) {
  return new Promise((resolve, reject) => {
    const req = s.request(headers);
    const parts = [];
    let head;
    req.on('response', (h) => { head = h; });
    req.on('data', (d) => parts.push(d));
    req.on('end', () => resolve({ status: head[':status'], headers: head, body: Buffer.concat(parts) }));
    req.on('error', reject);
    req.end(body);
  });
}

run({
  // Five GETs at once, a 1 MiB POST through req:json, a 4 MiB streamed
  // response: all on one session.
  async session() {
    let sessions = 0;
    const s = http2.connect(`https://localhost:${port}`, { ca, host: 'localhost', servername: 'localhost' });
    s.on('connect', () => { sessions++; });
    await withTimeout(new Promise((resolve, reject) => {
      s.once('connect', resolve);
      s.once('error', reject);
    }), 5000, 'connect');
    const gets = await withTimeout(Promise.all([1, 2, 3, 4, 5].map((i) =>
      request(s, { ':path': `/users/${i}` }))), 10000, 'gets');
    for (const [i, g] of gets.entries()) {
      const v = JSON.parse(g.body);
      if (v.id !== String(i + 1) || v.version !== '2') throw new Error(`GET ${i + 1}: ${g.body}`);
    }
    const payload = JSON.stringify({ s: 'x'.repeat(1048576 - 8) });
    const posted = await withTimeout(request(s, { ':method': 'POST', ':path': '/json',
      'content-type': 'application/json' }, payload), 10000, 'post');
    const got = JSON.parse(posted.body).got;
    const big = await withTimeout(request(s, { ':path': '/big/4096' }), 20000, 'big');
    for (let i = 0; i < big.body.length; i += 16384) {
      if (big.body[i] !== 97 + (i / 16384) % 26) throw new Error(`big: wrong byte at ${i}`);
    }
    out({ case: 'session', alpn: s.alpnProtocol, gets: gets.map((g) => g.status),
      posted: payload.length === JSON.stringify(got).length ? payload.length : -1,
      big: big.body.length, sessions });
    s.close();
  },
});
