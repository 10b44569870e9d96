-- SPDX-License-Identifier: MIT
-- URL parsing and redirect resolution for mp.fetch (lua/moonport/fetch.lua).
-- Pure Lua, no server state: spec/lua/url_spec.lua tests it under busted.
--
--   local u, err = url.parse("http://[::1]:8080/a/b?q=1")
--   -- u.host "::1", u.port 8080, u.target "/a/b?q=1",
--   -- u.authority "[::1]:8080" (the Host header)
--   url.resolve("http://h/a/b?x", "../c")   --> "http://h/c"
local M = {}

local find, sub, lower, byte = string.find, string.sub, string.lower, string.byte
local tonumber, concat = tonumber, table.concat

local HTTP = { http = 80, https = 443 }

-- parse(s, schemes): { scheme, host, port, target, authority } or nil,
-- err, for http:// (port 80 by default) and https:// (443; mp.fetch then
-- speaks TLS through mp.tcp), or the schemes given as { name = default
-- port } (mp.websocket's ws and wss): one parser for every client, so a
-- host with a blank, CR or LF never reaches a Host line.
function M.parse(s, schemes)
  if type(s) ~= "string" then return nil, "the URL must be a string" end
  local scheme, rest = s:match("^([%a][%w+.-]*)://(.*)$")
  if not scheme then return nil, "bad URL (no scheme://): " .. s end
  scheme = lower(scheme)
  local dport = (schemes or HTTP)[scheme]
  if not dport then return nil, "unsupported scheme: " .. scheme end
  local e = find(rest, "[/?#]")
  local auth = e and sub(rest, 1, e - 1) or rest
  local target = e and sub(rest, e) or ""
  if find(auth, "@", 1, true) then return nil, "bad URL (credentials in the authority): " .. s end
  local host, port
  if byte(auth, 1) == 91 then -- "[": an IPv6 literal
    local h, p = auth:match("^%[([%x:.]+)%](.*)$")
    if not h or not find(h, ":", 1, true) then return nil, "bad URL (IPv6 host): " .. s end
    host, port = h, p
  else
    local h, p = auth:match("^([^:]*)(.*)$")
    host, port = h, p
  end
  if host == "" then return nil, "bad URL (no host): " .. s end
  if not host:match("^[%w.%-_:]+$") then return nil, "bad URL (host): " .. s end
  local pnum = dport
  if port ~= "" then
    local digits = port:match("^:(%d+)$")
    pnum = digits and #digits <= 5 and tonumber(digits)
    if not pnum or pnum < 1 or pnum > 65535 then return nil, "bad URL (port): " .. s end
  end
  local hash = find(target, "#", 1, true) -- the fragment stays with the client
  if hash then target = sub(target, 1, hash - 1) end
  if target == "" then
    target = "/"
  elseif byte(target, 1) == 63 then -- "?q" right after the authority
    target = "/" .. target
  end
  if find(target, "[%c ]") then return nil, "bad URL (a blank or control byte in the path): " .. s end
  local authority = byte(auth, 1) == 91 and "[" .. host .. "]" or host
  if pnum ~= dport then authority = authority .. ":" .. pnum end
  return { scheme = scheme, host = host, port = pnum, target = target, authority = authority }
end

-- RFC 3986 5.2.4: "." and ".." segments of a path taken away.
local function remove_dots(path)
  local out = {}
  local n = 0
  local trailing = false
  for seg in (path .. "/"):gmatch("([^/]*)/") do
    trailing = false
    if seg == ".." then
      if n > 0 then out[n] = nil; n = n - 1 end
      trailing = true
    elseif seg == "." then
      trailing = true
    else
      n = n + 1
      out[n] = seg
    end
  end
  local r = concat(out, "/")
  if trailing or (n > 0 and out[n] == "" ) then
    if sub(r, -1) ~= "/" then r = r .. "/" end
  end
  if byte(r, 1) ~= 47 then r = "/" .. r end
  return r
end
M.remove_dots = remove_dots

-- Whether a header value may go on the wire: any byte but the control
-- bytes (HTAB excepted) and DEL, as the server requires of what it reads
-- (RFC 9110 5.5).
function M.value_ok(v) return not find(v, "[%z\1-\8\10-\31\127]") end

-- resolve(base, location): the absolute URL a Location header names,
-- relative to the URL `base` that answered (RFC 3986 5.2). A base's
-- fragment is dropped; a location's own is kept (parse drops it later).
function M.resolve(base, loc)
  if loc:match("^[%a][%w+.-]*:") then return loc end
  local scheme, auth, target = base:match("^([%a][%w+.-]*)://([^/?#]*)([^#]*)")
  if not scheme then return nil, "bad base URL: " .. tostring(base) end
  if sub(loc, 1, 2) == "//" then return scheme .. ":" .. loc end
  local path, query = target:match("^([^?]*)(.*)$")
  if path == "" then path = "/" end
  if loc == "" then return scheme .. "://" .. auth .. path .. query end
  local c = byte(loc, 1)
  if c == 35 then return scheme .. "://" .. auth .. path .. query .. loc end -- "#f"
  if c == 63 then return scheme .. "://" .. auth .. path .. loc end -- "?q"
  local lpath, rest = loc:match("^([^?#]*)(.*)$")
  if c ~= 47 then -- relative: against the base's directory
    lpath = path:match("^(.*/)") .. lpath
  end
  return scheme .. "://" .. auth .. remove_dots(lpath) .. rest
end

return M
