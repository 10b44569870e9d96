'use strict';
// WebSocket cases for spec/e2e/ws_node_spec.lua, run with the npm `ws` client
// against spec/fixtures/ws_node_app.lua:
//   node ws_cases.js PORT CASE [ARGS...]
// Each case prints JSON lines (one object each) that the spec asserts on,
// and ends with {"done":true}. Nothing is judged here beyond what a line
// says; a client-side failure prints {"error": "..."} and exits 1.
const WebSocket = require('ws');
const { port, args, out, SCALE, withTimeout, get, run } = require('./case_common');

const base = `ws://127.0.0.1:${port}`;

// Deterministic bytes that are not valid UTF-8 text (an LCG).
function bytes(n, seed = 1) {
  const b = Buffer.alloc(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    b[i] = x >>> 23;
  }
  if (n > 0) b[0] = 0xff; // never UTF-8
  return b;
}

// ASCII text of exactly n bytes that is not periodic in short runs.
function text(n) {
  const alpha = 'abcdefghijklmnopqrstuvwxyz0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ';
  let s = '';
  for (let i = 0; i < n; i++) s += alpha[(i * 7 + (i >> 6)) % alpha.length];
  return s;
}

// A client with a queue of received messages and a promise of its close.
class Client {
  constructor(path, options = {}) {
    this.ws = new WebSocket(base + path, options);
    this.messages = [];
    this.waiters = [];
    this.closed = new Promise((resolve) => {
      this.ws.on('close', (code, reason) => {
        this.closeInfo = { code, reason: reason.toString() };
        resolve(this.closeInfo);
        this._wake();
      });
    });
    this.ws.on('message', (data, isBinary) => {
      this.messages.push({ data: Buffer.from(data), isBinary });
      this._wake();
    });
    this.ws.on('error', (e) => { this.error = e; this._wake(); });
    this.opened = new Promise((resolve, reject) => {
      this.ws.on('open', resolve);
      this.ws.on('error', reject);
      this.ws.on('unexpected-response', (req, res) => {
        let body = '';
        res.on('data', (d) => { body += d; });
        res.on('end', () => {
          const e = new Error(`unexpected response ${res.statusCode}`);
          e.status = res.statusCode;
          e.headers = res.headers;
          e.body = body;
          reject(e);
        });
      });
    });
  }

  _wake() {
    const w = this.waiters;
    this.waiters = [];
    w.forEach((f) => f());
  }

  // The next message, within ms.
  next(ms = 5000, what = 'a message') {
    return withTimeout(new Promise((resolve, reject) => {
      const check = () => {
        if (this.messages.length > 0) return resolve(this.messages.shift());
        if (this.closeInfo) return reject(new Error(`closed (${this.closeInfo.code}) waiting for ${what}`));
        this.waiters.push(check);
      };
      check();
    }), ms, what);
  }

  // Waits until `n` messages are queued (not taken).
  count(n, ms = 5000, what = `${n} messages`) {
    return withTimeout(new Promise((resolve, reject) => {
      const check = () => {
        if (this.messages.length >= n) return resolve();
        if (this.closeInfo) return reject(new Error(`closed (${this.closeInfo.code}) with ${this.messages.length} of ${what}`));
        this.waiters.push(check);
      };
      check();
    }), ms, what);
  }

  send(data, binary) {
    return new Promise((resolve, reject) => {
      this.ws.send(data, { binary }, (e) => (e ? reject(e) : resolve()));
    });
  }
}

async function open(path, options) {
  const c = new Client(path, options);
  await withTimeout(c.opened, 5000, `open ${path}`);
  return c;
}

// Polls /log?tag=T until an entry with ev == `ev` is there.
async function logEntry(tag, ev, ms = 5000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const r = await get(`/log?tag=${encodeURIComponent(tag)}`);
    const e = JSON.parse(r.body).find((x) => x.ev === ev);
    if (e) return e;
    if (Date.now() > deadline) return null;
    await new Promise((r2) => setTimeout(r2, 20));
  }
}

