'use strict';
// Response compression cases for spec/e2e/compress_spec.lua, read with
// node's http client and node's zlib (which checks the gzip and brotli
// bytes: CRC, lengths, trailer):
//   node compress_cases.js PORT CASE [ARGS...]
// Prints JSON lines and ends with {"done":true}.
const http = require('http');
const zlib = require('zlib');
const { port, args, out, withTimeout, get, run } = require('./case_common');

// The decompressing stream for a response's Content-Encoding.
function decoder(res) {
  return res.headers['content-encoding'] === 'br' ? zlib.createBrotliDecompress() : zlib.createGunzip();
}

// GET path with headers: { status, headers, raw (Buffer), chunks (the
// raw pieces as they arrived) }.
function request(path, headers = {}, method = 'GET') {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method, headers, agent: false }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, raw: Buffer.concat(parts) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

function decode(r) {
  const enc = r.headers['content-encoding'];
  if (enc === 'gzip') return zlib.gunzipSync(r.raw).toString();
  if (enc === 'br') return zlib.brotliDecompressSync(r.raw).toString();
  return r.raw.toString();
}

// One response as the spec wants to see it.
async function one(path, ae, method) {
  const headers = ae === undefined ? {} : { 'accept-encoding': ae };
  const r = await withTimeout(request(path, headers, method), 10000, path);
  const body = method === 'HEAD' ? '' : decode(r);
  return {
    path, ae: ae === undefined ? null : ae, status: r.status,
    encoding: r.headers['content-encoding'] || null,
    vary: r.headers.vary || null,
    etag: r.headers.etag || null,
    length: r.headers['content-length'] === undefined ? null : Number(r.headers['content-length']),
    chunked: r.headers['transfer-encoding'] === 'chunked',
    raw_len: r.raw.length, body_len: body.length,
    body_head: body.slice(0, 40),
    body_json_len: method !== 'HEAD' && r.headers['content-type'] === 'application/json' ? JSON.parse(body).length : null,
  };
}

const cases = {
  // ARGS: "path|accept-encoding|method" triples; one row each
  async responses() {
    for (const a of args) {
      const [path, ae, method] = a.split('|');
      out(await one(path, ae === '-' ? undefined : ae, method || 'GET'));
    }
  },

  // /stream?n=N through one gunzip (or brotli) stream: each piece must
  // come out of the decompressor before the server sends the next one (it
  // waits for GET /go?i=<i>), so an unflushed piece would hang here.
  // ARGS: N [ACCEPT-ENCODING, default gzip]
  async stream() {
    const n = Number(args[0]);
    const ae = args[1] || 'gzip';
    await get('/go?i=0');
    const got = [];
    await withTimeout(new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: `/stream?n=${n}`, agent: false,
        headers: { 'accept-encoding': ae } }, (res) => {
        out({ status: res.statusCode, encoding: res.headers['content-encoding'] || null,
              chunked: res.headers['transfer-encoding'] === 'chunked' });
        const gun = decoder(res);
        let text = '';
        gun.on('data', (d) => {
          text += d.toString();
          let nl;
          while ((nl = text.indexOf('\n')) >= 0) {
            const line = text.slice(0, nl);
            text = text.slice(nl + 1);
            const i = Number(line.split(' ')[1]);
            got.push(i);
            get(`/go?i=${i}`).catch(reject);
          }
        });
        gun.on('end', resolve);
        gun.on('error', reject);
        res.pipe(gun);
      });
      req.on('error', reject);
    }), 30000, 'the stream');
    out({ pieces: got });
  },

  // An SSE stream on channel ARGS[0]: "ready", then N published events,
  // each published only once the one before it was decoded.
  // ARGS: CH N [ACCEPT-ENCODING, default gzip]
  async sse() {
    const ch = args[0], n = Number(args[1]);
    const ae = args[2] || 'gzip';
    const got = [];
    await withTimeout(new Promise((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: `/sse?ch=${ch}`, agent: false,
        headers: { 'accept-encoding': ae } }, (res) => {
        out({ status: res.statusCode, encoding: res.headers['content-encoding'] || null,
              vary: res.headers.vary || null });
        const gun = decoder(res);
        let text = '';
        gun.on('data', (d) => {
          text += d.toString();
          let end;
          while ((end = text.indexOf('\n\n')) >= 0) {
            const block = text.slice(0, end);
            text = text.slice(end + 2);
            const data = block.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
            got.push(data);
            if (got.length > n) { req.destroy(); resolve(); return; }
            get(`/publish?ch=${ch}&d=event${got.length}`).catch(reject);
          }
        });
        gun.on('error', reject);
        res.pipe(gun);
      });
      req.on('error', (e) => { if (got.length <= n) reject(e); });
    }), 30000, 'the SSE stream');
    out({ events: got });
  },
};

run(cases);
