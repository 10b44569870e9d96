// Node.js + npm `ws` peer of bench/fanout_z.lua for scripts/bench-compress:
// perMessageDeflate with no context takeover either way (the setting that
// lets moonport deflate once), threshold 64; a publish is
// `for (c of subscribers) c.send(msg)`, which deflates for each.
// usage: node bench/node_fanout_z.js PORT   (ws from spec/node/node_modules)
'use strict';
const http = require('http');
const path = require('path');
const { WebSocketServer } = require(path.join(__dirname, '..', 'spec', 'node', 'node_modules', 'ws'));

function jsonOf(i) {
  const items = [];
  for (let k = 1; k <= 16; k++) {
    items.push(`{"id":${k},"user":"u${(i + k) % 13}","text":"hello there, how are you"}`);
  }
  return `{"i":${i},"items":[${items.join(',')}]}`;
}

const subscribers = new Set();
const server = http.createServer((req, res) => {
  const i = Number(new URL(req.url, 'http://x').searchParams.get('i')) || 0;
  const msg = jsonOf(i);
  for (const c of subscribers) c.send(msg);
  res.end('ok');
});
const wss = new WebSocketServer({
  server,
  clientTracking: false,
  perMessageDeflate: { serverNoContextTakeover: true, clientNoContextTakeover: true, threshold: 64 },
});
wss.on('connection', (ws) => {
  subscribers.add(ws);
  ws.on('close', () => subscribers.delete(ws));
  ws.on('error', () => {});
  ws.send('ready');
});
server.listen(Number(process.argv[2]), '127.0.0.1');
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
