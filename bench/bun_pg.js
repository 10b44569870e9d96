// scripts/bench-pg's Bun peer: bun bench/bun_pg.js PORT URL POOL (Bun.sql).
const [port, url, pool] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4])];
const sql = new Bun.SQL(url, { max: pool });
const rnd = () => 1 + Math.floor(Math.random() * 100000);
const one = async () => (await sql`SELECT id, n, name FROM bench_t WHERE id = ${rnd()}`)[0];
Bun.serve({
  port, hostname: "127.0.0.1",
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (path === "/one") return Response.json(await one());
    if (path === "/five") return Response.json(await Promise.all([one(), one(), one(), one(), one()]));
    if (path === "/insert") {
      const r = await sql`INSERT INTO bench_log (n, note) VALUES (${Math.floor(Math.random() * 1e6)}, 'bench') RETURNING id`;
      return Response.json(r[0]);
    }
    return new Response("no", { status: 404 });
  },
});
