// bench-proxy's Bun row: Bun.serve passing each request through fetch()
// (Bun keeps upstream connections alive on its own).
// Usage: bun bench/bun_proxy.js PORT UPSTREAM_PORT
const [port, upPort] = process.argv.slice(2).map(Number);
Bun.serve({
  port, hostname: "127.0.0.1",
  fetch(req) {
    const u = new URL(req.url);
    return fetch(`http://127.0.0.1:${upPort}${u.pathname}${u.search}`, {
      method: req.method, headers: req.headers, body: req.body,
    });
  },
});
