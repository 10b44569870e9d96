'use strict';
// permessage-deflate cases for spec/e2e/ws_deflate_spec.lua against
// spec/fixtures/ws_deflate_app.lua, with the npm `ws` client (its own
// perMessageDeflate) and with raw sockets whose frames are made here with
// node's zlib (what `ws` would never send: bombs, RSV1 where it may not
// be, fragments of a compressed message):
//   node ws_deflate_cases.js PORT CASE [ARGS...]
// Prints JSON lines and ends with {"done":true}.
const net = require('net');
const crypto = require('crypto');
const zlib = require('zlib');
const WebSocket = require('ws');
const { port, args, out, SCALE, withTimeout, get, run } = require('./case_common');

const base = `ws://127.0.0.1:${port}`;

function text(n) {
  const words = ['alpha', 'beta', 'gamma', 'delta', 'moon', 'port', 'json', '{"k":1}'];
  let s = '';
  for (let i = 0; s.length < n; i++) s += words[(i * 7 + (i >> 3)) % words.length] + ' ';
  return s.slice(0, n);
}

// One ws client: opens, echoes the given messages, reports.
async function echoWith(pmd, msgs) {
  const ws = new WebSocket(`${base}/echo`, { perMessageDeflate: pmd });
  let answer = null;
  ws.on('upgrade', (res) => { answer = res.headers['sec-websocket-extensions'] || null; });
  await withTimeout(new Promise((res, rej) => { ws.on('open', res); ws.on('error', rej); }), 10000, 'open');
  const got = [];
  const done = new Promise((resolve) => {
    ws.on('message', (data, isBinary) => {
      got.push({ data: Buffer.from(data), isBinary });
      if (got.length === msgs.length) resolve();
    });
  });
  for (const m of msgs) ws.send(m.data, { binary: m.binary });
  await withTimeout(done, 10000, 'echoes');
  ws.close();
  const same = msgs.every((m, i) => got[i].isBinary === m.binary && got[i].data.equals(Buffer.from(m.data)));
  return { answer, extensions: Object.keys(ws._extensions || {}), same, n: got.length };
}

// ---- raw frames ----

function mask(payload) {
  const key = crypto.randomBytes(4);
  const out = Buffer.from(payload);
  for (let i = 0; i < out.length; i++) out[i] ^= key[i & 3];
  return { key, out };
}

// A client frame: first byte b0 (FIN, RSV, opcode), masked payload.
function frame(b0, payload) {
  const { key, out } = mask(payload);
  let head;
  if (out.length < 126) head = Buffer.from([b0, 0x80 | out.length]);
  else if (out.length < 65536) { head = Buffer.alloc(4); head[0] = b0; head[1] = 0x80 | 126; head.writeUInt16BE(out.length, 2); }
  else { head = Buffer.alloc(10); head[0] = b0; head[1] = 0x80 | 127; head.writeBigUInt64BE(BigInt(out.length), 2); }
  return Buffer.concat([head, key, out]);
}

// deflate-raw of buf as a message (sync flush, the 00 00 ff ff cut off)
function deflated(buf) {
  const z = zlib.deflateRawSync(buf, { finishFlush: zlib.constants.Z_SYNC_FLUSH });
  return z.subarray(0, z.length - 4);
}

// Server frames out of bytes: [{ b0, payload }], and what is left.
function parseFrames(buf) {
  const frames = [];
  let at = 0;
  for (;;) {
    if (buf.length - at < 2) break;
    const b0 = buf[at];
    let len = buf[at + 1] & 0x7f, h = 2;
    if (len === 126) { if (buf.length - at < 4) break; len = buf.readUInt16BE(at + 2); h = 4; }
    else if (len === 127) { if (buf.length - at < 10) break; len = Number(buf.readBigUInt64BE(at + 2)); h = 10; }
    if (buf.length - at < h + len) break;
    frames.push({ b0, payload: buf.subarray(at + h, at + h + len) });
    at += h + len;
  }
  return { frames, rest: buf.subarray(at) };
}

