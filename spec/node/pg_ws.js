// N WebSocket clients (npm ws) of moonport's pg_app.lua, each subscribed
// (from C) to the pub/sub channel LISTEN feeds. Prints {"ready":true} once
// every client has its "ready"; then counts the messages each receives
// until every one has seen "end", and prints {"clients":, "per":{payload:
// [min,max] copies per client}, "order_ok":} and {"done":true}.
// Usage: node pg_ws.js PORT N
const WebSocket = require("ws");
const [port, n] = [Number(process.argv[2]), Number(process.argv[3])];
let ready = 0, ended = 0, orderOk = true;
const counts = [];
const seen = [];
for (let i = 0; i < n; i++) {
  counts.push({});
  seen.push([]);
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
  ws.on("message", (data) => {
    const s = data.toString();
    if (s === "ready") {
      if (++ready === n) console.log(JSON.stringify({ ready: true }));
      return;
    }
    counts[i][s] = (counts[i][s] || 0) + 1;
    seen[i].push(s);
    if (s === "end" && ++ended === n) finish();
  });
  ws.on("error", (e) => console.log(JSON.stringify({ error: String(e) })));
}
function finish() {
  const per = {};
  for (const c of counts) {
    for (const k of Object.keys(c)) {
      const [lo, hi] = per[k] || [Infinity, 0];
      per[k] = [Math.min(lo, c[k]), Math.max(hi, c[k])];
    }
  }
  for (const list of seen) {
    const nums = list.filter((s) => s !== "end").map(Number);
    for (let j = 1; j < nums.length; j++) if (nums[j] < nums[j - 1]) orderOk = false;
  }
  console.log(JSON.stringify({ clients: n, per, order_ok: orderOk }));
  console.log(JSON.stringify({ done: true }));
  process.exit(0);
}
