'use strict';
// What the case scripts of spec/node/ share (ws_cases.js, sse_cases.js),
// each run as
//   node X_cases.js PORT CASE [ARGS...]
// printing JSON lines (one object each) and ending with {"done":true}; a
// client-side failure prints {"error": "..."} and exits 1.

const port = Number(process.argv[2]);
const which = process.argv[3];
const args = process.argv.slice(4);

const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
// Deadlines stretch for sanitizer builds of the server (spec/js.lua sets it).
const SCALE = Number(process.env.SPEC_SCALE || 1);

// `promise`, or a rejection after ms (stretched by SCALE).
function withTimeout(promise, ms, what) {
  ms *= SCALE;
  let t;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      t = setTimeout(() => reject(new Error(`timeout after ${ms} ms: ${what}`)), ms);
    }),
  ]).finally(() => clearTimeout(t));
}

// GET http://127.0.0.1:PORT<path>: { status, body }.
async function get(path) {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: r.status, body: await r.text() };
}

// Runs cases[CASE], then prints {"done":true} and exits 0.
function run(cases) {
  (async () => {
    const fn = cases[which];
    if (!fn) throw new Error(`no case ${which}`);
    await fn();
    out({ done: true });
    process.exit(0);
  })().catch((e) => {
    out({ error: e.message });
    process.exit(1);
  });
}

module.exports = { port, which, args, out, SCALE, withTimeout, get, run };
