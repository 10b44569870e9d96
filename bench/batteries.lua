-- SPDX-License-Identifier: MIT
-- scripts/bench-batteries' moonport side: runs bench/batteries_ops.lua's
-- operations with mp.re, mp.crypto, mp.template and mp.jwt at the script's
-- top level and prints one line per operation: NAME OPS_PER_CPU_SECOND
-- CHECK. Usage: moonport bench/batteries.lua SECONDS OP...
local mp = require "moonport"
local dir = arg[0]:match("^(.*)/") or "."
local ops = dofile(dir .. "/batteries_ops.lua")
local seconds = tonumber(mp.args[1]) or 1

local page = mp.template.compile(ops.FORTUNES_TEMPLATE, "fortunes.html")
local secret = "bench-secret-0123456789abcdef0123"
local token = mp.jwt.sign({ sub = "user-1", iat = os.time(), exp = os.time() + 3600 }, secret)
local jopts = { algs = { "HS256" } }
local impl = {
  re_match = function(s, re) return mp.re.match(s, re, "jo") end,
  b64 = mp.crypto.base64.encode,
  hmac_sha1 = function(k, m) return mp.crypto.hmac("sha1", k, m) end,
  jwt_verify = function(t) return mp.jwt.verify(t, secret, jopts) end,
  jwt_token = token,
}
for i = 2, #mp.args do
  local name = mp.args[i]
  if name == "page_template" then
    impl.page = function(rows) return page({ rows = ops.sort_fortunes(rows) }) end
    name = "page"
  elseif name == "page_by_hand" then
    impl.page = ops.fortunes_by_hand
    name = "page"
  end
  local rate, check = ops.run(impl, name, seconds)
  print(("%s %.0f %.4f"):format(mp.args[i], rate, check))
end
io.stdout:flush()
os.exit(0)
