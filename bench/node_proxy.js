// bench-proxy's Node row: every request fetches the upstream's body with
// http.get on a keep-alive Agent and returns it.
// Usage: node bench/node_proxy.js PORT UPSTREAM_PORT
const http = require("http");
const [port, upPort] = process.argv.slice(2).map(Number);
const agent = new http.Agent({ keepAlive: true, maxSockets: 128 });
http.createServer((req, res) => {
  http.get({ host: "127.0.0.1", port: upPort, path: "/", agent }, (up) => {
    const parts = [];
    up.on("data", (d) => parts.push(d));
    up.on("end", () => {
      res.writeHead(up.statusCode, { "Content-Type": "text/plain" });
      res.end(Buffer.concat(parts));
    });
  }).on("error", (e) => { res.statusCode = 502; res.end(String(e)); });
}).listen(port, "127.0.0.1");
