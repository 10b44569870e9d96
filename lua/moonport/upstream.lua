-- SPDX-License-Identifier: MIT
-- mp.upstream(opts): a set of upstream servers and up:proxy(req, res [, o]),
-- the reverse proxy. Lua decides (which server, whether to try again,
-- what health says); the bytes are C's: core.upstream.try
-- (src/lx/lx_upstream.c over src/http/proxy.c) rewrites the head, pumps
-- both bodies with back pressure and splices a WebSocket.
--
-- Health lives in one mp.shared dictionary ("moonport.upstream"), so
-- every lane of every worker sees the same state: passive marks (failures
-- in fail_timeout), active checks (each server checked once per interval
-- by whichever lane takes the check's lease), the server list of
-- up:set_servers. A lane reads one key per request (the upstream's
-- generation) and reloads the rest only when it moved.
local core = require("moonport.core")
local C = core.upstream
local hash = C.hash
-- core.upstream.try's halves, called here as wait.lua's wrapper would:
-- the check (it raises for misuse) and a yield that has the runner arm
-- the try. The wrapper is a vararg function, whose VARG the JIT can't
-- record after the check's C call: it ran interpreted on every request.
local try_check, try_arm = C.try_check, C.try_arm
local yield, TOKEN = core.raw_yield, core.wait_token
-- monotonic ms, the clock of the down marks every process reads: through
-- the FFI when it can be had (moonport_upstream_now, src/lx/lx_upstream.c),
-- which the JIT compiles into the trace; core.fetch.now, a C API function,
-- ended the trace where it was called, twice a request
local now, cnow = core.fetch.now, core.fetch.now
do
  local ok, ffi = pcall(require, "ffi")
  if ok and pcall(ffi.cdef, "double moonport_upstream_now(void);") then
    local found, fn = pcall(function() return ffi.C.moonport_upstream_now end)
    if found then now = fn end
  end
end
local type, pairs, ipairs, tostring, tonumber = type, pairs, ipairs, tostring, tonumber
local setmetatable, error, rawget = setmetatable, error, rawget
local floor, exp, random = math.floor, math.exp, math.random
local concat, sort, lower, find, format = table.concat, table.sort, string.lower, string.find, string.format

local DICT, DICT_SIZE = "moonport.upstream", "4m"
local IDEMPOTENT = { GET = true, HEAD = true, PUT = true, DELETE = true, OPTIONS = true, TRACE = true }
local BALANCE = { round_robin = true, least_conn = true, hash = true, ewma = true }
local RING_POINTS = 160 -- per unit of weight
local EWMA_TAU = 10000  -- ms

local U = {}
U.__index = U
local count = 0 -- mp.upstream calls in this lane: the default names agree
                -- across lanes, which all run the same top level

local function is_ip(h)
  return h:match("^%d+%.%d+%.%d+%.%d+$") or h:find(":", 1, true)
end

local TLS_FIELDS = { "ca", "cert", "key", "sni" }

-- A server's tls: nil, or mp.tcp's table with the name to send and verify
-- always in sni (the host when it is a name; an IP address is verified as
-- one). Its strings are kept in the dictionary by set_servers, so they
-- may hold no tab or newline.
local function tls_of(tls, host, level)
  if tls == nil or tls == false then return nil end
  local t = {}
  if type(tls) == "table" then
    for k in pairs(tls) do
      if k ~= "verify" and k ~= "ca" and k ~= "cert" and k ~= "key" and k ~= "sni" then
        error("mp.upstream: tls has verify, ca, cert, key and sni, not " .. tostring(k), level)
      end
    end
    for _, k in ipairs(TLS_FIELDS) do
      local v = tls[k]
      if v ~= nil and (type(v) ~= "string" or v == "" or find(v, "[\t\n]")) then
        error("mp.upstream: tls." .. k .. " is a non-empty string", level)
      end
      t[k] = v
    end
    t.verify = tls.verify ~= false
  elseif tls ~= true then
    error("mp.upstream: tls is true or a table { verify =, ca =, cert =, key =, sni = }", level)
  end
  if not t.sni and not is_ip(host) then t.sni = host end
  return t
end

-- the tls table as one line of set_servers' list, and back
local function tls_enc(t)
  return (t.verify and "v" or "n") .. "\t" .. (t.ca or "") .. "\t" .. (t.cert or "") ..
    "\t" .. (t.key or "") .. "\t" .. (t.sni or "")
end
local function tls_dec(line)
  local v, ca, cert, key, sni = line:match("^([vn])\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$")
  if not v then return nil end
  local function o(x) return x ~= "" and x or nil end
  return { verify = v == "v", ca = o(ca), cert = o(cert), key = o(key), sni = o(sni) }
end

-- One server from its spec: "host:port" or { host =, port =, weight =, tls = }.
local function server(spec, level)
  local host, port, weight, tls
  if type(spec) == "string" then
    host, port = spec:match("^%[(.+)%]:(%d+)$")
    if not host then host, port = spec:match("^([^:]+):(%d+)$") end
    if not host then error("mp.upstream: bad server '" .. spec .. "' (host:port)", level) end
    port, weight = tonumber(port), 1
  elseif type(spec) == "table" then
    host, port, weight, tls = spec.host, spec.port, spec.weight or 1, spec.tls
  else
    error("mp.upstream: a server is 'host:port' or a table", level)
  end
  if type(host) ~= "string" or host == "" then error("mp.upstream: a server needs a host", level) end
  if type(port) ~= "number" or port < 1 or port > 65535 or port % 1 ~= 0 then
    error("mp.upstream: bad port for " .. tostring(host), level)
  end
  if type(weight) ~= "number" or weight < 1 or weight > 1000 or weight % 1 ~= 0 then
    error("mp.upstream: weight is a whole number from 1 to 1000", level)
  end
  tls = tls_of(tls, host, level)
  local addr = (host:find(":", 1, true) and "[" .. host .. "]" or host) .. ":" .. port
  return { host = host, port = port, weight = weight, addr = addr, key = addr, tls = tls,
    ip = is_ip(host) and host or nil, ip_until = 0,
    cw = 0, active = 0, ewma = 0, ewma_t = 0, down_until = 0,
    requests = 0, errors = 0, ms = 0, -- since the last flush to the dictionary
  }
end

local function servers_of(list, level)
  if type(list) ~= "table" or #list == 0 then error("mp.upstream: servers is a non-empty list", level) end
  local out, seen = {}, {}
  for i, spec in ipairs(list) do
    local s = server(spec, level + 1)
    if seen[s.addr] then error("mp.upstream: server " .. s.addr .. " given twice", level) end
    seen[s.addr] = true
    s.index = i
    out[i] = s
  end
  return out
end

-- the consistent-hash ring: RING_POINTS points per unit of weight, each
-- hash("addr#i"); a key goes to the first point at or after its hash
local function build_ring(up)
  local pts = {}
  for _, s in ipairs(up.list) do
    for i = 1, RING_POINTS * s.weight do
      pts[#pts + 1] = { hash(s.addr .. "#" .. i), s }
    end
  end
  sort(pts, function(a, b) return a[1] < b[1] end)
  local h, owner = {}, {}
  for i, p in ipairs(pts) do h[i], owner[i] = p[1], p[2] end
  up.ring_h, up.ring_s = h, owner
end

-- ---- servers given by name ----
--
-- A server given by a name stands for every address the name has (at
-- most the resolver's 16, DNS_MAX_ADDRS, the first of the answer; its
-- IPv4 ones if it has any, else its IPv6 ones: a server bound to 0.0.0.0
-- refuses ::1), each a peer of its own with the server's weight, port
-- and tls, as nginx's upstream does; up.specs is the list as given,
-- up.list the peers that are balanced, checked and marked. Names are
-- asked again once a second (RESOLVE_EVERY) on the lane's resolver,
-- which answers from its cache until the record's TTL ends, so a new
-- address set is in use within a second of its TTL; a failed lookup keeps
-- the addresses known. A name never resolved yet stands as itself (a
-- placeholder looked up when picked).
local RESOLVE_EVERY = 1000

local resolve -- mp.resolve, found on first use
local function addrs_of(host)
  resolve = resolve or require("moonport").resolve
  local all, err = resolve(host)
  if type(all) ~= "table" then return nil, err or ("cannot resolve " .. host) end
  local v4, v6 = {}, {}
  for _, x in ipairs(all) do
    if find(x, ":", 1, true) then v6[#v6 + 1] = x else v4[#v4 + 1] = x end
  end
  local out = #v4 > 0 and v4 or v6
  if #out == 0 then return nil, "cannot resolve " .. host end
  sort(out)
  return out
end

local function new_peer(sp, ip, addr)
  return { host = sp.host, port = sp.port, weight = sp.weight, tls = sp.tls, addr = addr,
    key = addr, ip = ip, ip_until = 0, spec = sp.addr,
    cw = 0, active = 0, ewma = 0, ewma_t = 0, down_until = 0,
    requests = 0, errors = 0, ms = 0 }
end

-- up.list from up.specs and the addresses known (up.addrs), keeping the
-- state of peers that stay
local function rebuild(up)
  local peers, old = {}, up.by_addr or {}
  for _, sp in ipairs(up.specs) do
    local known = not sp.ip and up.addrs[sp.addr]
    if known then
      for ip in known:gmatch("%S+") do
        local addr = (find(ip, ":", 1, true) and "[" .. ip .. "]" or ip) .. ":" .. sp.port
        local pe = old[addr]
        if not pe or pe.spec ~= sp.addr then pe = new_peer(sp, ip, addr) end
        pe.weight, pe.tls = sp.weight, sp.tls
        peers[#peers + 1] = pe
      end
    else
      peers[#peers + 1] = sp
    end
  end
  up.list = peers
  up.by_addr = {}
  for i, pe in ipairs(peers) do
    pe.index = i
    pe.ka = "a|" .. up.name .. "|" .. pe.addr
    up.by_addr[pe.addr] = pe
    -- a pooled TLS connection was verified under this object's settings:
    -- it goes back only to this object's tries
    if pe.tls then pe.key = pe.addr .. "|tls" .. up.n end
    if up.dict then pe.down_until = up.dict:get("d|" .. up.name .. "|" .. pe.addr) or 0 end
  end
  if up.balance == "hash" then build_ring(up) end
end

local function set_list(up, specs)
  up.specs = specs
  up.named = false
  for _, sp in ipairs(specs) do
    if not sp.ip then up.named = true end
  end
  up.resolve_at = 0
  rebuild(up)
end

-- Asks the names again when RESOLVE_EVERY has passed (may wait: the
-- lookup yields, and one coroutine of the lane asks while the others go on)
local function refresh(up, t)
  if not up.named or t < up.resolve_at then return end
  up.resolve_at = t + RESOLVE_EVERY
  local changed = false
  for _, sp in ipairs(up.specs) do
    if not sp.ip then
      local a = addrs_of(sp.host)
      local k = a and concat(a, " ")
      if k and up.addrs[sp.addr] ~= k then
        up.addrs[sp.addr] = k
        changed = true
      end
    end
  end
  if changed then rebuild(up) end
end

-- ---- shared state ----

local function k_gen(up) return "g|" .. up.name end
local function k_down(up, s) return "d|" .. up.name .. "|" .. s.addr end

-- Reloads the list (after set_servers elsewhere) and the down marks.
local function reload(up, gen)
  local d = up.dict
  up.gen = gen
  local spec = d:get("s|" .. up.name)
  if spec and spec ~= up.spec then
    local list = {}
    for addr in spec:gmatch("[^\n]+") do
      local a, w, t = addr:match("^(%S+) (%d+) ?(.*)$")
      local keep = up.by_addr[a]
      local s = server(a, 3)
      s.weight = tonumber(w)
      if t ~= "" then s.tls = tls_dec(t) end
      if keep then s.cw, s.ewma, s.ewma_t, s.active = keep.cw, keep.ewma, keep.ewma_t, keep.active end
      s.index = #list + 1
      list[#list + 1] = s
    end
    up.spec = spec
    set_list(up, list)
  end
  if up.named then up.resolve_at = 0 end
  for _, s in ipairs(up.list) do
    s.down_until = d:get(k_down(up, s)) or 0
  end
end

local function sync(up)
  local g = up.dict:get(up.kgen) or 0
  if g ~= up.gen then reload(up, g) end
end

local function bump(up)
  up.dict:incr(up.kgen, 1, 0)
end

-- A failure of s (a connection error, a timeout, a 5xx): max_fails of them
-- in fail_timeout take it out for fail_timeout.
local function failed(up, s)
  s.errors = s.errors + 1
  if up.max_fails == 0 then return end
  local d, ttl = up.dict, up.fail_timeout / 1000
  local n = d:incr("f|" .. up.name .. "|" .. s.addr, 1, 0, ttl)
  if n and n >= up.max_fails and s.down_until == 0 then
    local t = now() + up.fail_timeout
    d:set(k_down(up, s), t, ttl)
    s.down_until = t
    bump(up)
  end
end

local function is_down(s, t)
  local u = s.down_until
  return u ~= 0 and (u < 0 or u > t)
end

-- ---- balancing ----

local function usable(s, tried, t)
  return not (tried and tried[s]) and not is_down(s, t)
end

local function pick_rr(up, tried, t)
  local best, total = nil, 0
  for _, s in ipairs(up.list) do
    if usable(s, tried, t) then
      s.cw = s.cw + s.weight
      total = total + s.weight
      if not best or s.cw > best.cw then best = s end
    end
  end
  if best then best.cw = best.cw - total end
  return best
end

local function pick_least(up, tried, t)
  local best, bs
  local n = #up.list
  local start = up.rr % n
  up.rr = up.rr + 1
  for i = 0, n - 1 do
    local s = up.list[(start + i) % n + 1]
    if usable(s, tried, t) then
      -- in flight over every lane of every worker (the dictionary's count)
      local score = (up.dict:get(s.ka) or 0) / s.weight
      if not best or score < bs then best, bs = s, score end
    end
  end
  return best
end

local function ewma_score(s, t)
  local e = s.ewma
  if s.ewma_t > 0 then e = e * exp((s.ewma_t - t) / EWMA_TAU) end
  return (e + 1) * (s.active + 1) / s.weight
end

-- power of two choices on the decayed latency times the load
local function pick_ewma(up, tried, t)
  local ok, n = up.scratch, 0
  for _, s in ipairs(up.list) do
    if usable(s, tried, t) then n = n + 1; ok[n] = s end
  end
  if n == 0 then return nil end
  if n == 1 then return ok[1] end
  local a = random(n)
  local b = random(n - 1)
  if b >= a then b = b + 1 end
  local sa, sb = ok[a], ok[b]
  for i = 1, n do ok[i] = nil end
  return ewma_score(sa, t) <= ewma_score(sb, t) and sa or sb
end

local function pick_hash(up, req, tried, t)
  local key = up.key(req)
  if key == nil then return pick_rr(up, tried, t) end
  local h, hs, ss = hash(tostring(key)), up.ring_h, up.ring_s
  local lo, hi = 1, #hs
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if hs[mid] < h then lo = mid + 1 else hi = mid end
  end
  if hs[lo] < h then lo = 1 end
  local n = #hs
  for i = 0, n - 1 do
    local s = ss[(lo - 1 + i) % n + 1]
    if usable(s, tried, t) then return s end
  end
  return nil
end

local function pick(up, req, tried, t)
  local b = up.balance
  if b == "round_robin" then return pick_rr(up, tried, t) end
  if b == "least_conn" then return pick_least(up, tried, t) end
  if b == "ewma" then return pick_ewma(up, tried, t) end
  return pick_hash(up, req, tried, t)
end

-- ---- proxying ----

-- a peer's address; a name not resolved yet (its placeholder) is looked
-- up here
local function ip_of(s)
  if s.ip then return s.ip end
  local a, err = addrs_of(s.host)
  if not a then return nil, err end
  return a[1]
end

local function check_name(k, what)
  if type(k) ~= "string" or not k:match("^[%w!#$%%&'*+.^_`|~-]+$") then
    error("up:proxy: bad header name in " .. what .. ": " .. tostring(k), 3)
  end
end

-- The extra header lines and the '\n'-ended names to drop of opts.
local function head_opts(o)
  local extra, drop = nil, nil
  if o.headers then
    local lines, names = {}, {}
    for k, v in pairs(o.headers) do
      check_name(k, "headers")
      names[#names + 1] = lower(k) .. "\n"
      if v ~= false then
        v = tostring(v)
        if find(v, "[%z\r\n]") then error("up:proxy: bad header value for " .. k, 3) end
        lines[#lines + 1] = k .. ": " .. v .. "\r\n"
      end
    end
    extra, drop = concat(lines), concat(names)
  end
  if o.strip then
    local names = { drop }
    for _, k in ipairs(o.strip) do
      check_name(k, "strip")
      names[#names + 1] = lower(k) .. "\n"
    end
    drop = concat(names)
  end
  return extra, drop
end

local function answer(res, status, msg)
  res:status(status):header("content-type", "text/plain; charset=utf-8")
  res:send(msg)
end

-- What a try leaves to count: the server's in-flight count, and for an
-- answer its requests, time and latency average (a 5xx is a failure).
-- A function of its own so that the JIT compiles it: up:proxy's frame
-- comes back from try's yield in the interpreter and stays there, so
-- code written after the try ran interpreted on every request.
local function settle(up, s, shared_active, status, err, ms)
  s.active = s.active - 1
  if shared_active then up.dict:incr(s.ka, -1, 0) end
  if err then return end
  s.requests = s.requests + 1
  s.ms = s.ms + ms
  local tn = now()
  if s.ewma_t > 0 then
    local w = exp((s.ewma_t - tn) / EWMA_TAU)
    s.ewma = s.ewma * w + ms * (1 - w)
  else
    s.ewma = ms
  end
  s.ewma_t = tn
  if status >= 500 then failed(up, s) end
end

-- up:proxy(req, res [, o]) -> status | nil, err
function U.proxy(up, req, res, o)
  if type(req) ~= "table" then error("up:proxy: req expected", 2) end
  local host, target, extra, drop
  if o ~= nil then
    if type(o) ~= "table" then error("up:proxy: options must be a table", 2) end
    if o.path ~= nil then
      if type(o.path) ~= "string" or o.path:sub(1, 1) ~= "/" or find(o.path, "[%s%z]") then
        error("up:proxy: path must start with / and have no blanks", 2)
      end
      target = o.path
      if not find(target, "?", 1, true) then
        local q = req.target and req.target:match("%?.*$")
        if q then target = target .. q end
      end
    end
    if o.host ~= nil and o.host ~= "keep" and o.host ~= "upstream" then
      error("up:proxy: host is \"keep\" or \"upstream\"", 2)
    end
    host = o.host
    extra, drop = head_opts(o)
  end
  sync(up)
  -- core.fetch.now, the C API clock, here on purpose: the JIT ends its
  -- trace at a C API call and links the trace after it to the retry
  -- loop's own trace. With the FFI clock here too, the traces recorded
  -- from the handler's entry ran into the loop below, aborted ("inner
  -- loop in root trace") and left the request's start to the interpreter
  -- (about 2,000 instructions more per request, callgrind).
  local t = cnow()
  if up.named then refresh(up, t) end
  -- a streamed body is read once: a request whose body went out can't be
  -- sent again, whatever its method
  local h, body = req.headers, rawget(req, "body")
  local idem = IDEMPOTENT[req.method] and (body ~= nil or
    not (h["content-length"] or h["transfer-encoding"]))
  local tried, last, last_s = nil, nil, nil
  -- least_conn counts what is in flight in the dictionary, so every lane
  -- of every worker balances on the same numbers (two shared writes per
  -- try; a try's wait can't be cut short, so each +1 gets its -1 unless
  -- the worker dies under it)
  local shared_active = up.balance == "least_conn"
  local tries = up.retries + 1
  local attempt = 0
  while attempt < tries do
    local s = pick(up, req, tried, t)
    if not s then
      if not tried then
        -- every server is down: try the one back soonest rather than none
        for _, x in ipairs(up.list) do
          if not last_s or (x.down_until >= 0 and x.down_until < last_s.down_until) then last_s = x end
        end
        s = last_s
      end
      if not s then break end
    end
    attempt = attempt + 1
    local ip, rerr = ip_of(s)
    if not ip then
      last = rerr
      failed(up, s)
      tried = tried or {}
      tried[s] = true
    else
      local authority = host == "upstream" and s.addr or nil
      local fresh = false
      for _ = 1, 2 do -- a stale pooled connection gets one fresh try
        s.active = s.active + 1
        if shared_active then up.dict:incr(s.ka, 1, 0) end
        local port, key, cid, xid = s.port, s.key, req.conn_id, req._xid
        local ka, cms, tms, tls = up.keepalive, up.connect_timeout, up.timeout, s.tls
        try_check(req, ip, port, key, ka, cms, tms, authority, target, extra, drop,
          fresh, tls, ip, cid, xid, body)
        local status, err, sent, answered, reused, ms, spliced =
          yield(TOKEN, try_arm, req, ip, port, key, ka, cms, tms, authority, target,
            extra, drop, fresh, tls, ip, cid, xid, body)
        settle(up, s, shared_active, status, err, ms)
        if not err then return status, nil, spliced end
        if answered or err == "client closed" then
          s.requests = s.requests + 1
          failed(up, s)
          return nil, err
        end
        if reused and (idem or not sent) and not fresh then
          fresh = true
        else
          tried = tried or {}
          tried[s] = true
          s.requests = s.requests + 1
          failed(up, s)
          last = err
          if sent and not idem then
            answer(res, 502, "502 Bad Gateway: the upstream failed after the request was sent (" .. err .. ")\n")
            return nil, err
          end
          break
        end
      end
    end
  end
  if last == "timeout" then
    answer(res, 504, "504 Gateway Timeout: no upstream answered in time\n")
  else
    answer(res, 502, "502 Bad Gateway: no upstream could be reached (" .. tostring(last or "none usable") .. ")\n")
  end
  return nil, last or "no upstream"
end

-- ---- run time ----

function U.servers(up)
  sync(up)
  local d, t, out = up.dict, now(), {}
  if up.named then refresh(up, t) end
  for i, s in ipairs(up.list) do
    local pre = "m|" .. up.name .. "|" .. s.addr .. "|"
    local fails = d:get("f|" .. up.name .. "|" .. s.addr) or 0
    out[i] = { addr = s.addr, host = s.host, port = s.port, weight = s.weight,
      state = is_down(s, t) and "down" or "up", fails = fails,
      active = up.balance == "least_conn" and (d:get(s.ka) or 0) or s.active,
      requests = (d:get(pre .. "r") or 0) + s.requests,
      errors = (d:get(pre .. "e") or 0) + s.errors,
      ewma_ms = s.ewma }
  end
  return out
end

function U.set_servers(up, list)
  local new = servers_of(list, 3)
  local lines = {}
  for i, s in ipairs(new) do
    lines[i] = s.addr .. " " .. s.weight .. (s.tls and " " .. tls_enc(s.tls) or "")
  end
  local spec = concat(lines, "\n")
  local ok, err = up.dict:set("s|" .. up.name, spec)
  if not ok then return nil, err end
  bump(up)
  sync(up)
  return true
end

-- per-lane counts go to the dictionary once a second (a shared write per
-- request would cost more than the count is worth)
local function flush(up)
  local d = up.dict
  for _, s in ipairs(up.list) do
    if s.requests > 0 or s.errors > 0 then
      local pre = "m|" .. up.name .. "|" .. s.addr .. "|"
      d:incr(pre .. "r", s.requests, 0)
      d:incr(pre .. "e", s.errors, 0)
      d:incr(pre .. "t", s.ms, 0)
      s.requests, s.errors, s.ms = 0, 0, 0
    end
  end
end

-- A check of a TLS server: GET over mp.tcp with the server's tls (its
-- sni verified against the address connected to, which mp.fetch's URL
-- can't say), the status line read, the connection closed.
local function check_tls(c, s, ip, mp)
  local sock = mp.tcp(ip, s.port, { timeout = c.timeout, tls = s.tls, pool = false })
  if not sock then return false end
  local okw = sock:send("GET " .. c.path .. " HTTP/1.1\r\nHost: " .. (c.host or s.addr) ..
    "\r\nUser-Agent: moonport-check\r\nConnection: close\r\n\r\n")
  local line = okw and sock:receive("*l")
  sock:close()
  local st = line and tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  return st and (c.expect[st] or false) or false
end

-- One active check of s, by the lane that took its lease.
local function check_one(up, s, mp)
  local c = up.check
  local ip = ip_of(s)
  local ok = false
  if ip and s.tls then
    ok = check_tls(c, s, ip, mp)
  elseif ip then
    local url = "http://" .. (ip:find(":", 1, true) and "[" .. ip .. "]" or ip) .. ":" .. s.port .. c.path
    local r = mp.fetch(url, { timeout = c.timeout,
      headers = { host = c.host or s.addr, ["user-agent"] = "moonport-check" } })
    ok = r and (c.expect[r.status] or false)
  end
  local d, base = up.dict, up.name .. "|" .. s.addr
  if ok then
    d:delete("ko|" .. base)
    if d:get(k_down(up, s)) then
      local n = d:incr("ok|" .. base, 1, 0)
      if n and n >= c.passes then
        d:delete(k_down(up, s))
        d:delete("ok|" .. base)
        d:delete("f|" .. base)
        bump(up)
      end
    end
  else
    d:delete("ok|" .. base)
    local n = d:incr("ko|" .. base, 1, 0)
    local cur = d:get(k_down(up, s))
    if n and n >= c.fails and cur ~= -1 then
      d:set(k_down(up, s), -1) -- until the checks pass again
      bump(up)
    end
  end
end

local function start_checks(up, mp)
  local c = up.check
  mp.every(c.interval, function()
    sync(up)
    if up.named then refresh(up, now()) end
    flush(up)
    for _, s in ipairs(up.list) do
      -- the lease: one lane of one worker checks s in this interval
      if up.dict:add("c|" .. up.name .. "|" .. s.addr, true, c.interval * 0.9 / 1000) then
        check_one(up, s, mp)
      end
    end
  end)
end

local function num(o, k, def, lo, hi)
  local v = o[k]
  if v == nil then return def end
  if type(v) ~= "number" or v < lo or v > hi or v % 1 ~= 0 then
    error(format("mp.upstream: %s must be a whole number from %d to %d", k, lo, hi), 3)
  end
  return v
end

return function(o)
  if type(o) ~= "table" then error("mp.upstream: options table expected", 2) end
  local mp = require("moonport")
  count = count + 1
  local up = setmetatable({}, U)
  up.n = count
  up.name = o.name or ("upstream" .. count)
  if type(up.name) ~= "string" or find(up.name, "[|\n]") then
    error("mp.upstream: name is a string without '|'", 2)
  end
  up.balance = o.balance or "round_robin"
  if not BALANCE[up.balance] then
    error("mp.upstream: balance is round_robin, least_conn, hash or ewma", 2)
  end
  if up.balance == "hash" then
    up.key = o.key or function(req) return (req:peer()) end
    if type(up.key) ~= "function" then error("mp.upstream: key must be a function(req)", 2) end
  end
  up.keepalive = num(o, "keepalive", 64, 0, 10000)
  up.connect_timeout = num(o, "connect_timeout", 5000, 1, 3600000)
  up.timeout = num(o, "timeout", 60000, 1, 3600000)
  up.retries = num(o, "retries", 1, 0, 100)
  up.max_fails = num(o, "max_fails", 3, 0, 1000000)
  up.fail_timeout = num(o, "fail_timeout", 10000, 1, 3600000)
  up.rr, up.gen, up.scratch, up.addrs = 0, -1, {}, {}
  set_list(up, servers_of(o.servers, 3))
  up.dict = mp.shared(DICT, { size = DICT_SIZE })
  up.kgen = k_gen(up)
  if o.check ~= nil then
    local c = o.check
    if type(c) ~= "table" then error("mp.upstream: check must be a table", 2) end
    if type(c.path) ~= "string" or c.path:sub(1, 1) ~= "/" then
      error("mp.upstream: check.path must start with /", 2)
    end
    local expect = {}
    local e = c.expect or 200
    for _, st in ipairs(type(e) == "table" and e or { e }) do expect[st] = true end
    up.check = { path = c.path, host = c.host, expect = expect,
      interval = num(c, "interval", 5000, 10, 3600000),
      timeout = num(c, "timeout", 2000, 1, 3600000),
      fails = num(c, "fails", 3, 1, 1000), passes = num(c, "passes", 2, 1, 1000) }
    if not mp.is_root() then start_checks(up, mp) end
  else
    if not mp.is_root() then mp.every(1000, function() flush(up) end) end
  end
  return up
end
