// Node.js echo server for the moonport benchmark (scripts/bench-echo).
// usage: node bench/node_echo.js PORT [ADDRESS]   (address defaults to 127.0.0.1)
'use strict';
const net = require('net');

const port = Number(process.argv[2]) || 3000;
const address = process.argv[3] || '127.0.0.1';

const server = net.createServer((socket) => {
  socket.on('data', (d) => socket.write(d));
  socket.on('error', () => {}); // a reset peer must not kill the server
});
server.on('error', (err) => {
  console.error(`node_echo: ${address}:${port}: ${err.message}`);
  process.exit(1);
});
server.listen(port, address);
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));
