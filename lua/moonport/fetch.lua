-- SPDX-License-Identifier: MIT
-- mp.fetch(url [, opts]): an HTTP/1.1 client written over mp.tcp, so it
-- waits only its coroutine and shares mp.tcp's per-lane keep-alive pool.
--
--   local res, err = mp.fetch("http://127.0.0.1:9000/users/7", {
--     method = "POST", headers = { ["content-type"] = "application/json" },
--     body = '{"a":1}', timeout = 2000, follow = 3 })
--   -- res.status, res.headers["content-type"], res.body; or nil, err
--
-- The response head is parsed in C (core.fetch.parse over
-- src/http/http1_response.c: the framing rules live there); the body
-- framing (Content-Length, chunked, close-delimited), redirects and the
-- retry of a dead pooled connection are here. The transport is mp.tcp;
-- an https:// URL is the same exchange over mp.tcp's TLS (the URL's host
-- sent as SNI and verified, against the system store unless opts.tls
-- says otherwise).
local core = require("moonport.core")
local tcp = require("moonport.tcp")
local url = require("moonport.url")
local addrfilter = require("moonport.addrfilter")
local C = core.fetch
local parse, now = C.parse, C.now
local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber
local setmetatable = setmetatable
local error, concat, min, ceil = error, table.concat, math.min, math.ceil
local lower, format = string.lower, string.format

local VERSION = C.version
local MAX_BODY = 8 * 1024 * 1024
local MAX_HEADER = 64 * 1024
local TIMEOUT = 30000
local POOL_SIZE = 30
local POOL_IDLE = 60000
local MAX_FOLLOW = 5 -- follow = true

-- Methods a retry may repeat: the server cannot tell a second try apart
-- from a first (RFC 9110 9.2.2).
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true }
local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

local function fail(s, err)
  if s then s:close() end
  return nil, err
end

-- The request's bytes up to its body. headers: { name = value | {values} }.
local function request_head(method, u, headers, body_kind, body_len)
  local out, n = { method, " ", u.target, " HTTP/1.1\r\n" }, 4
  local have = {}
  if headers then
    for k, v in pairs(headers) do
      if type(k) ~= "string" or not k:match("^[%w!#$%%&'*+.^_`|~-]+$") then
        return nil, "bad header name: " .. tostring(k)
      end
      local lk = lower(k)
      -- The framing fields are the client's own: it writes the body.
      if lk ~= "content-length" and lk ~= "transfer-encoding" then
        have[lk] = true
        local vs = type(v) == "table" and v or { v }
        for _, one in ipairs(vs) do
          local tv = type(one)
          if tv ~= "string" and tv ~= "number" then
            return nil, "bad header value for " .. k
          end
          one = tostring(one)
          if not url.value_ok(one) then return nil, "bad header value for " .. k end
          out[n + 1], out[n + 2], out[n + 3], out[n + 4] = k, ": ", one, "\r\n"
          n = n + 4
        end
      end
    end
  end
  if not have.host then out[n + 1] = "Host: " .. u.authority .. "\r\n"; n = n + 1 end
  if not have["user-agent"] then out[n + 1] = "User-Agent: moonport/" .. VERSION .. "\r\n"; n = n + 1 end
  if body_kind == "chunked" then
    out[n + 1] = "Transfer-Encoding: chunked\r\n"; n = n + 1
  elseif body_kind == "string" or method == "POST" or method == "PUT" or method == "PATCH" then
    out[n + 1] = "Content-Length: " .. (body_len or 0) .. "\r\n"; n = n + 1
  end
  out[n + 1] = "\r\n"
  return concat(out)
end

-- One socket step's timeout: what is left of the fetch's deadline.
local function arm(s, deadline)
  local left = deadline - now()
  if left < 1 then return false end
  s:settimeout(ceil(left))
  return true
end

