// Node + busboy's side of scripts/bench-upload: a multipart upload
// streamed to disk (busboy's file stream piped into fs.createWriteStream).
// usage: NODE_PATH=spec/node/node_modules node bench/node_upload.js PORT DIR
'use strict';
const http = require('http');
const fs = require('fs');
const busboy = require('busboy');

const [port, dir] = [Number(process.argv[2]), process.argv[3]];
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(0));

http.createServer((req, res) => {
  let saved = 0;
  const writes = [];
  const bb = busboy({ headers: req.headers, limits: { fileSize: Infinity } });
  bb.on('file', (name, file) => {
    const out = fs.createWriteStream(`${dir}/node.bin`);
    file.on('data', (d) => { saved += d.length; });
    writes.push(new Promise((resolve) => out.on('close', resolve)));
    file.pipe(out);
  });
  bb.on('close', async () => {
    await Promise.all(writes);
    res.end(String(saved));
  });
  req.pipe(bb);
}).listen(port, '127.0.0.1');
