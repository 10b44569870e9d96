-- SPDX-License-Identifier: MIT
-- mp.tcp: a client socket whose calls wait only their coroutine, in the
-- shape of OpenResty's cosockets so drivers written for them port easily.
--
--   local s, err = mp.tcp { host = "127.0.0.1", port = 6379, timeout = 1000 }
--   local s, err = mp.tcp("db.local", 5432)          -- or { path = "/run/x.sock" }
--   s:send("PING\r\n")                               -- bytes, or nil, err
--   local line, err, partial = s:receive("*l")       -- also n, "*a"
--   local read = s:receiveuntil("\r\n\r\n", { inclusive = false })
--   local head = read()                               -- next piece, or nil, err
--   s:setkeepalive(10000, 16)                         -- into the lane's pool
--
-- Failures are nil and "timeout", "closed", or another message. The buffer,
-- the timers, the pool and the connection itself are src/lx/lx_tcp.c.
local core = require("moonport.core")
local addrfilter = require("moonport.addrfilter")
local resolve = require("moonport.dns")
local C = core.tcp
local new, recv, send = C.new, C.recv, C.send
local arm_connect, arm_io = C.arm_connect, C.arm_io
local R_N, R_LINE, R_ALL, R_UNTIL = C.R_N, C.R_LINE, C.R_ALL, C.R_UNTIL
local yield, TOKEN = core.raw_yield, core.wait_token
local type, error, tostring, concat = type, error, tostring, table.concat
local pairs, ipairs = pairs, ipairs

local methods = {
  settimeouts = C.settimeouts,
  settimeout = C.settimeout,
  setkeepalive = C.setkeepalive,
  getreusedtimes = C.getreusedtimes,
  close = C.close,
  peer = C.peer, -- server sockets (mp.listen { on_connect = }): ip, port
  uid = C.uid,
  tls = C.tls, -- { protocol =, cipher =, sni =, alpn =, resumed = } or nil
}

local function read(self, mode, arg, incl)
  local a, b, c = recv(self, mode, arg, incl)
  if a ~= false then return a, b, c end
  return yield(TOKEN, arm_io, self)
end

-- s:receive(n | "*l" | "*a"): n bytes, a line without its "\n" (and "\r"),
-- or everything up to the peer's close. On failure nil, err and what was
-- read (the partial data).
function methods:receive(pat)
  if pat == nil or pat == "*l" or pat == "l" then return read(self, R_LINE) end
  if pat == "*a" or pat == "a" then return read(self, R_ALL) end
  if type(pat) == "number" then
    if pat < 0 or pat % 1 ~= 0 then
      error("receive: the byte count must be a whole number >= 0", 2)
    end
    return read(self, R_N, pat)
  end
  error("receive: expects a byte count, \"*l\" or \"*a\", got " .. tostring(pat), 2)
end

-- s:receiveuntil(pattern [, { inclusive = true }]): an iterator; each call
-- returns the bytes up to the next occurrence of the plain pattern (with
-- it when inclusive), or nil, err, partial.
function methods:receiveuntil(pat, opts)
  if type(pat) ~= "string" or #pat == 0 or #pat > 4096 then
    error("receiveuntil: the pattern must be a string of 1 to 4096 bytes", 2)
  end
  local incl = type(opts) == "table" and opts.inclusive and true or false
  return function() return read(self, R_UNTIL, pat, incl) end
end

-- s:send(data): the number of bytes, once the kernel took them all (a
-- peer that does not read makes it wait, bounded by the send timeout);
-- data is a string, a number or an array of them.
function methods:send(data)
  local t = type(data)
  if t == "table" then
    data = concat(data)
  elseif t ~= "string" and t ~= "number" then
    error("send: expects a string, a number or an array of them", 2)
  end
  local n, err = send(self, data)
  if n ~= false then return n, err end
  return yield(TOKEN, arm_io, self)
end

C.mt.__index = methods

