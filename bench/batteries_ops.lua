-- SPDX-License-Identifier: MIT
-- The operations scripts/bench-batteries times, the same Lua for moonport
-- (bench/batteries.lua, with mp's functions) and for nginx + Lua (a
-- content_by_lua handler, with ngx's): ops.run(impl, name, seconds) runs
-- one operation in a loop until `seconds` of this process's CPU time
-- (os.clock) have passed and returns operations per CPU-second and a
-- check value (so no loop is optimised away, and both servers must agree).
local ops = {}

local clock = os.clock

-- 100 fortunes, "sorted, escaped and joined": the TechEmpower shape, with
-- characters that need escaping in some rows.
local function fortunes()
  local rows = {}
  for i = 1, 100 do
    rows[i] = { id = i, message = ("fortune %d: <b>%s</b> & \"%s\""):format(
      (i * 7919) % 1000, ("x"):rep(i % 17), i % 3 == 0 and "it's" or "ok") }
  end
  return rows
end
ops.fortunes = fortunes

local ESC = { ["<"] = "&lt;", [">"] = "&gt;", ["&"] = "&amp;", ['"'] = "&quot;", ["'"] = "&#39;" }
local function esc(s)
  s = tostring(s)
  if not s:find("[<>&\"']") then return s end
  return (s:gsub("[<>&\"']", ESC))
end

-- The page by hand: what a careful programmer writes without a template.
function ops.fortunes_by_hand(rows)
  local sorted = {}
  for i = 1, #rows do sorted[i] = rows[i] end
  table.sort(sorted, function(a, b) return a.message < b.message end)
  local b, n = { "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table>" ..
    "<tr><th>id</th><th>message</th></tr>" }, 1
  for i = 1, #sorted do
    local f = sorted[i]
    n = n + 1
    b[n] = "<tr><td>" .. esc(f.id) .. "</td><td>" .. esc(f.message) .. "</td></tr>"
  end
  n = n + 1
  b[n] = "</table></body></html>"
  return table.concat(b, "", 1, n)
end

ops.FORTUNES_TEMPLATE = "<!DOCTYPE html><html><head><title>Fortunes</title></head><body><table>" ..
  "<tr><th>id</th><th>message</th></tr>" ..
  "{% for _, f in ipairs(rows) do %}<tr><td>{{ f.id }}</td><td>{{ f.message }}</td></tr>{% end %}" ..
  "</table></body></html>"

function ops.sort_fortunes(rows)
  local sorted = {}
  for i = 1, #rows do sorted[i] = rows[i] end
  table.sort(sorted, function(a, b) return a.message < b.message end)
  return sorted
end

ops.RE_SUBJECT = "john_smith42@example.org"
ops.RE = [[^([a-z][a-z0-9_]{3,32})@(example\.(?:com|org|net))$]]
ops.B64_INPUT = ("moonport batteries "):rep(4):sub(1, 64)
ops.HMAC_KEY = "a secret key of some length"
ops.HMAC_MSG = ("GET /api/v1/items?page=2 1733000000 "):rep(3):sub(1, 100)

-- impl: { re_match(s, re) -> m, b64(s) -> s, hmac_sha1(k, m) -> raw,
--         page(rows) -> html (the template or by hand) }
function ops.run(impl, name, seconds)
  local n, check, t0 = 0, 0, clock()
  local step = 1000
  if name == "re_match" then
    local f, s, re = impl.re_match, ops.RE_SUBJECT, ops.RE
    repeat
      for _ = 1, step do
        local m = f(s, re)
        check = check + #m[1]
      end
      n = n + step
    until clock() - t0 >= seconds
  elseif name == "base64" then
    local f, s = impl.b64, ops.B64_INPUT
    repeat
      for _ = 1, step do check = check + #f(s) end
      n = n + step
    until clock() - t0 >= seconds
  elseif name == "hmac_sha1" then
    local f, k, msg = impl.hmac_sha1, ops.HMAC_KEY, ops.HMAC_MSG
    repeat
      for _ = 1, step do check = check + #f(k, msg) end
      n = n + step
    until clock() - t0 >= seconds
  elseif name == "page" then
    local f, rows = impl.page, fortunes()
    step = 10
    repeat
      for _ = 1, step do check = check + #f(rows) end
      n = n + step
    until clock() - t0 >= seconds
  elseif name == "jwt_verify" then
    local f, tok = impl.jwt_verify, impl.jwt_token
    repeat
      for _ = 1, step do check = check + #f(tok).sub end
      n = n + step
    until clock() - t0 >= seconds
  else
    error("unknown op " .. tostring(name))
  end
  return n / (clock() - t0), check / n
end

return ops