const cases = {};

// Each payload echoed on /echo: same bytes and same frame type back.
cases.echo = async () => {
  const c = await open('/echo');
  const payloads = [
    ['text hello', 'hello', false],
    ['text empty', '', false],
    ['binary empty', Buffer.alloc(0), true],
    ['binary 1', bytes(1), true],
    ['text utf8', 'héllo wörld ✓ 日本語 🚀 ∑', false],
    ['text utf8 78000 bytes', '日本語🚀'.repeat(6000), false],
  ];
  for (const n of [125, 126, 127, 65535, 65536]) {
    payloads.push([`binary ${n}`, bytes(n, n), true]);
    payloads.push([`text ${n}`, text(n), false]);
  }
  payloads.push(['binary 1 MiB', bytes(1048576, 7), true]);
  payloads.push(['text 1 MiB', text(1048576), false]);
  for (const [name, data, binary] of payloads) {
    await c.send(data, binary);
    const m = await c.next(10000, `the echo of ${name}`);
    const sent = Buffer.from(data);
    out({ name, sent_len: sent.length, got_len: m.data.length, same: sent.equals(m.data),
      sent_binary: binary, got_binary: m.isBinary });
  }
  c.ws.close(1000);
  await withTimeout(c.closed, 5000, 'close');
};

// Binary and text messages on /auto (ws:send without is_text) and /kind
// (what on_message's is_text says).
cases.kinds = async () => {
  const auto = await open('/auto');
  const kind = await open('/kind');
  const items = [
    ['ascii as binary', Buffer.from('abc'), true],
    ['ascii as text', 'abc', false],
    ['utf8 as binary', Buffer.from('ü✓'), true],
    ['invalid utf8 as binary', Buffer.from([0xff, 0xfe, 0x41]), true],
    ['empty as binary', Buffer.alloc(0), true],
    ['empty as text', '', false],
  ];
  for (const [name, data, binary] of items) {
    await auto.send(data, binary);
    const a = await auto.next(5000, `auto ${name}`);
    await kind.send(data, binary);
    const k = JSON.parse((await kind.next(5000, `kind ${name}`)).data.toString());
    out({ name, sent_binary: binary, auto_binary: a.isBinary,
      auto_same: Buffer.from(data).equals(a.data), lua_is_text: k.is_text, lua_len: k.len });
  }
  auto.ws.close(); kind.ws.close();
};

cases.ping = async () => {
  const c = await open('/echo');
  const pongs = [];
  const got = new Promise((resolve) => c.ws.on('pong', (d) => { pongs.push(d.toString()); if (pongs.length === 2) resolve(); }));
  c.ws.ping('are you there');
  c.ws.ping('');
  await withTimeout(got, 3000, 'two pongs');
  // the connection still echoes after the control frames
  await c.send('after ping', false);
  const m = await c.next(3000, 'echo after ping');
  out({ pongs, after: m.data.toString() });
  c.ws.close();
};

// The server closes: args CODE REASON (or none).
cases.server_close = async () => {
  const q = args.length ? `?code=${args[0]}&reason=${encodeURIComponent(args[1] || '')}` : '';
  const c = new Client('/close' + q);
  const info = await withTimeout(c.closed, 5000, 'the server close');
  out({ code: info.code, reason: info.reason, messages: c.messages.length });
};

// The client closes with CODE REASON; the server's on_close is logged.
cases.client_close = async () => {
  const tag = `cc${process.pid}`;
  const c = await open(`/echo?tag=${tag}`);
  await logEntry(tag, 'open');
  const t0 = Date.now();
  c.ws.close(Number(args[0]), args[1]);
  const info = await withTimeout(c.closed, 5000, 'the close handshake');
  const ms = Date.now() - t0;
  const e = await logEntry(tag, 'close');
  out({ client_saw: info, handshake_ms: ms, on_close: e });
};

