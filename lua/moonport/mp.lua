-- The parts of the `moonport` module (mp) written in Lua; luaopen_moonport
-- (src/lx/lx_moonport.c) calls this with the table it built in C.
local json = require("moonport.json")
local router = require("moonport.router")
local line = require("moonport.line")
local serve = require("moonport.serve")
local core = require("moonport.core")
local waitable = core.waitable
local type, pairs, tonumber = type, pairs, tonumber

-- A host name, not an address literal (those need no lookup).
local function is_name(host)
  return type(host) == "string" and host ~= "" and not host:find(":", 1, true)
    and not host:match("^%d+%.%d+%.%d+%.%d+$")
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- errnos mp.connect's on_fail turns into its usual messages
local EADDRNOTAVAIL, ETIMEDOUT = -99, -110

return function(mp)
  mp.json = json
  mp.router = router.new
  -- framing = "line": lua/moonport/line.lua over on_data
  local listen, connect = mp.listen, mp.connect
  mp.listen = function(opts, ...)
    if type(opts) == "table" and opts.framing ~= nil then opts = line.wrap(opts, "mp.listen") end
    if type(opts) == "table" and opts.on_connect ~= nil then opts = serve.wrap(opts) end
    return listen(opts, ...)
  end
  -- A host name is looked up on the lane's resolver (mp.resolve) when the
  -- caller may wait, so a slow DNS answer stalls only its coroutine; at a
  -- script's top level the C side's blocking lookup stays (start-up).
  -- The connect timeout covers the lookup.
  local resolve = mp.resolve
  mp.connect = function(opts, ...)
    if type(opts) == "table" and opts.framing ~= nil then opts = line.wrap(opts, "mp.connect") end
    if type(opts) == "table" and opts.path == nil and is_name(opts.host) and waitable() then
      local ct = tonumber(opts.connect_timeout) or 10
      local addrs, err = resolve(opts.host, { timeout = ct > 0 and ct * 1000 or 0 })
      opts = copy(opts)
      opts._name = opts.host -- what TLS sends as SNI and verifies
      if addrs then
        opts.host = addrs[1]
      else
        opts._fail = err == "timeout" and ETIMEDOUT or EADDRNOTAVAIL
      end
    end
    return connect(opts, ...)
  end
  -- mp.redis(url): the URL's host name is looked up the same way, once,
  -- when the client is made (its reconnects go to that address).
  local redis = mp.redis
  mp.redis = function(url, ...)
    if type(url) == "string" and waitable() then
      local pre, host, post = url:match("^(rediss?://[^@/]*@)([^:/%[%]@]+)(.*)$")
      if not pre then pre, host, post = url:match("^(rediss?://)([^:/%[%]@]+)(.*)$") end
      if host and is_name(host) then
        local addrs = resolve(host, { family = 4 }) -- a URL takes IPv4 as is
        if addrs then
          url = pre .. addrs[1] .. post
          -- rediss: the name, not the address, is what TLS verifies
          if pre:match("^rediss:") and not post:match("[?&]sni=") then
            url = url .. (post:find("?", 1, true) and "&" or "?") .. "sni=" .. host
          end
        end
      end
    end
    return redis(url, ...)
  end
  return mp
end