-- One response head, to its empty line, as the bytes came. A line ends
-- in CRLF or in a bare LF: RFC 9112 2.2 lets a recipient take either, some
-- servers send LF, and the C parser reads both (so "\r\n\r\n" can't be
-- what ends a head). Bounded by max_header in all. Returns the head, or
-- nil, err and whether any byte of it came (a dead pooled connection
-- sends none: only then is a retry safe).
local function read_head(s, next_line, max, deadline)
  local lines, n = {}, 0
  while true do
    if not arm(s, deadline) then return nil, "timeout", n > 0 end
    local line, err, partial = next_line()
    if not line then
      if err == "max_buffer exceeded" then err = "response header too large" end
      return nil, err, n > 0 or (partial ~= nil and partial ~= "")
    end
    n = n + #line
    if n > max then return nil, "response header too large", true end
    lines[#lines + 1] = line
    if line == "\n" or line == "\r\n" then return concat(lines) end
  end
end

local function closed(err)
  return err == "closed" and "closed before the end of the body" or err
end

-- A reader of the body as the head says: each call returns the next
-- piece, nil at the end, or nil, err (then always that). deadline() is the
-- time the next read must end by.
local function body_reader(s, kind, clen, o, deadline)
  local piece, max_body = o.max_header, o.max_body
  local total, need_crlf, done, failed = 0, false, kind == "none", nil
  local left = kind == "length" and clen or 0 -- chunked: of the current chunk
  if kind == "length" then
    if clen > max_body then failed = "body too large" end
    done = clen == 0
  end
  local function step()
    if kind == "length" then
      local d, err = s:receive(min(left, piece))
      if not d then return nil, closed(err) end
      left = left - #d
      done = left == 0
      return d
    elseif kind == "close" then
      local d, err, partial = s:receive(piece)
      if not d then
        if err ~= "closed" then return nil, err end
        d, done = partial or "", true
      end
      total = total + #d
      if total > max_body then return nil, "body too large" end
      if d == "" then return nil end
      return d
    end
    -- chunked
    if need_crlf then
      local crlf, err = s:receive("*l")
      if crlf ~= "" then return nil, crlf and "bad chunked body" or closed(err) end
      need_crlf = false
      if not arm(s, deadline()) then return nil, "timeout" end
    end
    if left == 0 then
      local line, err = s:receive("*l")
      if not line then return nil, closed(err) end
      local hex = line:match("^(%x+)[ \t]*;?")
      if not hex or #hex > 15 then return nil, "bad chunked body" end
      local size = tonumber(hex, 16)
      if size == 0 then
        -- Trailer fields up to the empty line, skipped; bounded as a head.
        local tb = 0
        repeat
          if not arm(s, deadline()) then return nil, "timeout" end
          local t, terr = s:receive("*l")
          if not t then return nil, closed(terr) end
          tb = tb + #t + 2
          if tb > o.max_header then return nil, "response trailers too large" end
        until t == ""
        done = true
        return nil
      end
      total = total + size
      if total > max_body then return nil, "body too large" end
      left = size
      if not arm(s, deadline()) then return nil, "timeout" end
    end
    local d, err = s:receive(min(left, piece))
    if not d then return nil, closed(err) end
    left = left - #d
    need_crlf = left == 0
    return d
  end
  return function()
    if failed then return nil, failed end
    if done then return nil end
    if not arm(s, deadline()) then failed = "timeout"; return nil, failed end
    local d, err = step()
    if err then failed = err end
    return d, err
  end
end

-- The whole body through a reader: the string, or nil, err.
local function read_body(next_piece)
  local parts, np = {}, 0
  while true do
    local d, err = next_piece()
    if not d then
      if err then return nil, err end
      return concat(parts, "", 1, np)
    end
    np = np + 1; parts[np] = d
  end
end

-- res:read() of a stream = true fetch: the next piece of the body, nil at
-- its end, or nil, err. The connection goes back to the pool at the end
-- (when the response allows), or is closed on an error or res:close().
local stream_mt = { __index = {} }
function stream_mt.__index:read()
  local st = self._st
  if not st then return nil, self._err end
  local d, err = st.next()
  if d == nil then
    self._st, self._err = nil, err or nil
    if not err and st.keep then
      st.s:setkeepalive(st.o.pool_idle, st.o.pool_size)
    else
      st.s:close()
    end
  end
  return d, err
end
function stream_mt.__index:close()
  local st = self._st
  if st then self._st, self._err = nil, "closed"; st.s:close() end
end

-- Sends a body a function yields piece by piece, chunked; nil, err.
local function send_pieces(s, body, deadline)
  while true do
    local p = body()
    if p == nil or p == "" then
      if p == nil then break end
    else
      p = tostring(p)
      if not arm(s, deadline) then return nil, "timeout" end
      local ok, err = s:send({ format("%x\r\n", #p), p, "\r\n" })
      if not ok then return nil, err end
    end
  end
  if not arm(s, deadline) then return nil, "timeout" end
  return s:send("0\r\n\r\n")
end

-- One request and its response on one connection (a second on a fresh
-- one when a pooled connection turns out dead before any answer).
local function exchange(u, method, head, body, o, deadline)
  local retry = IDEMPOTENT[method] and type(body) ~= "function"
  for attempt = 1, 2 do
    local left = deadline - now()
    if left < 1 then return nil, "timeout" end
    local fresh = nil -- nil: from the pool if it has one; false: a new one
    if attempt == 2 then fresh = false end
    local s, err = tcp { host = u.host, port = u.port, timeout = ceil(left),
      max_buffer = o.max_header, max_line = min(o.max_header, 4096),
      pool = fresh, tls = u.scheme == "https" and o.tls or nil, deny = o.deny, allow = o.allow }
    if not s then return nil, err end
    local reused = s:getreusedtimes() > 0
    local ok
    if type(body) == "string" then
      ok, err = s:send({ head, body })
    else
      ok, err = s:send(head)
      if ok and body then ok, err = send_pieces(s, body, deadline) end
    end
    local status, headers, kind, clen, keep, reason
    if ok then
      local next_line = s:receiveuntil("\n", { inclusive = true })
      while true do
        local h, rerr, some = read_head(s, next_line, o.max_header, deadline)
        if not h then
          err = rerr
          if some then retry = false end
          break
        end
        local n, interim
        n, status, headers, kind, clen, keep, interim, reason = parse(h, o.max_header, method == "HEAD")
        if not n then err, status = status, nil; retry = false; break end
        if not interim then ok = true; break end
        retry = false -- the server answered: not a dead connection
        ok, status = nil, nil
      end
      if not status then ok = nil end
    end
    if ok then
      local timeout = o.timeout
      if o.stream and not (o.follow and REDIRECT[status] and headers.location) then
        -- Each read of a stream has the whole timeout: a stream may last.
        local next_piece = body_reader(s, kind, clen, o, function() return now() + timeout end)
        local keep_it = keep and o.keepalive ~= false
        return setmetatable({ status = status, reason = reason, headers = headers,
          _st = { s = s, next = next_piece, keep = keep_it, o = o } }, stream_mt)
      end
      local b, berr = read_body(body_reader(s, kind, clen, o, function() return deadline end))
      if not b then return fail(s, berr) end
      if keep and o.keepalive ~= false then
        s:setkeepalive(o.pool_idle, o.pool_size)
      else
        s:close()
      end
      return { status = status, reason = reason, headers = headers, body = b }
    end
    s:close()
    if not (reused and retry and attempt == 1 and err ~= "timeout") then
      return nil, err
    end
  end
end

-- The fields a cross-origin redirect drops (as undici does).
local CREDENTIALS = { authorization = true, cookie = true, host = true,
  ["proxy-authorization"] = true }

local function check_opts(o)
  if o == nil then return {} end
  if type(o) ~= "table" then error("mp.fetch: opts must be a table", 3) end
  for _, k in ipairs { "timeout", "max_body", "max_header", "pool_size", "pool_idle" } do
    local v = o[k]
    if v ~= nil and (type(v) ~= "number" or v < 1) then
      error("mp.fetch: " .. k .. " must be a number >= 1", 3)
    end
  end
  if o.pool_size ~= nil and o.pool_size > 1024 then
    error("mp.fetch: pool_size must be 1 to 1024", 3)
  end
  if o.method ~= nil and (type(o.method) ~= "string" or not o.method:match("^%u+$")) then
    error("mp.fetch: method must be an upper-case name like \"GET\"", 3)
  end
  if o.headers ~= nil and type(o.headers) ~= "table" then error("mp.fetch: headers must be a table", 3) end
  if o.redirect_headers ~= nil and o.redirect_headers ~= "drop" and o.redirect_headers ~= "keep" then
    error('mp.fetch: redirect_headers must be "keep" or "drop"', 3)
  end
  if o.deny ~= nil or o.allow ~= nil then
    local ok, ferr = addrfilter.new(addrfilter.pick(o.deny, o.allow))
    if not ok then error("mp.fetch: " .. ferr, 3) end
  end
  local bt = type(o.body)
  if o.body ~= nil and bt ~= "string" and bt ~= "function" then
    error("mp.fetch: body must be a string or a function returning pieces", 3)
  end
  if o.tls ~= nil then
    if type(o.tls) ~= "table" then
      error("mp.fetch: tls must be a table { verify =, ca =, cert =, key = }", 3)
    end
    if o.tls.sni ~= nil then
      error("mp.fetch: tls.sni can't be set: the name verified is each URL's host", 3)
    end
  end
  return o
end

return function(target, opts)
  local o = check_opts(opts)
  local cfg = {
    max_body = o.max_body or MAX_BODY,
    max_header = o.max_header or MAX_HEADER,
    pool_size = o.pool_size or POOL_SIZE,
    pool_idle = o.pool_idle or POOL_IDLE,
    keepalive = o.keepalive, deny = o.deny, allow = o.allow,
    stream = o.stream and true or false,
    timeout = o.timeout or TIMEOUT,
    tls = o.tls or true, -- for https:// URLs (true: the system's store)
  }
  local follow = o.follow
  if follow == true then follow = MAX_FOLLOW elseif not follow then follow = 0 end
  if type(follow) ~= "number" then error("mp.fetch: follow must be a number or a boolean", 2) end
  cfg.follow = follow > 0
  local deadline = now() + (o.timeout or TIMEOUT)
  local method, body, headers = o.method or "GET", o.body, o.headers
  local hops = 0
  while true do
    local u, err = url.parse(target)
    if not u then return nil, err end
    local bkind = type(body) == "function" and "chunked" or (body and "string")
    local head, herr = request_head(method, u, headers, bkind, body and bkind == "string" and #body)
    if not head then return nil, herr end
    local res, rerr = exchange(u, method, head, body, cfg, deadline)
    if not res then return nil, rerr end
    res.url = target
    local loc = res.headers.location
    if follow == 0 or not REDIRECT[res.status] or not loc then return res end
    if hops >= follow then return nil, "too many redirects" end
    local st = res.status
    if st == 307 or st == 308 then
      if type(body) == "function" then return res end -- can't replay it
    elseif method ~= "HEAD" then
      method, body = "GET", nil
      if headers then -- the body's own fields go with it
        local h2 = {}
        for k, v in pairs(headers) do
          local lk = lower(k)
          if lk ~= "content-type" and lk ~= "content-encoding" then h2[k] = v end
        end
        headers = h2
      end
    end
    local nxt, nerr = url.resolve(target, loc)
    if not nxt then return nil, nerr end
    local nu = url.parse(nxt)
    -- https -> http would send the rest in the clear: only when asked
    if nu and u.scheme == "https" and nu.scheme == "http" and not o.allow_downgrade then
      return nil, "redirect from https to http refused (allow_downgrade = true follows it)"
    end
    if headers and (not nu or nu.authority ~= u.authority or nu.scheme ~= u.scheme) then
      -- Credentials stay with the host (and the scheme: https's are not
      -- sent in the clear) they were meant for; redirect_headers = "drop"
      -- sends none of the caller's fields to another origin (a custom
      -- credential header such as X-Api-Key included).
      local h2 = {}
      if o.redirect_headers ~= "drop" then
        for k, v in pairs(headers) do
          local lk = lower(k)
          if not CREDENTIALS[lk] then h2[k] = v end
        end
      end
      headers = h2
    end
    hops = hops + 1
    target = nxt
  end
end
