// Node.js HTTP server for the moonport benchmark (scripts/bench-http).
// usage: node bench/node_http.js PORT [ADDRESS [WORKERS [PUBLIC_DIR]]]
//   (address defaults to 127.0.0.1; WORKERS > 1 forks that many cluster
//   workers sharing the port, the primary only supervises)
//   GET /json -> {"message":"Hello, World!","n":1,"ok":true} (application/json)
//   GET /static/NAME (with PUBLIC_DIR) -> PUBLIC_DIR/static/NAME, read per
//     request with fs.readFile (async) and sent with Content-Length; .txt as
//     text/plain, anything else application/octet-stream; 404 if unreadable.
//     Node has no built-in static file server: this is the plain core-API
//     way (no cache, no ETag or Range), not a framework's middleware.
//   anything else -> "Hello World" (text/plain)
'use strict';
const cluster = require('cluster');
const fs = require('fs');
const http = require('http');
const path = require('path');

const port = Number(process.argv[2]) || 3003;
const address = process.argv[3] || '127.0.0.1';
const workers = Number(process.argv[4]) || 1;
const publicDir = process.argv[5] ? path.resolve(process.argv[5]) : null;

for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));

if (workers > 1 && cluster.isPrimary) {
  for (let i = 0; i < workers; i++) cluster.fork();
  cluster.on('exit', (w, code, signal) => {
    console.error(`node_http: worker ${w.process.pid} exited (${signal || code})`);
    process.exit(1);
  });
  // the workers get SIGTERM from process.exit's teardown (disconnect)
  process.on('exit', () => { for (const id in cluster.workers) cluster.workers[id].process.kill(); });
} else {
  const hello = 'Hello World';
  const notFound = (res) => {
    res.writeHead(404, { 'Content-Type': 'text/plain', 'Content-Length': 9 });
    res.end('not found');
  };
  const sendStatic = (req, res) => {
    let rel;
    try {
      rel = decodeURIComponent(req.url.split('?')[0]);
    } catch (e) {
      return notFound(res);
    }
    const file = path.join(publicDir, rel);
    // path.join normalizes "..": anything that ends up outside the folder is refused
    if (!file.startsWith(publicDir + path.sep) || rel.includes('\0')) return notFound(res);
    fs.readFile(file, (err, data) => {
      if (err) return notFound(res);
      const type = path.extname(file) === '.txt' ? 'text/plain' : 'application/octet-stream';
      res.writeHead(200, { 'Content-Type': type, 'Content-Length': data.length });
      res.end(data);
    });
  };
  const server = http.createServer((req, res) => {
    if (publicDir && req.url.startsWith('/static/')) {
      sendStatic(req, res);
      return;
    }
    if (req.url === '/json') {
      const body = JSON.stringify({ message: 'Hello, World!', n: 1, ok: true });
      res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(body) });
      res.end(body);
      return;
    }
    res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': hello.length });
    res.end(hello);
  });
  server.keepAliveTimeout = 65000;
  server.on('error', (err) => {
    console.error(`node_http: ${address}:${port}: ${err.message}`);
    process.exit(1);
  });
  server.listen(port, address);
}
