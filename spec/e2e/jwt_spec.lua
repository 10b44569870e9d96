-- Spec: mp.jwt against tokens and keys the npm jose package makes in this
-- run (spec/node/jwt_cases.mjs): HS256/384/512, RS256, ES256 and EdDSA
-- from PEM and from a JWKS; alg none, algorithm confusion (an RS256 public
-- key as the HS256 secret), tampering, expiry and not-before with and
-- without leeway, audience and issuer; then tokens mp.jwt signs, checked
-- by jose; then misuse.
local H = require "spec.helper"
local JS = require "spec.js"
local cjson = require "cjson"
local run = require("spec.batteries").run

describe("mp.jwt", function()
  local made
  setup(function()
    if H.exists(JS.node) then made = JS.run("jwt_cases.mjs", { "make" }, 60)[1] end
  end)
  after_each(H.cleanup)

  local function verify_all(cases)
    local dir = H.tmpdir()
    H.write_file(dir .. "/made.json", cjson.encode(made))
    H.write_file(dir .. "/cases.json", cjson.encode(cases))
    return run([=[
      local dir = arg[0]:match("^(.*)/")
      local function read(n) local f = assert(io.open(n)) local s = f:read("*a") f:close() return s end
      local made = cjson.decode(read("]=] .. dir .. [=[/made.json"))
      local cases = cjson.decode(read("]=] .. dir .. [=[/cases.json"))
      local K = { secret = made.secret, rsa_pub = made.rsa.pub, ec_pub = made.ec.pub,
                  ed_pub = made.ed.pub, jwks = made.jwks, jwks_json = cjson.encode(made.jwks),
                  all = { made.secret, made.rsa.pub, made.ec.pub, made.ed.pub } }
      local out = {}
      for i, c in ipairs(cases) do
        local opts = { algs = c.algs, aud = c.aud, iss = c.iss, leeway = c.leeway }
        local claims, err = mp.jwt.verify(made.tokens[c.token], K[c.keys], opts)
        out[i] = claims and ("ok " .. tostring(claims.sub)) or err
      end
      return out]=])
  end

  it("accepts what jose signed, with each algorithm and key form", function()
    if not made then pending("no node") return end
    local cases = {
      { token = "hs256", keys = "secret", algs = { "HS256" }, aud = "app", iss = "me" },
      { token = "hs384", keys = "secret", algs = { "HS384" } },
      { token = "hs512", keys = "secret", algs = { "HS512", "HS256" } },
      { token = "rs256", keys = "rsa_pub", algs = { "RS256" } },
      { token = "es256", keys = "ec_pub", algs = { "ES256" } },
      { token = "eddsa", keys = "ed_pub", algs = { "EdDSA" } },
      { token = "rs256", keys = "jwks", algs = { "RS256", "ES256", "EdDSA" } },
      { token = "es256", keys = "jwks", algs = { "RS256", "ES256", "EdDSA" } },
      { token = "eddsa", keys = "jwks_json", algs = { "EdDSA" } },
      { token = "rs256_nokid", keys = "jwks", algs = { "RS256" } },
      { token = "es256", keys = "all", algs = { "HS256", "ES256" } },
      { token = "aud_list", keys = "secret", algs = { "HS256" }, aud = { "app", "other" } },
      { token = "no_claims_time", keys = "secret", algs = { "HS256" } },
      { token = "expired_30s", keys = "secret", algs = { "HS256" }, leeway = 60 },
    }
    local r = verify_all(cases)
    for i, c in ipairs(cases) do
      assert.equal(c.token == "no_claims_time" and "ok u2" or "ok u1", r[i], c.token .. " with " .. c.keys)
    end
  end)

  it("refuses alg none, algorithm confusion, tampering, and bad claims", function()
    if not made then pending("no node") return end
    local cases = {
      { token = "none", keys = "secret", algs = { "HS256" }, want = "alg none refused" },
      { token = "none_signed", keys = "secret", algs = { "HS256" }, want = "alg none refused" },
      -- the RS256 public key offered as an HS256 secret is never one
      { token = "confusion", keys = "rsa_pub", algs = { "RS256", "HS256" }, want = "no key for HS256" },
      { token = "confusion", keys = "jwks", algs = { "HS256" }, want = "no key for HS256" },
      { token = "confusion", keys = "rsa_pub", algs = { "RS256" }, want = "algorithm not allowed: HS256" },
      { token = "tampered", keys = "secret", algs = { "HS256" }, want = "bad signature" },
      { token = "wrong_secret", keys = "secret", algs = { "HS256" }, want = "bad signature" },
      { token = "es256_flipped", keys = "ec_pub", algs = { "ES256" }, want = "bad signature" },
      { token = "rs256", keys = "ec_pub", algs = { "RS256" }, want = "no RS256 key with kid r1" },
      { token = "rs256_nokid", keys = "ed_pub", algs = { "RS256" }, want = "no key for RS256" },
      { token = "rs256_otherkid", keys = "jwks", algs = { "RS256" }, want = "no RS256 key with kid zz" },
      { token = "hs512", keys = "secret", algs = { "HS256" }, want = "algorithm not allowed: HS512" },
      { token = "expired", keys = "secret", algs = { "HS256" }, want = "expired" },
      { token = "expired_30s", keys = "secret", algs = { "HS256" }, want = "expired" },
      { token = "expired_30s", keys = "secret", algs = { "HS256" }, leeway = 10, want = "expired" },
      { token = "nbf_future", keys = "secret", algs = { "HS256" }, want = "not yet valid" },
      { token = "iat_future", keys = "secret", algs = { "HS256" }, want = "issued in the future" },
      { token = "bad_exp", keys = "secret", algs = { "HS256" }, want = "bad exp claim" },
      { token = "hs256", keys = "secret", algs = { "HS256" }, aud = "other", want = "wrong audience" },
      { token = "aud_list", keys = "secret", algs = { "HS256" }, aud = "nope", want = "wrong audience" },
      { token = "no_claims_time", keys = "secret", algs = { "HS256" }, aud = "app", want = "wrong audience" },
      { token = "hs256", keys = "secret", algs = { "HS256" }, iss = "them", want = "wrong issuer" },
    }
    local r = verify_all(cases)
    for i, c in ipairs(cases) do
      assert.equal(c.want, r[i], c.token .. " with " .. c.keys)
    end
  end)

  it("signs tokens jose verifies, from PEM private keys", function()
    if not made then pending("no node") return end
    local dir = H.tmpdir()
    H.write_file(dir .. "/made.json", cjson.encode(made))
    local r = run([=[
      local f = assert(io.open("]=] .. dir .. [=[/made.json")) local made = cjson.decode(f:read("*a")) f:close()
      local J, now = mp.jwt, os.time()
      local claims = { sub = "from-moonport", iat = now, exp = now + 60 }
      local t = {
        HS256 = J.sign(claims, made.secret),
        RS256 = J.sign(claims, made.rsa.priv, { alg = "RS256", kid = "r1" }),
        ES256 = J.sign(claims, made.ec.priv, { alg = "ES256" }),
        EdDSA = J.sign(claims, J.key(made.ed.priv), { alg = "EdDSA" }),
      }
      -- and back through mp.jwt itself
      local back = {}
      for alg, tok in pairs(t) do
        local keys = alg == "HS256" and made.secret or made[alg == "RS256" and "rsa" or alg == "ES256" and "ec" or "ed"].pub
        local c, err = J.verify(tok, keys, { algs = { alg } })
        back[alg] = c and c.sub or err
      end
      return { tokens = t, back = back, secret = made.secret, rsa = made.rsa.pub,
               ec = made.ec.pub, ed = made.ed.pub }]=])
    for _, alg in ipairs({ "HS256", "RS256", "ES256", "EdDSA" }) do
      assert.equal("from-moonport", r.back[alg], alg)
    end
    H.write_file(dir .. "/signed.json", cjson.encode(r))
    local out = JS.run("jwt_cases.mjs", { "check", dir .. "/signed.json" }, 60)[1]
    for _, alg in ipairs({ "HS256", "RS256", "ES256", "EdDSA" }) do
      assert.is_true(out[alg].ok, alg .. ": " .. tostring(out[alg].err))
      assert.equal("from-moonport", out[alg].sub)
    end
    assert.equal("r1", out.RS256.kid)
  end)

  it("raises on misuse and returns nil, err for junk", function()
    local r = run([=[
      local J, out = mp.jwt, {}
      local function try(f) local ok, err = pcall(f) out[#out + 1] = tostring(err) end
      try(function() local _ = J.verify("a.b.c", "k") end)
      try(function() local _ = J.verify("a.b.c", "k", { algs = {} }) end)
      try(function() local _ = J.verify("a.b.c", "k", { algs = { "none" } }) end)
      try(function() local _ = J.verify("a.b.c", "k", { algs = { "HS257" } }) end)
      try(function() local _ = J.verify("a.b.c", nil, { algs = { "HS256" } }) end)
      try(function() local _ = J.verify("a.b.c", "", { algs = { "HS256" } }) end)
      try(function() local _ = J.verify("a.b.c", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", { algs = { "RS256" } }) end)
      try(function() local _ = J.sign({}, "k", { alg = "none" }) end)
      try(function() local _ = J.sign({}, "k", { alg = "RS256" }) end)
      try(function() local _ = J.sign("x", "k") end)
      local junk = {}
      local o = { algs = { "HS256" } }
      for _, t in ipairs({ "", "a", "a.b", "a.b.c.d", "!!.b.c", "e30.e30.", string.rep("a", 70000),
                           mp.crypto.base64.encode_url('{"alg":"HS256"}') .. ".!!." .. "x" }) do
        local c, err = J.verify(t, "k", o)
        junk[#junk + 1] = tostring(c) .. " " .. tostring(err)
      end
      local tok = J.sign({ sub = "s" }, "k")
      local c, h = J.decode(tok)
      local _, vh = J.verify(tok, "k", o)
      vh.alg = "none" -- the caller's copy: the next verify is unaffected
      local again = J.verify(tok, "k", o)
      return { out = out, junk = junk, decoded = { c.sub, h.alg, h.typ }, again = again and again.sub }]=])
    local want = { "opts.algs must list", "opts.algs must list", "unknown algorithm 'none'",
                   "unknown algorithm 'HS257'", "keys must be", "an empty secret", "not a usable key",
                   "alg must be", "needs its kind of private key", "claims table expected" }
    for i, w in ipairs(want) do
      assert.truthy(H.plain(r.out[i], w), r.out[i])
      assert.truthy(r.out[i]:match("t%.lua:%d+:"), "names the script's line: " .. r.out[i])
    end
    for _, j in ipairs(r.junk) do
      assert.truthy(j:match("^nil "), j)
      assert.is_falsy(j:match(" nil$"), j)
    end
    assert.same({ "s", "HS256", "JWT" }, r.decoded)
    assert.equal("s", r.again)
  end)
end)
