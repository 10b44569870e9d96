// Node.js HTTP server for the moonport benchmark (scripts/bench-http).
// usage: node bench/node_http.js PORT [ADDRESS [WORKERS]]
//   (address defaults to 127.0.0.1; WORKERS > 1 forks that many cluster
//   workers sharing the port, the primary only supervises)
//   GET /json -> {"message":"Hello, World!","n":1,"ok":true} (application/json)
//   anything else -> "Hello World" (text/plain)
'use strict';
const cluster = require('cluster');
const http = require('http');

const port = Number(process.argv[2]) || 3003;
const address = process.argv[3] || '127.0.0.1';
const workers = Number(process.argv[4]) || 1;

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
  const server = http.createServer((req, res) => {
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
