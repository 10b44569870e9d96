// Load generator of scripts/bench-compress's WebSocket half: N npm ws
// clients (perMessageDeflate offered unless COMPRESS is 0, each message
// inflated and checked by ws), then M messages published with at most
// WINDOW (default 1) in flight (a new one once every subscriber has an
// earlier one); each subscriber must see them in order; prints
// {"deliveries", "cpu_us_per_delivery", "agreed", "bad"} with the
// server's CPU (utime + stime of PID and its children from /proc) over
// the run.
// usage: node bench/ws_compress_load.js PORT N M COMPRESS PID [WINDOW]
'use strict';
const fs = require('fs');
const http = require('http');
const path = require('path');
const WebSocket = require(path.join(__dirname, '..', 'spec', 'node', 'node_modules', 'ws'));

const [port, n, m, compress, pid] = process.argv.slice(2).map(Number);
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });

function ticks() {
  let t = 0;
  const pids = [pid];
  try {
    for (const c of fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/)) {
      if (c) pids.push(Number(c));
    }
  } catch (e) { /* no children */ }
  for (const p of pids) {
    try {
      const f = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
      const rest = f.slice(f.lastIndexOf(')') + 2).split(' ');
      t += Number(rest[11]) + Number(rest[12]);
    } catch (e) { /* gone */ }
  }
  return t;
}

function get(p) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path: p, agent }, (res) => { res.resume(); res.on('end', resolve); })
      .on('error', reject);
  });
}

(async () => {
  const window = Number(process.argv[7]) || 1;
  const pmd = compress ? { serverNoContextTakeover: true, clientNoContextTakeover: true } : false;
  let ready = 0, agreed = 0, bad = 0;
  let onReady;
  const readyP = new Promise((r) => { onReady = r; });
  const counts = new Map(); // message -> subscribers that have it
  let onDone = null; // called with a message once all have it
  for (let k = 0; k < n; k++) {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/sub`, { perMessageDeflate: pmd });
    let last = -1;
    ws.on('upgrade', (res) => { if (res.headers['sec-websocket-extensions']) agreed++; });
    ws.on('message', (d) => {
      const s = d.toString();
      if (s === 'ready') { if (++ready === n) onReady(); return; }
      const i = JSON.parse(s).i;
      if (i <= last) bad++;
      last = i;
      const c = (counts.get(i) || 0) + 1;
      counts.set(i, c);
      if (c === n) { counts.delete(i); if (onDone) onDone(i); }
    });
    ws.on('error', (e) => { console.error(e.message); process.exit(1); });
    if (k % 100 === 99) await new Promise((r) => setTimeout(r, 5));
  }
  await readyP;
  await new Promise((r) => setTimeout(r, 300));
  // publishes `count` messages from `first`, at most `window` in flight
  function burst(first, count) {
    return new Promise((resolve, reject) => {
      let next = first, done = 0;
      const pub = () => { get(`/pub?i=${next++}`).catch(reject); };
      onDone = () => {
        if (++done === count) resolve();
        else if (next < first + count) pub();
      };
      for (let k = 0; k < Math.min(window, count); k++) pub();
    });
  }
  await burst(0, 20); // warm-up, not counted
  const t0 = ticks();
  await burst(20, m);
  const t1 = ticks();
  const hz = 100;
  const deliveries = n * m;
  process.stdout.write(JSON.stringify({ deliveries, agreed, bad, window,
    cpu_us_per_delivery: ((t1 - t0) / hz / deliveries) * 1e6 }) + '\n');
  process.exit(bad ? 1 : 0);
})();