// The client drops the TCP connection without a close frame.
cases.client_drop = async () => {
  const tag = `cd${process.pid}`;
  const c = await open(`/echo?tag=${tag}`);
  await logEntry(tag, 'open');
  c.ws.terminate();
  out({ on_close: await logEntry(tag, 'close') });
};

// A message of max_msg + 1 bytes (in one frame, or in fragments) closes
// with 1009; a message of exactly max_msg (1 MiB) is echoed.
cases.too_big = async () => {
  const max = 1048576;
  const c = await open('/echo');
  await c.send(bytes(max, 3), true);
  const m = await c.next(10000, 'the echo of max_msg bytes');
  out({ name: 'at max', got_len: m.data.length });
  c.ws.close();
  // a fresh connection that sends too much at once, as an upload would
  const o = await open('/echo');
  o.ws.on('error', (e) => { o.sendError = e.code || e.message; });
  await o.send(bytes(max + 1, 4), true).catch(() => {});
  const info = await withTimeout(o.closed, 5000, 'the close after max + 1');
  out({ name: 'one frame over', code: info.code, reason: info.reason,
    messages: o.messages.length, client_error: o.sendError || null });

  const f = await open('/echo');
  const half = bytes(max / 2, 5);
  f.ws.send(half, { binary: true, fin: false });
  f.ws.send(half, { binary: true, fin: false });
  f.ws.send(Buffer.from([1]), { binary: true, fin: true });
  const finfo = await withTimeout(f.closed, 5000, 'the close after fragments over max');
  out({ name: 'fragments over', code: finfo.code, messages: f.messages.length });
};

// A text message that is not UTF-8 closes with 1007.
cases.bad_utf8 = async () => {
  const c = await open('/echo');
  c.ws.send(Buffer.from([0x61, 0xff, 0xfe]), { binary: false });
  const info = await withTimeout(c.closed, 5000, 'the close after bad UTF-8');
  out({ code: info.code, messages: c.messages.length });
};

// A message in three fragments comes back as one message.
cases.fragments = async () => {
  const c = await open('/echo');
  c.ws.send('frag', { binary: false, fin: false });
  c.ws.send('men', { binary: false, fin: false });
  c.ws.ping('between');
  c.ws.send('ted ✓', { binary: false, fin: true });
  const m = await c.next(3000, 'the reassembled message');
  out({ data: m.data.toString(), binary: m.isBinary });
  c.ws.close();
};

cases.info = async () => {
  const c = await open('/info?x=1&y=two%20words', { headers: { 'X-Test': 'abc', 'X-Other': 'def' } });
  const m = await c.next(3000, 'the info message');
  out({ binary: m.isBinary, info: JSON.parse(m.data.toString()) });
  c.ws.close();
};

// Upgrade on a server without websocket: what the client gets.
cases.refused = async () => {
  const c = new Client('/echo');
  try {
    await withTimeout(c.opened, 5000, 'the upgrade');
    out({ opened: true });
    c.ws.close();
  } catch (e) {
    out({ opened: false, status: e.status || null, body: e.body || null, message: e.message });
  }
  out({ after: await get('/plain') });
};