// Opens a raw WebSocket with the given extension offer; returns
// { sock, answer, next() -> a server frame }.
function rawOpen(offer) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0), head = null;
    const frames = [], waiters = [];
    let ended = false;
    const wake = () => { while (waiters.length && (frames.length || ended)) waiters.shift()(); };
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      if (!head) {
        const e = buf.indexOf('\r\n\r\n');
        if (e < 0) return;
        head = buf.subarray(0, e).toString();
        buf = buf.subarray(e + 4);
        const m = /\r\nsec-websocket-extensions: *([^\r\n]*)/i.exec(head);
        resolve({
          sock, answer: m ? m[1] : null, status: Number(head.split(' ')[1]),
          next: () => new Promise((res) => { waiters.push(() => res(frames.shift() || null)); wake(); }),
        });
      }
      const p = parseFrames(buf);
      buf = Buffer.from(p.rest);
      frames.push(...p.frames);
      wake();
    });
    sock.on('close', () => { ended = true; wake(); });
    sock.on('error', (e) => { ended = true; wake(); if (!head) reject(e); });
    const key = crypto.randomBytes(16).toString('base64');
    sock.write(`GET /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n` +
      (offer ? `Sec-WebSocket-Extensions: ${offer}\r\n` : '') + '\r\n');
  });
}

// Waits for a close frame (or the end): its code, or null.
async function closeCode(c) {
  for (;;) {
    const f = await withTimeout(c.next(), 20000, 'a close frame');
    if (!f) return null;
    if ((f.b0 & 0x0f) === 8) return f.payload.length >= 2 ? f.payload.readUInt16BE(0) : 1005;
  }
}

const PMD = 'permessage-deflate; client_max_window_bits';

