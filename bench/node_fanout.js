// Node.js + npm `ws` peer of bench/fanout.lua for scripts/bench-fanout:
// the same commands, one WebSocket text message each ("sub\n", "pub <text>\n",
// "who\n"); a publish is `for (c of subscribers) c.send(text)`.
// usage: node bench/node_fanout.js PORT [ADDRESS]   (ws from spec/node/node_modules)
'use strict';
const path = require('path');
const { WebSocketServer } = require(path.join(__dirname, '..', 'spec', 'node', 'node_modules', 'ws'));

const port = Number(process.argv[2]) || 3003;
const host = process.argv[3] || '127.0.0.1';
const subscribers = new Set();

const wss = new WebSocketServer({ port, host, perMessageDeflate: false, clientTracking: false });
wss.on('connection', (ws) => {
  ws.on('message', (data) => {
    const s = data.toString();
    if (s.startsWith('pub ')) {
      const msg = s.slice(4);
      for (const c of subscribers) c.send(msg);
    } else if (s === 'sub\n') {
      subscribers.add(ws);
      ws.send('ok 0 0\n');
    } else if (s === 'who\n') {
      ws.send('me 0 0\n');
    } else {
      ws.close();
    }
  });
  ws.on('close', () => subscribers.delete(ws));
  ws.on('error', () => {});
});
wss.on('error', (err) => {
  console.error(`node_fanout: ${host}:${port}: ${err.message}`);
  process.exit(1);
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