local function opt_num(v, what)
  if v ~= nil and type(v) ~= "number" then
    error("mp.tcp: " .. what .. " must be a number", 3)
  end
  return v
end

-- With deny / allow (moonport.addrfilter): the name is looked up here and
-- each address checked before it is connected to, in the lookup's order,
-- the next tried when a connect fails (refused, unreachable, timeout);
-- TLS still sends and verifies the name. The connect goes to the address
-- that was checked, so a second lookup can't rebind it.
local RETRY = { ["connection refused"] = true, ["timeout"] = true,
  ["network is unreachable"] = true, ["no route to host"] = true,
  ["host is unreachable"] = true }

local function connect_checked(o, host, tls, deny, allow)
  local check, ferr = addrfilter.new(deny, allow)
  if not check then error("mp.tcp: " .. ferr, 3) end
  local addrs
  if addrfilter.parse(host) then
    addrs = { host }
  else
    local rerr
    addrs, rerr = resolve(host, { timeout = o.timeout })
    if not addrs then return nil, rerr end
  end
  -- TLS verifies the name, not the address connected to
  local t = tls
  if tls and not addrfilter.parse(host) then
    t = { sni = host }
    if type(tls) == "table" then
      for k, v in pairs(tls) do t[k] = v end
      t.sni = tls.sni or host
    end
  end
  local last = "no such host"
  for _, ip in ipairs(addrs) do
    local ok, why = check(ip)
    if not ok then
      last = "address refused: " .. ip .. " (" .. why .. ")"
    else
      local s, ready = new(ip, opt_num(o.port, "port"), nil, opt_num(o.timeout, "timeout"),
        opt_num(o.max_buffer, "max_buffer"), opt_num(o.max_line, "max_line"), o.pool == false, t)
      if ready then return s end
      local cok, err = yield(TOKEN, arm_connect, s)
      if cok then return s end
      if not RETRY[err] then return nil, err end
      last = err
    end
  end
  return nil, last
end

-- mp.tcp { host =, port = | path =, timeout =, max_buffer =, max_line =,
--          pool = false (connect anew, never take from the pool),
--          tls = true | { verify =, ca =, sni =, cert =, key = },
--          deny = { "loopback", "private", "10.0.0.0/8", ... } | false,
--          allow = function(ip) return true end }
-- (neither given: the lane's default, addrfilter.pick)
-- or mp.tcp(host, port [, opts]).
return function(a, b, c)
  local o
  if type(a) == "table" then
    o = a
  elseif type(a) == "string" then
    o = type(c) == "table" and c or {}
    o = { host = a, port = b, timeout = o.timeout, max_buffer = o.max_buffer,
          max_line = o.max_line, pool = o.pool, tls = o.tls, deny = o.deny, allow = o.allow }
  else
    error("mp.tcp: expects { host =, port = } or { path = }, or host, port", 2)
  end
  local host, path, tls = o.host, o.path, o.tls
  if tls ~= nil and type(tls) ~= "boolean" and type(tls) ~= "table" then
    error("mp.tcp: tls must be true or a table { verify =, ca =, sni =, cert =, key = }", 2)
  end
  if path ~= nil and type(path) ~= "string" then error("mp.tcp: path must be a string", 2) end
  if host ~= nil and type(host) ~= "string" then error("mp.tcp: host must be a string", 2) end
  local deny, allow = addrfilter.pick(o.deny, o.allow)
  if (deny ~= nil or allow ~= nil) and host and not path then
    return connect_checked(o, host, tls, deny, allow)
  end
  local s, ready = new(host, opt_num(o.port, "port"), path, opt_num(o.timeout, "timeout"),
    opt_num(o.max_buffer, "max_buffer"), opt_num(o.max_line, "max_line"), o.pool == false, tls)
  if ready then return s end
  local ok, err = yield(TOKEN, arm_connect, s)
  if not ok then return nil, err end
  return s
end
