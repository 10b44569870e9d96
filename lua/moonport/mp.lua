-- SPDX-License-Identifier: MIT
-- The parts of the `moonport` module (mp) written in Lua; luaopen_moonport
-- (src/lx/lx_moonport.c) calls this with the table it built in C.
local json = require("moonport.json")
local router = require("moonport.router")
local line = require("moonport.line")
local serve = require("moonport.serve")
local core = require("moonport.core")
local http = require("moonport.http")
local cors = require("moonport.cors")
local session = require("moonport.session")
local addrfilter = require("moonport.addrfilter")
local waitable = core.waitable
local type, pairs, ipairs, tonumber, tostring, error = type, pairs, ipairs, tonumber, tostring, error

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
  mp.cors = cors.new
  mp.session = session.new
  local mp_http = mp.http
  -- deny / allow on mp.http: the lane's default for the clients
  -- (mp.fetch, mp.tcp, mp.websocket, mp.connect) of calls that give
  -- neither; the server itself is not filtered by them
  mp.http = function(opts, ...)
    if type(opts) == "table" and (opts.deny ~= nil or opts.allow ~= nil) then
      local ok, err = addrfilter.set_default(opts.deny, opts.allow)
      if not ok then error("mp.http: " .. err, 2) end
    end
    return mp_http(http.options(opts), ...)
  end
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
  -- deny / allow (or the lane's default, moonport.addrfilter): the
  -- addresses a name gives are checked here and the connect goes to the
  -- first one allowed (no second lookup to rebind); none: on_fail with
  -- "address refused: IP (why)". A name can only be looked up so where
  -- the caller may wait: at top level it raises.
  local function connect_checked(opts, deny, allow, ...)
    local check, ferr = addrfilter.new(deny, allow)
    if not check then error("mp.connect: " .. ferr, 3) end
    opts = copy(opts)
    opts.deny, opts.allow = nil, nil
    local host = opts.host or "127.0.0.1"
    local addrs
    if addrfilter.parse(host) then
      addrs = { host }
    elseif not waitable() then
      error("mp.connect: deny / allow check the addresses " .. tostring(host) .. " gives: connect from a " ..
        "callback (at top level the lookup would block and its answer go unchecked)", 3)
    else
      local ct = tonumber(opts.connect_timeout) or 10
      local err
      addrs, err = resolve(host, { timeout = ct > 0 and ct * 1000 or 0 })
      opts._name = host
      if not addrs then
        opts._fail = err == "timeout" and ETIMEDOUT or EADDRNOTAVAIL
        return connect(opts, ...)
      end
    end
    local refused
    for _, ip in ipairs(addrs) do
      local ok, why = check(ip)
      if ok then
        opts.host = ip
        return connect(opts, ...)
      end
      refused = refused or ("address refused: " .. ip .. " (" .. why .. ")")
    end
    opts._fail_msg = refused
    return connect(opts, ...)
  end
  mp.connect = function(opts, ...)
    if type(opts) == "table" and opts.framing ~= nil then opts = line.wrap(opts, "mp.connect") end
    if type(opts) == "table" and opts.path == nil then
      local deny, allow = addrfilter.pick(opts.deny, opts.allow)
      if deny ~= nil or allow ~= nil then return connect_checked(opts, deny, allow, ...) end
    end
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
