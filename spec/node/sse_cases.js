'use strict';
// Server-sent events cases for spec/e2e/sse_spec.lua, read with node's own
// http client and an event-stream parser that follows the HTML standard's
// rules (fields, multi-line data, comments, CR/LF/CRLF line ends):
//   node sse_cases.js PORT CASE [ARGS...]
// Prints JSON lines and ends with {"done":true}.
const http = require('http');
const { port, args, out, withTimeout, get, run } = require('./case_common');

// One event-stream response: .events (each { event, data, id }, id being
// the id field of that event or null), .lastId, .ended.
class Stream {
  constructor(path, headers = {}) {
    this.events = [];
    this.waiters = [];
    this.ended = false;
    this.lastId = '';
    this.buf = '';
    this.block = { data: [], event: '', id: null };
    this.response = new Promise((resolve, reject) => {
      this.req = http.get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
        this.status = res.statusCode;
        this.headers = res.headers;
        res.setEncoding('utf8');
        res.on('data', (d) => this._feed(d));
        res.on('end', () => { this._feed('', true); this.ended = true; this._wake(); });
        res.on('error', () => { this.ended = true; this._wake(); });
        resolve(res);
      });
      this.req.on('error', (e) => { this.ended = true; this._wake(); reject(e); });
    });
  }

  _wake() {
    const w = this.waiters;
    this.waiters = [];
    w.forEach((f) => f());
  }

  _feed(chunk, last = false) {
    this.buf += chunk;
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buf);
      if (!m) break;
      // a lone CR at the very end may be the first half of a CRLF
      if (m[0] === '\r' && m.index === this.buf.length - 1 && !last) break;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      this._line(line);
    }
    this._wake();
  }

  _line(line) {
    const b = this.block;
    if (line === '') {
      if (b.data.length > 0) {
        this.events.push({ event: b.event || 'message', data: b.data.join('\n'), id: b.id });
      }
      this.block = { data: [], event: '', id: null };
      return;
    }
    if (line[0] === ':') return;
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value[0] === ' ') value = value.slice(1);
    if (field === 'data') b.data.push(value);
    else if (field === 'event') b.event = value;
    else if (field === 'id' && !value.includes('\0')) { b.id = value; this.lastId = value; }
  }

  // Waits for n events in all (or the end of the stream).
  count(n, ms = 5000, what = `${n} events`) {
    return withTimeout(new Promise((resolve, reject) => {
      const check = () => {
        if (this.events.length >= n) return resolve();
        if (this.ended) return reject(new Error(`stream ended with ${this.events.length} of ${what}`));
        this.waiters.push(check);
      };
      check();
    }), ms, what);
  }

  end(ms = 5000) {
    return withTimeout(new Promise((resolve) => {
      const check = () => (this.ended ? resolve() : this.waiters.push(check));
      check();
    }), ms, 'the end of the stream');
  }

  close() { this.req.destroy(); }
}

const cases = {};

cases.events = async () => {
  const s = new Stream('/sse/events');
  await withTimeout(s.response, 5000, 'the response');
  await s.end();
  out({ status: s.status, type: s.headers['content-type'], events: s.events });
};

// N streams on PATH?ch=CH get a "ready" event, then M published messages
// each, in order. Args: PATH N CH M
cases.subscribe = async () => {
  const [path, nstr, ch, mstr] = args;
  const n = Number(nstr); const m = Number(mstr);
  const streams = Array.from({ length: n }, () => new Stream(`${path}?ch=${ch}`));
  await Promise.all(streams.map((s) => s.count(1, 5000, 'ready')));
  const workers = {};
  for (const s of streams) {
    const r = s.events.shift();
    const w = r.event === 'ready' ? r.data : `not ready: ${r.event}`;
    workers[w] = (workers[w] || 0) + 1;
  }
  out({ workers });
  const pub = await get(`/publish?ch=${ch}&n=${m}&p=s`);
  await Promise.all(streams.map((s) => s.count(m, 5000).catch(() => {})));
  await new Promise((r) => setTimeout(r, 100));
  const counts = {};
  for (const s of streams) {
    const k = s.events.map((e) => `${e.event}:${e.data}`).join(',');
    counts[k] = (counts[k] || 0) + 1;
  }
  out({ pub, sequences: counts });
  streams.forEach((s) => s.close());
};

// sse:last_event_id(): with and without a Last-Event-ID header, and on a
// reconnection that sends the id of the last event received, as
// EventSource does.
cases.last = async () => {
  const plain = new Stream('/sse/last');
  await plain.count(3);
  out({ name: 'no header', events: plain.events });
  plain.close();
  const given = new Stream('/sse/last', { 'Last-Event-ID': '42' });
  await given.count(3);
  out({ name: 'header 42', events: given.events });
  given.close();
  const first = new Stream('/sse/last?close=1');
  await first.end();
  const again = new Stream('/sse/last?close=1', { 'Last-Event-ID': first.lastId });
  await again.end();
  out({ name: 'reconnect', first_last_id: first.lastId, events: again.events });
};

run(cases);
