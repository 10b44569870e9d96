// The Node `http` upstream of spec/e2e/tcp_http_spec.lua and
// spec/e2e/fetch_spec.lua (keep-alive on):
//   /hello    -> "hello from node" (Content-Length)
//   /chunked  -> "abc" in three chunks (Transfer-Encoding: chunked)
//   /conns    -> the number of TCP connections it accepted so far
//   /echo     -> JSON { method, url, headers, body } of the request
//   /close    -> a close-delimited body (no length, then the close)
//   /s204, /s304, /head (HEAD: a length, no body), /interim (a 100 first)
//   /multi    -> two X-Multi fields
//   /connclose -> "bye" with Connection: close
//   /r301 /r302 /r303 /r307 /r308 -> redirects (relative, absolute, ...)
//   /loop     -> a redirect to itself
//   /away     -> a 302 to /echo?from=away at localhost (another origin)
//   /slow?ms=N -> "slow" after N ms
//   /bighdr   -> a 100 KB header field
//   /lying    -> Content-Length: 100, then 5 bytes and the close
//   /forever  -> a chunked body that never ends
//   /reset    -> half a body, then a TCP reset
//   /lf       -> a head whose lines end in a bare LF (one in CRLF)
//   /lfchunked -> a 100 and a chunked answer, bare LF throughout
//   /lfbig    -> 1,000 fields of a bare-LF head (past max_header)
//   /arm      -> "armed"; the next request on that connection gets no
//                answer, its connection is closed (a dead pooled one)
// Prints {"port": N} once it listens on 127.0.0.1 (a port the kernel picks).
const http = require("http");

let conns = 0;
let port = 0;
function raw(req, bytes, then) {
  const sock = req.socket;
  sock.write(bytes, () => { if (then) then(sock); else sock.end(); });
}
const server = http.createServer((req, res) => {
  if (req.socket.armed) { req.socket.destroy(); return; }
  const u = new URL(req.url, "http://x");
  const p = u.pathname;
  if (p === "/hello") {
    res.setHeader("Content-Type", "text/plain");
    res.end("hello from node");
  } else if (p === "/chunked") {
    res.write("a");
    setTimeout(() => { res.write("b"); setTimeout(() => res.end("c"), 20); }, 20);
  } else if (p === "/conns") {
    res.end(String(conns));
  } else if (p === "/echo") {
    let body = "";
    req.on("data", (d) => { body += d; });
    req.on("end", () => {
      res.setHeader("Content-Type", "application/json");
      res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, body }));
    });
  } else if (p === "/close") {
    raw(req, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close");
  } else if (p === "/s204") {
    res.statusCode = 204; res.end();
  } else if (p === "/s304") {
    res.statusCode = 304; res.setHeader("ETag", "\"v1\""); res.end();
  } else if (p === "/head") {
    res.setHeader("Content-Length", "11");
    res.end(req.method === "HEAD" ? undefined : "hello world");
  } else if (p === "/interim") {
    raw(req, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal");
  } else if (p === "/multi") {
    res.setHeader("X-Multi", ["one", "two"]);
    res.end("m");
  } else if (p === "/connclose") {
    res.setHeader("Connection", "close");
    res.end("bye");
  } else if (/^\/r30[12378]$/.test(p)) {
    const code = Number(p.slice(2));
    const to = { 301: "/hello", 302: `http://127.0.0.1:${port}/echo?from=302`,
                 303: "echo?from=303", 307: "/echo?from=307", 308: "./echo?from=308" }[code];
    req.resume();
    req.on("end", () => { res.statusCode = code; res.setHeader("Location", to); res.end("moved"); });
  } else if (p === "/away") {
    res.statusCode = 302; res.setHeader("Location", `http://localhost:${port}/echo?from=away`); res.end();
  } else if (p === "/loop") {
    res.statusCode = 302; res.setHeader("Location", "/loop"); res.end();
  } else if (p === "/slow") {
    setTimeout(() => res.end("slow"), Number(u.searchParams.get("ms") || 1000));
  } else if (p === "/bighdr") {
    raw(req, "HTTP/1.1 200 OK\r\nX-Big: " + "x".repeat(100 * 1024) + "\r\nContent-Length: 2\r\n\r\nok");
  } else if (p === "/lying") {
    raw(req, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
  } else if (p === "/forever") {
    const piece = "z".repeat(16 * 1024);
    const t = setInterval(() => { if (!res.write(piece)) { /* keep on anyway */ } }, 1);
    res.on("close", () => clearInterval(t));
  } else if (p === "/reset") {
    raw(req, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nhalf", (sock) => {
      setTimeout(() => sock.resetAndDestroy(), 30);
    });
  } else if (p === "/lf") {
    raw(req, "HTTP/1.1 200 OK\nContent-Type: text/plain\nX-Mixed: crlf\r\nContent-Length: 7\n\nbare lf");
  } else if (p === "/lfchunked") {
    raw(req, "HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n" +
             "3\nabc\n2\r\nde\n0\nX-Trailer: t\n\n");
  } else if (p === "/lfbig") {
    raw(req, "HTTP/1.1 200 OK\n" + ("X-Many: " + "y".repeat(100) + "\n").repeat(1000) +
             "Content-Length: 2\n\nok");
  } else if (p === "/arm") {
    req.socket.armed = true;
    res.end("armed");
  } else {
    res.statusCode = 404;
    res.end("no");
  }
});
server.keepAliveTimeout = 30000;
server.on("connection", () => { conns += 1; });
server.listen(0, "127.0.0.1", () => {
  port = server.address().port;
  console.log(JSON.stringify({ port }));
});
