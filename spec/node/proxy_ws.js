'use strict';
// npm `ws` through mp.upstream's WebSocket splice (spec/e2e/upstream_spec.lua):
//   node proxy_ws.js PORT
// Connects to ws://127.0.0.1:PORT/echo (the proxy, whose upstream is
// spec/node/ws_server.js), sends a text, a binary, a 1 MiB text and 200
// small messages, checks every echo, then closes with 4000 "bye". Prints
// {"echoed": n, "bytes": n}, {"closed": code} and {"done": true}.
const WebSocket = require('ws');
const port = Number(process.argv[2]);
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const SCALE = Number(process.env.SPEC_SCALE || 1);
const big = 'x'.repeat(1 << 20);
const bin = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
const msgs = [['t', 'hello'], ['b', bin], ['t', big]];
for (let i = 0; i < 200; i++) msgs.push(['t', 'm' + i]);

const ws = new WebSocket(`ws://127.0.0.1:${port}/echo`);
const timer = setTimeout(() => { out({ error: 'timeout' }); process.exit(1); }, 20000 * SCALE);
let next = 0, echoed = 0, bytes = 0;
ws.on('open', () => { for (const [k, v] of msgs) ws.send(v, { binary: k === 'b' }); });
ws.on('message', (data, isBinary) => {
  const [k, v] = msgs[next++];
  const ok = k === 'b' ? isBinary && Buffer.compare(data, v) === 0 : !isBinary && data.toString() === v;
  if (!ok) { out({ error: `echo ${next} differs` }); process.exit(1); }
  echoed++;
  bytes += data.length;
  if (next === msgs.length) { out({ echoed, bytes }); ws.close(4000, 'bye'); }
});
ws.on('close', (code) => { clearTimeout(timer); out({ closed: code }); out({ done: true }); });
ws.on('error', (e) => { out({ error: e.message }); process.exit(1); });
