-- SPDX-License-Identifier: MIT
-- Which addresses a client may connect to: the `deny` list and `allow`
-- function of mp.tcp, mp.fetch (every redirect hop), checked on the
-- address a connect goes to after the lookup, not on the name (so a name
-- that resolves to a denied address is refused, and the address checked
-- is the one connected: no second lookup to rebind). Pure Lua:
-- spec/lua/addrfilter_spec.lua tests it.
--
--   local f = addrfilter.new({ "loopback", "private", "10.1.0.0/16" }, fn)
--   local ok, why = f("127.0.0.1")   --> false, "loopback"
--
-- Names: "loopback" (127.0.0.0/8, ::1), "private" (10/8, 172.16/12,
-- 192.168/16, fc00::/7, 100.64/10 carrier-grade NAT), "link-local"
-- (169.254/16, fe80::/10: cloud metadata services live there),
-- "unspecified" (0.0.0.0/8, ::), "multicast" (224/4, ff00::/8); or a CIDR
-- ("192.0.2.0/24", "2001:db8::/32") or one address. An IPv4-mapped IPv6
-- address (::ffff:127.0.0.1) is checked as the IPv4 one.
local M = {}

local tonumber, type, ipairs, floor = tonumber, type, ipairs, math.floor
local find, sub, match, lower = string.find, string.sub, string.match, string.lower

-- An address as 16 bytes (IPv4 as ::ffff:a.b.c.d) and whether it was v4;
-- nil when it is not one.
-- The dotted quad's four bytes (each 0-255, no leading zero: inet_pton's
-- form), or nil.
local function v4bytes(s)
  local parts = { match(s, "^(%d+)%.(%d+)%.(%d+)%.(%d+)$") }
  if #parts ~= 4 then return nil end
  for i, p in ipairs(parts) do
    local v = tonumber(p)
    if v > 255 or (#p > 1 and sub(p, 1, 1) == "0") then return nil end
    parts[i] = v
  end
  return parts
end

local function parse(s)
  if type(s) ~= "string" then return nil end
  local v4 = v4bytes(s)
  if v4 then
    return { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, v4[1], v4[2], v4[3], v4[4] }, true
  end
  if not find(s, ":", 1, true) then return nil end
  s = lower(s)
  -- an embedded dotted quad at the end (::ffff:1.2.3.4)
  local tail = {}
  local head, quad = match(s, "^(.*:)(%d+%.%d+%.%d+%.%d+)$")
  if quad then
    local q = v4bytes(quad)
    if not q then return nil end
    tail = q
    s = head .. "0:0" -- two placeholder groups, replaced below
  end
  local left, right = s, nil
  local dbl = find(s, "::", 1, true)
  if dbl then
    left, right = sub(s, 1, dbl - 1), sub(s, dbl + 2)
    if find(right, "::", 1, true) then return nil end
  end
  local function groups(part)
    local g = {}
    if part == "" then return g end
    for x in (part .. ":"):gmatch("([^:]*):") do
      if not match(x, "^%x%x?%x?%x?$") then return nil end
      g[#g + 1] = tonumber(x, 16)
    end
    return g
  end
  local lg, rg = groups(left), right and groups(right) or {}
  if not lg or not rg then return nil end
  local n = #lg + #rg
  if (dbl and n > 7) or (not dbl and n ~= 8) then return nil end
  local all = {}
  for _, v in ipairs(lg) do all[#all + 1] = v end
  for _ = 1, 8 - n do all[#all + 1] = 0 end
  for _, v in ipairs(rg) do all[#all + 1] = v end
  local bytes = {}
  for i = 1, 8 do
    bytes[2 * i - 1], bytes[2 * i] = floor(all[i] / 256), all[i] % 256
  end
  if quad then bytes[13], bytes[14], bytes[15], bytes[16] = tail[1], tail[2], tail[3], tail[4] end
  -- an IPv4-mapped address is the IPv4 one
  local mapped = true
  for i = 1, 10 do if bytes[i] ~= 0 then mapped = false end end
  mapped = mapped and bytes[11] == 255 and bytes[12] == 255
  return bytes, mapped
end
M.parse = parse

-- A CIDR or address as { bytes, bits } (an IPv4 prefix counted in the
-- mapped form: /8 is /104).
local function net(s)
  local a, bits = match(s, "^([^/]+)/(%d+)$")
  a = a or s
  local b, v4 = parse(a)
  if not b then return nil end
  local max = v4 and 32 or 128
  bits = bits and tonumber(bits) or max
  if bits > max then return nil end
  return { b, v4 and bits + 96 or bits }
end

local NAMES = {
  loopback = { "127.0.0.0/8", "::1/128" },
  private = { "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7" },
  ["link-local"] = { "169.254.0.0/16", "fe80::/10" },
  unspecified = { "0.0.0.0/8", "::/128" },
  multicast = { "224.0.0.0/4", "ff00::/8" },
}

-- Whether the 16 bytes b are inside n = { bytes, bits }: the first
-- `bits` bits agree.
local function inside(b, n)
  local nb, bits = n[1], n[2]
  for i = 1, 16 do
    if bits <= 0 then return true end
    local shift = 2 ^ (8 - (bits >= 8 and 8 or bits))
    if floor(b[i] / shift) ~= floor(nb[i] / shift) then return false end
    bits = bits - 8
  end
  return true
end

-- new(deny, allow): a check function(ip) -> true, or false and the reason;
-- nil, err for a bad deny entry. Either may be nil.
function M.new(deny, allow)
  local nets = {}
  if deny ~= nil then
    if type(deny) ~= "table" then return nil, "deny must be a list of names and CIDRs" end
    for i, d in ipairs(deny) do
      if type(d) ~= "string" then return nil, "deny[" .. i .. "] must be a string" end
      local list = NAMES[d] or { d }
      for _, c in ipairs(list) do
        local n = net(c)
        if not n then return nil, "deny[" .. i .. "]: not a name, an address or a CIDR: " .. d end
        n[3] = d
        nets[#nets + 1] = n
      end
    end
  end
  if allow ~= nil and type(allow) ~= "function" then return nil, "allow must be a function" end
  return function(ip)
    local b = parse(ip)
    if not b then return false, "not an address: " .. tostring(ip) end
    for _, n in ipairs(nets) do
      if inside(b, n) then return false, n[3] end
    end
    if allow and not allow(ip) then return false, "allow said no" end
    return true
  end
end

-- The lane's default (mp.http { deny =, allow = }): what mp.tcp,
-- mp.fetch, mp.connect and mp.websocket check when a call gives neither.
-- Module state, so one per lane (each lane is its own Lua state); set at
-- the script's top level, every lane gets the same.
local default_deny, default_allow

-- Sets the default; nil, err for a bad entry (nothing changes then).
function M.set_default(deny, allow)
  local ok, err = M.new(deny, allow)
  if not ok then return nil, err end
  default_deny, default_allow = deny, allow
  return true
end

-- The deny and allow a call goes by: its own when it gives either
-- (deny = false: none, not even the default), else the lane's default.
function M.pick(deny, allow)
  if deny == nil and allow == nil then return default_deny, default_allow end
  if deny == false then deny = nil end
  return deny, allow
end

return M
