// The Node `http` upstream of spec/e2e/tcp_http_spec.lua (keep-alive on):
//   /hello    -> "hello from node" (Content-Length)
//   /chunked  -> "abc" in three chunks (Transfer-Encoding: chunked)
//   /conns    -> the number of TCP connections it accepted so far
// Prints {"port": N} once it listens on 127.0.0.1 (a port the kernel picks).
const http = require("http");

let conns = 0;
const server = http.createServer((req, res) => {
  if (req.url === "/hello") {
    res.setHeader("Content-Type", "text/plain");
    res.end("hello from node");
  } else if (req.url === "/chunked") {
    res.write("a");
    setTimeout(() => { res.write("b"); setTimeout(() => res.end("c"), 20); }, 20);
  } else if (req.url === "/conns") {
    res.end(String(conns));
  } else {
    res.statusCode = 404;
    res.end("no");
  }
});
server.keepAliveTimeout = 30000;
server.on("connection", () => { conns += 1; });
server.listen(0, "127.0.0.1", () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
