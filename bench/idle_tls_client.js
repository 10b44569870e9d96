// Client of scripts/bench-tls-idle: opens N connections of one kind to a
// server, keeps them all open and silent, and prints the growth of the
// server's RSS per connection.
// usage: node bench/idle_tls_client.js KIND PORT N PIDS [CA]
//   KIND plain      TCP, one GET / (keep-alive) answered, then silent
//        tls        TLS handshake done (the certificate checked against CA
//                   for 127.0.0.1), then silent: no request
//        tls-req    TLS handshake, one GET / answered, then silent
//        h2c-req    cleartext HTTP/2 (prior knowledge), one GET / answered
//                   on its session, then silent (scripts/bench-h2)
//        h2-req     the same over TLS (ALPN h2)
//   PIDS  the server's processes, comma-separated: their VmRSS is summed
// First WARM connections of the same kind are opened and closed (the
// server's one-off allocations: OpenSSL's lazy tables, the lane's pools),
// then the RSS is read, the N connections opened (at most BATCH at a time),
// and after 2 s of silence the RSS read again.
// Prints "KIND bytes_per_connection rss_before_kb rss_after_kb".
'use strict';
const fs = require('fs');
const net = require('net');
const tls = require('tls');
const http2 = require('http2');

const [kind, portArg, nArg, pidsArg, caFile] = process.argv.slice(2);
const port = Number(portArg);
const n = Number(nArg);
const pids = (pidsArg || '').split(',').filter(Boolean);
if (!['plain', 'tls', 'tls-req', 'h2c-req', 'h2-req'].includes(kind) || !port || !n || pids.length === 0) {
  console.error('usage: node bench/idle_tls_client.js plain|tls|tls-req|h2c-req|h2-req PORT N PID[,PID...] [CA]');
  process.exit(2);
}
const ca = caFile ? fs.readFileSync(caFile) : undefined;
const WARM = 20;
const BATCH = 200;
const REQ = 'GET / HTTP/1.1\r\nHost: b\r\n\r\n';

const rssKb = () => pids.reduce((sum, pid) => {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s*(\d+)/);
  return sum + Number(m[1]);
}, 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// an HTTP/2 session and one GET / on it; resolves with the session
function openH2() {
  return new Promise((resolve, reject) => {
    const secure = kind === 'h2-req';
    const s = http2.connect(`${secure ? 'https' : 'http'}://127.0.0.1:${port}`,
      secure ? { ca, rejectUnauthorized: !!ca, minVersion: 'TLSv1.3' } : {});
    const timer = setTimeout(() => { s.destroy(); reject(new Error('timeout')); }, 20000);
    s.on('error', (err) => { clearTimeout(timer); reject(err); });
    s.on('close', () => { if (!s.idleOk) reject(new Error('closed by the server')); });
    const r = s.request({ ':path': '/' });
    let got = '';
    r.setEncoding('latin1');
    r.on('data', (d) => { got += d; });
    r.on('end', () => {
      clearTimeout(timer);
      if (got.includes('Hello World')) resolve(s); else reject(new Error(`bad answer: ${got}`));
    });
    r.end();
  });
}

// one connection of `kind`; resolves with the socket once it is idle
function open() {
  if (kind.startsWith('h2')) return openH2();
  return new Promise((resolve, reject) => {
    let sock;
    let got = '';
    const fail = (err) => { sock.destroy(); reject(err); };
    const ask = () => {
      sock.setTimeout(0);
      sock.on('data', (d) => {
        got += d.toString('latin1');
        if (got.includes('Hello World')) { sock.removeAllListeners('data'); resolve(sock); }
      });
      sock.write(REQ);
    };
    if (kind === 'plain') {
      sock = net.connect({ host: '127.0.0.1', port }, ask);
    } else {
      sock = tls.connect({
        host: '127.0.0.1', port, ca, rejectUnauthorized: !!ca, minVersion: 'TLSv1.3',
      }, () => {
        if (kind !== 'tls') return ask();
        sock.setTimeout(0);
        return resolve(sock);
      });
    }
    sock.setTimeout(20000, () => fail(new Error('timeout')));
    sock.on('error', fail);
    sock.on('close', () => { if (!sock.idleOk) reject(new Error('closed by the server')); });
  });
}

async function openMany(count) {
  const socks = [];
  for (let i = 0; i < count; i += BATCH) {
    const batch = [];
    for (let j = i; j < Math.min(count, i + BATCH); j++) batch.push(open());
    socks.push(...await Promise.all(batch));
  }
  return socks;
}

(async () => {
  const warm = await openMany(WARM);
  for (const s of warm) { s.idleOk = true; s.destroy(); }
  await sleep(1000);
  const before = rssKb();
  const socks = await openMany(n);
  let closed = 0;
  for (const s of socks) {
    s.setTimeout(0);
    s.on('close', () => { closed++; });
  }
  await sleep(2000);
  const after = rssKb();
  if (closed > 0) throw new Error(`${closed} of the idle connections were closed by the server`);
  console.log(`${kind} ${Math.round((after - before) * 1024 / n)} ${before} ${after}`);
  for (const s of socks) { s.idleOk = true; s.destroy(); }
  process.exit(0);
})().catch((err) => {
  console.error(`idle_tls_client: ${kind}: ${err.message.trim().split("\n")[0]}`);
  process.exit(1);
});
