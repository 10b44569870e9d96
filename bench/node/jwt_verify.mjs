// scripts/bench-batteries' Node side: HS256 JWT verification, with the npm
// jose package (jwtVerify) and by hand over node:crypto (createHmac, a
// timing-safe compare, JSON.parse, the exp check), each for SECONDS of
// this process's CPU time. Prints "NAME OPS_PER_CPU_SECOND CHECK" lines.
// Usage: node jwt_verify.mjs JOSE_DIR SECONDS
import { createHmac, timingSafeEqual } from "node:crypto";
import { pathToFileURL } from "node:url";

const [joseDir, secondsArg] = process.argv.slice(2);
const seconds = Number(secondsArg) || 1;
const jose = await import(pathToFileURL(joseDir + "/dist/webapi/index.js").href);
const secret = "bench-secret-0123456789abcdef0123";
const key = new TextEncoder().encode(secret);
const now = Math.floor(Date.now() / 1000);
const token = await new jose.SignJWT({ sub: "user-1", iat: now, exp: now + 3600 })
  .setProtectedHeader({ alg: "HS256", typ: "JWT" }).sign(key);

function cpu() { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; }

function byHand(tok) {
  const [h, p, s] = tok.split(".");
  if (s === undefined) throw new Error("malformed");
  const header = JSON.parse(Buffer.from(h, "base64url").toString());
  if (header.alg !== "HS256") throw new Error("alg");
  const mac = createHmac("sha256", secret).update(h + "." + p).digest();
  const sig = Buffer.from(s, "base64url");
  if (sig.length !== mac.length || !timingSafeEqual(sig, mac)) throw new Error("bad signature");
  const claims = JSON.parse(Buffer.from(p, "base64url").toString());
  if (typeof claims.exp === "number" && Date.now() / 1000 >= claims.exp) throw new Error("expired");
  return claims;
}

async function timeIt(name, f, isAsync) {
  let n = 0, check = 0;
  const t0 = cpu();
  do {
    for (let i = 0; i < 1000; i++) {
      const c = isAsync ? await f(token) : f(token);
      check += c.sub.length;
    }
    n += 1000;
  } while (cpu() - t0 < seconds);
  console.log(`${name} ${Math.round(n / (cpu() - t0))} ${(check / n).toFixed(4)}`);
}

await timeIt("jwt_verify_jose", async (t) => (await jose.jwtVerify(t, key, { algorithms: ["HS256"] })).payload, true);
await timeIt("jwt_verify_hand", byHand, false);
