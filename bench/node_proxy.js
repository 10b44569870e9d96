// scripts/bench-proxy's Node.js server: every request is fetched from the
// upstream with http.request on a keep-alive Agent and its body sent back.
// usage: node bench/node_proxy.js PORT UPSTREAM_PORT
'use strict';
const http = require('http');
const port = Number(process.argv[2]);
const up = Number(process.argv[3]);
const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
http.createServer((req, res) => {
  const u = http.request({ host: '127.0.0.1', port: up, path: '/', agent }, (ur) => {
    const parts = [];
    ur.on('data', (d) => parts.push(d));
    ur.on('end', () => {
      const body = Buffer.concat(parts);
      res.writeHead(ur.statusCode, { 'Content-Type': 'text/plain', 'Content-Length': body.length });
      res.end(body);
    });
  });
  u.on('error', (e) => { res.writeHead(502); res.end(e.message); });
  u.end();
}).listen(port, '127.0.0.1');
