// bench-proxy's Node row: npm http-proxy (spec/node/node_modules) on a
// keep-alive Agent. Usage: node bench/node_http_proxy.js PORT UPSTREAM_PORT
const http = require("http");
const httpProxy = require("../spec/node/node_modules/http-proxy");
const [port, upPort] = process.argv.slice(2).map(Number);
const agent = new http.Agent({ keepAlive: true, maxSockets: 128 });
const proxy = httpProxy.createProxyServer({ target: `http://127.0.0.1:${upPort}`, agent });
proxy.on("error", (e, req, res) => { res.statusCode = 502; res.end(String(e)); });
http.createServer((req, res) => proxy.web(req, res)).listen(port, "127.0.0.1");
