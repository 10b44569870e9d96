-- SPDX-License-Identifier: MIT
-- scripts/bench-batteries' cost table: what one call of each mp.crypto,
-- mp.re, mp.template and mp.jwt function costs, in ns of CPU time per
-- call (os.clock over a loop of at least SECONDS), at a script's top
-- level. Usage: moonport bench/batteries_costs.lua SECONDS
local mp = require "moonport"
local C, R, J = mp.crypto, mp.re, mp.jwt
local seconds = tonumber(mp.args[1]) or 0.5
local dir = arg[0]:match("^(.*)/") or "."
local ops = dofile(dir .. "/batteries_ops.lua")

local function cost(label, f)
  local n, t0, sink = 0, os.clock(), 0
  repeat
    for _ = 1, 100 do local v = f() sink = sink + (type(v) == "string" and #v or 1) end
    n = n + 100
  until os.clock() - t0 >= seconds
  print(("| `%s` | %.0f |"):format(label, (os.clock() - t0) / n * 1e9))
  return sink
end

local s64, s1k = ("x"):rep(64), ("x"):rep(1024)
local key = C.random(32)
local box = C.seal(key, s1k)
local b64 = C.base64.encode(s1k)
local secret = "bench-secret-0123456789abcdef0123"
local now = os.time()
local claims = { sub = "user-1", iat = now, exp = now + 3600 }
local hs = J.sign(claims, secret)
local function keypair(kind)
  local p = io.popen("openssl genpkey -algorithm " .. kind .. " 2>/dev/null")
  local priv = p:read("*a") p:close()
  local tmp = os.tmpname()
  local f = io.open(tmp, "w") f:write(priv) f:close()
  p = io.popen("openssl pkey -in " .. tmp .. " -pubout 2>/dev/null")
  local pub = p:read("*a") p:close()
  os.remove(tmp)
  return priv, pub
end
local rsa_priv, rsa_pub = keypair("RSA -pkeyopt rsa_keygen_bits:2048")
local ec_priv, ec_pub = keypair("EC -pkeyopt ec_paramgen_curve:P-256")
local ed_priv, ed_pub = keypair("ED25519")
local rs = J.sign(claims, rsa_priv, { alg = "RS256" })
local es = J.sign(claims, ec_priv, { alg = "ES256" })
local ed = J.sign(claims, ed_priv, { alg = "EdDSA" })
local page = mp.template.compile(ops.FORTUNES_TEMPLATE)
local rows = ops.sort_fortunes(ops.fortunes())
local text = ("lorem ipsum dolor sit amet #tag "):rep(32) -- 1 KiB

print("| call | ns per call |")
print("| --- | --- |")
cost('sha256(64 B, "hex")', function() return C.sha256(s64, "hex") end)
cost("sha256(1 KiB)", function() return C.sha256(s1k) end)
cost("sha1(64 B)", function() return C.sha1(s64) end)
cost('hmac("sha256", k, 64 B)', function() return C.hmac("sha256", secret, s64) end)
cost('hmac("sha1", k, 1 KiB)', function() return C.hmac("sha1", secret, s1k) end)
cost("random(16)", function() return C.random(16) end)
cost("uuid()", function() return C.uuid() end)
cost("uuid(7)", function() return C.uuid(7) end)
cost("equal(64 B, 64 B)", function() return C.equal(s64, s64) end)
cost("base64.encode(1 KiB)", function() return C.base64.encode(s1k) end)
cost("base64.decode(1 KiB of data)", function() return C.base64.decode(b64) end)
cost("hex.encode(64 B)", function() return C.hex.encode(s64) end)
cost("seal(k, 1 KiB)", function() return C.seal(key, s1k) end)
cost("open(k, 1 KiB)", function() return C.open(key, box) end)
cost("pbkdf2(p, s, 10000, 32)", function() return C.pbkdf2("pw", "salt", 10000, 32) end)
cost("scrypt(p, s) (N=16384, r=8)", function() return C.scrypt("pw", "salt") end)
cost("re.match(24 B, the bench pattern)", function() return R.match(ops.RE_SUBJECT, ops.RE) end)
cost("re.find(1 KiB, [[#(\\w+)]])", function() return R.find(text, [[#(\w+)]]) end)
cost("re.gsub(1 KiB, [[#(\\w+)]], \"<$1>\") (32 matches)", function() return R.gsub(text, [[#(\w+)]], "<$1>") end)
cost("re.split(1 KiB, \" \")", function() return #R.split(text, " ") end)
cost("template: the 100-row fortunes page", function() return page({ rows = rows }) end)
cost("jwt.sign HS256", function() return J.sign(claims, secret) end)
cost("jwt.verify HS256", function() return J.verify(hs, secret, { algs = { "HS256" } }).sub end)
cost("jwt.verify RS256 (2048)", function() return J.verify(rs, rsa_pub, { algs = { "RS256" } }).sub end)
cost("jwt.verify ES256", function() return J.verify(es, ec_pub, { algs = { "ES256" } }).sub end)
cost("jwt.verify EdDSA", function() return J.verify(ed, ed_pub, { algs = { "EdDSA" } }).sub end)
cost("jwt.sign RS256 (2048)", function() return J.sign(claims, rsa_priv, { alg = "RS256" }) end)
cost("jwt.sign ES256", function() return J.sign(claims, ec_priv, { alg = "ES256" }) end)
io.stdout:flush()
os.exit(0)
