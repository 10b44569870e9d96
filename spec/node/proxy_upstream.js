// An upstream of spec/e2e/upstream_spec.lua: Node's `http` server, keep-alive
// on. Usage: node proxy_upstream.js ID [PORT]. Prints {"port": N, "id": ID}.
//   /id          -> its ID (text/plain)
//   /echo        -> JSON { id, method, url, headers, body } of the request
//   /hop         -> "hop" with hop-by-hop fields and one its Connection names
//   /die         -> reads the request (body too), then destroys the socket
//                   without an answer; counts it (/hits)
//   /hits        -> JSON { die: N, requests: N, health: N (checks), healthy: N (answered 200) }
//   /health      -> 200 "ok", or 503 after /sick (until /well)
//   /upload?ms=N&every=K -> reads the body pausing N ms every K reads; answers
//                   JSON { bytes, md5 }
//   /download?bytes=N&ms=M&every=K -> N bytes of a pattern, honouring back
//                   pressure, pausing M ms every K 64 KiB writes; chunked
//   /slow?ms=N   -> "slow" after N ms
//   /bighead     -> a 100 KB header field
//   /hold?on=1   -> from then on /id is not answered (held; /hits counts
//                   them) until /hold?on=0 answers them all
// With TLS_CERT and TLS_KEY (PEM files) in the environment it is Node's
// `https` server instead; /echo then says whether the socket was encrypted
// and /hits counts the TLS handshakes (conns). BIND: the address to listen
// on (127.0.0.1).
const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const https = require("https");
const id = process.argv[2] || "up";
let die = 0, requests = 0, health = 0, healthy = 0, sick = false, conns = 0;
let hold = false, held = [];
const pattern = Buffer.alloc(65536);
for (let i = 0; i < pattern.length; i++) pattern[i] = (i * 31 + 7) & 255;

const tls = process.env.TLS_CERT ?
  { cert: fs.readFileSync(process.env.TLS_CERT), key: fs.readFileSync(process.env.TLS_KEY) } : null;
const server = (tls ? https.createServer.bind(https, tls) : http.createServer)((req, res) => {
  requests++;
  const u = new URL(req.url, "http://x");
  const p = u.pathname;
  if (p === "/id" && hold) {
    held.push(res);
  } else if (p === "/hold") {
    hold = u.searchParams.get("on") === "1";
    if (!hold) { for (const r of held) r.end(id); held = []; }
    res.end("hold " + hold);
  } else if (p === "/id") {
    res.setHeader("Content-Type", "text/plain");
    res.end(id);
  } else if (p === "/echo") {
    const parts = [];
    req.on("data", (d) => parts.push(d));
    req.on("end", () => {
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ id, method: req.method, url: req.url, headers: req.headers,
        rawHeaders: req.rawHeaders, body: Buffer.concat(parts).toString(),
        encrypted: !!req.socket.encrypted }));
    });
  } else if (p === "/hop") {
    res.writeHead(200, { "Content-Type": "text/plain", "Connection": "keep-alive, X-Secret",
      "X-Secret": "1", "Keep-Alive": "timeout=5", "Proxy-Connection": "keep-alive",
      "Trailer": "X-T", "X-Kept": "yes" });
    res.end("hop");
  } else if (p === "/die") {
    req.on("data", () => {});
    req.on("end", () => { die++; req.socket.destroy(); });
  } else if (p === "/hits") {
    res.end(JSON.stringify({ die, requests, health, healthy, conns, held: held.length }));
  } else if (p === "/health") {
    health++;
    if (!sick) healthy++;
    res.statusCode = sick ? 503 : 200;
    res.end(sick ? "sick" : "ok");
  } else if (p === "/sick") { sick = true; res.end("sick"); }
  else if (p === "/well") { sick = false; res.end("well"); }
  else if (p === "/upload") {
    const ms = Number(u.searchParams.get("ms") || 0);
    const every = Number(u.searchParams.get("every") || 1);
    let bytes = 0, reads = 0;
    const md5 = crypto.createHash("md5");
    req.on("data", (d) => {
      bytes += d.length;
      md5.update(d);
      if (ms && ++reads % every === 0) { req.pause(); setTimeout(() => req.resume(), ms); }
    });
    req.on("end", () => res.end(JSON.stringify({ bytes, md5: md5.digest("hex") })));
  } else if (p === "/download") {
    let left = Number(u.searchParams.get("bytes") || 0);
    const ms = Number(u.searchParams.get("ms") || 0);
    const every = Number(u.searchParams.get("every") || 1);
    let writes = 0;
    res.setHeader("Content-Type", "application/octet-stream");
    const step = () => {
      while (left > 0) {
        const n = Math.min(left, pattern.length);
        left -= n;
        const more = res.write(n === pattern.length ? pattern : pattern.subarray(0, n));
        if (left === 0) break;
        if (!more) { res.once("drain", ms ? () => setTimeout(step, ms) : step); return; }
        if (ms && ++writes % every === 0) { setTimeout(step, ms); return; }
      }
      res.end();
    };
    step();
  } else if (p === "/bighead") {
    res.setHeader("X-Big", "b".repeat(100000));
    res.end("big");
  } else if (p === "/slow") {
    setTimeout(() => res.end("slow"), Number(u.searchParams.get("ms") || 1000));
  } else {
    res.statusCode = 404;
    res.end("no such path\n");
  }
});
server.on(tls ? "secureConnection" : "connection", () => { conns++; });
server.keepAliveTimeout = 60000;
server.listen(Number(process.argv[3] || 0), process.env.BIND || "127.0.0.1", () => {
  console.log(JSON.stringify({ port: server.address().port, id }));
});
