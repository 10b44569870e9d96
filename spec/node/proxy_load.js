// A load client of spec/e2e/upstream_spec.lua: N requests, C at a time, over
// keep-alive connections (node's http Agent). Usage:
//   node proxy_load.js PORT PATH N C [METHOD] [HEADER=VALUE...]
// Prints one JSON line: { status: { "200": n, ... }, bodies: { body: n },
// errors: n } (bodies counted when at most 64 bytes).
const http = require("http");
const [port, path, n, c, method] = [Number(process.argv[2]), process.argv[3],
  Number(process.argv[4]), Number(process.argv[5]), process.argv[6] || "GET"];
const headers = {};
for (const kv of process.argv.slice(7)) {
  const i = kv.indexOf("=");
  headers[kv.slice(0, i)] = kv.slice(i + 1);
}
const agent = new http.Agent({ keepAlive: true, maxSockets: c });
const out = { status: {}, bodies: {}, errors: 0, errmsg: {} };
let started = 0, done = 0;
function one() {
  if (started >= n) return;
  started++;
  const req = http.request({ port, path, method, agent, headers, host: "127.0.0.1" }, (res) => {
    const parts = [];
    res.on("data", (d) => parts.push(d));
    res.on("end", () => {
      out.status[res.statusCode] = (out.status[res.statusCode] || 0) + 1;
      const b = Buffer.concat(parts).toString();
      if (b.length <= 64) out.bodies[b] = (out.bodies[b] || 0) + 1;
      finish();
    });
  });
  req.on("error", (e) => { out.errors++; out.errmsg[e.message] = (out.errmsg[e.message] || 0) + 1; finish(); });
  req.end();
}
function finish() {
  done++;
  if (done === n) { console.log(JSON.stringify(out)); agent.destroy(); return; }
  one();
}
for (let i = 0; i < c; i++) one();
