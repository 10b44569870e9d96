-- SPDX-License-Identifier: MIT
-- Cookies (RFC 6265): `parse` reads a request's Cookie header into
-- req.cookies (lua/moonport/request.lua makes it on first use), `set` is
-- res:cookie (lua/moonport/http.lua adds it to the response's methods).
-- Values are kept as sent: encoding one (base64url, %-escapes) is the
-- caller's choice, and `set` refuses what a header can't carry.
local type, error, tostring, pairs, floor = type, error, tostring, pairs, math.floor
local find, sub, byte, lower, format = string.find, string.sub, string.byte, string.lower, string.format
local os_date = os.date

local M = {}

-- a token (RFC 9110 5.6.2): the characters of a cookie name
local TOKEN = "^[!#$%%&'*+%-.^_`|~%w]+$"
-- cookie-octets (RFC 6265 4.1.1): no CTL, space, DQUOTE, comma, ; or \
local BAD_OCTET = "[%c %\",;\\\128-\255]"

-- parse(header): { name = value } of a Cookie header. A name seen twice
-- keeps its first value (the most specific path comes first, RFC 6265
-- 5.4); a pair without "=" or with a bad name or value is skipped.
function M.parse(header)
  local out = {}
  if type(header) ~= "string" then return out end
  local pos, n = 1, #header
  while pos <= n do
    local semi = find(header, ";", pos, true) or n + 1
    local pair = sub(header, pos, semi - 1)
    pos = semi + 1
    local eq = find(pair, "=", 1, true)
    if eq then
      local name = pair:sub(1, eq - 1):match("^[ \t]*(.-)[ \t]*$")
      local value = pair:sub(eq + 1):match("^[ \t]*(.-)[ \t]*$")
      if #value >= 2 and byte(value, 1) == 34 and byte(value, -1) == 34 then
        value = sub(value, 2, -2)
      end
      if out[name] == nil and find(name, TOKEN) and not find(value, BAD_OCTET) then
        out[name] = value
      end
    end
  end
  return out
end

local SAME_SITE = { strict = "Strict", lax = "Lax", none = "None" }

-- an attribute value (Path, Domain): no CTL and no ";"
local function attr(name, v)
  if type(v) ~= "string" or v == "" or find(v, "[%c;]") then
    error("res:cookie: " .. name .. " must be a non-empty string without ';' " ..
      "or control characters (got " .. tostring(v) .. ")", 4)
  end
  return v
end

local KNOWN = { max_age = true, expires = true, path = true, domain = true, secure = true,
  http_only = true, same_site = true, partitioned = true }

-- header(name, value, opts): the Set-Cookie value; raises (at the caller
-- of res:cookie) for what a header can't carry or a browser would drop.
function M.header(name, value, opts)
  if type(name) ~= "string" or not find(name, TOKEN) then
    error("res:cookie: the name must be a token (letters, digits, !#$%&'*+-.^_`|~; got " ..
      tostring(name) .. ")", 3)
  end
  if type(value) == "number" then value = tostring(value) end
  if type(value) ~= "string" or find(value, BAD_OCTET) then
    error("res:cookie: the value of " .. name .. " can't hold control characters, " ..
      "spaces, '\"', ',', ';' or '\\' (encode it first)", 3)
  end
  local s = name .. "=" .. value
  opts = opts or {}
  if type(opts) ~= "table" then
    error("res:cookie: options must be a table (got " .. type(opts) .. ")", 3)
  end
  for k in pairs(opts) do
    if not KNOWN[k] then error("res:cookie: unknown option " .. tostring(k), 3) end
  end
  local path = opts.path
  if path == nil then path = "/" end
  if path ~= false then s = s .. "; Path=" .. attr("path", path) end
  if opts.domain ~= nil then s = s .. "; Domain=" .. attr("domain", opts.domain) end
  local ma = opts.max_age
  if ma ~= nil then
    if type(ma) ~= "number" or ma ~= floor(ma) then
      error("res:cookie: max_age must be a whole number of seconds (got " .. tostring(ma) .. ")", 3)
    end
    s = s .. format("; Max-Age=%d", ma)
  end
  local ex = opts.expires
  if ex ~= nil then
    if type(ex) ~= "number" then
      error("res:cookie: expires must be a time in seconds since the epoch (got " ..
        tostring(ex) .. ")", 3)
    end
    s = s .. "; Expires=" .. os_date("!%a, %d %b %Y %H:%M:%S GMT", floor(ex))
  end
  local ss = opts.same_site
  if ss ~= nil then
    ss = type(ss) == "string" and SAME_SITE[lower(ss)]
    if not ss then
      error("res:cookie: same_site must be \"Strict\", \"Lax\" or \"None\" (got " ..
        tostring(opts.same_site) .. ")", 3)
    end
    if ss == "None" and not opts.secure then
      error("res:cookie: same_site = \"None\" needs secure = true (browsers drop it otherwise)", 3)
    end
  end
  if opts.partitioned and not opts.secure then
    error("res:cookie: partitioned needs secure = true", 3)
  end
  if opts.secure then s = s .. "; Secure" end
  if opts.http_only then s = s .. "; HttpOnly" end
  if ss then s = s .. "; SameSite=" .. ss end
  if opts.partitioned then s = s .. "; Partitioned" end
  return s
end

-- res:cookie(name, value [, opts]): adds a Set-Cookie header (one per
-- call, so one response may set several); returns res.
function M.set(res, name, value, opts)
  return res:header("Set-Cookie", M.header(name, value, opts))
end

return M
