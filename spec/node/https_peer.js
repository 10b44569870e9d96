'use strict';
// A Node `https` server with an npm `ws` server on it, for
// spec/e2e/tls_client_spec.lua (mp.fetch https:// and mp.websocket wss://
// against a TLS peer we did not write). Usage: node https_peer.js CERT KEY.
// Prints {"port": N} once it listens on 127.0.0.1. Paths:
//   GET  /hello        "hello from node https"
//   POST /echo         {"method", "body", "length"} of the request
//   GET  /to?url=U     302 to U
//   wss  /echo         every message back as it came
const fs = require('fs');
const https = require('https');
const WebSocket = require('ws');

const [cert, key] = process.argv.slice(2);
const server = https.createServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) },
  (req, res) => {
    const url = new URL(req.url, 'https://x');
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (url.pathname === '/hello') {
        res.setHeader('Content-Type', 'text/plain');
        res.end('hello from node https');
      } else if (url.pathname === '/echo') {
        res.setHeader('Content-Type', 'application/json');
        res.end(JSON.stringify({ method: req.method, body: body.toString('latin1'),
          length: body.length, host: req.headers.host }));
      } else if (url.pathname === '/to') {
        res.statusCode = 302;
        res.setHeader('Location', url.searchParams.get('url'));
        res.end();
      } else {
        res.statusCode = 404;
        res.end('no such path');
      }
    });
  });
const wss = new WebSocket.Server({ server, path: '/echo' });
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  ws.on('error', () => {});
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
