// JWTs made and checked by the npm jose package (and node's crypto for
// what jose refuses to make), for spec/e2e/jwt_spec.lua.
//   node jwt_cases.mjs make          -> keys and tokens, one JSON line
//   node jwt_cases.mjs check FILE    -> verifies FILE's tokens (made by
//                                       mp.jwt) with jose, one JSON line
//   node jwt_cases.mjs hs HEX TOKEN  -> jose's jwtVerify of an HS256 token
//                                       under the secret HEX (iss
//                                       "batteries", aud "spec")
// The last line is {"done":true}.
import * as jose from "jose";
import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";

const now = Math.floor(Date.now() / 1000);
const b64u = (s) => Buffer.from(s).toString("base64url");

async function pair(alg, kid, opts) {
  const { publicKey, privateKey } = await jose.generateKeyPair(alg, { extractable: true, ...opts });
  const jwk = { ...(await jose.exportJWK(publicKey)), kid, alg, use: "sig" };
  return {
    kid, alg, publicKey, privateKey, jwk,
    pub: await jose.exportSPKI(publicKey),
    priv: await jose.exportPKCS8(privateKey),
  };
}

async function token(claims, key, header) {
  return new jose.SignJWT(claims).setProtectedHeader(header).sign(key);
}

async function make() {
  const secret = "a-secret-of-32-bytes-or-more-0123456789";
  const skey = new TextEncoder().encode(secret);
  const rsa = await pair("RS256", "r1", { modulusLength: 2048 });
  const ec = await pair("ES256", "e1");
  const ed = await pair("EdDSA", "d1", { crv: "Ed25519" });
  const base = { sub: "u1", aud: "app", iss: "me", iat: now, exp: now + 600 };
  const t = {};
  t.hs256 = await token(base, skey, { alg: "HS256", typ: "JWT" });
  t.hs384 = await token(base, skey, { alg: "HS384" });
  t.hs512 = await token(base, skey, { alg: "HS512" });
  t.rs256 = await token(base, rsa.privateKey, { alg: "RS256", kid: "r1" });
  t.es256 = await token(base, ec.privateKey, { alg: "ES256", kid: "e1" });
  t.eddsa = await token(base, ed.privateKey, { alg: "EdDSA", kid: "d1" });
  t.rs256_nokid = await token(base, rsa.privateKey, { alg: "RS256" });
  t.rs256_otherkid = await token(base, rsa.privateKey, { alg: "RS256", kid: "zz" });
  t.expired = await token({ ...base, exp: now - 3600 }, skey, { alg: "HS256" });
  t.expired_30s = await token({ ...base, exp: now - 30 }, skey, { alg: "HS256" });
  t.nbf_future = await token({ ...base, nbf: now + 3600 }, skey, { alg: "HS256" });
  t.iat_future = await token({ ...base, iat: now + 3600 }, skey, { alg: "HS256" });
  t.bad_exp = await token({ ...base, exp: "tomorrow" }, skey, { alg: "HS256" });
  t.aud_list = await token({ ...base, aud: ["x", "app"] }, skey, { alg: "HS256" });
  t.no_claims_time = await token({ sub: "u2" }, skey, { alg: "HS256" });
  t.none = new jose.UnsecuredJWT(base).encode();
  // jose refuses to make these two: node's crypto does.
  const input = (h) => b64u(JSON.stringify(h)) + "." + b64u(JSON.stringify(base));
  const ci = input({ alg: "HS256", typ: "JWT" });
  t.confusion = ci + "." + createHmac("sha256", rsa.pub).update(ci).digest("base64url");
  const ni = input({ alg: "none" });
  t.none_signed = ni + "." + createHmac("sha256", secret).update(ni).digest("base64url");
  const parts = t.hs256.split(".");
  t.tampered = parts[0] + "." + b64u(JSON.stringify({ ...base, sub: "admin" })) + "." + parts[2];
  t.wrong_secret = await token(base, new TextEncoder().encode("another secret"), { alg: "HS256" });
  const es = t.es256.split(".");
  const sig = Buffer.from(es[2], "base64url");
  sig[10] ^= 1;
  t.es256_flipped = es[0] + "." + es[1] + "." + sig.toString("base64url");
  console.log(JSON.stringify({
    now, secret, tokens: t,
    rsa: { pub: rsa.pub, priv: rsa.priv, jwk: rsa.jwk },
    ec: { pub: ec.pub, priv: ec.priv, jwk: ec.jwk },
    ed: { pub: ed.pub, priv: ed.priv, jwk: ed.jwk },
    jwks: { keys: [rsa.jwk, ec.jwk, ed.jwk] },
  }));
}

async function check(file) {
  const { secret, tokens, rsa, ec, ed } = JSON.parse(readFileSync(file, "utf8"));
  const keys = {
    HS256: new TextEncoder().encode(secret),
    RS256: await jose.importSPKI(rsa, "RS256"),
    ES256: await jose.importSPKI(ec, "ES256"),
    EdDSA: await jose.importSPKI(ed, "EdDSA"),
  };
  const out = {};
  for (const [alg, tok] of Object.entries(tokens)) {
    try {
      const { payload, protectedHeader } = await jose.jwtVerify(tok, keys[alg], { algorithms: [alg] });
      out[alg] = { ok: true, sub: payload.sub, kid: protectedHeader.kid ?? null };
    } catch (e) {
      out[alg] = { ok: false, err: String(e.code || e) };
    }
  }
  console.log(JSON.stringify(out));
}

async function hs(hex, tok) {
  try {
    const { payload } = await jose.jwtVerify(tok, Buffer.from(hex, "hex"),
      { algorithms: ["HS256"], issuer: "batteries", audience: "spec" });
    console.log(JSON.stringify({ ok: true, payload }));
  } catch (e) {
    console.log(JSON.stringify({ ok: false, err: String(e.code || e) }));
  }
}

const [mode, a, b] = process.argv.slice(2);
await (mode === "make" ? make() : mode === "hs" ? hs(a, b) : check(a));
console.log(JSON.stringify({ done: true }));
