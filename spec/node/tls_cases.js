'use strict';
// TLS cases for spec/e2e/tls_spec.lua, with Node's own https and tls
// modules and the npm `ws` client, against spec/fixtures/tls_app.lua:
//   node tls_cases.js PORT CASE CA_PEM [ARGS...]
// Every client trusts only CA_PEM (the spec's test CA) and verifies the
// server's name, as a browser would. Each case prints JSON lines that the
// spec asserts on and ends with {"done":true}; a client-side failure
// prints {"error": "..."} and exits 1.
const fs = require('fs');
const https = require('https');
const tls = require('tls');
const WebSocket = require('ws');
const { port, args, out, withTimeout, run } = require('./case_common');

const ca = fs.readFileSync(args[0]);
const host = 'localhost';

// Deterministic bytes (an LCG), not UTF-8.
function bytes(n, seed = 7) {
  const b = Buffer.alloc(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    b[i] = x >>> 23;
  }
  if (n > 0) b[0] = 0xff;
  return b;
}

// One https request: { status, body (Buffer), socket facts }.
function request(agent, method, path, body) {
  return new Promise((resolve, reject) => {
    const req = https.request({ host, port, method, path, ca, agent, ALPNProtocols: ['http/1.1'],
      headers: body ? { 'content-length': body.length } : {} }, (res) => {
      const parts = [];
      // (a keep-alive agent takes the socket back at the end)
      const s = res.socket;
      const facts = { authorized: s.authorized, protocol: s.getProtocol(), alpn: s.alpnProtocol,
        subject: s.getPeerCertificate().subject.CN, issuer: s.getPeerCertificate().issuer.CN,
        reused: s.isSessionReused(), localPort: s.localPort };
      res.on('data', (d) => parts.push(d));
      res.on('end', () => {
        resolve({ status: res.statusCode, body: Buffer.concat(parts), ...facts });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

// A tls.connect socket once its handshake is done.
function connect(opts) {
  return new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', servername: host, port, ca, ...opts });
    s.once('secureConnect', () => resolve(s));
    s.once('error', reject);
  });
}

// Reads from s until `done(text)` says the text is whole, or the close.
function readAll(s, done) {
  return new Promise((resolve, reject) => {
    let text = '';
    s.on('data', (d) => {
      text += d.toString('latin1');
      if (done && done(text)) resolve(text);
    });
    s.on('end', () => resolve(text));
    s.on('error', reject);
  });
}

run({
  // https.request: GET /tls twice and POST 1 MiB on one keep-alive agent.
  async https() {
    const agent = new https.Agent({ keepAlive: true, maxSockets: 1, ca });
    const a = await withTimeout(request(agent, 'GET', '/tls'), 5000, 'GET /tls');
    const b = await withTimeout(request(agent, 'GET', '/tls'), 5000, 'GET /tls again');
    const body = bytes(1 << 20);
    const c = await withTimeout(request(agent, 'POST', '/echo', body), 10000, 'POST /echo');
    for (const [name, r] of [['get', a], ['again', b]]) {
      out({ name, status: r.status, authorized: r.authorized, protocol: r.protocol,
        alpn: r.alpn, subject: r.subject, issuer: r.issuer, localPort: r.localPort,
        server: JSON.parse(r.body.toString()) });
    }
    out({ name: 'post', status: c.status, same: c.body.equals(body), len: c.body.length,
      localPort: c.localPort });
    agent.destroy();
  },

  // https with TLS 1.2 at most.
  async https12() {
    const agent = new https.Agent({ maxVersion: 'TLSv1.2', ca });
    const r = await withTimeout(request(agent, 'GET', '/tls'), 5000, 'GET /tls');
    out({ status: r.status, authorized: r.authorized, protocol: r.protocol,
      server: JSON.parse(r.body.toString()) });
  },

  // tls.connect to mp.listen (ARGS: servername): one line back, conn:tls().
  async tls() {
    const s = await withTimeout(connect({ servername: args[1], ALPNProtocols: ['http/1.1'] }),
      5000, 'handshake');
    s.write('hi');
    const line = await withTimeout(readAll(s, (t) => t.includes('\n')), 5000, 'reply');
    out({ authorized: s.authorized, protocol: s.getProtocol(), alpn: s.alpnProtocol,
      subject: s.getPeerCertificate().subject.CN, server: JSON.parse(line) });
    s.end();
  },

  // A name the certificate does not have: Node refuses it (ERR_TLS_CERT_ALTNAME_INVALID).
  async wrongname() {
    try {
      const s = await withTimeout(connect({ servername: args[1] }), 5000, 'handshake');
      out({ connected: true, authorized: s.authorized });
      s.destroy();
    } catch (e) {
      out({ connected: false, code: e.code, message: e.message });
    }
  },

  // ARGS: N. N handshakes at once, all held open; then each asks GET /who.
  async concurrent() {
    const n = Number(args[1]);
    const started = Date.now();
    const settled = await withTimeout(Promise.allSettled(
      Array.from({ length: n }, () => connect({}))), 30000, `${n} handshakes`);
    const socks = settled.filter((r) => r.status === 'fulfilled').map((r) => r.value);
    const errors = settled.filter((r) => r.status === 'rejected').map((r) => r.reason.message);
    const handshaken = socks.length;
    const answers = await withTimeout(Promise.all(socks.map((s) => {
      const p = readAll(s);
      s.write('GET /who HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
      return p;
    })), 30000, `${n} answers`);
    const ok = answers.filter((t) => /^HTTP\/1\.1 200 /.test(t) && /\r\n\r\nwho \d+ \d+\n$/.test(t));
    out({ n, handshaken, answered: ok.length, errors: errors.slice(0, 5),
      authorized: socks.filter((s) => s.authorized).length, ms: Date.now() - started });
  },

  // ARGS: N, PATH. One socket: N GET /who and 3 GET PATH (a big static
  // file) written at once, not read for a second (the server's queue
  // fills and it stops reading), then read: each answer, in order, with
  // the SHA-256 of each PATH body.
  async pipeline() {
    const n = Number(args[1]);
    const s = await withTimeout(connect({}), 5000, 'handshake');
    s.pause();
    let reqs = '';
    for (let i = 0; i < n; i++) reqs += 'GET /who HTTP/1.1\r\nHost: localhost\r\n\r\n';
    for (let i = 0; i < 3; i++) reqs += `GET ${args[2]} HTTP/1.1\r\nHost: localhost\r\n\r\n`;
    reqs += 'GET /who HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n';
    s.write(reqs);
    await new Promise((r) => setTimeout(r, 1000));
    const chunks = [];
    const ended = new Promise((resolve, reject) => {
      s.on('data', (d) => chunks.push(d));
      s.on('end', resolve);
      s.on('error', reject);
    });
    s.resume();
    await withTimeout(ended, 30000, 'all answers');
    const all = Buffer.concat(chunks);
    const answers = [];
    let at = 0;
    while (at < all.length) {
      const headEnd = all.indexOf('\r\n\r\n', at);
      if (headEnd < 0) break;
      const head = all.subarray(at, headEnd).toString('latin1');
      const len = Number((/\r\ncontent-length: *(\d+)/i.exec(head) || [])[1]);
      const body = all.subarray(headEnd + 4, headEnd + 4 + len);
      answers.push({ status: Number(head.split(' ')[1]), len: body.length,
        who: body.length < 100 ? body.toString() : undefined,
        sha256: require('crypto').createHash('sha256').update(body).digest('hex') });
      at = headEnd + 4 + len;
    }
    out({ answers: answers.length, bytes: all.length, rest: all.length - at,
      statuses: [...new Set(answers.map((a) => a.status))],
      whos: answers.filter((a) => a.who).length,
      bigs: answers.filter((a) => !a.who).map((a) => a.sha256),
      bigAt: answers.map((a, i) => (a.who ? -1 : i)).filter((i) => i >= 0) });
  },

  // The npm ws client over wss:// (ARGS: path): ws:tls() first, then echoes.
  async wss() {
    const ws = new WebSocket(`wss://${host}:${port}${args[1] || '/ws'}`, { ca });
    const messages = [];
    let wake = null;
    ws.on('message', (data, isBinary) => {
      messages.push({ data: Buffer.from(data), isBinary });
      if (wake) wake();
    });
    const next = () => withTimeout(new Promise((resolve) => {
      const take = () => { wake = null; resolve(messages.shift()); };
      if (messages.length) take(); else wake = take;
    }), 10000, 'a message');
    await withTimeout(new Promise((resolve, reject) => {
      ws.on('open', resolve);
      ws.on('error', reject);
    }), 5000, 'wss open');
    const first = await next();
    out({ name: 'open', server: JSON.parse(first.data.toString()),
      authorized: ws._socket.authorized, protocol: ws._socket.getProtocol() });
    const cases = [['text', Buffer.from('hello over wss ✓'), false],
      ['binary 64 KiB', bytes(65536), true], ['binary 1 MiB', bytes(1 << 20, 3), true]];
    for (const [name, payload, binary] of cases) {
      ws.send(payload, { binary });
      const m = await next();
      out({ name, same: m.data.equals(payload), len: m.data.length, binary: m.isBinary });
    }
    const closed = new Promise((resolve) => ws.on('close', (code) => resolve(code)));
    ws.close(1000, 'bye');
    out({ name: 'close', code: await withTimeout(closed, 5000, 'close') });
  },
});
