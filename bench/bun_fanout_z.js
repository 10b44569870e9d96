// SPDX-License-Identifier: MIT
// Bun peer of bench/fanout_z.lua for scripts/bench-compress: Bun.serve's
// WebSocket with perMessageDeflate: true (as the issue asks: Bun's shared
// compressor, which answers without server context takeover), every
// subscriber on topic "z" (ws.subscribe), a publish is server.publish.
// usage: bun bench/bun_fanout_z.js PORT
//   WebSocket /sub: subscribes, then "ready"
//   GET /pub?i=I: publishes message I (about 1 KiB of JSON)
'use strict';

function jsonOf(i) {
  const items = [];
  for (let k = 1; k <= 16; k++) {
    items.push(`{"id":${k},"user":"u${(i + k) % 13}","text":"hello there, how are you"}`);
  }
  return `{"i":${i},"items":[${items.join(',')}]}`;
}

const server = Bun.serve({
  port: Number(process.argv[2]),
  hostname: '127.0.0.1',
  fetch(req, srv) {
    const url = new URL(req.url);
    if (url.pathname === '/sub') {
      if (srv.upgrade(req)) return undefined;
      return new Response('upgrade failed', { status: 400 });
    }
    if (url.pathname === '/pub') {
      srv.publish('z', jsonOf(Number(url.searchParams.get('i')) || 0));
      return new Response('ok');
    }
    return new Response('ok');
  },
  websocket: {
    perMessageDeflate: true,
    idleTimeout: 0,
    maxPayloadLength: 1 << 20,
    backpressureLimit: 1 << 24,
    open(ws) {
      ws.subscribe('z');
      ws.send('ready');
    },
    message() {},
  },
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => { server.stop(true); process.exit(0); });
