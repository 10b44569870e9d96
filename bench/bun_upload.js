// Bun's side of scripts/bench-upload: await req.formData() (Bun parses the
// whole body in memory), then Bun.write of the file part to disk.
// usage: bun bench/bun_upload.js PORT DIR
const [port, dir] = [Number(process.argv[2]), process.argv[3]];
Bun.serve({
  port, hostname: '127.0.0.1', maxRequestBodySize: 2 ** 32,
  async fetch(req) {
    const form = await req.formData();
    let saved = 0;
    for (const [, v] of form) {
      if (typeof v !== 'string') saved += await Bun.write(`${dir}/bun.bin`, v);
    }
    return new Response(String(saved));
  },
});
