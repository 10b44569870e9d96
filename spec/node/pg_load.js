// N concurrent GETs of moonport's /one?ID (spec/fixtures/pg_app.lua), all
// at once on their own connections: prints {"ok":, "fail":, "errors": [..]}
// then {"done": true}. Usage: node pg_load.js PORT N [PATH]
const http = require("http");
const [port, n, path] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4] || "/one"];
const agent = new http.Agent({ keepAlive: false, maxSockets: n });
let ok = 0, fail = 0, left = n;
const errors = [];
const lanes = {};
for (let i = 0; i < n; i++) {
  const id = 1 + (i % 1000);
  http.get({ host: "127.0.0.1", port, path: `${path}?${id}`, agent }, (res) => {
    let body = "";
    res.on("data", (d) => (body += d));
    res.on("end", () => {
      let v = null;
      try { v = JSON.parse(body); } catch (e) { /* counted below */ }
      if (res.statusCode === 200 && v && (path !== "/one" || v.n === id * 10)) {
        ok++;
        if (v.lane) lanes[v.lane] = (lanes[v.lane] || 0) + 1;
      } else {
        fail++;
        if (errors.length < 5) errors.push(`${res.statusCode} ${body.slice(0, 200)}`);
      }
      if (--left === 0) finish();
    });
  }).on("error", (e) => {
    fail++;
    if (errors.length < 5) errors.push(String(e));
    if (--left === 0) finish();
  });
}
function finish() {
  console.log(JSON.stringify({ ok, fail, errors, lanes }));
  console.log(JSON.stringify({ done: true }));
}
