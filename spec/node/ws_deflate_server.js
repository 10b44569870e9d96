'use strict';
// An npm `ws` server with perMessageDeflate for spec/e2e/ws_deflate_spec.lua
// (mp.websocket's compress against a server we did not write):
//   node ws_deflate_server.js [takeover]
// "takeover": context takeover both ways (ws's default); else the server
// asks for no context takeover on either side. Threshold 0: every message
// is deflated. Prints {"port": N} once it listens on 127.0.0.1. Paths:
//   /echo        every message back, as it came
//   /stats       (HTTP) JSON: { offers: [...the Sec-WebSocket-Extensions
//                of each upgrade], rsv1: frames from clients with RSV1,
//                frames: frames from clients }
const http = require('http');
const WebSocket = require('ws');

const takeover = process.argv[2] === 'takeover';
const wss = new WebSocket.Server({
  noServer: true,
  perMessageDeflate: {
    threshold: 0,
    serverNoContextTakeover: !takeover,
    clientNoContextTakeover: !takeover,
  },
});

const stats = { offers: [], answers: [], rsv1: 0, frames: 0 };

// Counts the client's frames and their RSV1 bits from the raw bytes (each
// frame's head: its length says where the next one starts).
function watch(socket) {
  let buf = Buffer.alloc(0);
  socket.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      let len = buf[1] & 0x7f, h = 2;
      if (len === 126) { if (buf.length < 4) return; len = buf.readUInt16BE(2); h = 4; }
      else if (len === 127) { if (buf.length < 10) return; len = Number(buf.readBigUInt64BE(2)); h = 10; }
      if (buf[1] & 0x80) h += 4;
      if (buf.length < h + len) return;
      stats.frames++;
      if (buf[0] & 0x40) stats.rsv1++;
      buf = buf.subarray(h + len);
    }
  });
}

wss.on('headers', (headers) => {
  const ext = headers.find((h) => /^sec-websocket-extensions:/i.test(h));
  stats.answers.push(ext ? ext.replace(/^[^:]*: */, '') : null);
});

const server = http.createServer((req, res) => {
  res.setHeader('content-type', 'application/json');
  res.end(JSON.stringify(stats));
});
server.on('upgrade', (req, socket, head) => {
  stats.offers.push(req.headers['sec-websocket-extensions'] || null);
  watch(socket);
  if (head.length) socket.emit('data', head);
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  });
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
