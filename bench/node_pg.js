// scripts/bench-pg's Node peers: node bench/node_pg.js PORT URL POOL CLIENT
// CLIENT: "postgres" (npm postgres) or "pg" (npm pg's Pool). The endpoints
// of bench/pg.lua.
const http = require("http");
const [port, url, pool, client] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4]), process.argv[5]];
const rnd = () => 1 + Math.floor(Math.random() * 100000);
let one, insert;
if (client === "postgres") {
  const sql = require("postgres")(url, { max: pool });
  one = async () => (await sql`SELECT id, n, name FROM bench_t WHERE id = ${rnd()}`)[0];
  insert = async () => (await sql`INSERT INTO bench_log (n, note) VALUES (${Math.floor(Math.random() * 1e6)}, 'bench') RETURNING id`)[0];
} else {
  const { Pool } = require("pg");
  const p = new Pool({ connectionString: url, max: pool });
  one = async () => (await p.query({ name: "one", text: "SELECT id, n, name FROM bench_t WHERE id = $1", values: [rnd()] })).rows[0];
  insert = async () => (await p.query({ name: "ins", text: "INSERT INTO bench_log (n, note) VALUES ($1, 'bench') RETURNING id", values: [Math.floor(Math.random() * 1e6)] })).rows[0];
}
http.createServer(async (req, res) => {
  try {
    let body;
    if (req.url === "/one") body = await one();
    else if (req.url === "/five") body = await Promise.all([one(), one(), one(), one(), one()]);
    else if (req.url === "/insert") body = await insert();
    else { res.writeHead(404); return res.end("no"); }
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify(body));
  } catch (e) {
    res.writeHead(500);
    res.end(String(e));
  }
}).listen(port, "127.0.0.1");