// N clients subscribed to CH (path /sub or /subfn, args: PATH N CH PREFIX)
// get the messages of an HTTP publish (M of them) and then of a timer
// publish (M more), in order. Prints the workers the clients were on and
// each client's messages as a summary.
cases.subscribe = async () => {
  const [path, nstr, ch, mstr] = args;
  const n = Number(nstr); const m = Number(mstr || 50);
  const clients = await Promise.all(Array.from({ length: n }, () => open(`${path}?ch=${ch}`)));
  const workers = {};
  for (const c of clients) {
    const r = (await c.next(5000, 'ready')).data.toString();
    const w = r.split(' ')[1];
    workers[w] = (workers[w] || 0) + 1;
  }
  out({ workers });
  const pub = await get(`/publish?ch=${ch}&n=${m}&p=h`);
  await Promise.all(clients.map((c) => c.count(m, 5000, 'the HTTP publish').catch(() => {})));
  const tpub = await get(`/publish_timer?ch=${ch}&n=${m}&p=t&ms=1`);
  await Promise.all(clients.map((c) => c.count(2 * m, 5000, 'the timer publish').catch(() => {})));
  await new Promise((r) => setTimeout(r, 100)); // anything extra
  const got = clients.map((c) => c.messages.map((x) => x.data.toString()).join(','));
  const counts = {};
  for (const g of got) counts[g] = (counts[g] || 0) + 1;
  out({ pub, tpub, sequences: counts });
  clients.forEach((c) => c.ws.close());
};

// A glob subscription: messages to matching channels only.
cases.glob = async () => {
  const c = await open('/sub?ch=room.*&glob=1');
  await c.next(5000, 'ready');
  await get('/publish?ch=room.a&n=1&p=a');
  await get('/publish?ch=other.x&n=1&p=x');
  await get('/publish?ch=room.b&n=1&p=b');
  await get('/publish?ch=roomc&n=1&p=c');
  await c.count(2, 3000).catch(() => {});
  await new Promise((r) => setTimeout(r, 100));
  out({ got: c.messages.map((x) => x.data.toString()) });
  c.ws.close();
};

// What the C path sends for a table (its JSON, as text) and for bytes that
// are not UTF-8 (binary).
cases.sub_kinds = async () => {
  const c = await open('/sub?ch=kinds');
  await c.next(5000, 'ready');
  await get('/publish_table?ch=kinds');
  await get('/publish?ch=kinds&n=1&p=%FF%FE');
  await get('/publish?ch=kinds&n=1&p=%C3%BC');
  await c.count(3, 3000).catch(() => {});
  out({ got: c.messages.map((m) => ({ hex: m.data.toString('hex'), binary: m.isBinary })) });
  c.ws.close();
};

// A subscriber that stops reading while N messages of SIZE bytes are
// published (one every 5 ms: more than max_queue in all), and one that
// keeps reading: what each received (the slow one's messages must be 1..k
// with no gap).
cases.sub_slow = async () => {
  const [n, size] = args.map(Number);
  const slow = await open('/sub?ch=big');
  const fast = await open('/sub?ch=big');
  await slow.next(5000, 'ready'); await fast.next(5000, 'ready');
  slow.ws.pause();
  const pub = await get(`/publish_big?ch=big&n=${n}&size=${size}&ms=5`);
  await fast.count(n, 15000).catch(() => {});
  await new Promise((r) => setTimeout(r, 300 * SCALE));
  slow.ws.resume();
  const info = await withTimeout(slow.closed, 10000, 'the slow subscriber closed');
  const idx = (c) => c.messages.map((m) => Number(m.data.subarray(0, 6).toString()));
  const sidx = idx(slow);
  const gapless = sidx.every((v, i) => v === i + 1);
  const fidx = idx(fast);
  out({ pub: pub.body, fast: fidx.length, fast_in_order: fidx.every((v, i) => v === i + 1),
    slow: sidx.length, slow_gapless: gapless, slow_sizes: slow.messages.every((m) => m.data.length === size),
    slow_close: info.code, fast_open: fast.ws.readyState === 1 });
  fast.ws.close();
};

// N clients at once, each sending M messages back to back and checking
// that the echoes come back complete and in order.
cases.many = async () => {
  const n = Number(args[0]); const m = Number(args[1]);
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: n }, async (_, i) => {
    try {
      const c = await open('/echo');
      const sent = [];
      for (let j = 0; j < m; j++) {
        const s = `client ${i} message ${j} ` + 'x'.repeat((i * 31 + j * 17) % 300);
        sent.push(s);
        c.ws.send(s);
      }
      await c.count(m, 15000, `${m} echoes`);
      const got = c.messages.map((x) => x.data.toString());
      c.ws.close();
      return got.join('\n') === sent.join('\n') ? 'ok' : `client ${i}: echoes differ`;
    } catch (e) {
      return `client ${i}: ${e.message}`;
    }
  }));
  const bad = results.filter((r) => r !== 'ok');
  out({ clients: n, ok: n - bad.length, bad: bad.slice(0, 5), ms: Date.now() - t0 });
};