const cases = {
  // ARGS: JSON perMessageDeflate options (or false) for each connection
  async negotiate() {
    for (const a of args) {
      const pmd = JSON.parse(a);
      const msgs = [
        { data: text(6000), binary: false },
        { data: 'tiny', binary: false },
        { data: Buffer.from(text(3000)), binary: true },
        { data: text(6000), binary: false }, // the same again: context helps
      ];
      const before = JSON.parse((await get('/stats')).body);
      const r = await echoWith(pmd, msgs);
      const after = JSON.parse((await get('/stats')).body);
      out({ options: pmd, ...r, deflates: after.ws_deflates - before.ws_deflates,
            deflate_in: after.ws_deflate_in - before.ws_deflate_in,
            deflate_out: after.ws_deflate_out - before.ws_deflate_out });
    }
  },

  // ARGS: offers, one connection each; the answer's value (or null)
  async offers() {
    for (const offer of args) {
      const c = await withTimeout(rawOpen(offer), 10000, 'handshake');
      out({ offer, status: c.status, answer: c.answer });
      c.sock.destroy();
    }
  },

  // A compressed message in three fragments (RSV1 on the first only):
  // echoed whole, compressed (RSV1) by the server.
  async fragments() {
    const c = await withTimeout(rawOpen(PMD), 10000, 'handshake');
    const msg = Buffer.from(text(5000));
    const z = deflated(msg);
    const a = Math.floor(z.length / 3), b = Math.floor((2 * z.length) / 3);
    c.sock.write(Buffer.concat([frame(0x40 | 0x01, z.subarray(0, a)), frame(0x00, z.subarray(a, b)),
      frame(0x80, z.subarray(b))]));
    const f = await withTimeout(c.next(), 10000, 'the echo');
    const rsv1 = (f.b0 & 0x40) !== 0;
    const body = rsv1 ? zlib.inflateRawSync(Buffer.concat([f.payload, Buffer.from([0, 0, 0xff, 0xff])]),
      { finishFlush: zlib.constants.Z_SYNC_FLUSH }) : f.payload;
    out({ answer: c.answer, rsv1, opcode: f.b0 & 0x0f, same: body.equals(msg), wire: f.payload.length });
    c.sock.destroy();
  },

  // ARGS: what to send after the handshake; the close code that comes
  async bad() {
    const what = args[0];
    const c = await withTimeout(rawOpen(what === 'nooffer' ? null : PMD), 10000, 'handshake');
    const t0 = Date.now();
    if (what === 'bomb') {
      // MiB of zeros that deflate to a frame far under max_msg (1 MiB)
      const mib = Number(args[1]);
      const z = deflated(Buffer.alloc(mib << 20));
      out({ bomb_wire: z.length });
      c.sock.write(frame(0x80 | 0x40 | 0x02, z));
    } else if (what === 'ping') {
      c.sock.write(frame(0x80 | 0x40 | 0x09, deflated(Buffer.from('hi'))));
    } else if (what === 'cont') {
      c.sock.write(Buffer.concat([frame(0x40 | 0x01, deflated(Buffer.from('ab'))), frame(0x80 | 0x40, Buffer.from([0]))]));
    } else if (what === 'garbage') {
      c.sock.write(frame(0x80 | 0x40 | 0x02, Buffer.from([0xff, 0xfe, 0xfd, 0xfc, 0x00, 0x01])));
    } else if (what === 'badtext') {
      c.sock.write(frame(0x80 | 0x40 | 0x01, deflated(Buffer.from([0xc3, 0x28, 0x41]))));
    } else if (what === 'nooffer') {
      c.sock.write(frame(0x80 | 0x40 | 0x01, deflated(Buffer.from('hello'))));
    }
    const code = await closeCode(c);
    out({ what, answer: c.answer, code, ms: Date.now() - t0 });
    c.sock.destroy();
  },

  // N compressed subscribers of channel ARGS[0]; M messages of SIZE bytes
  // published once they are all ready; every one must arrive, in order,
  // intact. The server's deflate count is reported.
  async fanout() {
    const [ch, nStr, mStr, sizeStr, pmdStr] = args;
    const n = Number(nStr), m = Number(mStr), size = Number(sizeStr);
    const pmd = pmdStr ? JSON.parse(pmdStr) : { serverNoContextTakeover: true, clientNoContextTakeover: true };
    const clients = [];
    let ready = 0, complete = 0, bad = 0, compressed = 0;
    let allReady, allDone;
    const readyP = new Promise((r) => { allReady = r; });
    const doneP = new Promise((r) => { allDone = r; });
    for (let i = 0; i < n; i++) {
      const ws = new WebSocket(`${base}/sub?ch=${ch}`, { perMessageDeflate: pmd });
      const st = { ws, got: 0 };
      ws.on('upgrade', (res) => { if (res.headers['sec-websocket-extensions']) compressed++; });
      ws.on('message', (data) => {
        const s = data.toString();
        if (s === 'ready') { if (++ready === n) allReady(); return; }
        let v;
        try { v = JSON.parse(s); } catch (e) { bad++; }
        if (v && v.i !== st.got + 1) bad++;
        st.got++;
        if (st.got === m && ++complete === n) allDone();
      });
      ws.on('error', () => { bad++; });
      clients.push(st);
      if (i % 100 === 99) await new Promise((r) => setTimeout(r, 10));
    }
    await withTimeout(readyP, 60000, `${n} subscribers ready (${ready})`);
    const before = JSON.parse((await get('/stats')).body);
    await get(`/publish?ch=${ch}&n=${m}&size=${size}`);
    await withTimeout(doneP, 90000, `every message to every subscriber (${complete} complete)`);
    const after = JSON.parse((await get('/stats')).body);
    out({ subscribers: n, compressed, messages: m, bad,
          deflates: after.ws_deflates - before.ws_deflates,
          delivered: after.pubsub_delivered - before.pubsub_delivered,
          deflate_in: after.ws_deflate_in - before.ws_deflate_in,
          deflate_out: after.ws_deflate_out - before.ws_deflate_out });
    for (const c of clients) c.ws.terminate();
  },
};

run(cases);
