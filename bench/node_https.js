// Node.js HTTPS server for scripts/bench-tls (and scripts/bench-tls-idle).
// usage: node bench/node_https.js PORT CERT KEY [ADDRESS [PLAIN_PORT]]
//   TLS 1.3 only (minVersion), the given certificate; one process.
//   PLAIN_PORT: the same handler over plain `http` in the same process.
//   GET / (anything) -> "Hello World" (text/plain, Content-Length)
'use strict';
const fs = require('fs');
const http = require('http');
const https = require('https');

const port = Number(process.argv[2]) || 3443;
const cert = process.argv[3];
const key = process.argv[4];
const address = process.argv[5] || '127.0.0.1';
const plainPort = Number(process.argv[6]) || 0;
if (!cert || !key) {
  console.error('usage: node bench/node_https.js PORT CERT KEY [ADDRESS]');
  process.exit(2);
}

for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));

const hello = 'Hello World';
const handler = (req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': hello.length });
  res.end(hello);
};
const serve = (server, p) => {
  server.keepAliveTimeout = 65000;
  server.on('error', (err) => {
    console.error(`node_https: ${address}:${p}: ${err.message}`);
    process.exit(1);
  });
  server.listen(p, address);
};
serve(https.createServer({
  cert: fs.readFileSync(cert),
  key: fs.readFileSync(key),
  minVersion: 'TLSv1.3',
}, handler), port);
if (plainPort) serve(http.createServer(handler), plainPort);