// A server that sends more than the socket takes: every message arrives,
// and the server saw "queue full" and went on from on_ready.
cases.flood = async () => {
  const [n, size] = args.map(Number);
  const c = new Client(`/flood?n=${n}&size=${size}`);
  // stop reading as soon as it is open (pause() does nothing before), so
  // that the server's queue fills up
  c.ws.on('open', () => c.ws.pause());
  await withTimeout(c.opened, 5000, 'open');
  await new Promise((r) => setTimeout(r, 300));
  c.ws.resume();
  await c.count(n + 1, 15000, `${n} messages and done`).catch(() => {});
  const sizes = c.messages.slice(0, n).every((x) => x.data.length === size && x.isBinary);
  const last = c.messages.length ? c.messages[c.messages.length - 1].data.toString() : null;
  out({ received: c.messages.length, sizes, last });
  c.ws.close();
};

// Opens PATH, sends DATA (text) unless it is "-", and reports how the
// server closes (or what it answered instead of closing).
cases.send_close = async () => {
  const [path, data] = args;
  const c = await open(path);
  if (data !== '-') await c.send(data, false).catch(() => {});
  const info = await withTimeout(c.closed, 5000, 'the close');
  out({ code: info.code, reason: info.reason, messages: c.messages.map((m) => m.data.toString()) });
};

// Opens PATH, sends DATA (text), and prints the first N messages that
// arrive (text, and whether each was binary).
cases.send_recv = async () => {
  const [path, data, n] = args;
  const c = await open(path);
  await c.send(data, false);
  await c.count(Number(n), 5000);
  out({ messages: c.messages.map((m) => ({ data: m.data.toString(), binary: m.isBinary })) });
  c.ws.close();
};

// Opens N sockets on PATH, prints {"opened":N}, then how each was closed
// (for a server shutdown).
cases.hold = async () => {
  const [path, n] = args;
  const cs = await Promise.all(Array.from({ length: Number(n) }, () => open(path)));
  out({ opened: cs.length });
  const infos = await Promise.all(cs.map((c) => withTimeout(c.closed, 15000, 'the close')));
  const codes = {};
  for (const i of infos) codes[`${i.code} ${i.reason}`] = (codes[`${i.code} ${i.reason}`] || 0) + 1;
  out({ codes });
};

// websocket.on_upgrade: PATH, then the subprotocols to offer (comma-
// separated, "-" for none) and an Origin ("-" for none). Prints either
// {"opened": true, protocol, headers} and the first message, or
// {"refused": status, headers, body} from the ws client's
// 'unexpected-response' (the answer the server gave instead of a 101).
cases.upgrade = async () => {
  const [path, protos, origin] = args;
  const options = {};
  if (origin !== '-') options.origin = origin;
  const list = protos === '-' ? [] : protos.split(',');
  const ws = new WebSocket(base + path, list, options);
  const row = await withTimeout(new Promise((resolve) => {
    ws.on('upgrade', (res) => { ws.upgradeHeaders = res.headers; });
    ws.on('open', () => {
      ws.once('message', (data) => resolve({
        opened: true, protocol: ws.protocol, headers: ws.upgradeHeaders,
        first: data.toString(),
      }));
    });
    ws.on('unexpected-response', (req, res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ refused: res.statusCode, headers: res.headers, body }));
    });
    ws.on('error', (e) => resolve({ error: e.message }));
  }), 5000, 'the upgrade');
  out(row);
  ws.terminate();
};

run(cases);
