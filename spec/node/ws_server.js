'use strict';
// An npm `ws` server for spec/e2e/ws_client_spec.lua (mp.websocket against a
// server we did not write). Prints {"port": N} once it listens on
// 127.0.0.1, then one {"closed": path, "code": c, "reason": r} line per
// connection that ends. Paths:
//   /echo        every message back, text as text, binary as binary
//   /frag        sends "hello world" as three text fragments with a ping
//                between them, then 0..255 as two binary fragments
//   /pingme      pings with "xyz"; on the pong sends "got pong <payload>"
//   /close       on the message "close-me" closes with 4001 "bye"
//   /proto       picks "chat.v2" when offered
//   /big?n=N     sends N bytes of text at once
//   /burst?n=N   sends "m1 xxx.." .. "mN xxx.." (1 KB each) at once
//   raw answers (no ws): /404 (404), /badaccept (101 with a wrong accept),
//   /hugehead (a 101 with a 20 KB header field),
//   /wrongproto (101 choosing a subprotocol no one offered), /masked (a
//   good 101, then a masked text frame, which only clients may send)
const http = require('http');
const crypto = require('crypto');
const WebSocket = require('ws');

const wss = new WebSocket.Server({
  noServer: true,
  handleProtocols: (protocols) => (protocols.has('chat.v2') ? 'chat.v2' : false),
});

function accept(key) {
  return crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
}

function raw101(key, extra) {
  return 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
    `Sec-WebSocket-Accept: ${key}\r\n${extra || ''}\r\n`;
}

const server = http.createServer((req, res) => { res.statusCode = 426; res.end(); });
server.on('upgrade', (req, socket, head) => {
  const url = new URL(req.url, 'http://x');
  const key = req.headers['sec-websocket-key'] || '';
  socket.on('error', () => {});
  switch (url.pathname) {
    case '/404':
      socket.end('HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n');
      return;
    case '/badaccept':
      socket.write(raw101(accept(key + 'x')));
      return;
    case '/hugehead':
      socket.write(raw101(accept(key), 'X-Big: ' + 'x'.repeat(20000) + '\r\n'));
      return;
    case '/wrongproto':
      socket.write(raw101(accept(key), 'Sec-WebSocket-Protocol: other\r\n'));
      return;
    case '/masked': {
      const payload = Buffer.from('hi');
      const mask = Buffer.from([1, 2, 3, 4]);
      const frame = Buffer.alloc(2 + 4 + payload.length);
      frame[0] = 0x81;
      frame[1] = 0x80 | payload.length;
      mask.copy(frame, 2);
      for (let i = 0; i < payload.length; i++) frame[6 + i] = payload[i] ^ mask[i & 3];
      socket.write(raw101(accept(key)));
      socket.write(frame);
      socket.on('data', () => {}); // the client's close frame
      return;
    }
    default:
  }
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on('close', (code, reason) => {
      console.log(JSON.stringify({ closed: url.pathname, code, reason: reason.toString() }));
    });
    ws.on('error', () => {});
    switch (url.pathname) {
      case '/echo':
        ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
        break;
      case '/frag':
        ws.send('hello', { fin: false });
        ws.ping('between');
        ws.send(' wor', { fin: false });
        ws.send('ld', { fin: true });
        {
          const b = Buffer.alloc(256);
          for (let i = 0; i < 256; i++) b[i] = i;
          ws.send(b.subarray(0, 100), { binary: true, fin: false });
          ws.send(b.subarray(100), { binary: true, fin: true });
        }
        break;
      case '/pingme':
        ws.on('pong', (data) => ws.send('got pong ' + data.toString()));
        ws.ping('xyz');
        break;
      case '/close':
        ws.on('message', (data) => { if (data.toString() === 'close-me') ws.close(4001, 'bye'); });
        break;
      case '/proto':
        ws.send('protocol ' + ws.protocol);
        break;
      case '/burst':
        for (let i = 1; i <= Number(url.searchParams.get('n')); i++) ws.send('m' + i + ' ' + 'x'.repeat(1000));
        break;
      case '/big':
        ws.send('x'.repeat(Number(url.searchParams.get('n'))));
        break;
      default:
        ws.close(4404, 'no such path');
    }
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
