// Node's own fetch with a FormData body against moonport's req:parts()
// (spec/e2e/upload_spec.lua). Usage: node upload_fetch.js URL SIZE
// Sends a field with non-ASCII text, a file of SIZE bytes (byte i is
// (i * 7 + 3) % 251) and a file whose name needs escaping; prints the
// status and the JSON answer.
'use strict';
const [url, size] = [process.argv[2], Number(process.argv[3])];
const bytes = new Uint8Array(size);
for (let i = 0; i < size; i++) bytes[i] = (i * 7 + 3) % 251;
const fd = new FormData();
fd.append('title', 'héllo wörld "quoted"');
fd.append('doc', new Blob([bytes], { type: 'application/x-test' }), 'data.bin');
fd.append('odd', new Blob(['x\r\n--not-a-boundary\r\n']), 'we"ird name.txt');
fetch(url, { method: 'POST', body: fd }).then(async (res) => {
  console.log(JSON.stringify({ status: res.status, body: await res.json() }));
}).catch((e) => { console.error(e); process.exit(1); });
